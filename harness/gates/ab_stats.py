"""The statistics of the A/B verdict (:mod:`harness.gates.ab`): request pairs, the ratio of two arms'
quantiles with its interval and test, the error rate's exact binomial test, and the family's levels.

**The pairs.** Samples pair up by request id within a block pair (the same request sent to both arms,
:func:`paired_samples`); a request that failed, or has no value of the field, in either arm drops the
pair, so both arms are measured on the same requests.

**The ratio.** For each latency metric (a percentile of a record field: ``tpot_p50`` …) the estimate is
``R = Q_candidate ÷ Q_base``, the project's nearest-rank quantile (:mod:`harness.common.stats`) of each
arm's samples pooled over all blocks (:func:`ratio_interval`).

**The interval** is the percentile bootstrap over request pairs, resampled *within* each block pair
(stratified: every resample keeps each block pair's count of requests). A machine that drifts between
block pairs moves both arms of a pair alike, and each request is compared with itself: the drift
cancels from the comparison, and no resample holds more of a slow pair than the data do. What is left
is that a drifting machine spreads the pooled distribution, which widens a quantile's interval by as
much as it spreads the quantile (pairs up to ~2× apart: about 11 %, ``tests/gates/test_ab.py``).
Seeded (:data:`DEFAULT_SEED`), :data:`DEFAULT_RESAMPLES` resamples, vectorised in single precision: a
few thousand pairs take about half a second. A percentile bootstrap needs samples on both sides of the
quantile: a metric whose pairs leave fewer than :data:`TAIL_SAMPLES` of them beyond it (P95 of fewer
than 200 pairs) cannot be judged (:func:`min_pairs`).

**Noise a pair does not share.** A neighbour that slows one arm's block and not its partner shifts
that pair's ratio alone, and every request of the block with it. The bootstrap cannot see it (it
resamples the requests of blocks that already ran: on a simulated 15 % such effect its 95 % interval
covered the truth half the time). The block pairs' own log ratios ``θⱼ`` can: their scatter gives the
pooled log ratio a second standard error, the paired ``t`` test's over block pairs
(:func:`block_pairs_se`), which assumes nothing about the requests inside a block.

**The test.** ``(ln R − ln limit) / se`` against a ``t`` distribution with ``P − 1`` degrees of
freedom (``P`` block pairs), ``se`` the larger of the two standard errors (:class:`RatioInterval`):
the p-value of "R ≤ limit", one-sided bounds at any level (the interval is the two-sided pair of
them), and the power to prove a given slowdown. Always ``P − 1``, not only when the block pairs
scatter more than their requests explain: four pairs that agree by chance cannot rule out a
neighbour that moved whole blocks. With a moment estimate of the excess (DerSimonian–Laird: zero
whenever the pairs happen to agree) and a normal reference, an unchanged engine failed a CI run (TPOT
1.37× "proven" above 1.1× from 4 pairs of 7 requests), and on simulated blocks 1.7–2.7 % of
candidates no slower than the base were proven 1.1× slower at a level of 1.25 % (``tests/gates/
test_ab.py``). The price is power with few pairs: judge on 8 or more.

**The error rate.** An exact one-sided binomial test against a largest acceptable rate
(:func:`error_rate_test`), its exact (Clopper–Pearson) upper bound (:func:`rate_upper`) and its power
exact at a given true rate (:func:`error_power`).

**The family.** One test's Bonferroni level for a family-wise false-alarm rate over every test and look
(:func:`levels`), and the Holm–Bonferroni step-down that rejects at it or larger ones (:func:`holm`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.common.stats import interval_ranks, percentile
from harness.gates.runs import FloatArray, RunFrame

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
TAIL_SAMPLES = 10
"""Pairs a percentile needs on its far side (``n · min(q, 1 − q) ≥ 10``) before its bootstrap
interval means anything: 20 for a median, 200 for a P95, 1 000 for a P99."""
_CELLS_PER_CHUNK = 4_000_000
"""Bootstrap cells (resamples × pairs) drawn at once: bounds the memory of a large run (~64 MB)."""


def min_pairs(q: float) -> int:
    """The fewest request pairs with which the ``q``-th percentile's ratio can be judged."""
    p = q / 100.0
    return math.ceil(TAIL_SAMPLES / min(p, 1.0 - p) - 1e-9)


