"""Streaming JSON plumbing shared by the Jaeger and OTLP readers.

A file is either JSON Lines (every line one complete JSON value: checked on the first line, read
with ``orjson`` line by line) or one big document (read incrementally with ``ijson``, yielding the
items under a prefix such as ``data.item`` so that only one trace is in memory at a time).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ijson
import orjson

from harness.common.errors import InputError
from harness.traces._base import OnSkip, iter_lines

FIRST_LINE_LIMIT = 1 << 20


def is_json_lines(path: Path) -> bool:
    """True if the first non-blank line is a complete JSON object or array on its own."""
    with path.open("rb") as fh:
        while True:
            line = fh.readline(FIRST_LINE_LIMIT)
            if not line:
                return False
            if line.strip():
                break
        if not line.endswith(b"\n") and fh.read(1):
            return False  # a longer first line: treat as one big (minified) document
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict | list)


def iter_json_lines(path: Path, skip: bool, on_skip: OnSkip, expected: str) -> Iterator[tuple[int, Any]]:
    for n, text in iter_lines(path, skip, on_skip, blank=False):
        try:
            yield n, orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            err = InputError(f"invalid JSON ({exc.msg}), expected {expected}", file=path, line=n)
            if not skip:
                raise err from None
            on_skip(err)


def top_level_keys(path: Path, wanted: set[str], limit: int = 64) -> tuple[str, str | None]:
    """('array', None) for a top-level array, else ('object', first top-level key that is in ``wanted``).

    Stops at the first wanted key, so a huge ``data`` array is not read.
    """
    with path.open("rb") as fh:
        try:
            events = ijson.parse(fh, use_float=True)
            seen = 0
            for prefix, event, value in events:
                if prefix == "" and event == "start_array":
                    return "array", None
                if prefix == "" and event == "map_key":
                    if value in wanted:
                        return "object", str(value)
                    seen += 1
                    if seen > limit:
                        break
                if prefix == "" and event == "end_map":
                    break
                if prefix == "" and event not in ("start_map", "map_key", "end_map"):
                    return "scalar", None
        except ijson.JSONError as exc:
            raise InputError(f"invalid JSON ({_first_line(exc)})", file=path) from None
        except UnicodeDecodeError:
            raise InputError("invalid UTF-8, expected a UTF-8 JSON file", file=path) from None
    return "object", None


def iter_items(path: Path, prefix: str) -> Iterator[tuple[int, Any]]:
    """(index, value) for each value under ``prefix`` of one big JSON document, incrementally."""
    with path.open("rb") as fh:
        try:
            yield from enumerate(ijson.items(fh, prefix, use_float=True))
        except ijson.JSONError as exc:
            raise InputError(
                f"invalid JSON ({_first_line(exc)})", file=path, field=prefix.replace(".item", "[]")
            ) from None
        except UnicodeDecodeError:
            raise InputError("invalid UTF-8, expected a UTF-8 JSON file", file=path) from None


def _first_line(exc: Exception) -> str:
    """yajl's messages span several lines (with a caret drawing); keep the first."""
    return str(exc).strip().splitlines()[0].strip() if str(exc).strip() else type(exc).__name__


def to_int(value: object, what: str) -> int:
    """An integer from a JSON number, a numeric string or an RFC 3339 time (→ µs since the epoch)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"expected a number for {what}, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return int(float(text))
    except ValueError:
        pass
    try:
        stamp = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected a number or RFC 3339 time for {what}, got {text!r}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=_dt.UTC)
    delta = stamp - _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
