"""Atomic file output and guarded input opening.

Outputs are written to a temporary file beside the target and renamed into place, so a crash or
Ctrl-C never leaves a half-written report, corpus or index behind: readers see the old file or the
new one. Inputs are checked before parsing so that a directory, an empty file or a binary file gets
a clear :class:`InputError` instead of a parser traceback. JSONL inputs (one JSON object per line,
optionally a pydantic model or a dataclass's ``TypeAdapter``) are read with :func:`iter_jsonl`
(``records.jsonl`` and ``server_metrics.jsonl`` too, through their stage's thin reader), or with
:func:`jsonl_lines` and :func:`parse_jsonl_line` for a payload already in memory, so every stage
reports a bad line the same way: file, line and the field's dotted path (``messages.0.role``).
Whole JSON documents (tier policies, scenario sets) are read with :func:`read_json` the same way.
YAML documents people write (ladder plans, baselines, deployment values) are read with
:func:`read_yaml`, which names the line of the field at fault too.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar, overload

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from harness.common.errors import ConfigError, HarnessError, InputError

if TYPE_CHECKING:
    import yaml
    from pydantic_core import ErrorDetails

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on clean exit fsync it and rename it onto ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    binary = "b" in mode
    try:
        # mkstemp creates 0600; outputs are ordinary files, so give them the mode open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_write(path, "wb", encoding=None) as fh:
        fh.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        fh.write(b"\n")


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> int:
    """Write one JSON object per line, atomically; returns the number of rows."""
    n = 0
    with atomic_write(path, "wb", encoding=None) as fh:
        for row in rows:
            fh.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY))
            fh.write(b"\n")
            n += 1
    return n


def json_object(text: str, field: str) -> dict[str, Any]:
    """``text`` as a JSON object, or a :class:`ConfigError` naming ``field`` (a setting that carries
    JSON: an environment variable, a command-line argument)."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise ConfigError("is not JSON", field=field) from None
    if not isinstance(doc, dict):
        raise ConfigError("must be a JSON object", field=field)
    return doc


