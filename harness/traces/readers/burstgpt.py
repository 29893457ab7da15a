"""BurstGPT request traces: CSV with Timestamp (s from the first day's midnight), Model, Request tokens,
Response tokens, Total tokens, Log Type and, in newer releases, Session ID and Elapsed time.

Per the BurstGPT README, ``Response tokens`` of 0 marks a failed request; such rows are kept with
``failed=True`` so that callers decide (the schedule command drops them unless told otherwise).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from harness.common.errors import InputError
from harness.traces._base import READERS, OnSkip, Reader
from harness.traces.model import RequestEvent, TagValue
from harness.traces.readers._csv import float_cell, header_of, int_cell, iter_rows

COLUMNS = ("timestamp", "request tokens", "response tokens")


def sniff(path: Path, head: bytes) -> bool:
    cols = header_of(head)
    return all(c in cols for c in COLUMNS)


def read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[RequestEvent]:
    origin: float | None = None
    source = f"burstgpt:{path}"
    for row, cells in iter_rows(path, COLUMNS, skip, on_skip):
        try:
            ts = float_cell(path, row, cells, "timestamp")
            inp = int_cell(path, row, cells, "request tokens")
            out = int_cell(path, row, cells, "response tokens")
            if origin is None:
                origin = ts
            if ts < origin:
                raise InputError(
                    "timestamp is before the first row's (expected rows in arrival order)",
                    file=path,
                    line=row,
                    field="Timestamp",
                )
        except InputError as err:
            if not skip:
                raise
            on_skip(err)
            continue
        tags: dict[str, TagValue] = {}
        if cells.get("model"):
            tags["gen_ai.request.model"] = cells["model"]
        if cells.get("session id"):
            tags["session.id"] = cells["session id"]
        if cells.get("elapsed time"):
            with contextlib.suppress(ValueError):
                tags["elapsed_s"] = float(cells["elapsed time"])
        yield RequestEvent(
            arrival_s=ts - origin,
            input_tokens=inp,
            output_tokens=out,
            operation=cells.get("log type") or None,
            tags=tags,
            source=source,
            line=row,
            failed=out == 0,
        )


READERS.register("burstgpt")(
    Reader(
        "burstgpt", "requests", "BurstGPT CSV (Timestamp, Request tokens, Response tokens)", sniff, read, 20
    )
)
