"""BurstGPT request traces: CSV with Timestamp (s from the first day's midnight), Model, Request tokens,
Response tokens, Total tokens, Log Type and, in newer releases, Session ID and Elapsed time.

Per the BurstGPT README, ``Response tokens`` of 0 marks a failed request; such rows are kept with
``failed=True`` so that callers decide (the schedule command drops them unless told otherwise).
"""

from __future__ import annotations

import contextlib
from typing import Any

from harness.traces.model import TagValue
from harness.traces.readers._csv import Cells, CsvRequests, register_csv


def _extras(cells: Cells, output_tokens: int) -> dict[str, Any]:
    tags: dict[str, TagValue] = {}
    if cells.get("model"):
        tags["gen_ai.request.model"] = cells["model"]
    if cells.get("session id"):
        tags["session.id"] = cells["session id"]
    if cells.get("elapsed time"):
        with contextlib.suppress(ValueError):
            tags["elapsed_s"] = float(cells["elapsed time"])
    return {"operation": cells.get("log type") or None, "tags": tags, "failed": output_tokens == 0}


FORMAT = register_csv(
    CsvRequests(
        "burstgpt",
        "BurstGPT CSV (Timestamp, Request tokens, Response tokens)",
        time="timestamp",
        input="request tokens",
        output="response tokens",
        time_field="Timestamp",
        extras=_extras,
    )
)
