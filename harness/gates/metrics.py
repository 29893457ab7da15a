"""What a gate can measure: a registry of metrics, each computed from a run's records with an interval.

A :class:`Metric` says how to get one number from a :class:`~harness.gates.runs.RunFrame` (already
narrowed to a scenario or stage), with the interval that number is known to at a confidence (a
:class:`~harness.gates.measurement.Measurement`), its unit and which way is good. Baselines name
metrics; ``harness baseline metrics`` lists them. Every metric is registered in :data:`METRICS` when
this module is imported, so the registry is complete wherever it is imported from here.

The kinds of metric (:attr:`Metric.kind`), each with its own interval (the percentile, pooled and
ratio statistics, the rates' interval and the widening of client-timed latencies by the client's own
jitter are :mod:`harness.gates.measurement`'s):

- **percentiles** (``tpot_p95`` …): the nearest-rank percentile of every record that has the field,
  with its order-statistic interval;
- **rates** (``error_rate``, ``hit_rate_*``, ``warm_rate``): ``k`` of ``n`` requests, with the exact
  binomial interval;
- **pooled percentiles** (``itl_p95`` …): one percentile of every inter-token gap of every request,
  its interval resampling whole requests;
- **relative** (``*_p95_rel``, ``warm_gain_ttft_p95``): a percentile over the same percentile of the
  result set labelled ``reference``;
- **maxima** (``prefill_peak_bytes_max``): the largest value seen; a run's own peak has no sampling
  interval, so its interval is the point;
- **agent sessions** (``session_makespan_p95``, ``session_success_rate``): a percentile and a rate as
  above, over sessions instead of requests: each session is one sample, its outcome
  (:func:`harness.load.session_summary.session_outcomes`) held on one row of the frame
  (:data:`~harness.gates.runs.SESSION_COLUMNS`);
- **server counters** (``server_prefix_hit_rate``): the target's own counters over the phase, from
  ``summary.json``'s ``server_metrics`` (:mod:`harness.load.server_metrics`). The server counted every
  token, so there is no sampling interval either: the interval is the point, ``n`` the tokens
  counted. Server-wide: a gate by stage takes that phase's deltas; one by scenario cannot be judged.

:func:`format_value` and :func:`format_interval` write a value and an interval in their unit for
tables and messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from harness.common.registry import Registry
from harness.gates.measurement import (
    Counts,
    Measurement,
    MetricContext,
    Samples,
    _nonfinite_problem,
    field_samples,
    kv_measured,
    min_samples_for_bound,
    percentile_metric,
    pooled_metric,
    rate_interval,
    relative_confidence,
    relative_metric,
)
from harness.gates.pooled import POOLED_MIN_REQUESTS
from harness.gates.runs import FloatArray, RunFrame
from harness.load.results import cache_counts, prefix_counts, warm_counts

Direction = Literal["at_most", "at_least"]
"""``at_most``: the measured value must not exceed the limit (latency, bytes, error rate);
``at_least``: it must not fall below it (hit rate, warm rate)."""
Unit = Literal["ms", "bytes", "bytes/token", "ratio", "x", "tokens"]
"""``ratio``: a share 0–1 (rates); ``x``: a dimensionless factor, any size (the ``*_rel`` metrics)."""


@dataclass(frozen=True)
class Metric:
    """How to compute one gateable number from a run's records."""

    name: str
    unit: Unit
    direction: Direction
    """The natural direction: which side of the threshold is good."""
    description: str
    compute: Callable[[RunFrame, MetricContext], Measurement]
    kind: Literal["percentile", "rate", "max", "relative", "counter", "pooled"]
    q: float | None = None
    """The percentile, for percentile metrics."""
    default_phase: str | None = None
    """The result-set label the metric belongs to when a gate names none (``cold``, ``warm``)."""
    measured_option: bool = False
    """Whether gates on it take ``require_measured`` (the prefill peak)."""
    abs_tolerance_floor: float = 0.0
    """The smallest absolute tolerance ``harness baseline update`` writes (guards near-zero values)."""
    samples: Samples | None = None
    """Percentile metrics: the samples ranked (``harness baseline update`` sizes its margins on them)."""
    counts: Counts | None = None
    """Rate metrics: ``(k, n)``."""
    errors_complement: bool = False
    """An ``at_least`` rate that is one minus an error rate (``session_success_rate``): a written
    baseline declares its limit as ``error_rate``'s, mirrored (:class:`~harness.gates.policy.GatePolicy`)."""
    counted: str | None = None
    """Rate metrics: what ``k`` counts, in verdicts (default: ``errors`` at most, ``hits`` at least)."""
    per: str = "requests"
    """What one sample is, in the notes a baseline update writes (``sessions`` for session metrics)."""
    speed_dependent: bool = False
    """Whether the value depends on how fast the machine is (absolute latencies: a baseline from
    other hardware cannot judge it); rates, bytes and the ``*_rel`` ratios travel between machines."""
    column: str | None = None
    """Percentile metrics of one record field: that field (``tpot_p95`` → ``tpot_ms``); ``None`` for
    derived samples. ``--until-precision`` watches it (:func:`~harness.gates.baseline.precision_targets`)."""
    client_timed: bool = False
    """Percentile metrics of latencies the client timed: the interval is widened by the client's own
    lateness at the same quantile (:func:`~harness.gates.measurement.client_jitter`). Set with the same
    flag on :func:`~harness.gates.measurement.percentile_metric`."""

    def default_min_samples(self, confidence: float) -> int:
        """The fewest samples with which this metric can ever pass at ``confidence``."""
        if self.kind == "percentile" and self.q is not None:
            return min_samples_for_bound(self.q, confidence)
        if self.kind == "relative" and self.q is not None:
            return min_samples_for_bound(self.q, relative_confidence(confidence))
        if self.kind == "rate":
            return 30
        if self.kind == "pooled":
            return POOLED_MIN_REQUESTS
        return 1