# ---- the pairs --------------------------------------------------------------------------------------


def paired_samples(
    pairs: Sequence[tuple[RunFrame, RunFrame]], column: str, *, pooled: bool = False
) -> tuple[list[FloatArray], list[FloatArray], int]:
    """Per block pair, the ``column`` values of the requests both arms answered with a value, in the
    same order (by request id); and how many requests of either arm were left out. ``pooled``: each
    request's inter-token gaps, one NaN-padded row a request (2-D arrays)."""
    base_out: list[FloatArray] = []
    cand_out: list[FloatArray] = []
    left_out = 0
    for base, cand in pairs:
        b, c = _by_id(base, column, pooled), _by_id(cand, column, pooled)
        common = [i for i in b if i in c]
        left_out += (len(b) - len(common)) + (len(c) - len(common))
        left_out += (base.n - len(b)) + (cand.n - len(c))
        if pooled:
            base_out.append(_rows([b[i] for i in common]))
            cand_out.append(_rows([c[i] for i in common]))
        else:
            base_out.append(np.asarray([b[i] for i in common], dtype=np.float64))
            cand_out.append(np.asarray([c[i] for i in common], dtype=np.float64))
    return base_out, cand_out, left_out


def _rows(groups: Sequence[FloatArray]) -> FloatArray:
    """Ragged arrays as the rows of one NaN-padded matrix."""
    width = max((g.size for g in groups), default=1)
    out = np.full((len(groups), max(width, 1)), np.nan)
    for i, g in enumerate(groups):
        out[i, : g.size] = g
    return out


def _by_id(frame: RunFrame, column: str, pooled: bool = False) -> dict[str, Any]:
    """Request id → value (``pooled``: its gaps), for the requests that succeeded with a finite value
    (an id seen twice in a block is ambiguous and left out)."""
    ids = frame.text["id"]
    seen: dict[str, int] = {}
    for i in ids:
        seen[str(i)] = seen.get(str(i), 0) + 1
    if pooled:
        gaps = frame.gaps()
        return {
            str(i): np.asarray(g, dtype=np.float64)
            for i, g, ok in zip(ids, gaps, frame.ok, strict=True)
            if ok and seen[str(i)] == 1 and len(g) and np.isfinite(np.asarray(g, dtype=np.float64)).all()
        }
    values = frame.col(column)
    usable = frame.ok & np.isfinite(values) & ~frame.bad(column)
    return {str(i): float(v) for i, v, u in zip(ids, values, usable, strict=True) if u and seen[str(i)] == 1}


# ---- the ratio and its interval ---------------------------------------------------------------------


@dataclass(frozen=True)
class RatioInterval:
    """``candidate ÷ base`` at one quantile, with its interval (module docstring)."""

    base: float
    candidate: float
    ratio: float
    lo: float
    hi: float
    """The two-sided interval at the confidence asked: :meth:`bounds` at half its ``α`` each side."""
    n: int
    """Request pairs."""
    boot_lo: float
    boot_hi: float
    """The stratified bootstrap's percentile interval alone (what the requests' own noise allows)."""
    spread: float
    """``τ``: the standard deviation, on the log scale, of one block pair's ratio beyond what its
    requests' noise explains (:attr:`spread_se` ÷ ``√Σ share²``; 0: the pairs scatter no more)."""
    log_se: float = math.nan
    """The standard deviation of the bootstrap's log ratios (the requests' own noise)."""
    spread_se: float = 0.0
    """How far the block pairs' excess scatter moves the pooled log ratio: ``√(between² − log_se²)``
    when the standard error from the block pairs' own scatter (:func:`block_pairs_se`) is the
    larger, else 0."""
    blocks: int = 1
    """Block pairs with request pairs."""

    @property
    def se(self) -> float:
        """The log ratio's standard error: the larger of the requests' bootstrap and the block pairs'
        own scatter (the module docstring)."""
        return math.hypot(self.log_se, self.spread_se)

    @property
    def df(self) -> float:
        """Degrees of freedom of the log ratio's ``t`` reference: ``P − 1`` whenever there are ``P ≥ 2``
        block pairs, whichever error is the larger (infinite with one). With few pairs, block pairs
        that agree by chance cannot rule out a neighbour that moved whole blocks: ``P − 1`` is what
        their scatter is known to."""
        return math.inf if self.blocks < 2 else float(self.blocks - 1)

    def bounds(self, alpha: float) -> tuple[float, float]:
        """One-sided bounds at level ``alpha`` each: ``P(true ratio < lo) ≤ α`` and likewise above ``hi``."""
        if not (math.isfinite(self.ratio) and self.ratio > 0 and math.isfinite(self.se)):
            return math.nan, math.nan
        w = _t_quantile(1.0 - alpha, self.df) * self.se
        return self.ratio * math.exp(-w), self.ratio * math.exp(w)

    def p_above(self, limit: float) -> float:
        """The one-sided p-value of "the true ratio is at most ``limit``": small when the candidate is
        proven slower than ``limit`` × the base."""
        if not (math.isfinite(self.ratio) and self.ratio > 0 and math.isfinite(self.se)):
            return 1.0
        if self.se == 0:
            return 0.0 if self.ratio > limit else 1.0
        return _t_sf((math.log(self.ratio) - math.log(limit)) / self.se, self.df)

    def power(self, limit: float, detect: float, alpha: float) -> float:
        """The chance that a candidate truly ``detect`` × slower is proven above ``limit`` at level
        ``alpha`` by a design with this one's standard error."""
        if not (math.isfinite(self.se) and self.se > 0):
            return 1.0 if math.isfinite(self.se) and detect > limit else math.nan
        shift = (math.log(detect) - math.log(limit)) / self.se
        return _t_sf(_t_quantile(1.0 - alpha, self.df) - shift, self.df)


