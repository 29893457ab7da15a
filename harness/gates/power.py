"""The exact one-sided binomial test every count-based gate decides with, its power and the samples it
needs.

A gate on a rate (``error_rate ≤ 1 %``, ``hit_rate_any ≥ 95 %``) or on a percentile (``tpot_p95 ≤
40 ms``: the share of samples above 40 ms is at most 5 %) is a statement about the probability ``π``
that one request lands on the wrong side. A run of ``n`` requests with ``k`` of them on the wrong side
is a binomial draw, so the test is exact, whatever the latency distribution:

- **fail** when the count proves the limit is exceeded: under ``π = π₀`` (the limit) a count at
  least this extreme has probability ``≤ α``, with ``α = 1 − confidence``. An unchanged target at
  the limit fails with probability at most ``α``; one inside it, less.
- **power**: the probability that the test fails when the truth is the regression the gate is meant
  to catch (``π = π₁``: a 5 % error rate, a hit rate of 70 %, a 1.3× slower decode). It depends on
  ``n`` alone (and on ``π₁``), so a gate says *before* a run how many requests it needs
  (:func:`samples_for_power`) and, after it, whether the run had that power.

A gate passes only when it did not fail **and** it had the power asked for (``power``, default
0.95), i.e. the run had at least the requests that first reach it: a run too small to see the
regression it guards against cannot be judged, rather than pass.
``upper`` says which way is wrong: ``True`` for at-most gates (errors, samples above a latency
limit), ``False`` for at-least gates (hits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

MAX_SAMPLES = 1_000_000
"""Where :func:`samples_for_power` stops looking (a regression that close to the limit is not
something a load test can see)."""


@lru_cache(maxsize=4096)
def critical_count(n: int, p0: float, alpha: float, upper: bool = True) -> int | None:
    """The least extreme count that fails: the smallest ``k`` with ``P(X ≥ k | p0) ≤ alpha`` (upper),
    or the largest ``k`` with ``P(X ≤ k | p0) ≤ alpha`` (lower); ``None`` when no count of ``n`` can
    (``n`` too small to prove anything at ``alpha``)."""
    from scipy.stats import binom

    if n <= 0:
        return None
    if upper:
        # P(X ≥ k) = sf(k − 1); sf decreases in k: the smallest k where it drops to alpha.
        k = int(binom.isf(alpha, n, p0)) + 1
        while k > 0 and binom.sf(k - 2, n, p0) <= alpha:
            k -= 1
        while k <= n and binom.sf(k - 1, n, p0) > alpha:
            k += 1
        return k if k <= n else None
    k = int(binom.ppf(alpha, n, p0))
    while k >= 0 and binom.cdf(k, n, p0) > alpha:
        k -= 1
    while k + 1 <= n and binom.cdf(k + 1, n, p0) <= alpha:
        k += 1
    return k if k >= 0 else None


def proves_beyond(k: int, n: int, p0: float, alpha: float, upper: bool = True) -> bool:
    """Whether ``k`` of ``n`` proves the probability beyond ``p0`` (above it when ``upper``) at ``alpha``."""
    crit = critical_count(n, p0, alpha, upper)
    if crit is None:
        return False
    return k >= crit if upper else k <= crit


def p_value(k: int, n: int, p0: float, upper: bool = True) -> float:
    """``P(X ≥ k | p0)`` (upper) or ``P(X ≤ k | p0)``: how surprising ``k`` of ``n`` is at the limit."""
    from scipy.stats import binom

    return float(binom.sf(k - 1, n, p0) if upper else binom.cdf(k, n, p0))


def power(n: int, p0: float, p1: float, alpha: float, upper: bool = True) -> float:
    """The probability that the test at ``p0`` fails when the truth is ``p1``."""
    from scipy.stats import binom

    crit = critical_count(n, p0, alpha, upper)
    if crit is None:
        return 0.0
    return float(binom.sf(crit - 1, n, p1) if upper else binom.cdf(crit, n, p1))


@lru_cache(maxsize=4096)
def samples_for_power(p0: float, p1: float, alpha: float, want: float, upper: bool = True) -> int | None:
    """The fewest samples with which the test at ``p0`` fails with probability ``≥ want`` when the
    truth is ``p1``; ``None`` when ``p1`` is not beyond ``p0`` or no size up to :data:`MAX_SAMPLES`
    reaches it. (Power is not monotone in ``n`` for a discrete test; this is the first ``n`` that
    reaches it, found by doubling then bisecting, then stepped back while it still holds.)"""
    if (upper and not p1 > p0) or (not upper and not p1 < p0):
        return None
    n = 1
    while power(n, p0, p1, alpha, upper) < want:
        n *= 2
        if n > MAX_SAMPLES:
            return None
    lo, hi = n // 2, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power(mid, p0, p1, alpha, upper) >= want:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class CountTest:
    """One exact test of ``k`` of ``n`` against the limit ``p0``, and its power against ``p1``."""

    k: int
    n: int
    p0: float
    """The limit, as the probability of landing on the wrong side."""
    p1: float | None
    """The regression to detect (``None``: none stated; the test then has no power to report)."""
    alpha: float
    upper: bool
    want: float
    """The power asked for."""

    @property
    def failed(self) -> bool:
        return proves_beyond(self.k, self.n, self.p0, self.alpha, self.upper)

    @property
    def power(self) -> float | None:
        if self.p1 is None:
            return None
        return power(self.n, self.p0, self.p1, self.alpha, self.upper)

    @property
    def needed(self) -> int | None:
        """The fewest samples that give :attr:`want` power (``None``: none, or no ``p1``)."""
        if self.p1 is None:
            return None
        return samples_for_power(self.p0, self.p1, self.alpha, self.want, self.upper)

    @property
    def powered(self) -> bool:
        """At least the size that first reaches :attr:`want` (:func:`samples_for_power`): a discrete
        test's power saws up and down by a point or so above that size, and a gate must not flip
        between pass and cannot-be-judged on one request more or less."""
        need = self.needed
        return need is not None and self.n >= need

    def p_value(self) -> float:
        return p_value(self.k, self.n, self.p0, self.upper)


def exceedance_test(
    values: np.ndarray, q: float, bar: float, *, scale: float, alpha: float, want: float
) -> CountTest:
    """The count test of an at-most ``q``-th percentile gate: ``k`` samples above ``bar`` (the limit, plus
    the client's jitter for client-timed latencies), against ``1 − q/100``, the share above the limit
    when the percentile sits at it. Its power is the plug-in one: the share of these samples that
    would lie above ``bar`` were every one ``scale`` times larger (the regression to catch)."""
    n = int(values.size)
    k = int((values > bar).sum())
    p0 = 1.0 - q / 100.0
    p1 = float((values * scale > bar).mean()) if n else 0.0
    return CountTest(k, n, p0, p1 if p1 > p0 else None, alpha, upper=True, want=want)


def describe_need(test: CountTest) -> str:
    """``"480 requests would (this run had 40: power 0.31)"`` for a reason line."""
    need = test.needed
    have = f"this run had {test.n}: power {test.power:.2f}" if test.power is not None else f"{test.n}"
    if need is None:
        return f"no run size reaches power {test.want:.2f} ({have})"
    return f"{need:,} would reach power {test.want:.2f} ({have})"


def is_finite_prob(p: float) -> bool:
    return math.isfinite(p) and 0.0 <= p <= 1.0