METRICS: Registry[Metric] = Registry("gate metric")


def _register(metric: Metric) -> Metric:
    METRICS.register(metric.name)(metric)
    return metric


def _kv_per_token_samples(frame: RunFrame) -> tuple[FloatArray, tuple[str, ...]]:
    kv, tokens = frame.col("prefill_kv_bytes"), frame.col("prompt_tokens")
    # Only requests that ran a prefill: a response-cache hit reports 0 KV bytes and would pull the
    # percentile down without saying anything about prefill memory.
    ran = (kv > 0) & ~np.isnan(tokens)
    bad_rows = frame.bad("prefill_kv_bytes") | frame.bad("prompt_tokens") | (ran & (tokens <= 0))
    keep = ran & ~bad_rows
    problems = _nonfinite_problem("prefill_kv_bytes / prompt_tokens", int(bad_rows.sum()), int(ran.sum()))
    return kv[keep] / tokens[keep], problems


def _peak_max(frame: RunFrame, ctx: MetricContext) -> Measurement:
    peak = frame.col("prefill_peak_bytes")
    bad = frame.bad("prefill_peak_bytes")
    # A response-cache hit reports a 0-byte, unmeasured peak: no prefill ran, nothing to measure.
    ran = (peak > 0) & ~bad
    problems = list(_nonfinite_problem("prefill_peak_bytes", int(bad.sum()), int(ran.sum() + bad.sum())))
    if ctx.require_measured:
        estimated = int((ran & (frame.peak_measured != 1)).sum())
        if estimated:
            problems.append(
                f"{estimated} of {int(ran.sum())} prefill peaks were estimated, not measured "
                "(peak_measured: false; measured peaks need CUDA), and the baseline requires measured ones"
            )
    if not ran.any():
        return Measurement(math.nan, math.nan, math.nan, 0, tuple(problems))
    value = float(peak[ran].max())
    return Measurement(value, value, value, int(ran.sum()), tuple(problems))


def _rate(hit: Counts) -> Callable[[RunFrame, MetricContext], Measurement]:
    def compute(frame: RunFrame, ctx: MetricContext) -> Measurement:
        k, n = hit(frame)
        if n == 0:
            return Measurement(math.nan, math.nan, math.nan, 0)
        lo, hi = rate_interval(k, n, ctx.confidence)
        return Measurement(k / n, lo, hi, n)

    return compute


