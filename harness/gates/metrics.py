"""What a gate can measure: a registry of metrics, each computed from a run's records with an interval.

A :class:`Metric` says how to get one number from a :class:`~harness.gates.runs.RunFrame` (already
narrowed to a scenario or stage), the interval that number is known to at a confidence, its unit and
which way is good. Baselines name metrics; ``harness baseline metrics`` lists them.

Three kinds of statistic, each with its own interval:

- **percentiles** (``tpot_p95`` …): the project's one definition (nearest rank,
  :func:`~harness.common.stats.percentile`) with its distribution-free order-statistic interval
  (:func:`~harness.common.stats.percentile_interval`). Samples are every record that has the field,
  exactly as ``summary.json`` counts them, so the gate's P95 is the summary's P95;
- **rates** (``error_rate``, ``hit_rate_*``, ``warm_rate``): ``k`` of ``n`` requests, with the exact
  (Clopper–Pearson) binomial interval;
- **maxima** (``prefill_peak_bytes_max``): the largest value seen; a run's own peak has no sampling
  interval, so its interval is the point;
- **pooled percentiles** (``itl_p95``): one percentile of every inter-token gap of every request, with a
  percentile-bootstrap interval that resamples whole requests (:func:`cluster_percentile_interval`): the
  gaps of one request are correlated (one slow step delays them all), so resampling gaps would claim a
  precision the run does not have;
- **server counters** (``server_prefix_hit_rate``): the target's own counters over the phase, from
  ``summary.json``'s ``server_metrics`` (:mod:`harness.load.telemetry`). The server counted every
  token, so there is no sampling interval either: the interval is the point, ``n`` the tokens
  counted. Server-wide: a gate by stage takes that phase's deltas; one by scenario cannot be judged.

Samples that were NaN or infinite in the file make the metric unjudgeable (never dropped quietly).

**Client jitter.** A latency the client measures is late by however late the client itself woke (its
CPU, its scheduler): the send is late by the record's own lateness, and reading a token can be late
the same way. So a percentile metric of client-timed samples (:attr:`Metric.client_timed`: TTFT,
TPOT, E2E, their ``*_from_intended`` forms, the cold start; not the lateness itself, not bytes, not
rates) widens its interval by the client's own lateness (``lateness_ms − queue_wait_ms``, the queue
wait being the target's backpressure) at the same quantile over the same records
(:func:`client_jitter`): ``lo − jitter``, ``hi + jitter``, ``lo`` not below 0. A run on a jittery
client is then judged with the uncertainty it really has, instead of being refused outright or
passed on numbers it cannot vouch for; a regression larger than the jitter still fails. Records
without ``queue_wait_ms`` (files from before it) count all their lateness as the client's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

import numpy as np

from harness.common.registry import Registry
from harness.common.stats import percentile, percentile_interval
from harness.gates.pooled import POOLED_MIN_REQUESTS, cluster_percentile_interval
from harness.gates.runs import FloatArray, RunFrame
from harness.load.results import cache_counts, prefix_counts, warm_counts

Direction = Literal["at_most", "at_least"]
"""``at_most``: the measured value must not exceed the limit (latency, bytes, error rate);
``at_least``: it must not fall below it (hit rate, warm rate)."""
Unit = Literal["ms", "bytes", "bytes/token", "ratio", "x", "tokens"]
"""``ratio``: a share 0–1 (rates); ``x``: a dimensionless factor, any size (the ``*_rel`` metrics)."""

REFERENCE_LABEL = "reference"
"""The result set the ``*_rel`` metrics divide by (``harness gate … reference=DIR``)."""


@dataclass(frozen=True)
class Measurement:
    """One metric on one result set: the value, its interval and how many samples it rests on.

    ``lo``/``hi`` bound the value at the baseline's confidence; ``-inf``/``inf`` when the sample is
    too small to bound that side (P99 of 50 samples has no upper bound), NaN when there are no
    samples. ``problems`` say why the value cannot be judged at all.
    """

    value: float
    lo: float
    hi: float
    n: int
    problems: tuple[str, ...] = ()
    jitter: float = 0.0
    """The client's own lateness (ms) at the metric's quantile, by which ``lo``/``hi`` were widened
    (0: not widened; see the module docstring)."""


@dataclass(frozen=True)
class MetricContext:
    """What a gate asks of a metric besides the records."""

    confidence: float = 0.95
    require_measured: bool = True
    reference: RunFrame | None = None
    """The records of the result set labelled ``reference`` (the ``*_rel`` metrics); ``None``: none given."""


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
    speed_dependent: bool = False
    """Whether the value depends on how fast the machine is (absolute latencies: a baseline from
    other hardware cannot judge it); rates, bytes and the ``*_rel`` ratios travel between machines."""
    column: str | None = None
    """Percentile metrics of one record field: that field (``tpot_p95`` → ``tpot_ms``); ``None`` for
    derived samples. ``--until-precision`` watches it (:func:`precision_targets`)."""
    client_timed: bool = False
    """Percentile metrics of latencies the client timed: the interval is widened by the client's own
    lateness at the same quantile (:func:`client_jitter`). Set with the same flag on
    :func:`percentile_metric`."""

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


@lru_cache(maxsize=256)
def min_samples_for_bound(q: float, confidence: float) -> int:
    """Smallest ``n`` for which the ``q``-th percentile's interval has a finite upper bound.

    Below it the upper end is ``+inf`` (:func:`~harness.common.stats.percentile_interval`), so an
    ``at_most`` gate could never pass: P95 at 95 % needs 72 samples, P99 needs 368.
    """
    from scipy.stats import binom

    p, alpha = q / 100.0, 1.0 - confidence
    n = 1
    while int(binom.ppf(1 - alpha / 2, n, p)) + 1 > n:
        n += 1
    return n


def rate_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) two-sided ``confidence`` interval of a rate ``k / n``.

    It covers the true rate with probability at least ``confidence`` for every ``n`` (conservative,
    unlike the normal approximation, which fails near 0 and 1 where hit and error rates live).
    """
    from scipy.stats import beta

    if n <= 0:
        return (math.nan, math.nan)
    alpha = 1.0 - confidence
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return (lo, hi)


