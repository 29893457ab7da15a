"""Sandboxed Jinja rendering of prompt templates.

Templates are code written by the corpus author; everything that fills them (trace text, log
lines, Faker values) is data. Data is only ever passed as variables, never compiled, so ``{{ 7*7 }}``
inside a log line renders as typed. The environment is Jinja's ``ImmutableSandboxedEnvironment``
(no ``__class__`` / ``|attr`` / ``str.format`` escapes, no mutation of passed objects) with
``StrictUndefined`` (a misspelt variable is an error, not an empty string). Templates load only
from the configured roots: names with ``..``, absolute names and symlinks that resolve outside a
root are refused. Output size and render time are capped; the checks run between output chunks,
and ``*`` / ``**`` results are size-checked so one expression cannot allocate gigabytes.
"""

from __future__ import annotations

import operator
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from harness.common.errors import ConfigError


class TemplateError(ConfigError):
    """A template is missing, malformed, unsafe, or failed to render (exit 4)."""


class ConfinedLoader(jinja2.BaseLoader):
    """Loads ``name`` from the first root that has it, refusing anything that leaves the roots."""

    def __init__(self, roots: Sequence[str | Path]) -> None:
        if not roots:
            raise TemplateError("no template root given")
        self.roots = [Path(r).resolve() for r in roots]

    def resolve(self, name: str) -> Path:
        if not name or "\\" in name or "\x00" in name:
            raise TemplateError("invalid template name", file=name)
        parts = name.split("/")
        if name.startswith("/") or Path(name).is_absolute() or any(p in ("..", "") for p in parts[:-1]):
            raise TemplateError(
                "template names must be relative and stay inside the template root", file=name
            )
        if ".." in parts:
            raise TemplateError("template names must not contain '..'", file=name)
        for root in self.roots:
            candidate = (root / name).resolve()
            if not candidate.is_relative_to(root):
                raise TemplateError(f"template resolves outside its root {root} (symlink?)", file=name)
            if candidate.is_file():
                return candidate
        raise TemplateError(f"template not found under {', '.join(map(str, self.roots))}", file=name)

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str | None, Callable[[], bool] | None]:
        path = self.resolve(template)
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read template: {exc}", file=path) from None
        mtime = path.stat().st_mtime
        return source, str(path), lambda: path.exists() and path.stat().st_mtime == mtime


class _Guarded(ImmutableSandboxedEnvironment):
    """Adds result-size checks for ``*`` and ``**`` (the sandbox only caps ``range``)."""

    intercepted_binops = frozenset(["*", "**"])
    max_operand = 1_000_000
    max_int_bits = 1 << 16
    """Integer results are capped too: one big-int ``**`` or ``*`` runs in C, so the render-time check
    between output chunks cannot interrupt it (``(((9**64)**64)**64)**64`` takes about a minute)."""

    def _check_int_bits(self, bits: int) -> None:
        if bits > self.max_int_bits:
            raise SecurityError("integer result too large in template")

    def call_binop(self, context: jinja2.runtime.Context, operator_: str, left: Any, right: Any) -> Any:
        both_int = isinstance(left, int) and isinstance(right, int)
        if operator_ == "**":
            if isinstance(left, int | float) and isinstance(right, int | float) and abs(right) > 64:
                raise SecurityError("exponent too large in template")
            if both_int and right > 0:
                self._check_int_bits(abs(left).bit_length() * right)
            return operator.pow(left, right)
        if both_int:
            self._check_int_bits(abs(left).bit_length() + abs(right).bit_length())
        # Sequence repetition: the size of the result is len × count.
        for seq, count in ((left, right), (right, left)):
            too_big = isinstance(seq, str | list | tuple) and isinstance(count, int)
            if too_big and len(seq) * max(count, 0) > self.max_operand:
                raise SecurityError("repetition result too large in template")
        return operator.mul(left, right)


class PromptRenderer:
    """Renders templates from confined roots with size and time limits.

    Args:
        roots: directories templates (and their includes) may come from.
        max_output_chars: a render producing more characters than this fails.
        max_render_s: a render running longer than this fails (checked between output chunks).
    """

    def __init__(
        self,
        roots: Sequence[str | Path],
        *,
        max_output_chars: int = 200_000,
        max_render_s: float = 2.0,
    ) -> None:
        self.loader = ConfinedLoader(roots)
        self.env = _Guarded(
            loader=self.loader,
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            # A renderer lives for one build: checking every included file's mtime on each render
            # (two stat calls per include per prompt) buys nothing.
            auto_reload=False,
        )
        self.max_output_chars = max_output_chars
        self.max_render_s = max_render_s
        self._cache: dict[str, jinja2.Template] = {}

    def template(self, name: str) -> jinja2.Template:
        if name not in self._cache:
            try:
                self._cache[name] = self.env.get_template(name)
            except TemplateError:
                raise
            except jinja2.TemplateSyntaxError as exc:
                raise TemplateError(
                    f"template syntax error: {exc.message}", file=exc.filename or name, line=exc.lineno
                ) from None
            except jinja2.TemplateNotFound as exc:
                raise TemplateError(f"included template not found: {exc.name}", file=name) from None
        return self._cache[name]

    def render(self, name: str, variables: Mapping[str, Any]) -> str:
        """Render template ``name`` with ``variables`` (data, rendered literally)."""
        tmpl = self.template(name)
        deadline = time.perf_counter() + self.max_render_s
        out: list[str] = []
        size = 0
        try:
            for chunk in tmpl.generate(**variables):
                size += len(chunk)
                if size > self.max_output_chars:
                    raise TemplateError(
                        f"rendered output exceeds {self.max_output_chars} characters", file=name
                    )
                if time.perf_counter() > deadline:
                    raise TemplateError(f"render took longer than {self.max_render_s} s", file=name)
                out.append(chunk)
        except TemplateError:
            raise
        except SecurityError as exc:
            raise TemplateError(
                f"unsafe template operation refused by the sandbox: {exc}", file=name, line=_line(exc, tmpl)
            ) from None
        except jinja2.UndefinedError as exc:
            raise TemplateError(
                f"undefined template variable: {exc.message}", file=name, line=_line(exc, tmpl)
            ) from None
        except jinja2.TemplateError as exc:
            raise TemplateError(
                f"template failed to render: {exc}", file=name, line=_line(exc, tmpl)
            ) from None
        except (TypeError, ValueError, ArithmeticError, KeyError, IndexError) as exc:
            raise TemplateError(
                f"template failed to render: {type(exc).__name__}: {exc}", file=name, line=_line(exc, tmpl)
            ) from None
        return "".join(out)


def _line(exc: BaseException, tmpl: jinja2.Template) -> int | None:
    """The template line the error was raised at (Jinja rewrites tracebacks to template frames)."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if tmpl.filename and frame.filename == tmpl.filename:
            line = frame.lineno
    return line
