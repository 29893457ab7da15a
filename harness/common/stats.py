"""The one percentile definition of the harness, and the summary every stage prints.

**Definition: nearest rank, exact, from all samples.** The p-th percentile of ``n`` samples is the
smallest sample ``x`` such that at least ``p`` % of the samples are ``≤ x``: the order statistic
``x₍ₖ₎`` with ``k = ⌈p/100 · n⌉`` (1-based), and the minimum for ``p = 0``. It is always a value that
was measured, never an interpolation between two (no bucket, no rounding: Locust's stats round to two
significant digits, 147 ms → 150 ms, and we never report those). NumPy calls it
``method="inverted_cdf"``; Hyndman and Fan call it definition 1; HdrHistogram reports the same.

Every percentile the project prints (load summaries, gates, reports, cache lookup latency, trace
scenario classes, benchmarks) goes through :func:`percentile` or :class:`Distribution`.

:func:`percentile_interval` gives a distribution-free confidence interval for a percentile from order
statistics (the number of samples below the true quantile is binomial), which is what the gates
decide on, so that one unlucky run does not flip a verdict; :func:`min_samples_for_interval` says how
many samples that interval needs before it exists, and :func:`relative_half_width` how tight it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import AliasChoices, ConfigDict, Field

from harness.common.model import StrictModel

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
"""The percentiles a :class:`Distribution` carries."""


def _sorted(values: Iterable[float] | np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float64]]:
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    arr.sort()
    return arr


def _rank(q: float, n: int) -> int:
    """0-based index of the nearest-rank ``q``-th percentile among ``n`` sorted samples."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    # The tiny epsilon keeps 95 % of 20 samples at rank 19, not 20, despite 0.95 * 20 = 19.000000000000004.
    return max(0, min(n - 1, math.ceil(q / 100.0 * n - 1e-9) - 1))


def percentile(values: Iterable[float] | np.ndarray[Any, Any], q: float) -> float:
    """The nearest-rank ``q``-th percentile (``0 ≤ q ≤ 100``) of ``values``; NaN when there are none.

    NaN samples are dropped (a request that produced no first token has no TTFT, not an infinite one).
    """
    arr = _sorted(values)
    if arr.size == 0:
        return math.nan
    return float(arr[_rank(q, arr.size)])


def percentile_interval(
    values: Iterable[float] | np.ndarray[Any, Any], q: float, confidence: float = 0.95
) -> tuple[float, float]:
    """A distribution-free two-sided ``confidence`` interval for the ``q``-th percentile.

    The count of samples below the true ``q``-quantile is Binomial(n, q/100), so the order statistics
    ``x₍ₗ₎ ≤ x₍ᵤ₎`` with ``l, u`` at the binomial's ``(1−c)/2`` and ``(1+c)/2`` quantiles cover it with
    probability ``≥ c``. When the sample is too small for an upper bound (e.g. P99 of 50 samples) the
    upper end is ``inf``: a gate then cannot prove the percentile is low, and says so. NaN bounds mean
    no samples at all.
    """
    arr = _sorted(values)
    n = arr.size
    if n == 0:
        return (math.nan, math.nan)
    lo_i, _, hi_i = interval_ranks(n, q, confidence)
    lo = float(arr[lo_i]) if lo_i >= 0 else -math.inf
    hi = float(arr[hi_i]) if hi_i < n else math.inf
    return (lo, hi)


def interval_ranks(n: int, q: float, confidence: float = 0.95) -> tuple[int, int, int]:
    """0-based ranks ``(lo, value, hi)``, among ``n ≥ 1`` sorted samples, of the ``q``-th percentile's
    :func:`percentile_interval` ends and of the percentile itself.

    ``lo`` is ``-1`` when the sample is too small for a lower bound, ``hi`` is ``n`` or more when it is
    too small for an upper one. A caller that keeps its samples unsorted (the load stage's live
    precision check) selects just these three order statistics (``np.partition``) instead of sorting.
    """
    from scipy.stats import binom

    if n < 1:
        raise ValueError("interval_ranks needs at least one sample")
    p = q / 100.0
    alpha = 1.0 - confidence
    lo_k = int(binom.ppf(alpha / 2, n, p))  # samples strictly below the lower bound
    hi_k = int(binom.ppf(1 - alpha / 2, n, p)) + 1  # 1-based rank of the upper bound
    return (lo_k - 1, _rank(q, n), hi_k - 1)