def relative_confidence(confidence: float) -> float:
    """The confidence of each of the two percentile intervals a ratio is built from: ``√c``, so that
    both hold at once with probability ≥ ``c`` (the two runs are independent)."""
    return math.sqrt(confidence)


def _nonfinite_problem(column: str, bad: int, n: int) -> tuple[str, ...]:
    if not bad:
        return ()
    return (f"{bad} of {n} {column} samples are NaN or infinite in the records",)


Samples = Callable[[RunFrame], tuple[FloatArray, tuple[str, ...]]]
"""The samples a percentile metric ranks, and why they cannot be judged (NaN in the file …)."""
Counts = Callable[[RunFrame], tuple[int, int]]
"""``(k, n)`` of a rate metric."""


def field_samples(column: str) -> Samples:
    """Every value of a record field (records without it do not count; NaN/inf in the file is a problem)."""

    def samples(frame: RunFrame) -> tuple[FloatArray, tuple[str, ...]]:
        values = frame.col(column)
        bad = frame.bad(column)
        # NaN in a column means "absent" unless the file said NaN (``bad``); ±inf is kept by the
        # mask below and flagged as a problem, never ranked.
        present = ~np.isnan(values) | bad
        return values[present & ~bad], _nonfinite_problem(column, int(bad.sum()), int(present.sum()))

    return samples


def kv_measured(samples: Samples, q: float = 95) -> Callable[[RunFrame, MetricContext], Measurement]:
    """A ``prefill_kv_bytes`` ``q``-th percentile that, where the baseline requires measured bytes,
    refuses a run whose target did not count them in its block manager (``prefill_kv_measured``): an
    older target's formula, or another server's."""
    compute = percentile_metric(samples, q)

    def judged(frame: RunFrame, ctx: MetricContext) -> Measurement:
        m = compute(frame, ctx)
        if not ctx.require_measured:
            return m
        counted = frame.kv_measured if frame.kv_measured is not None else np.full(frame.n, -1, dtype=np.int8)
        kv = frame.col("prefill_kv_bytes")
        unmeasured = int((~np.isnan(kv) & (counted != 1)).sum())
        if not unmeasured:
            return m
        why = (
            f"{unmeasured} prefill_kv_bytes were estimated, not measured (prefill_kv_measured: false: the "
            "target does not count its KV blocks), and the baseline requires measured ones"
        )
        return replace(m, problems=(*m.problems, why))

    return judged


def _kv_per_token_samples(frame: RunFrame) -> tuple[FloatArray, tuple[str, ...]]:
    kv, tokens = frame.col("prefill_kv_bytes"), frame.col("prompt_tokens")
    # Only requests that ran a prefill: a response-cache hit reports 0 KV bytes and would pull the
    # percentile down without saying anything about prefill memory.
    ran = (kv > 0) & ~np.isnan(tokens)
    bad_rows = frame.bad("prefill_kv_bytes") | frame.bad("prompt_tokens") | (ran & (tokens <= 0))
    keep = ran & ~bad_rows
    problems = _nonfinite_problem("prefill_kv_bytes / prompt_tokens", int(bad_rows.sum()), int(ran.sum()))
    return kv[keep] / tokens[keep], problems