def _server_prefix_hit_rate(frame: RunFrame, ctx: MetricContext) -> Measurement:
    """``prefix_hits / prefix_queries`` of the server's own counters over the frame's phase."""
    nan = math.nan
    if frame.server is None:
        why = "the run has no server metrics (summary.json: server_metrics; --server-metrics-interval 0?)"
        return Measurement(nan, nan, nan, 0, (why,))
    if frame.server_scenario is not None:
        why = f"the server's counters are not split by scenario (asked for {frame.server_scenario!r})"
        return Measurement(nan, nan, nan, 0, (why,))
    phase = frame.server.phase(frame.server_stage)
    if phase is None:
        return Measurement(nan, nan, nan, 0, (f"no server metrics for stage {frame.server_stage!r}",))
    if phase.prefix_queries is None or phase.prefix_hits is None:
        kind = frame.server.kind or "unknown"
        why = f"the target ({kind}) reports no prefix-cache counters" + (
            f" ({frame.server.error})" if frame.server.error else ""
        )
        return Measurement(nan, nan, nan, 0, (why,))
    if phase.prefix_queries <= 0:
        return Measurement(nan, nan, nan, 0)
    rate = phase.prefix_hits / phase.prefix_queries
    return Measurement(rate, rate, rate, int(phase.prefix_queries))


def _errors(frame: RunFrame) -> tuple[int, int]:
    return int((~frame.ok).sum()), frame.n


def _sessions_ok(frame: RunFrame) -> tuple[int, int]:
    """Agent sessions whose every call succeeded, of the sessions (one row each: ``session_ok``)."""
    ok = frame.col("session_ok")
    told = ~np.isnan(ok)
    return int((ok[told] == 1.0).sum()), int(told.sum())


def _cache_share(tier: str | None) -> Counts:
    """Share of requests answered by ``tier`` (``None``: any ``HIT-*``), among those that carried an
    ``x-cache`` header, failed requests counted as misses: :func:`harness.load.results.cache_counts`,
    as ``summary.json``'s ``hit_rate``."""

    def count(frame: RunFrame) -> tuple[int, int]:
        return cache_counts(frame.text["cache"], tier, frame.ok)

    return count


def _prefix_share(frame: RunFrame) -> tuple[int, int]:
    return prefix_counts(frame.col("cached_tokens"), frame.ok)


def _warm_share(frame: RunFrame) -> tuple[int, int]:
    """Requests served warm: :func:`harness.load.results.warm_counts`."""
    return warm_counts(frame.text["cache"], frame.col("cached_tokens"), frame.ok)


# ------------------------------------------------------------------------------------ the registry

_PERCENTILE_FIELDS: tuple[tuple[str, str, tuple[int, ...], str], ...] = (
    ("ttft", "ttft_ms", (50, 90, 95, 99), "time to first token, from send"),
    ("ttft_from_intended", "ttft_from_intended_ms", (50, 90, 95, 99), "time to first token, from intended"),
    ("tpot", "tpot_ms", (50, 90, 95, 99), "time per output token (decode latency)"),
    ("e2e", "e2e_ms", (50, 95, 99), "end-to-end latency, from send"),
    ("e2e_from_intended", "e2e_from_intended_ms", (95, 99), "end-to-end latency, from intended send"),
    ("lateness", "lateness_ms", (99,), "how late the client sent requests (client health)"),
)
for _short, _column, _qs, _what in _PERCENTILE_FIELDS:
    for _q in _qs:
        _register(
            Metric(
                name=f"{_short}_p{_q}",
                unit="ms",
                direction="at_most",
                description=f"P{_q} {_what} ({_column})",
                compute=percentile_metric(field_samples(_column), _q, client_timed=_short != "lateness"),
                samples=field_samples(_column),
                kind="percentile",
                q=_q,
                column=_column,
                # Sub-millisecond client lateness is jitter; 10 % of 0.3 ms would gate on noise.
                abs_tolerance_floor=1.0 if _short == "lateness" else 0.0,
                speed_dependent=True,
                client_timed=_short != "lateness",  # the lateness is the jitter itself
            )
        )

for _q in (50, 95, 99):
    _register(
        Metric(
            name=f"itl_p{_q}",
            unit="ms",
            direction="at_most",
            description=f"P{_q} inter-token latency, every gap of every request pooled (itl_ms), its "
            "interval resampling whole requests",
            compute=pooled_metric(_q),
            kind="pooled",
            q=_q,
            speed_dependent=True,
            column="itl_ms",
            client_timed=True,  # timed by the client: a slower target moves it (its interval is not widened)
        )
    )
