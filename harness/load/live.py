"""The run's live view: recent records and per-window counts, while the run goes.

The web UI's "LLM load" tab (:mod:`harness.load.web`) reads its percentiles and hit rate; the ladder
(:mod:`harness.load.control`) reads its window counts to judge a stage. Records enter it as they are
recorded (local run, worker) or received from the workers (master).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from harness.common.headers import CACHE_STATUSES
from harness.common.stats import Distribution
from harness.load.results import LATENCY_FIELDS, RequestRecord

LIVE_WINDOW = 5000
"""Records the live view (web UI) keeps: the most recent ones."""
_TAB_ORDER = ("ttft_ms", "ttfa_ms", "tpot_ms", "itl_ms", "e2e_ms", "lateness_ms", "ttft_from_intended_ms")
LIVE_FIELDS: tuple[str, ...] = tuple(f for f in _TAB_ORDER if f in LATENCY_FIELDS)
"""The latency fields the live view keeps percentiles of, in the tab's order (record fields only: a
name the records do not have would silently show an empty row)."""


@dataclass
class Live:
    """What the web UI and the ladder need while the run goes: recent records and per-window counts."""

    recent: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=LIVE_WINDOW))
    outcomes: list[tuple[float, bool]] = field(default_factory=list)
    """``(intended_s, ok)`` of every completed request (the ladder's window statistics)."""
    cache: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    errors: int = 0

    def add(self, rec: RequestRecord) -> None:
        self.recent.append(rec)
        ok = rec.ok
        self.outcomes.append((rec.intended_s, ok))
        self.requests += 1
        self.errors += not ok
        if rec.cache:
            self.cache[rec.cache] += 1

    def window(self, start_s: float, end_s: float) -> tuple[int, int]:
        completed = failed = 0
        for t, ok in self.outcomes:
            if start_s <= t < end_s:
                completed += 1
                failed += not ok
        return completed, failed

    def distributions(self) -> dict[str, Distribution]:
        out: dict[str, Distribution] = {}
        for name in LIVE_FIELDS:  # itl_ms is a list per record: every gap is a sample
            values = [v for r in self.recent if (v := getattr(r, name)) is not None]
            out[name] = Distribution.of([x for v in values for x in v] if name == "itl_ms" else values)
        return out

    def hit_rate(self) -> dict[str, float]:
        told = sum(self.cache.values())
        return {s: self.cache[s] / told for s in CACHE_STATUSES} if told else {}
