"""Trace ingestion: distributed traces and LLM request traces → normalized model, cold paths, scenarios.

Public API (stable; other stages import these names)::

    read_requests(path, *, format=None, skip_invalid=False) -> Iterator[RequestEvent]
    read_traces(path, *, format=None, skip_invalid=False) -> Iterator[Trace]
    detect_format(path) -> str
    load_scenarios(path) -> ScenarioSet
    load_schedule(path) -> list[ScheduleEntry]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.traces.api import (
        detect_format,
        formats,
        iter_schedule,
        load_scenarios,
        load_schedule,
        read_requests,
        read_traces,
    )
    from harness.traces.model import (
        ColdPathRecord,
        RequestEvent,
        ScenarioClass,
        ScenarioSet,
        ScheduleEntry,
        Span,
        SpanKind,
        Trace,
    )

_API = ("detect_format", "formats", "iter_schedule", "load_scenarios", "load_schedule", "read_requests",
        "read_traces")  # fmt: skip
_MODEL = ("ColdPathRecord", "RequestEvent", "ScenarioClass", "ScenarioSet", "ScheduleEntry", "Span",
          "SpanKind", "Trace")  # fmt: skip


def __getattr__(name: str) -> Any:
    # Imported on first use: the load stage's Locust processes need the model (a schedule's entries),
    # not the readers and their HTTP client (~0.15 s of every Locust start-up, every A/B block).
    module = "api" if name in _API else "model" if name in _MODEL else None
    if module is None:
        raise AttributeError(f"module 'harness.traces' has no attribute {name!r}")
    return getattr(importlib.import_module(f"harness.traces.{module}"), name)


__all__ = [
    "ColdPathRecord",
    "RequestEvent",
    "ScenarioClass",
    "ScenarioSet",
    "ScheduleEntry",
    "Span",
    "SpanKind",
    "Trace",
    "detect_format",
    "formats",
    "iter_schedule",
    "load_scenarios",
    "load_schedule",
    "read_requests",
    "read_traces",
]