_register(
    Metric(
        name="prefill_kv_bytes_per_token_p95",
        unit="bytes/token",
        direction="at_most",
        description="P95 of prefill_kv_bytes / prompt_tokens over requests that ran a prefill",
        compute=kv_measured(_kv_per_token_samples),
        samples=_kv_per_token_samples,
        kind="percentile",
        q=95,
        measured_option=True,
    )
)
for _q, _what in (
    (50, "median prefill_kv_bytes per request, every request counted (a response-cache hit wrote none: 0); "
     "harness ab compares it request by request (the same prompt on both arms)"),
    (95, "P95 of prefill_kv_bytes per request, every request counted (a response-cache hit wrote none: 0): "
     "the prefill memory a run's traffic costs"),
):  # fmt: skip
    _register(
        Metric(
            name=f"prefill_kv_bytes_p{_q}",
            unit="bytes",
            direction="at_most",
            description=_what,
            compute=kv_measured(field_samples("prefill_kv_bytes"), _q),
            samples=field_samples("prefill_kv_bytes"),
            kind="percentile",
            q=_q,
            column="prefill_kv_bytes",
            measured_option=True,
        )
    )
_register(
    Metric(
        name="prefill_peak_bytes_max",
        unit="bytes",
        direction="at_most",
        description="largest prefill peak memory (prefill_peak_bytes); measured peaks required unless "
        "require_measured: false",
        compute=_peak_max,
        kind="max",
        measured_option=True,
    )
)
_register(
    Metric(
        name="error_rate",
        unit="ratio",
        direction="at_most",
        description="share of requests that failed (HTTP status not 2xx, or no response)",
        compute=_rate(_errors),
        counts=_errors,
        kind="rate",
        abs_tolerance_floor=0.01,
    )
)
for _tier, _status, _what in (
    ("any", None, "any response-cache tier (x-cache HIT-*)"),
    ("l1", "HIT-L1", "the L1 response cache (x-cache HIT-L1)"),
    ("l2", "HIT-L2", "the L2 response cache (x-cache HIT-L2)"),
    ("l3", "HIT-L3", "the L3 semantic cache (x-cache HIT-L3)"),
):
    _register(
        Metric(
            name=f"hit_rate_{_tier}",
            unit="ratio",
            direction="at_least",
            description=f"share of requests answered by {_what}, among those with an x-cache header",
            compute=_rate(_cache_share(_status)),
            counts=_cache_share(_status),
            kind="rate",
        )
    )
_register(
    Metric(
        name="hit_rate_prefix",
        unit="ratio",
        direction="at_least",
        description="share of requests with prefix-cache hits (cached_tokens > 0), "
        "among those reporting usage",
        compute=_rate(_prefix_share),
        counts=_prefix_share,
        kind="rate",
    )
)
_register(
    Metric(
        name="cold_start_p99",
        unit="ms",
        direction="at_most",
        description="P99 cold-start latency: ttft_from_intended_ms of the cold phase (seed: ≤ 850 ms)",
        compute=percentile_metric(field_samples("ttft_from_intended_ms"), 99, client_timed=True),
        samples=field_samples("ttft_from_intended_ms"),
        kind="percentile",
        q=99,
        default_phase="cold",
        speed_dependent=True,
        column="ttft_from_intended_ms",
        client_timed=True,
    )
)
for _short, _column, _what in (
    ("ttft", "ttft_ms", "time to first token"),
    ("tpot", "tpot_ms", "time per output token (decode latency)"),
    ("e2e", "e2e_ms", "end-to-end latency"),
):
    _register(
        Metric(
            name=f"{_short}_p95_rel",
            unit="x",
            direction="at_most",
            description=f"P95 {_what} over the same P95 of the result set labelled 'reference' "
            "(an unloaded run on the same machine): a latency gate that travels between machines",
            compute=relative_metric(field_samples(_column), 95),
            samples=field_samples(_column),
            kind="relative",
            q=95,
        )
    )


def _gain(
    relative: Callable[[RunFrame, MetricContext], Measurement],
) -> Callable[[RunFrame, MetricContext], Measurement]:
    """``1 − ratio`` of a ``*_rel`` metric, its interval turned over with it."""

    def compute(frame: RunFrame, ctx: MetricContext) -> Measurement:
        m = relative(frame, ctx)
        return replace(m, value=1.0 - m.value, lo=1.0 - m.hi, hi=1.0 - m.lo)

    return compute