def client_lateness(frame: RunFrame) -> FloatArray:
    """Each record's own client lateness, ms: ``lateness_ms − queue_wait_ms`` (≥ 0), all of the
    lateness where no queue wait was recorded (or a broken one: the conservative reading)."""
    late = frame.col("lateness_ms")
    wait = frame.col("queue_wait_ms")
    own: FloatArray = np.maximum(0.0, late - np.where(np.isfinite(wait), wait, 0.0))
    return own[~np.isnan(late)]


def client_jitter(frame: RunFrame, q: float) -> float:
    """The client's own lateness at quantile ``q`` over ``frame`` (0 when no record has one)."""
    own = client_lateness(frame)
    if own.size == 0:
        return 0.0
    return percentile(own, q)


def percentile_metric(
    samples: Samples, q: float, *, client_timed: bool = False
) -> Callable[[RunFrame, MetricContext], Measurement]:
    """The nearest-rank ``q``-th percentile of ``samples`` with its order-statistic interval, widened
    by :func:`client_jitter` when the samples are ``client_timed``."""

    def compute(frame: RunFrame, ctx: MetricContext) -> Measurement:
        values, problems = samples(frame)
        if values.size == 0:
            return Measurement(math.nan, math.nan, math.nan, 0, problems)
        lo, hi = percentile_interval(values, q, ctx.confidence)
        jitter = client_jitter(frame, q) if client_timed else 0.0
        if jitter > 0:
            lo, hi = min(lo, max(0.0, lo - jitter)), hi + jitter
        return Measurement(percentile(values, q), lo, hi, int(values.size), problems, jitter)

    return compute


def pooled_metric(q: float) -> Callable[[RunFrame, MetricContext], Measurement]:
    """The ``q``-th percentile of every inter-token gap pooled, its interval resampling whole requests;
    ``n`` is the number of requests the gaps came from (the unit the interval resamples)."""

    def compute(frame: RunFrame, ctx: MetricContext) -> Measurement:
        groups = [g for g in frame.gaps() if len(g)]
        if not groups:
            return Measurement(math.nan, math.nan, math.nan, 0)
        pooled = np.concatenate(groups)
        bad = int((~np.isfinite(pooled)).sum())
        if bad:
            return Measurement(
                math.nan, math.nan, math.nan, len(groups), _nonfinite_problem("itl_ms", bad, pooled.size)
            )
        lo, hi = cluster_percentile_interval(groups, q, ctx.confidence)
        return Measurement(percentile(pooled, q), lo, hi, len(groups))

    return compute


def relative_metric(samples: Samples, q: float) -> Callable[[RunFrame, MetricContext], Measurement]:
    """The phase's ``q``-th percentile divided by the reference set's, with a distribution-free interval.

    Each percentile gets its order-statistic interval at ``√c`` (:func:`relative_confidence`); the
    runs are independent, so both cover their true percentiles at once with probability ≥ ``c``, and
    then ``[lo_phase / hi_ref, hi_phase / lo_ref]`` covers the true ratio. Conservative, like the
    comparison of ``harness run`` (docs/ci.md).
    """

    def compute(frame: RunFrame, ctx: MetricContext) -> Measurement:
        values, problems = samples(frame)
        if ctx.reference is None:
            return Measurement(
                math.nan, math.nan, math.nan, int(values.size),
                (*problems, f"no result set labelled {REFERENCE_LABEL!r} (pass {REFERENCE_LABEL}=DIR: an "
                 "unloaded run or the lowest-rate probe of a capacity search, on the same machine)"),
            )  # fmt: skip
        ref, ref_problems = samples(ctx.reference)
        problems = (*problems, *(f"reference: {p}" for p in ref_problems))
        if values.size == 0 or ref.size == 0:
            why = ("the reference set has no samples of this metric",) if ref.size == 0 else ()
            return Measurement(math.nan, math.nan, math.nan, int(values.size), (*problems, *why))
        c = relative_confidence(ctx.confidence)
        lo_p, hi_p = percentile_interval(values, q, c)
        lo_r, hi_r = percentile_interval(ref, q, c)
        ref_value = percentile(ref, q)
        if not ref_value > 0:
            return Measurement(
                math.nan, math.nan, math.nan, int(values.size),
                (*problems, f"the reference's P{q:g} is {ref_value:g}: nothing to divide by"),
            )  # fmt: skip
        need = min_samples_for_bound(q, c)
        if ref.size < need:
            problems = (
                *problems,
                f"the reference has {ref.size} samples; a ratio of P{q:g}s needs ≥ {need} in it",
            )
        lo = max(0.0, lo_p) / hi_r if math.isfinite(hi_r) and hi_r > 0 else 0.0
        hi = hi_p / lo_r if lo_r > 0 and math.isfinite(lo_r) else math.inf
        return Measurement(percentile(values, q) / ref_value, lo, hi, int(values.size), problems)

    return compute


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
    ("ttft_from_intended", "ttft_from_intended_ms", (50, 95, 99), "time to first token, from intended send"),
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
