"""Cold vs warm: what the caches changed, with an interval on every difference.

``harness run`` writes ``comparison.json`` (and prints it as a table,
:func:`harness.gates.output.comparison_table`): for each metric in :data:`COMPARED` the cold value,
the warm value, each with its interval, and the difference ``warm − cold`` with an interval.

Every number comes from the gates' metric registry (:data:`harness.gates.metrics.METRICS`): the
project's one percentile definition with its distribution-free order-statistic interval, exact
Clopper–Pearson intervals for rates, the observed maximum for maxima. The difference's interval is
built from the two phases' own intervals, each taken at confidence ``√c``: the phases are
independent samples, so both cover their true values at once with probability ``≥ √c · √c = c``,
and then ``[lo_warm − hi_cold, hi_warm − lo_cold]`` covers the true difference. It is
distribution-free and conservative (wider than a bootstrap would be, never narrower than the truth
allows); when it excludes 0 the change is real at confidence ``c`` (``better`` or ``worse``),
otherwise the run cannot tell (``no clear change``, or ``too few samples`` while a phase's interval
is still unbounded).
"""

from __future__ import annotations

import math

from harness.common.model import StrictModel
from harness.gates.measurement import Measurement, MetricContext
from harness.gates.metrics import METRICS
from harness.gates.runs import ResultSet

COMPARED: tuple[str, ...] = (
    "ttft_p95",
    "tpot_p95",
    "e2e_p95",
    "hit_rate_any",
    "hit_rate_prefix",
    "warm_rate",
    "prefill_kv_bytes_p95",
    "prefill_peak_bytes_max",
)
"""The metrics compared: P95 TTFT and TPOT (decode), E2E, hit rates, prefill memory."""


class Side(StrictModel):
    """One phase's value of one metric (``None``: no samples, or unbounded)."""

    value: float | None
    lo: float | None
    hi: float | None
    n: int


class Row(StrictModel):
    """One metric, cold and warm."""

    metric: str
    unit: str
    direction: str
    """Which way is better: ``at_most`` (lower) or ``at_least`` (higher)."""
    cold: Side
    warm: Side
    difference: Side
    """``warm − cold`` with its interval (``n`` is the smaller sample)."""
    relative: float | None
    """``warm / cold − 1`` (``None`` when cold is 0 or unknown)."""
    verdict: str
    """``better``, ``worse`` (the interval excludes 0 on that side), ``no clear change`` (it holds 0),
    ``too few samples`` (a phase's percentile has no bound on one side yet: a P95 needs 86
    requests a phase at the joint confidence), or ``unknown`` (no samples)."""


class Comparison(StrictModel):
    """``comparison.json``."""

    schema_version: int = 1
    confidence: float
    cold: str
    warm: str
    rows: list[Row]


def _fin(x: float) -> float | None:
    return None if math.isnan(x) or math.isinf(x) else x


def _side(m: Measurement) -> Side:
    return Side(value=_fin(m.value), lo=_fin(m.lo), hi=_fin(m.hi), n=m.n)


def compare(cold: ResultSet, warm: ResultSet, *, confidence: float = 0.95) -> Comparison:
    """Compare the two phases on every metric of :data:`COMPARED`."""
    shown = MetricContext(confidence=confidence, require_measured=False)
    joint = MetricContext(confidence=math.sqrt(confidence), require_measured=False)
    rows: list[Row] = []
    for name in COMPARED:
        metric = METRICS.get(name)
        c, w = metric.compute(cold.frame, shown), metric.compute(warm.frame, shown)
        cj, wj = metric.compute(cold.frame, joint), metric.compute(warm.frame, joint)
        diff = Measurement(w.value - c.value, wj.lo - cj.hi, wj.hi - cj.lo, min(c.n, w.n))
        known = c.n > 0 and w.n > 0 and c.value != 0 and not math.isnan(c.value)
        rel = w.value / c.value - 1 if known else None
        verdict = "unknown"
        if c.n and w.n and not (math.isnan(diff.lo) or math.isnan(diff.hi)):
            lower_is_better = metric.direction == "at_most"
            if diff.hi < 0:
                verdict = "better" if lower_is_better else "worse"
            elif diff.lo > 0:
                verdict = "worse" if lower_is_better else "better"
            elif math.isinf(diff.lo) or math.isinf(diff.hi):
                verdict = "too few samples"  # a phase's interval has no bound on one side
            else:
                verdict = "no clear change"
        rows.append(
            Row(
                metric=name,
                unit=metric.unit,
                direction=metric.direction,
                cold=_side(c),
                warm=_side(w),
                difference=_side(diff),
                relative=_fin(rel) if rel is not None else None,
                verdict=verdict,
            )
        )
    return Comparison(confidence=confidence, cold=str(cold.path), warm=str(warm.path), rows=rows)
