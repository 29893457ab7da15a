"""What the documentation tests read: the Markdown files, their links and anchors (GitHub's rules),
the command lines in their fenced code blocks, and a check of a ``harness …`` or ``locust -f …``
command line against the real command-line parsers (the typer/click tree of ``harness.cli.build_app``,
Locust's argparse parser and the load options it gets from :class:`harness.load.options.LoadOptions`).
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# ---- Markdown: fences, headings, links ------------------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def code_blocks(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(first line number, info string, lines) of every fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), lines[i].strip()[3:].strip(), i + 2
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        yield start, info, body
        i += 1


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (markup dropped), lowercased, punctuation dropped
    (letters, digits, ``-``, ``_`` and spaces kept), spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name in ``path``: its headings' (numbered ``-1``, ``-2`` … when they
    repeat, as GitHub does) and explicit ``<a id=…>`` / ``<a name=…>``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")


@dataclass(frozen=True)
class Link:
    file: Path
    line: int
    target: str


def links(path: Path) -> Iterator[Link]:
    """The links of ``path``'s prose (not in code spans or code blocks): inline and reference
    definitions."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        text = INLINE_CODE.sub("", line)
        for m in LINK.finditer(text):
            yield Link(path, number, m.group(1))
        ref = REF_DEF.match(text)
        if ref:
            yield Link(path, number, ref.group(1))


def broken(link: Link) -> str | None:
    """Why ``link`` does not resolve (``None``: it does). External links are not followed."""
    target = link.target
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: …
        return None
    path_part, _, anchor = target.partition("#")
    dest = link.file if not path_part else (link.file.parent / path_part).resolve()
    if not dest.exists():
        return f"{path_part}: no such file"
    if not dest.resolve().is_relative_to(ROOT):
        return f"{path_part}: outside the repository"
    if anchor:
        if dest.suffix != ".md" or dest.is_dir():
            return f"#{anchor}: not a Markdown file, so no anchors"
        if anchor not in anchors(dest):
            return f"#{anchor}: no such heading in {dest.relative_to(ROOT)}"
    return None


CODE_REF = re.compile(r"\bdocs/([\w.-]+\.md)#([\w-]+)")


def code_anchor_refs() -> Iterator[tuple[Path, int, str, str]]:
    """``docs/FILE.md#anchor`` references in the code and fixtures (a baseline's header names one):
    (file, line, doc, anchor)."""
    files = [*(ROOT / "harness").rglob("*.py"), *(ROOT / "fixtures").rglob("*.yaml")]
    for file in sorted(files):
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            for m in CODE_REF.finditer(line):
                yield file, number, m.group(1), m.group(2)


# ---- command lines in code blocks -----------------------------------------------------------------


def _subst(text: str) -> str:
    """``$(…)`` (balanced, possibly quoted) → ``SUBST``: a value the shell computes."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$(", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            out.append("SUBST")
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def shell_commands(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(line offset, words) of each simple command in a block of shell lines: ``\\`` continuations
    joined, comments dropped, ``$(…)`` replaced by a placeholder, split at ``&&``, ``||``, ``;``,
    ``|`` and ``&``; a ``$ `` prompt is dropped."""
    joined: list[tuple[int, str]] = []
    buf, start = "", 0
    for k, line in enumerate(lines):
        if not buf:
            start = k
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        joined.append((start, buf + line))
        buf = ""
    if buf:
        joined.append((start, buf))
    for offset, line in joined:
        text = _subst(line.strip())
        text = re.sub(r"^\$\s+", "", text)
        try:
            lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words = list(lexer)
        except ValueError:  # an unbalanced quote: prose in a code block, not a command
            continue
        command: list[str] = []
        for w in [*words, ";"]:
            if w and set(w) <= set("|&;"):
                if command:
                    yield offset, command
                command = []
            else:
                command.append(w)


ENV_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
WRAPPERS = frozenset({"time", "nohup", "exec", "env", "do", "then", "else", "!"})
"""Words before a command that are not the command: ``for …; do harness …; done`` is a command."""


def command_words(words: list[str]) -> list[str] | None:
    """The words from ``harness`` or ``locust`` on (env-var assignments and a wrapper before it
    skipped); ``None`` when the command is another program's."""
    i = 0
    while i < len(words) and (ENV_PREFIX.match(words[i]) or words[i] in WRAPPERS):
        i += 1
    if i < len(words) and Path(words[i]).name in ("harness", "locust"):
        return [Path(words[i]).name, *words[i + 1 :]]
    return None


def flag_of_word(word: str) -> str | None:
    """The option a word names (``--out=x`` → ``--out``), or ``None`` for a value or ``--``."""
    if not word.startswith("-") or word in ("-", "--") or re.match(r"^-\d", word):
        return None
    return word.split("=", 1)[0]


@cache
def harness_root() -> Any:
    import typer

    from harness.cli import build_app

    return typer.main.get_command(build_app())


def _options(command: Any) -> dict[str, Any]:
    """Option string → click parameter of ``command`` (both halves of ``--x/--no-x``)."""
    found: dict[str, Any] = {}
    for p in command.params:
        if p.param_type_name != "option":
            continue
        for name in (*p.opts, *p.secondary_opts):
            found[name] = p
    return found