@lru_cache(maxsize=256)
def min_samples_for_interval(q: float, confidence: float = 0.95) -> int:
    """The smallest ``n`` at which the ``q``-th percentile's :func:`percentile_interval` has both ends
    within the sample (finite), i.e. the fewest samples with which that percentile can be judged at all.

    At 95 % confidence: P50 needs 6, P90 36, P95 72, P99 368, P99.9 3688 (for high percentiles the
    upper end is the binding one, so this equals the gates' ``min_samples_for_bound``). Both rank
    conditions are monotone in ``n`` (a binomial quantile grows by at most 1 per added trial), so a
    bisection finds it.
    Raises :class:`ValueError` for ``q`` outside ``(0, 100)`` (no interval ever closes there).
    """
    if not 0.0 < q < 100.0:
        raise ValueError(f"percentile {q} has no two-sided interval (needs 0 < q < 100)")

    def closed(n: int) -> bool:
        lo_i, _, hi_i = interval_ranks(n, q, confidence)
        return lo_i >= 0 and hi_i < n

    hi = 1
    while not closed(hi):
        hi *= 2
        if hi > 1 << 40:  # pragma: no cover - only for q within 1e-12 of 0 or 100
            raise ValueError(f"percentile {q} needs more than 2^40 samples for an interval")
    lo = hi // 2  # not closed (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if closed(mid):
            hi = mid
        else:
            lo = mid
    return hi


def relative_half_width(value: float, lo: float, hi: float) -> float:
    """How precisely an interval ``[lo, hi]`` pins ``value``: ``max(hi − value, value − lo) / |value|``.

    The one definition behind ``--until-precision`` (docs/load.md): 0.1 means the true percentile is
    known to within ±10 % of the measured one. ``inf`` when an end is unbounded (too few samples) or
    the value is 0 with a non-degenerate interval; NaN when there is no value.
    """
    if math.isnan(value) or math.isnan(lo) or math.isnan(hi):
        return math.nan
    half = max(hi - value, value - lo)
    if math.isinf(half):
        return math.inf
    if value == 0.0:
        return 0.0 if half == 0.0 else math.inf
    return half / abs(value)


class Distribution(StrictModel):
    """Summary of a numeric sample: count, mean, spread and nearest-rank percentiles.

    Built with :meth:`of`. With no samples ``n`` is 0 and every statistic is ``None`` (JSON ``null``),
    so an empty metric can never be mistaken for a zero latency.
    """

    model_config = ConfigDict(frozen=True, populate_by_name=True)  # merged with StrictModel's

    n: int = Field(ge=0, validation_alias=AliasChoices("n", "count"))
    """Number of samples (files written before 0.2 call it ``count``; both are read)."""
    mean: float | None = None
    std: float | None = None
    """Population standard deviation."""
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float] | np.ndarray[Any, Any]) -> Distribution:
        """Summarize ``values`` (NaN samples are dropped)."""
        arr = _sorted(values)
        n = int(arr.size)
        if n == 0:
            return cls(n=0)
        ps = {f"p{q}": float(arr[_rank(q, n)]) for q in PERCENTILES}
        return cls(
            n=n,
            mean=float(arr.mean()),
            std=float(arr.std()),
            min=float(arr[0]),
            max=float(arr[-1]),
            **ps,
        )

    def percentile(self, q: int) -> float | None:
        """One of the stored percentiles (``q`` in :data:`PERCENTILES`), ``max`` for 100."""
        if q == 100:
            return self.max
        if q not in PERCENTILES:
            raise ValueError(f"p{q} is not stored; stored: {', '.join(f'p{p}' for p in PERCENTILES)}")
        value: float | None = getattr(self, f"p{q}")
        return value
