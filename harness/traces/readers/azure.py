"""Azure LLM inference traces (2023 and 2024 releases): CSV with TIMESTAMP, ContextTokens, GeneratedTokens.

The 2023 files write ``2023-11-16 18:17:03.9799600`` (7 fractional digits, no zone), the 2024 week
files add a zone offset (``2024-05-10 00:00:00.0093526+00:00``). Both are parsed by hand because
:meth:`datetime.fromisoformat` in Python 3.11 rejects 7 fractional digits. Times without a zone are
taken as UTC; only differences matter for arrival offsets.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from harness.common.errors import InputError
from harness.traces._base import READERS, OnSkip, Reader
from harness.traces.model import RequestEvent
from harness.traces.readers._csv import header_of, int_cell, iter_rows

COLUMNS = ("timestamp", "contexttokens", "generatedtokens")

_TS = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?$"
)


@functools.lru_cache(maxsize=4096)
def _minute(y: str, mo: str, d: str, h: str, mi: str) -> int:
    """Epoch seconds of a UTC minute; cached because consecutive rows share their minute."""
    return int(datetime(int(y), int(mo), int(d), int(h), int(mi), tzinfo=UTC).timestamp())


def parse_timestamp(text: str) -> int:
    """Nanoseconds since the epoch for an Azure TIMESTAMP cell; ``ValueError`` if it is not one.

    Integer nanoseconds because float seconds near 1.7e9 cannot hold the files' 100 ns resolution.
    """
    m = _TS.match(text.strip())
    if m is None:
        raise ValueError(text)
    y, mo, d, h, mi, s, frac, zone = m.groups()
    base = (_minute(y, mo, d, h, mi) + int(s)) * 10**9
    if frac:
        base += int(frac.ljust(9, "0"))
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        base -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60) * 10**9
    return base


def sniff(path: Path, head: bytes) -> bool:
    cols = header_of(head)
    return all(c in cols for c in COLUMNS)


def read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[RequestEvent]:
    origin: int | None = None
    source = f"azure:{path}"
    for row, cells in iter_rows(path, COLUMNS, skip, on_skip):
        try:
            try:
                ts = parse_timestamp(cells["timestamp"])
            except ValueError:
                raise InputError(
                    f"expected a time like 2023-11-16 18:17:03.9799600, got {cells['timestamp']!r}",
                    file=path,
                    line=row,
                    field="TIMESTAMP",
                ) from None
            inp = int_cell(path, row, cells, "contexttokens")
            out = int_cell(path, row, cells, "generatedtokens")
            if origin is None:
                origin = ts
            if ts < origin:
                raise InputError(
                    "time is before the first row's (expected rows in arrival order)",
                    file=path,
                    line=row,
                    field="TIMESTAMP",
                )
        except InputError as err:
            if not skip:
                raise
            on_skip(err)
            continue
        yield RequestEvent(
            arrival_s=(ts - origin) / 1e9, input_tokens=inp, output_tokens=out, source=source, line=row
        )


READERS.register("azure")(
    Reader(
        "azure",
        "requests",
        "Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens)",
        sniff,
        read,
        20,
    )
)
