"""SplitwiseSim request traces: CSV with request_id, request_type, application_id, arrival_timestamp
(seconds), batch_size, prompt_size, token_size."""

from __future__ import annotations

from typing import Any

from harness.traces.model import TagValue
from harness.traces.readers._csv import Cells, CsvRequests, register_csv


def _extras(cells: Cells, output_tokens: int) -> dict[str, Any]:
    tags: dict[str, TagValue] = {
        col: cells[col] for col in ("request_id", "request_type", "batch_size") if cells.get(col)
    }
    return {"tenant": cells.get("application_id") or None, "tags": tags}


FORMAT = register_csv(
    CsvRequests(
        "splitwise",
        "SplitwiseSim CSV (arrival_timestamp, prompt_size, token_size)",
        time="arrival_timestamp",
        input="prompt_size",
        output="token_size",
        time_field="arrival_timestamp",
        what="arrival",
        extras=_extras,
    )
)
