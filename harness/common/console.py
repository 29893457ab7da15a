"""The command line's rich consoles, made in one place.

Every command prints results on stdout (:func:`out`: tables, JSON, paths a script reads) and
progress, warnings and errors on stderr (:func:`err`), so ``harness … > result.json`` captures the
result alone. :func:`wide` is stdout at a minimum width: a table of many columns stays one row per
line where the terminal is narrow or absent (a CI log, a pipe), instead of folding every cell.
Rich consoles look up ``sys.stdout`` / ``sys.stderr`` when they print, so the shared instances
follow a redirection made later (pytest's capture included). Result tables are built with
:func:`table` in the command-line and output modules, never in a stage's domain code.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from functools import cache
from typing import Any

from rich.console import Console, JustifyMethod
from rich.table import Table


@cache
def out() -> Console:
    """Results: stdout."""
    return Console()


@cache
def err() -> Console:
    """Progress, warnings and errors: stderr."""
    return Console(stderr=True)


def wide(min_width: int) -> Console:
    """Stdout at least ``min_width`` columns wide (as wide as the terminal where that is wider)."""
    return Console(width=max(out().width, min_width))


def table(
    title: str,
    columns: Iterable[str | tuple[str, JustifyMethod]],
    rows: Iterable[Sequence[str]] = (),
    *,
    left: Collection[str] | None = None,
    **options: Any,
) -> Table:
    """A rich table: ``title``, then ``columns`` and ``rows`` (cells as text, rich markup allowed).

    A column is left-justified when ``left`` is ``None`` (rich's default) or names it, right-justified
    otherwise (``left={"metric"}``: a name and its numbers); a ``(name, justify)`` column says its
    own. ``options`` go to :class:`rich.table.Table` (``title_justify``, ``caption`` …)."""
    t = Table(title=title, **options)
    for col in columns:
        name, justify = col if isinstance(col, tuple) else (col, _justify(col, left))
        t.add_column(name, justify=justify)
    for row in rows:
        t.add_row(*row)
    return t


def _justify(name: str, left: Collection[str] | None) -> JustifyMethod:
    return "left" if left is None or name in left else "right"
