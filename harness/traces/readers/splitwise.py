"""SplitwiseSim request traces: CSV with request_id, request_type, application_id, arrival_timestamp
(seconds), batch_size, prompt_size, token_size."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from harness.common.errors import InputError
from harness.traces._base import READERS, OnSkip, Reader
from harness.traces.model import RequestEvent, TagValue
from harness.traces.readers._csv import float_cell, header_of, int_cell, iter_rows

COLUMNS = ("arrival_timestamp", "prompt_size", "token_size")


def sniff(path: Path, head: bytes) -> bool:
    cols = header_of(head)
    return all(c in cols for c in COLUMNS)


def read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[RequestEvent]:
    origin: float | None = None
    source = f"splitwise:{path}"
    for row, cells in iter_rows(path, COLUMNS, skip, on_skip):
        try:
            ts = float_cell(path, row, cells, "arrival_timestamp")
            inp = int_cell(path, row, cells, "prompt_size")
            out = int_cell(path, row, cells, "token_size")
            if origin is None:
                origin = ts
            if ts < origin:
                raise InputError(
                    "arrival is before the first row's (expected rows in arrival order)",
                    file=path,
                    line=row,
                    field="arrival_timestamp",
                )
        except InputError as err:
            if not skip:
                raise
            on_skip(err)
            continue
        tags: dict[str, TagValue] = {}
        for col in ("request_id", "request_type", "batch_size"):
            if cells.get(col):
                tags[col] = cells[col]
        yield RequestEvent(
            arrival_s=ts - origin,
            input_tokens=inp,
            output_tokens=out,
            tenant=cells.get("application_id") or None,
            tags=tags,
            source=source,
            line=row,
        )


READERS.register("splitwise")(
    Reader(
        "splitwise",
        "requests",
        "SplitwiseSim CSV (arrival_timestamp, prompt_size, token_size)",
        sniff,
        read,
        20,
    )
)
