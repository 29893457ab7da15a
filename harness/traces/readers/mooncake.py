"""Mooncake request traces (FAST'25 / arXiv release): JSONL with ``timestamp`` (ms), token counts and
``hash_ids`` of 512-token prefix blocks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import Field

from harness.common.formats import Reader, first_line
from harness.common.io import parse_jsonl_line
from harness.common.model import StrictModel
from harness.traces._base import (
    REQUEST_READERS,
    ArrivalClock,
    OnSkip,
    convert_rows,
    iter_lines,
)
from harness.traces.model import RequestEvent

BLOCK_SIZE = 512
"""Tokens per hash block, per the Mooncake trace README."""


class MooncakeRow(StrictModel):
    timestamp: float = Field(ge=0)
    input_length: int = Field(ge=0)
    output_length: int = Field(ge=0)
    hash_ids: list[int] = Field(default_factory=list)


EXPECTED = "a JSON object with timestamp, input_length, output_length, hash_ids"


def sniff(path: Path, head: bytes) -> bool:
    line = first_line(head)
    return line.startswith(b"{") and b'"input_length"' in line and b'"timestamp"' in line


def read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[RequestEvent]:
    clock = ArrivalClock(path, "timestamp", per_second=1000.0)
    source = f"mooncake:{path}"

    def convert(n: int, text: str) -> tuple[MooncakeRow, float]:
        row = parse_jsonl_line(text, n, MooncakeRow, file=path, expected=EXPECTED)
        return row, clock.offset(n, row.timestamp)

    for n, (row, arrival_s) in convert_rows(
        iter_lines(path, skip, on_skip, blank=False), convert, skip, on_skip
    ):
        yield RequestEvent(
            arrival_s=arrival_s,
            input_tokens=row.input_length,
            output_tokens=row.output_length,
            prefix_block_ids=tuple(row.hash_ids),
            block_size=BLOCK_SIZE,
            source=source,
            line=n,
        )


REQUEST_READERS.register("mooncake")(
    Reader("mooncake", "Mooncake JSONL request trace (timestamp ms, hash_ids)", sniff, read, 10)
)