def _t_quantile(p: float, df: float) -> float:
    from scipy.stats import norm, t

    return float(norm.ppf(p)) if not math.isfinite(df) else float(t.ppf(p, df))


def _t_sf(x: float, df: float) -> float:
    from scipy.stats import norm, t

    return float(norm.sf(x)) if not math.isfinite(df) else float(t.sf(x, df))


def _matrix(a: FloatArray) -> FloatArray:
    """One row per request pair: a 1-D array (one value a request) as a column, a 2-D one (each
    request's values, NaN-padded: its inter-token gaps) as it is."""
    m = np.asarray(a, np.float64)
    return m.reshape(-1, 1) if m.ndim == 1 else m


def _row_quantiles(values: npt.NDArray[np.float32], q: float) -> npt.NDArray[np.float32]:
    """The nearest-rank ``q``-th percentile of each row (NaN: no value; a row of none gives NaN)."""
    nan = np.isnan(values)
    if not nan.any():
        k = interval_ranks(values.shape[1], q)[1]
        return np.partition(values, k, axis=1)[:, k]
    counts = (~nan).sum(axis=1)
    ordered = np.sort(values, axis=1)  # NaN last
    ranks = np.clip(np.ceil(q / 100.0 * counts - 1e-9).astype(np.int64) - 1, 0, None)
    out = np.take_along_axis(ordered, ranks[:, None], axis=1)[:, 0]
    return np.where(counts > 0, out, np.float32(np.nan))