def check_input_file(path: str | Path, *, allow_empty: bool = False) -> Path:
    """Return ``path`` if it is a readable, non-empty, non-binary file; else raise :class:`InputError`."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", file=p)
    if p.is_dir():
        raise InputError("is a directory, expected a file", file=p)
    try:
        with p.open("rb") as fh:
            head = fh.read(8192)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=p) from None
    if not head and not allow_empty:
        raise InputError("file is empty", file=p)
    if b"\x00" in head:
        raise InputError("looks binary (contains NUL bytes), expected text", file=p)
    return p


def check_output_file(path: str | Path) -> Path:
    """Return ``path`` if a file can be written there (:func:`atomic_write` creates missing parent
    directories); else raise :class:`InputError`. For commands that read a lot before they write:
    a bad output path should fail before the reading, not after it."""
    p = Path(path)
    if p.is_dir():
        raise InputError("is a directory, expected a file to write", file=p)
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"cannot create the output's directory: {parent} is not a directory", file=p)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot write in {parent}", file=p)
    return p


def _expecting(message: str, expected: str | None) -> str:
    return f"{message}, expected {expected}" if expected else message


@overload
def parse_jsonl_line(
    raw: bytes | str,
    lineno: int | None,
    model: None = None,
    *,
    file: str | Path | None = None,
    expected: str | None = None,
    nonfinite: bool = False,
) -> dict[str, Any]: ...


@overload
def parse_jsonl_line(
    raw: bytes | str,
    lineno: int | None,
    model: type[M],
    *,
    file: str | Path | None = None,
    expected: str | None = None,
    nonfinite: bool = False,
) -> M: ...


@overload
def parse_jsonl_line(
    raw: bytes | str,
    lineno: int | None,
    model: TypeAdapter[T],
    *,
    file: str | Path | None = None,
    expected: str | None = None,
    nonfinite: bool = False,
) -> T: ...


def parse_jsonl_line(
    raw: bytes | str,
    lineno: int | None,
    model: type[M] | TypeAdapter[T] | None = None,
    *,
    file: str | Path | None = None,
    expected: str | None = None,
    nonfinite: bool = False,
) -> M | T | dict[str, Any]:
    """One JSONL line as a validated ``model`` (a pydantic model, or a ``TypeAdapter`` for a
    dataclass) or, without one, as a JSON object.

    Raises :class:`InputError` naming ``file``, ``lineno`` and, for a validation error, the first
    failing field as a dotted path (``messages.0.role``); a line that is JSON but not an object is
    ``not a JSON object``. ``expected`` (``"a schedule entry"``) is appended to every message as
    ``…, expected a schedule entry``. With ``nonfinite``, the ``NaN`` / ``Infinity`` / ``-Infinity``
    literals (which Python's json module writes, and strict JSON refuses) are read as the floats they
    stand for (``records.jsonl``'s NaN rule, :func:`harness.load.results.read_records`).
    """
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if not nonfinite:
            raise InputError(
                _expecting(f"invalid JSON ({exc.msg})", expected), file=file, line=lineno
            ) from None
        try:
            obj = json.loads(raw)
        except ValueError:
            raise InputError(
                _expecting(f"invalid JSON ({exc.msg})", expected), file=file, line=lineno
            ) from None
    if not isinstance(obj, dict):
        raise InputError(_expecting("not a JSON object", expected), file=file, line=lineno)
    if model is None:
        return obj
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(obj)
        return model.model_validate(obj)
    except ValidationError as exc:
        raise validation_input_error(exc, file=file, line=lineno, expected=expected) from None


def read_json(path: str | Path, model: type[M], *, expected: str) -> M:
    """A JSON document from ``path``, validated as ``model``.

    Every problem is one :class:`InputError` naming the file and, for a syntax error, its line, or,
    for a validation error, the field's dotted path; ``expected`` says what the file should be
    (``"a tier policy file"``).
    """
    p = check_input_file(path)
    try:
        obj = orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(_expecting(f"invalid JSON ({exc.msg})", expected), file=p, line=exc.lineno) from None
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise validation_input_error(exc, file=p, expected=expected) from None


E = TypeVar("E", bound=HarnessError)


def validation_error(
    exc: ValidationError,
    error: type[E],
    *,
    file: str | Path | None = None,
    line: int | None = None,
    field: str | None = None,
    expected: str | None = None,
    what: str | None = None,
    hint: str | None = None,
) -> E:
    """The first problem of a pydantic ``ValidationError`` as one ``error`` (``ConfigError`` for
    settings and configuration files, ``InputError`` for data), the one translation of the project.

    The error names the failing field by its dotted path (``stages.1.target_qps``) unless ``field``
    names it otherwise (an environment variable); the message is pydantic's, without the ``Value
    error,`` that it puts before a validator's own words, after ``what: `` (``invalid setting``) and
    followed by ``, expected <expected>``.
    """
    err = exc.errors()[0]
    path = ".".join(str(x) for x in err.get("loc", ())) or None
    message = _expecting(_message(err), expected)
    return error(
        f"{what}: {message}" if what else message, file=file, line=line, field=field or path, hint=hint
    )


def validation_input_error(
    exc: ValidationError,
    *,
    file: str | Path | None = None,
    line: int | None = None,
    expected: str | None = None,
) -> InputError:
    """:func:`validation_error` as an :class:`InputError` (bad data, not bad configuration)."""
    return validation_error(exc, InputError, file=file, line=line, expected=expected)


def _message(err: ErrorDetails) -> str:
    # A validator's ValueError reads "Value error, <what we wrote>": show what we wrote.
    return err.get("msg", "invalid value").removeprefix("Value error, ")


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at pydantic location ``loc`` (the deepest one that exists)."""
    import yaml

    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            match = node.value[part]
        else:
            match = None
        if match is None:
            break
        node = match
        line = node.start_mark.line + 1
    return line


def yaml_line(path: str | Path, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the value at ``loc`` (a pydantic location) in the YAML file at ``path``."""
    import yaml

    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None
    return _line_of(node, loc)


@overload
def read_yaml(
    path: str | Path,
    model: None = None,
    *,
    expected: str,
    error: type[HarnessError] = InputError,
    hint: Callable[[ErrorDetails], str | None] | None = None,
    context: dict[str, Any] | None = None,
) -> dict[str, Any]: ...


@overload
def read_yaml(
    path: str | Path,
    model: type[M],
    *,
    expected: str,
    error: type[HarnessError] = InputError,
    hint: Callable[[ErrorDetails], str | None] | None = None,
    context: dict[str, Any] | None = None,
) -> M: ...


def read_yaml(
    path: str | Path,
    model: type[M] | None = None,
    *,
    expected: str,
    error: type[HarnessError] = InputError,
    hint: Callable[[ErrorDetails], str | None] | None = None,
    context: dict[str, Any] | None = None,
) -> M | dict[str, Any]:
    """A YAML mapping from ``path``, validated as ``model`` when one is given.

    Every problem is one ``error`` (:class:`InputError` unless the file is configuration) naming the
    file, the line and, for a validation error, the field's dotted path and the line it is on
    (``stages.1.target_qps``). ``expected`` says what the file should be (``"a ladder plan"``);
    ``hint`` may add a suggestion for a validation error; ``context`` is pydantic's validation
    context (a ladder plan's ``capacity``, which resolves ``qps: 50%``).
    """
    import yaml

    p = check_input_file(path)
    text = p.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise error(f"not valid YAML ({exc.problem}), expected {expected}", file=p, line=line) from None
    except yaml.YAMLError as exc:
        raise error(f"not valid YAML ({exc}), expected {expected}", file=p) from None
    if not isinstance(data, dict):
        raise error(f"not a YAML mapping, expected {expected}", file=p)
    if model is None:
        return data
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise validation_error(
            exc,
            error,
            file=p,
            line=_line_of(yaml.compose(text, Loader=yaml.SafeLoader), tuple(err.get("loc", ()))),
            hint=hint(err) if hint is not None else None,
        ) from None


def jsonl_lines(lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(1-based line number, line)`` of each line that is not blank, a UTF-8 byte-order mark on the
    first one dropped: the lines of a JSONL file (its handle) or of a payload already in memory (a
    zipped log's member, ``data.splitlines()``). Blank lines are counted, so numbers stay the file's."""
    for lineno, raw in enumerate(lines, start=1):
        line = raw[3:] if lineno == 1 and raw.startswith(b"\xef\xbb\xbf") else raw
        if line.strip():
            yield lineno, line


@overload
def iter_jsonl(
    path: str | Path,
    model: None = None,
    *,
    expected: str | None = None,
    allow_empty: bool = False,
    nonfinite: bool = False,
) -> Iterator[tuple[int, dict[str, Any]]]: ...


@overload
def iter_jsonl(
    path: str | Path,
    model: type[M],
    *,
    expected: str | None = None,
    allow_empty: bool = False,
    nonfinite: bool = False,
) -> Iterator[tuple[int, M]]: ...


@overload
def iter_jsonl(
    path: str | Path,
    model: TypeAdapter[T],
    *,
    expected: str | None = None,
    allow_empty: bool = False,
    nonfinite: bool = False,
) -> Iterator[tuple[int, T]]: ...


def iter_jsonl(
    path: str | Path,
    model: type[M] | TypeAdapter[T] | None = None,
    *,
    expected: str | None = None,
    allow_empty: bool = False,
    nonfinite: bool = False,
) -> Iterator[tuple[int, M | T | dict[str, Any]]]:
    """Stream ``(1-based line number, value)`` from a JSONL file, one line in memory at a time: the
    one JSONL file reader of the project (``records.jsonl`` and ``server_metrics.jsonl`` included).

    The file is checked with :func:`check_input_file` first (``allow_empty``: an empty file is no
    rows, not an error, as for a run that sent no request); lines come from :func:`jsonl_lines`
    (blank ones skipped, a byte-order mark ignored) and each goes through :func:`parse_jsonl_line`
    (``nonfinite`` as there), so the first bad line raises :class:`InputError` naming the file, line
    and field.
    """
    p = check_input_file(path, allow_empty=allow_empty)
    with p.open("rb") as fh:
        for lineno, line in jsonl_lines(fh):
            yield (
                lineno,
                parse_jsonl_line(line, lineno, model, file=p, expected=expected, nonfinite=nonfinite),
            )
