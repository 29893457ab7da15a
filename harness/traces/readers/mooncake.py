"""Mooncake request traces (FAST'25 / arXiv release): JSONL with ``timestamp`` (ms), token counts and
``hash_ids`` of 512-token prefix blocks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.common.errors import InputError
from harness.traces._base import READERS, OnSkip, Reader, first_line, iter_lines, pydantic_error
from harness.traces.model import RequestEvent

BLOCK_SIZE = 512
"""Tokens per hash block, per the Mooncake trace README."""


class MooncakeRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timestamp: float = Field(ge=0)
    input_length: int = Field(ge=0)
    output_length: int = Field(ge=0)
    hash_ids: list[int] = Field(default_factory=list)


EXPECTED = "a JSON object with timestamp, input_length, output_length, hash_ids"


def sniff(path: Path, head: bytes) -> bool:
    line = first_line(head)
    return line.startswith(b"{") and b'"input_length"' in line and b'"timestamp"' in line


def read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[RequestEvent]:
    origin: float | None = None
    source = f"mooncake:{path}"
    for n, text in iter_lines(path, skip, on_skip):
        if not text.strip():
            continue
        try:
            try:
                row = MooncakeRow.model_validate_json(text)
            except ValidationError as exc:
                raise pydantic_error(exc, path, n, EXPECTED) from None
            if origin is None:
                origin = row.timestamp
            if row.timestamp < origin:
                raise InputError(
                    f"timestamp {row.timestamp:g} is before the first row's {origin:g} "
                    "(expected rows in arrival order)",
                    file=path,
                    line=n,
                    field="timestamp",
                )
        except InputError as err:
            if not skip:
                raise
            on_skip(err)
            continue
        yield RequestEvent(
            arrival_s=(row.timestamp - origin) / 1000.0,
            input_tokens=row.input_length,
            output_tokens=row.output_length,
            prefix_block_ids=tuple(row.hash_ids),
            block_size=BLOCK_SIZE,
            source=source,
            line=n,
        )


READERS.register("mooncake")(
    Reader("mooncake", "requests", "Mooncake JSONL request trace (timestamp ms, hash_ids)", sniff, read, 10)
)