def ratio_interval(
    base: Sequence[FloatArray],
    candidate: Sequence[FloatArray],
    q: float,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> RatioInterval:
    """The ratio of the ``q``-th percentiles of ``candidate`` and ``base`` pooled over blocks, and its
    two-sided ``confidence`` interval: ``t(P − 1)`` on the log scale with the larger standard error
    of the percentile bootstrap over request pairs, stratified by block pair, and the block pairs'
    own scatter (:func:`block_pairs_se`).

    ``base[j][i]`` and ``candidate[j][i]`` are the same request's latency in block pair ``j`` (or, as
    rows of 2-D arrays, the same request's values, NaN-padded: its inter-token gaps, pooled); each
    resample draws, with replacement, as many pairs from every block pair as it holds (stratified).
    Block pairs without pairs are skipped. ``ValueError`` when there are none at all, or arrays of a
    block pair differ in shape."""
    if len(base) != len(candidate):
        raise ValueError("base and candidate have different numbers of block pairs")
    pairs = zip(base, candidate, strict=True)
    blocks = [(_matrix(b), _matrix(c)) for b, c in pairs]
    for j, (b, c) in enumerate(blocks):
        if b.shape[0] != c.shape[0]:
            raise ValueError(
                f"block pair {j + 1}: base and candidate are not paired ({b.shape} vs {c.shape})"
            )
    blocks = [(b, c) for b, c in blocks if b.shape[0]]
    if not blocks:
        raise ValueError("no request pairs")
    width = max(max(b.shape[1], c.shape[1]) for b, c in blocks)
    padded = [(_pad(b, width), _pad(c, width)) for b, c in blocks]
    b_all = np.concatenate([b for b, _ in padded])
    c_all = np.concatenate([c for _, c in padded])
    n = int(b_all.shape[0])
    base_q, cand_q = percentile(b_all.ravel(), q), percentile(c_all.ravel(), q)
    ratio = cand_q / base_q if base_q > 0 else math.nan
    rng = np.random.default_rng(seed)
    sizes = [b.shape[0] for b, _ in padded]
    starts = [int(x) for x in np.cumsum([0, *sizes[:-1]])]
    ratios = np.empty(resamples, dtype=np.float64)
    chunk = max(1, _CELLS_PER_CHUNK // (n * width))
    # Resampled in single precision: half the memory traffic of the gathers and partitions, which are
    # the whole cost; a relative rounding of 6e-8 is far below any latency's resolution.
    b32, c32 = b_all.astype(np.float32), c_all.astype(np.float32)
    for first in range(0, resamples, chunk):
        rows = min(chunk, resamples - first)
        # Each block pair's columns draw only its own pairs: the stratification.
        draws = [
            start + rng.integers(0, size, size=(rows, size))
            for start, size in zip(starts, sizes, strict=True)
        ]
        idx = np.concatenate(draws, axis=1)
        # A drawn request brings all its values (its gaps): the resampling unit is the request.
        bs, cs = b32[idx].reshape(rows, n * width), c32[idx].reshape(rows, n * width)
        qb, qc = _row_quantiles(bs, q), _row_quantiles(cs, q)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[first : first + rows] = np.where(qb > 0, qc.astype(np.float64) / qb, np.nan)
    nan = math.nan
    if np.isnan(ratios).any() or not math.isfinite(ratio) or ratio <= 0:
        return RatioInterval(base_q, cand_q, ratio, nan, nan, n, nan, nan, nan, blocks=len(blocks))
    alpha = 1.0 - confidence
    boot_lo, boot_hi = percentile(ratios, 100.0 * alpha / 2), percentile(ratios, 100.0 * (1 - alpha / 2))
    with np.errstate(divide="ignore"):  # a resample whose candidate quantile is 0: log −inf, se NaN
        log_se = float(np.std(np.log(ratios), ddof=1)) if resamples > 1 else nan
    between = block_pairs_se(padded, q)
    if not math.isfinite(between):
        return RatioInterval(base_q, cand_q, ratio, nan, nan, n, boot_lo, boot_hi, nan, blocks=len(blocks))
    # The block pairs' excess: what their scatter says beyond the requests' noise (0 when it says less).
    spread_se = math.sqrt(max(0.0, between**2 - log_se**2))
    shares = np.asarray(sizes, dtype=np.float64) / n
    out = RatioInterval(
        base_q, cand_q, ratio, nan, nan, n, boot_lo, boot_hi,
        spread_se / math.sqrt(float((shares**2).sum())), log_se=log_se, spread_se=spread_se,
        blocks=len(blocks),
    )  # fmt: skip
    lo, hi = out.bounds(alpha / 2)
    return dataclasses.replace(out, lo=lo, hi=hi)


def _pad(m: FloatArray, width: int) -> FloatArray:
    if m.shape[1] == width:
        return m
    out = np.full((m.shape[0], width), np.nan)
    out[:, : m.shape[1]] = m
    return out


def _log_ratio(b: FloatArray, c: FloatArray, q: float) -> float:
    pb, pc = percentile(b, q), percentile(c, q)
    return math.log(pc / pb) if pb > 0 and pc > 0 else math.nan


def block_pairs_se(blocks: Sequence[tuple[FloatArray, FloatArray]], q: float) -> float:
    """The standard error of the block pairs' log ratios' share-weighted mean, from their own scatter:
    ``√(P/(P − 1) · Σ sⱼ² (θⱼ − θ̄)²)``, ``θⱼ`` block pair ``j``'s ``ln(Q_candidate / Q_base)``, ``sⱼ`` its
    share of the request pairs (with equal shares, the sample standard deviation of the ``θⱼ`` over
    ``√P``). 0 with fewer than two block pairs (nothing to compare); NaN when a ratio is not finite.

    It assumes nothing about the requests inside a block: a neighbour that slowed one block and not
    its partner moves every request of that pair, and only the block pairs' scatter shows it. Drift
    shared by a pair's two blocks cancels in its ``θⱼ`` and does not inflate it."""
    p = len(blocks)
    if p < 2:
        return 0.0
    theta = np.array([_log_ratio(b.ravel(), c.ravel(), q) for b, c in blocks])
    if not np.isfinite(theta).all():
        return math.nan
    shares = np.array([b.shape[0] for b, _ in blocks], dtype=np.float64)
    shares /= shares.sum()
    mean = float((shares * theta).sum())
    return math.sqrt(p / (p - 1) * float((shares**2 * (theta - mean) ** 2).sum()))


# ---- the error rate ---------------------------------------------------------------------------------


def error_rate_test(errors: int, requests: int, max_rate: float, confidence: float) -> tuple[float, bool]:
    """``(p, proven)``: the exact one-sided binomial p-value of ``errors`` of ``requests`` under an
    error rate of ``max_rate``, and whether it proves the rate above it at level ``(1 − c)/2``."""
    from scipy.stats import binom

    if requests <= 0:
        return 1.0, False
    p = float(binom.sf(errors - 1, requests, max_rate)) if errors > 0 else 1.0
    return p, p < (1.0 - confidence) / 2


def rate_upper(errors: int, requests: int, level: float) -> float:
    """The exact (Clopper–Pearson) one-sided upper bound at ``level`` on an error rate seen as
    ``errors`` of ``requests``."""
    from scipy.stats import beta

    if errors >= requests:
        return 1.0
    return float(beta.ppf(1.0 - level, errors + 1, requests - errors))


def error_power(requests: int, max_rate: float, detect: float, level: float) -> float:
    """The chance an exact one-sided binomial test at ``level`` proves an error rate above
    ``max_rate`` from ``requests`` requests when the true rate is ``detect``."""
    from scipy.stats import binom

    if requests <= 0:
        return 0.0
    # The fewest errors that prove it: P(X ≥ k | max_rate) < level.
    ks = np.arange(requests + 2)
    sf = binom.sf(ks - 1, requests, max_rate)
    k = int(ks[np.argmax(sf < level)]) if (sf < level).any() else requests + 1
    return float(binom.sf(k - 1, requests, detect))


# ---- the family -------------------------------------------------------------------------------------


def levels(alpha: float, tests: int, looks: int = 1) -> float:
    """The one-sided level of one test's Bonferroni step, for a family false-alarm rate ``alpha`` over
    ``tests`` tests and up to ``looks`` looks: ``α / tests / looks``.

    An A/B verdict's own tests (its metrics and the error rate, ``own`` of them) share
    ``α · own / tests`` per look by Holm's step-down, which rejects at this level or larger ones;
    a gate file judged on the same candidate gives each of its tests ``α / tests`` (Bonferroni, one
    look); a look that stops early never spends the rest. By the union bound, the chance of any
    false fail, over every look and every test, stays at most ``α``."""
    if not (0 < alpha < 1 and tests >= 1 and looks >= 1):
        raise ValueError(f"need 0 < alpha < 1, tests ≥ 1 and looks ≥ 1 (got {alpha}, {tests}, {looks})")
    return alpha / tests / looks


def holm(p_values: Sequence[float], alpha: float) -> list[float | None]:
    """Holm–Bonferroni at family-wise level ``alpha``: for each hypothesis, the level it was rejected
    at, or ``None`` (the smallest p against ``α/m``, the next against ``α/(m − 1)`` …, stopping at
    the first that is not below its level).

    A rejected test's bounds belong at the level it was rejected at: at the first level (``α/m``) a
    later step's interval can still reach below the limit it was proven above."""
    m = len(p_values)
    out: list[float | None] = [None] * m
    for step, i in enumerate(sorted(range(m), key=lambda k: p_values[k])):
        at = alpha / (m - step)
        if not p_values[i] < at:
            break
        out[i] = at
    return out
