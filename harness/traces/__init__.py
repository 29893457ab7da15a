"""Trace ingestion: distributed traces and LLM request traces → normalized model, cold paths, scenarios.

Public API (stable; other stages import these names)::

    read_requests(path, *, format=None, skip_invalid=False) -> Iterator[RequestEvent]
    read_traces(path, *, format=None, skip_invalid=False) -> Iterator[Trace]
    detect_format(path) -> str
    load_scenarios(path) -> ScenarioSet
    load_schedule(path) -> list[ScheduleEntry]
"""

from __future__ import annotations

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