def check_harness(words: list[str]) -> tuple[str, list[str]]:
    """Check ``harness …`` against the CLI: the command path exists and every option it gives is one
    of that command's, spelt as it is now (an old, hidden spelling is a mistake in a document).
    Returns the command path and the problems found (none: it parses)."""
    assert words[0] == "harness"
    node = harness_root()
    path = ["harness"]
    problems: list[str] = []
    i = 1
    while hasattr(node, "commands"):  # a group: its own options, then a sub-command
        if i >= len(words):
            return " ".join(path), problems
        word = words[i]
        flag = flag_of_word(word)
        if flag is not None:
            opts = _options(node)
            if flag in ("--help", "--version"):
                return " ".join(path), problems
            if flag not in opts:
                problems.append(f"{' '.join(path)}: no option {flag}")
                return " ".join(path), problems
            i += 1 if opts[flag].is_flag or "=" in word else 2
            continue
        if word not in node.commands:
            problems.append(f"{' '.join(path)}: no command {word!r} (it has {', '.join(node.commands)})")
            return " ".join(path), problems
        node = node.commands[word]
        path.append(word)
        i += 1
    opts = _options(node)
    rest = words[i:]
    j = 0
    while j < len(rest):
        word = rest[j]
        if word == "--":  # `harness baseline calibrate … -- <harness run options>`: the old form
            problems.append(f"{' '.join(path)}: `-- <options>` is an old form: give them before --")
            problems += check_harness(["harness", "run", *rest[j + 1 :]])[1]
            break
        flag = flag_of_word(word)
        if flag is None or flag == "--help":
            j += 1
            continue
        param = opts.get(flag)
        if param is None:
            problems.append(f"{' '.join(path)}: no option {flag}")
            j += 1
            continue
        if param.hidden:
            problems.append(f"{' '.join(path)}: {flag} is an old spelling (see `{' '.join(path)} --help`)")
        j += 1 if param.is_flag or "=" in word else 2
    return " ".join(path), problems


@cache
def locust_options() -> dict[str, bool]:
    """Option string → takes a value, for ``locust -f locustfiles/…``: Locust's own options and the
    load options our plugin adds (their current spellings only). Locust's parser is read in a child
    process: importing locust monkey-patches the interpreter with gevent, which no test process may
    carry into the tests after it."""
    import json
    import subprocess
    import sys

    from harness.common.options import flag_names
    from harness.load.options import LoadOptions

    probe = (
        "import json; from locust.argument_parser import get_parser; "
        "print(json.dumps({k: a.nargs != 0 for k, a in get_parser()._option_string_actions.items()}))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    found: dict[str, bool] = json.loads(shown.stdout.strip().splitlines()[-1])
    for name, info in LoadOptions.model_fields.items():
        for flag in flag_names(name, info):
            if flag.startswith("--"):
                found[flag] = info.annotation is not bool
    return found


def check_locust(words: list[str]) -> list[str]:
    """Check ``locust -f locustfiles/X.py …``: the locustfile exists and every option is Locust's or
    one of the load options (current spellings)."""
    assert words[0] == "locust"
    opts = locust_options()
    problems: list[str] = []
    j = 1
    while j < len(words):
        word = words[j]
        flag = flag_of_word(word)
        if flag is None:
            j += 1
            continue
        if flag not in opts:
            problems.append(f"locust: no option {flag} (Locust's or `harness load replay --help`'s)")
            j += 1
            continue
        if flag in ("-f", "--locustfile") and "=" not in word and j + 1 < len(words):
            file = words[j + 1]
            if file.startswith("locustfiles/") and not (ROOT / file).is_file():
                problems.append(f"locust: no locustfile {file}")
        j += 1 if not opts[flag] or "=" in word else 2
    return problems


@dataclass(frozen=True)
class CommandLine:
    file: Path
    line: int
    words: list[str]

    def __str__(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}: {' '.join(self.words)}"


SHELL_INFOS = ("", "bash", "sh", "shell", "console", "yaml", "yml")
"""Code blocks whose ``harness``/``locust`` lines are commands (a YAML block holds a CI job's
``run:`` lines)."""


def command_lines(path: Path) -> Iterator[CommandLine]:
    """Every ``harness …`` / ``locust …`` command in ``path``'s fenced code blocks, and in its
    indented (four-space) code lines."""
    text = path.read_text(encoding="utf-8")
    for start, info, body in code_blocks(text):
        if info.split()[0:1] and info.split()[0] not in SHELL_INFOS:
            continue
        # A YAML step's `run: harness …` or `- run: |` lines: the command after "run:".
        cleaned = [re.sub(r"^\s*(?:-\s*)?run:\s*\|?\s*", "", line) for line in body]
        for offset, words in shell_commands(cleaned):
            cmd = command_words(words)
            if cmd is not None:
                yield CommandLine(path, start + offset, cmd)
    indented = [(n, line[4:]) for n, line in prose_lines(text) if line.startswith("    ") and line.strip()]
    for number, line in indented:
        for _, words in shell_commands([line]):
            cmd = command_words(words)
            if cmd is not None and len(cmd) > 1:
                yield CommandLine(path, number, cmd)


def problems_of(cmd: CommandLine) -> list[str]:
    if cmd.words[0] == "harness":
        return check_harness(cmd.words)[1]
    return check_locust(cmd.words)
