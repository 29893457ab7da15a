"""Atomic file output and guarded input opening.

Outputs are written to a temporary file beside the target and renamed into place, so a crash or
Ctrl-C never leaves a half-written report, corpus or index behind: readers see the old file or the
new one. Inputs are checked before parsing so that a directory, an empty file or a binary file gets
a clear :class:`InputError` instead of a parser traceback.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from harness.common.errors import InputError


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
