"""How a gate metric's number is measured: a :class:`Measurement` and the statistics it is computed with.

A :class:`Measurement` is one number from a :class:`~harness.gates.runs.RunFrame` (already narrowed to
a scenario or stage), the interval it is known to at a confidence, the samples it rests on and why it
cannot be judged, if it cannot; a :class:`MetricContext` is what a gate asks besides the records. The
registered metrics (:data:`harness.gates.metrics.METRICS`) are built from the statistics here, each
with its own interval:

- **percentiles** (:func:`percentile_metric` of :func:`field_samples`): the project's one definition
  (nearest rank, :func:`~harness.common.stats.percentile`) with its distribution-free order-statistic
  interval (:func:`~harness.common.stats.percentile_interval`; :func:`min_samples_for_bound`: the
  fewest samples with a finite upper bound). Samples are every record that has the field, exactly as
  ``summary.json`` counts them, so the gate's P95 is the summary's P95; :func:`kv_measured` also
  refuses estimated prefill KV bytes where measured ones are required;
- **rates**: ``k`` of ``n`` requests, with the exact (Clopper–Pearson) binomial interval
  (:func:`rate_interval`);
- **pooled percentiles** (:func:`pooled_metric`): one percentile of every inter-token gap of every
  request, with a percentile-bootstrap interval that resamples whole requests
  (:func:`~harness.gates.pooled.cluster_percentile_interval`): the gaps of one request are correlated
  (one slow step delays them all), so resampling gaps would claim a precision the run does not have;
- **ratios** (:func:`relative_metric`): a percentile over the same percentile of the result set
  labelled :data:`REFERENCE_LABEL`, each interval at ``√c`` (:func:`relative_confidence`) so that
  the ratio's interval holds at ``c``.

Samples that were NaN or infinite in the file make the metric unjudgeable (never dropped quietly).

**Client jitter.** A latency the client measures is late by however late the client itself woke (its
CPU, its scheduler): the send is late by the record's own lateness, and reading a token can be late
the same way. So a percentile metric of client-timed samples
(:attr:`~harness.gates.metrics.Metric.client_timed`: TTFT, TPOT, E2E, their ``*_from_intended``
forms, the cold start; not the lateness itself, not bytes, not rates) widens its interval by the
client's own lateness (``lateness_ms − queue_wait_ms``, the queue wait being the target's
backpressure) at the same quantile over the same records (:func:`client_jitter`): ``lo − jitter``,
``hi + jitter``, ``lo`` not below 0. A run on a jittery client is then judged with the uncertainty it
really has, instead of being refused outright or passed on numbers it cannot vouch for; a regression
larger than the jitter still fails. Records without ``queue_wait_ms`` (files from before it) count all
their lateness as the client's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from harness.common.stats import percentile, percentile_interval
from harness.gates.pooled import cluster_percentile_interval
from harness.gates.runs import FloatArray, RunFrame

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
