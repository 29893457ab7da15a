"""Azure LLM inference traces (2023 and 2024 releases): CSV with TIMESTAMP, ContextTokens, GeneratedTokens.

The 2023 files write ``2023-11-16 18:17:03.9799600`` (7 fractional digits, no zone), the 2024 week
files add a zone offset (``2024-05-10 00:00:00.0093526+00:00``). Both are parsed by hand because
:meth:`datetime.fromisoformat` in Python 3.11 rejects 7 fractional digits. Times without a zone are
taken as UTC; only differences matter for arrival offsets.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from pathlib import Path

from harness.common.errors import InputError
from harness.traces.readers._csv import Cells, CsvRequests, register_csv

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


def _time(path: Path, row: int, cells: Cells) -> int:
    try:
        return parse_timestamp(cells["timestamp"])
    except ValueError:
        raise InputError(
            f"expected a time like 2023-11-16 18:17:03.9799600, got {cells['timestamp']!r}",
            file=path,
            line=row,
            field="TIMESTAMP",
        ) from None


FORMAT = register_csv(
    CsvRequests(
        "azure",
        "Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens)",
        time="timestamp",
        input="contexttokens",
        output="generatedtokens",
        time_field="TIMESTAMP",
        what="time",
        per_second=1e9,
        parse_time=_time,
    )
)
