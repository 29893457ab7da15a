"""Arrival schedules for the load stage: replayed from a request trace or synthetic (Poisson / gamma).

A schedule is JSONL of :class:`ScheduleEntry` (intended send offsets from the run start). Replay
keeps the trace's inter-arrival gaps, divided by ``speedup``, after cutting a ``[start_s, end_s)``
window of source time and capping every idle gap at ``max_gap_s`` (so a trace with a night of
silence does not stall a run). Synthetic schedules draw inter-arrival times with a seeded NumPy
generator: exponential (Poisson process) or gamma with mean ``1/rate`` and coefficient of variation
``cv`` (burstier for ``cv > 1``); a scenario set, when given, labels each entry by class weight.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from harness.common.errors import ConfigError
from harness.traces.model import RequestEvent, ScenarioSet, ScheduleEntry


def from_requests(
    events: Iterable[RequestEvent],
    *,
    speedup: float = 1.0,
    start_s: float = 0.0,
    end_s: float | None = None,
    max_gap_s: float | None = None,
    include_failed: bool = False,
) -> Iterator[ScheduleEntry]:
    if speedup <= 0:
        raise ConfigError("speedup must be > 0")
    if max_gap_s is not None and max_gap_s < 0:
        raise ConfigError("max gap must be ≥ 0 s")
    offset = 0.0
    prev: float | None = None
    for ev in events:
        if ev.arrival_s < start_s or (ev.failed and not include_failed):
            continue
        if end_s is not None and ev.arrival_s >= end_s:
            break
        if prev is not None:
            gap = max(0.0, ev.arrival_s - prev)
            if max_gap_s is not None:
                gap = min(gap, max_gap_s)
            offset += gap / speedup
        prev = ev.arrival_s
        yield ScheduleEntry(
            offset_s=offset,
            input_tokens=ev.input_tokens,
            output_tokens=ev.output_tokens,
            prefix_block_ids=list(ev.prefix_block_ids),
            source_trace_id=ev.source_trace_id,
            tenant=ev.tenant,
        )


def synthetic(
    *,
    rate: float,
    process: str = "poisson",
    cv: float = 1.0,
    duration_s: float | None = None,
    count: int | None = None,
    seed: int = 0,
    scenarios: ScenarioSet | None = None,
) -> Iterator[ScheduleEntry]:
    import numpy as np

    if rate <= 0:
        raise ConfigError("rate must be > 0 requests/s")
    if duration_s is None and count is None:
        raise ConfigError("give a duration or a count for a synthetic schedule")
    if process not in ("poisson", "gamma"):
        raise ConfigError(f"unknown arrival process {process!r}; known: poisson, gamma")
    if process == "gamma" and cv <= 0:
        raise ConfigError("cv must be > 0 for a gamma process")
    rng = np.random.default_rng(seed)
    names: list[str] = []
    weights = None
    if scenarios is not None:
        names = [c.name for c in scenarios.classes]
        w = np.asarray([c.weight for c in scenarios.classes], dtype=float)
        weights = w / w.sum()
    t = 0.0
    n = 0
    while count is None or n < count:
        if process == "poisson":
            gap = rng.exponential(1.0 / rate)
        else:
            shape = 1.0 / (cv * cv)
            gap = rng.gamma(shape, 1.0 / (rate * shape))
        if n > 0:
            t += float(gap)
        if duration_s is not None and t >= duration_s:
            break
        scenario = names[int(rng.choice(len(names), p=weights))] if names else None
        yield ScheduleEntry(offset_s=t, scenario=scenario)
        n += 1
