"""The command line's rich consoles, made in one place.

Every command prints results on stdout (:func:`out`: tables, JSON, paths a script reads) and
progress, warnings and errors on stderr (:func:`err`), so ``harness … > result.json`` captures the
result alone. :func:`wide` is stdout at a minimum width: a table of many columns stays one row per
line where the terminal is narrow or absent (a CI log, a pipe), instead of folding every cell.
Rich consoles look up ``sys.stdout`` / ``sys.stderr`` when they print, so the shared instances
follow a redirection made later (pytest's capture included).
"""

from __future__ import annotations

from functools import cache

from rich.console import Console


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