_register(
    Metric(
        name="warm_gain_ttft_p95",
        unit="ratio",
        direction="at_least",
        description="the warmup's realized cut in P95 TTFT: 1 − P95(phase) / P95(the set labelled "
        "'reference', the cold pass): harness analysis effect's planned pass against its cold pass "
        "(seed: ≥ 41 %)",
        compute=_gain(relative_metric(field_samples("ttft_ms"), 95)),
        samples=field_samples("ttft_ms"),
        kind="relative",
        q=95,
        default_phase="planned",
    )
)
_register(
    Metric(
        name="warm_rate",
        unit="ratio",
        direction="at_least",
        description="share of warm-phase requests served warm (a response-cache or prefix-cache hit; "
        "seed: ≥ 92 %)",
        compute=_rate(_warm_share),
        counts=_warm_share,
        kind="rate",
        default_phase="warm",
    )
)
_register(
    Metric(
        name="server_prefix_hit_rate",
        unit="ratio",
        direction="at_least",
        description="the target's own prefix hit rate: prompt tokens its prefix cache served over tokens "
        "looked up, from its /metrics counters over the phase (summary.json: server_metrics); for "
        "targets that report no cached_tokens",
        compute=_server_prefix_hit_rate,
        kind="counter",
    )
)

_register(
    Metric(
        name="ttfa_p95",
        unit="ms",
        direction="at_most",
        description="P95 time to first answer token from send (ttfa_ms): the first content, refusal or "
        "tool-call token, after the thinking (ttft_ms counts thinking tokens too)",
        compute=percentile_metric(field_samples("ttfa_ms"), 95, client_timed=True),
        samples=field_samples("ttfa_ms"),
        kind="percentile",
        q=95,
        column="ttfa_ms",
        speed_dependent=True,
        client_timed=True,
    )
)
_register(
    Metric(
        name="reasoning_tokens_p50",
        unit="tokens",
        direction="at_most",
        description="P50 thinking tokens per response (reasoning_tokens: the target's usage count, else "
        "the client's): a model that thinks longer answers later and costs more",
        compute=percentile_metric(field_samples("reasoning_tokens"), 50),
        samples=field_samples("reasoning_tokens"),
        kind="percentile",
        q=50,
        column="reasoning_tokens",
        abs_tolerance_floor=1.0,
    )
)

_register(
    Metric(
        name="session_makespan_p95",
        unit="ms",
        direction="at_most",
        description="P95 agent-session makespan: from a session's start to the end of its last call, one "
        "sample per session replayed as its call graph (summary.json: agent_sessions)",
        compute=percentile_metric(field_samples("session_makespan_ms"), 95),
        samples=field_samples("session_makespan_ms"),
        kind="percentile",
        q=95,
        speed_dependent=True,
        per="sessions",
        # Not widened by the client's jitter: a makespan (seconds) holds the client's lateness of every
        # call on its longest chain, which one request's lateness quantile does not bound.
    )
)
_register(
    Metric(
        name="session_success_rate",
        unit="ratio",
        direction="at_least",
        description="share of agent sessions whose every call succeeded (a blocked call fails its session), "
        "exact binomial over sessions",
        compute=_rate(_sessions_ok),
        counts=_sessions_ok,
        counted="successful sessions",
        per="sessions",
        errors_complement=True,
        kind="rate",
        abs_tolerance_floor=0.01,  # as error_rate's: one point
    )
)


# --------------------------------------------------------------------------------------- formatting


def format_value(value: float | None, unit: str) -> str:
    """A value with its unit for tables and messages (``41.2 ms``, ``93.10 %``, ``12.0 MiB``)."""
    if value is None or math.isnan(value):
        return "—"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if unit == "ratio":
        return f"{value * 100:.2f} %"
    if unit == "bytes":
        return _bytes(value)
    if unit == "bytes/token":
        return f"{value:,.0f} B/token"
    if unit == "x":
        return f"{value:.3f}×"
    return f"{_num(value)} {unit}"


def _num(value: float) -> str:
    mag = abs(value)
    if mag >= 1000:
        return f"{value:,.0f}"
    if mag >= 100:
        return f"{value:.1f}"
    if mag >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _bytes(value: float) -> str:
    mag = abs(value)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if mag >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:,.0f} B"


def format_interval(lo: float | None, hi: float | None, unit: str) -> str:
    """``[lo, hi]`` in the value's unit; ``—`` when unknown."""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return "—"
    return f"[{format_value(lo, unit)}, {format_value(hi, unit)}]"
