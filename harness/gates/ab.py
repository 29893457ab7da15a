"""The A/B verdict: is a candidate target slower than a base target measured beside it, block by block?

``harness ab`` (:mod:`harness.experiments.ab`) replays block pairs of distinct requests against two
targets, alternating A B B A …, each block pair sending the same requests to both. This module judges
what it measured; it needs no stored latency, only the two arms' records.

**The ratio.** For each latency metric (a percentile of a record field: ``tpot_p50`` …) the estimate is
``R = Q_candidate ÷ Q_base``, the project's nearest-rank quantile (:mod:`harness.common.stats`) of each
arm's samples pooled over all blocks. Samples pair up by request id within a block pair (the same
request sent to both arms); a request that failed, or has no value of the field, in either arm drops
the pair, so both arms are measured on the same requests.

**The interval** is the percentile bootstrap over request pairs, resampled *within* each block pair
(stratified: every resample keeps each block pair's count of requests). A machine that drifts between
block pairs moves both arms of a pair alike, and each request is compared with itself: the drift
cancels from the comparison, and no resample holds more of a slow pair than the data do. What is left
is that a drifting machine spreads the pooled distribution, which widens a quantile's interval by as
much as it spreads the quantile (pairs up to ~2× apart: about 11 %, ``tests/gates/test_ab.py``).
Seeded (:data:`DEFAULT_SEED`), :data:`DEFAULT_RESAMPLES` resamples, vectorised in single precision: a
few thousand pairs take about half a second. A percentile bootstrap needs samples on both sides of the
quantile: a metric whose pairs leave fewer than :data:`TAIL_SAMPLES` of them beyond it (P95 of fewer
than 200 pairs) cannot be judged.

**Noise a pair does not share.** A neighbour that slows one arm's block and not its partner shifts
that pair's ratio alone. The bootstrap cannot see it (it resamples the requests of blocks that already
ran: on a simulated 15 % such effect its 95 % interval covered the truth half the time). The block
pairs' own ratios can: when they scatter more than their requests' noise explains (Cochran's ``Q``,
the DerSimonian–Laird estimate ``τ`` of the excess, :func:`block_spread`), the interval is widened on
the log scale by ``t(P−1) · τ · √Σ share²`` in quadrature (``P`` block pairs, each holding its share
of the requests; the ``t`` quantile because ``τ`` is itself estimated from ``P`` pairs). Pairs that
agree leave it as the bootstrap made it. ``ab.json`` keeps both intervals and the spread.

**The test.** ``(ln R − ln limit) / se`` against a ``t`` distribution, ``se²`` the bootstrap's
variance of ``ln R`` plus the block pairs' excess spread ``(τ · √Σ share²)²``, its degrees of freedom
Welch–Satterthwaite's (:class:`RatioInterval`): the p-value of "R ≤ limit", and one-sided bounds at
any level.

**The family.** α = ``1 − confidence`` is the chance that a candidate no slower than ``limit`` and
erring no more than ``max_error_rate`` fails anything, over every test and every look
(:func:`levels`): with ``m`` tests in all (these metrics, the error rate, and ``other_tests`` judged
elsewhere on the candidate, a gate file's) and ``K`` looks, the metrics and the error rate are
rejected by Holm–Bonferroni (:func:`holm`) at ``α · own / m / K``. For a metric:

- **fail** when Holm rejects "R ≤ limit": the candidate is proven slower than ``limit`` × the base;
- **pass** when not, and the upper bound at ``α / m / K`` is at most ``detect``: a slowdown of
  ``detect`` × is ruled out;
- **cannot be judged** otherwise, with how many block pairs would likely decide it: the interval's
  half-width on the side that decides shrinks as ``1/√pairs``.

Each metric carries its **power**: the chance this design, at the standard error it measured, fails a
candidate ``detect`` × slower. The candidate's **error rate** (its blocks and any further runs: a warm
pass) is an exact one-sided binomial test against ``max_error_rate`` in the same Holm family, its power
exact at ``detect_error_rate``; errors fail whatever else went wrong. Overall: fail > cannot be judged >
pass, exit 1 / 6 / 0 (:data:`harness.gates.judge.EXIT_CODES`). A block run that cannot be judged itself
(client-bound, interrupted, its counts disagreeing) makes every latency verdict *cannot be judged*: its
numbers are not the target's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field
from rich.markup import escape
from rich.table import Table

from harness.common.model import StrictModel
from harness.common.stats import interval_ranks, percentile
from harness.gates.judge import EXIT_CODES, VERDICT_WORDS, Overall
from harness.gates.metrics import METRICS, Metric, format_interval, format_value, rate_interval
from harness.gates.runs import FloatArray, ResultSet, RunFrame
from harness.load.results import BYTES_FIELDS

AB_SCHEMA_VERSION: Literal[1] = 1
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
DEFAULT_METRICS = "ttft_p50,tpot_p50,itl_p50,e2e_p50,tpot_p95,itl_p95"
"""The engine's latencies: first token, decode (per request and every gap pooled) at the median and
the P95, and the whole answer."""
TAIL_SAMPLES = 10
"""Pairs a percentile needs on its far side (``n · min(q, 1 − q) ≥ 10``) before its bootstrap
interval means anything: 20 for a median, 200 for a P95, 1 000 for a P99."""
_CELLS_PER_CHUNK = 4_000_000
"""Bootstrap cells (resamples × pairs) drawn at once: bounds the memory of a large run (~64 MB)."""
ARMS = ("base", "candidate")


def ab_metric(name: str) -> Metric:
    """The metric ``name`` an A/B run can judge: a percentile of a latency field the client timed
    (``ttft_p50``, ``tpot_p95``, ``e2e_from_intended_p99`` …), of every inter-token gap pooled
    (``itl_p50``, ``itl_p95``: each request's gaps pair with the same request's on the other arm), or of
    the prefill KV bytes the target counted (``prefill_kv_bytes_p50``: the same prompt's memory on both
    arms). ``ValueError`` names the others."""
    known = ab_metric_names()
    if name not in known:
        raise ValueError(f"{name!r} is not a percentile an A/B run judges; known: {', '.join(known)}")
    return METRICS.get(name)


def ab_metric_names() -> list[str]:
    """Every metric :func:`ab_metric` accepts."""
    return [
        name
        for name, m in METRICS.items()
        if m.kind in ("percentile", "pooled")
        and m.column is not None
        and (m.client_timed or m.column in BYTES_FIELDS)
        and m.default_phase is None
    ]


def parse_ab_metrics(text: str) -> list[Metric]:
    """``"ttft_p50,tpot_p95"`` → the metrics, in order, each once (``ValueError`` for an unknown or an
    empty list)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("no metric given")
    return [ab_metric(n) for n in dict.fromkeys(names)]


def min_pairs(q: float) -> int:
    """The fewest request pairs with which the ``q``-th percentile's ratio can be judged."""
    p = q / 100.0
    return math.ceil(TAIL_SAMPLES / min(p, 1.0 - p) - 1e-9)


def reachable(metrics: Sequence[Metric], pairs: int) -> tuple[list[Metric], list[str]]:
    """The metrics a design of ``pairs`` request pairs (blocks × requests a block) can judge, and why
    each other one is left out. A metric the design can never judge would make every run of it
    *cannot be judged*, however clear the others: like a gate the runs cannot power, it is left out
    and said, not carried as a verdict (``harness ab`` does this for its default metrics; metrics
    asked for by name are judged, and say what they would need)."""
    kept: list[Metric] = []
    notes: list[str] = []
    for m in metrics:
        assert m.q is not None
        need = min_pairs(m.q)
        if need > pairs:
            notes.append(
                f"{m.name} left out: a P{m.q:g} needs ≥ {need} request pairs, this design has {pairs} "
                "(more --blocks or --block-requests to judge it)"
            )
        else:
            kept.append(m)
    return kept, notes


# ---- the ratio and its interval ---------------------------------------------------------------------


@dataclass(frozen=True)
class RatioInterval:
    """``candidate ÷ base`` at one quantile, with its interval (module docstring)."""

    base: float
    candidate: float
    ratio: float
    lo: float
    hi: float
    """The interval: the stratified bootstrap's, widened by :attr:`spread` when there is any."""
    n: int
    """Request pairs."""
    boot_lo: float
    boot_hi: float
    """The stratified bootstrap's interval alone (what the requests' own noise allows)."""
    spread: float
    """``τ``: the standard deviation, on the log scale, of the block pairs' own ratios beyond what
    their requests' noise explains (0: none seen, or fewer than two block pairs)."""
    log_se: float = math.nan
    """The standard deviation of the bootstrap's log ratios (the requests' own noise)."""
    spread_se: float = 0.0
    """``τ · √Σ share²``: how far the block pairs' excess spread moves the pooled log ratio."""
    blocks: int = 1
    """Block pairs with request pairs."""

    @property
    def se(self) -> float:
        """The log ratio's standard error: the requests' noise and the block pairs' excess spread."""
        return math.hypot(self.log_se, self.spread_se)

    @property
    def df(self) -> float:
        """Degrees of freedom of the log ratio's ``t`` reference (Welch–Satterthwaite): infinite when
        the block pairs agree, ``P − 1`` when their spread is all of the error (``τ`` is itself
        estimated from ``P`` block pairs)."""
        if self.spread_se <= 0 or self.blocks < 2:
            return math.inf
        return (self.blocks - 1) * (1.0 + (self.log_se / self.spread_se) ** 2) ** 2

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
    two-sided ``confidence`` interval: the percentile bootstrap over request pairs, stratified by
    block pair, widened by the block pairs' excess spread (:func:`block_spread`).

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
    per_block: list[FloatArray] = []
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
        if first == 0:  # each block pair's own log ratio over the same resamples (a few hundred do)
            per_block = _block_log_ratios(
                bs[:SPREAD_RESAMPLES], cs[:SPREAD_RESAMPLES], starts, sizes, q, width=width
            )
    alpha = 1.0 - confidence
    if np.isnan(ratios).any() or not math.isfinite(ratio):
        nan = math.nan
        return RatioInterval(base_q, cand_q, ratio, nan, nan, n, nan, nan, nan, blocks=len(blocks))
    boot_lo, boot_hi = percentile(ratios, 100.0 * alpha / 2), percentile(ratios, 100.0 * (1 - alpha / 2))
    with np.errstate(divide="ignore"):
        log_se = float(np.std(np.log(ratios), ddof=1)) if resamples > 1 else math.nan
    theta = [_log_ratio(b.ravel(), c.ravel(), q) for b, c in padded]
    tau = block_spread(theta, [float(np.var(v, ddof=1)) if v.size > 1 else 0.0 for v in per_block])
    lo, hi = boot_lo, boot_hi
    spread_se = 0.0
    if tau > 0 and math.isfinite(tau):
        from scipy.stats import t

        # A per-pair shift moves the pooled quantile by about its share of the requests.
        shares = np.asarray(sizes, dtype=np.float64) / n
        spread_se = tau * math.sqrt(float((shares**2).sum()))
        extra = float(t.ppf(1 - alpha / 2, len(blocks) - 1)) * spread_se
        centre = math.log(ratio)
        lo = math.exp(centre - math.hypot(centre - math.log(boot_lo), extra))
        hi = math.exp(centre + math.hypot(math.log(boot_hi) - centre, extra))
    elif not math.isfinite(tau):
        lo, hi = math.nan, math.nan
        spread_se = math.nan
    return RatioInterval(
        base_q, cand_q, ratio, lo, hi, n, boot_lo, boot_hi, tau, log_se=log_se, spread_se=spread_se,
        blocks=len(blocks),
    )  # fmt: skip


def _pad(m: FloatArray, width: int) -> FloatArray:
    if m.shape[1] == width:
        return m
    out = np.full((m.shape[0], width), np.nan)
    out[:, : m.shape[1]] = m
    return out


SPREAD_RESAMPLES = 500
"""Resamples that estimate each block pair's own variance (a variance needs fewer than an interval's
2.5 % tails)."""


def _log_ratio(b: FloatArray, c: FloatArray, q: float) -> float:
    pb, pc = percentile(b, q), percentile(c, q)
    return math.log(pc / pb) if pb > 0 and pc > 0 else math.nan


def _block_log_ratios(
    bs: npt.NDArray[np.float32],
    cs: npt.NDArray[np.float32],
    starts: Sequence[int],
    sizes: Sequence[int],
    q: float,
    *,
    width: int = 1,
) -> list[FloatArray]:
    """Each block pair's resampled log ratio, from the columns of the pooled resamples that hold it."""
    out: list[FloatArray] = []
    for start, size in zip(starts, sizes, strict=True):
        cols = slice(start * width, (start + size) * width)
        qb, qc = _row_quantiles(bs[:, cols], q), _row_quantiles(cs[:, cols], q)
        with np.errstate(divide="ignore", invalid="ignore"):
            out.append(np.log(qc.astype(np.float64) / qb))
    return out


VARIANCE_FLOOR = 1e-6
"""The smallest variance of a block pair's log ratio taken as known (0.1 %): a block whose resamples
never move (one pair, ties) would otherwise weigh infinitely."""


def block_spread(theta: Sequence[float], variances: Sequence[float]) -> float:
    """``τ``: how much the block pairs' log ratios ``theta`` scatter beyond their own sampling
    ``variances`` (the DerSimonian–Laird moment estimate: Cochran's ``Q`` against its ``P − 1``
    degrees of freedom). 0 with fewer than two block pairs; NaN when a ratio is not finite.

    A neighbour that slows one arm's block and not its partner shifts that pair's ratio alone: the
    within-pair bootstrap cannot see it (it resamples requests of blocks that already ran), the spread
    between pairs does."""
    th = np.asarray(theta, dtype=np.float64)
    if th.size < 2:
        return 0.0
    if not np.isfinite(th).all():
        return math.nan
    v = np.maximum(np.nan_to_num(np.asarray(variances, dtype=np.float64), nan=VARIANCE_FLOOR), VARIANCE_FLOOR)
    w = 1.0 / v
    s1, s2 = float(w.sum()), float((w * w).sum())
    mean = float((w * th).sum()) / s1
    q_stat = float((w * (th - mean) ** 2).sum())
    tau2 = max(0.0, (q_stat - (th.size - 1)) / (s1 - s2 / s1))
    return math.sqrt(tau2)


# ---- the verdict rule -------------------------------------------------------------------------------


def decide_ratio(
    ratio: float, lo: float, hi: float, *, limit: float, detect: float, pairs: int
) -> tuple[Overall, str, int | None]:
    """The verdict on one ratio's interval, why, and (cannot be judged) about how many block pairs in
    all would decide it (the module docstring's rule)."""
    if not all(math.isfinite(x) for x in (ratio, lo, hi)):
        return "unjudgeable", "the ratio has no finite interval (a base percentile of 0?)", None
    if lo > limit:
        return "fail", f"the candidate is slower: the whole interval is above the limit {limit:g}×", None
    if hi <= detect:
        return "pass", f"a slowdown of {detect:g}× is ruled out (the interval ends at {hi:.3f}×)", None
    # Whichever side is nearer to deciding: the upper half-width falling to detect − R (pass), or
    # the lower one to R − limit (fail). Half-widths shrink as 1/√pairs.
    factors = []
    if detect > ratio:
        factors.append(((hi - ratio) / (detect - ratio)) ** 2)
    if ratio > limit and ratio > lo:
        factors.append(((ratio - lo) / (ratio - limit)) ** 2)
    then = math.ceil(pairs * min(factors)) if factors else None
    more = f"; about {then} block pairs in all would likely decide it" if then is not None else ""
    why = (
        f"neither proven above the limit {limit:g}× nor a slowdown of {detect:g}× ruled out: the interval "
        f"reaches {hi:.3f}×{more}"
    )
    return "unjudgeable", why, then


def error_rate_test(errors: int, requests: int, max_rate: float, confidence: float) -> tuple[float, bool]:
    """``(p, proven)``: the exact one-sided binomial p-value of ``errors`` of ``requests`` under an
    error rate of ``max_rate``, and whether it proves the rate above it at level ``(1 − c)/2``."""
    from scipy.stats import binom

    if requests <= 0:
        return 1.0, False
    p = float(binom.sf(errors - 1, requests, max_rate)) if errors > 0 else 1.0
    return p, p < (1.0 - confidence) / 2


# ---- the report -------------------------------------------------------------------------------------


class MetricVerdict(StrictModel):
    """One latency metric: both arms' values, the ratio with its interval, the verdict and why."""

    metric: str
    unit: str
    base: float | None
    candidate: float | None
    ratio: float | None
    lo: float | None
    hi: float | None
    pairs: int
    """Request pairs the ratio rests on."""
    unpaired: int
    """Requests of either arm left out: failed, no value of the field, or not answered in the other."""
    min_pairs: int
    bootstrap_lo: float | None = None
    bootstrap_hi: float | None = None
    """The stratified bootstrap's interval alone, before the block pairs' spread widened it."""
    block_spread: float | None = None
    """How far the block pairs' own ratios scatter beyond their requests' noise, as a factor − 1
    (``exp(τ) − 1``; 0: not at all): a neighbour that slowed single blocks."""
    verdict: Overall
    reason: str
    """One sentence with the numbers and the cause."""
    why: str
    block_pairs_needed: int | None = None
    """Cannot be judged: about how many block pairs in all would likely decide it."""
    p_value: float | None = None
    """One-sided p-value of "the candidate is at most ``limit`` × the base"
    (:meth:`RatioInterval.p_above`)."""
    tested_at: float | None = None
    """The one-sided level ``lo`` and ``hi`` are at (the family's share of this test: :func:`levels`)."""
    power: float | None = None
    """The chance this design fails a candidate ``detect`` × slower, at this run's standard error."""


class ErrorVerdict(StrictModel):
    """The candidate's error rate, judged against ``max_error_rate`` (the base's for comparison)."""

    base_errors: int
    base_requests: int
    candidate_errors: int
    candidate_requests: int
    rate: float | None
    lo: float | None
    hi: float | None
    max_error_rate: float
    p_value: float
    """``P(errors ≥ observed)`` were the true rate ``max_error_rate`` (exact binomial)."""
    verdict: Overall
    reason: str
    tested_at: float | None = None
    """The one-sided level of the Bonferroni step (Holm may reject at a larger one)."""
    detect: float | None = None
    """The error rate the test must catch (``detect_error_rate``)."""
    power: float | None = None
    """The chance of failing a candidate whose error rate is :attr:`detect`, with this many requests."""


class ABJudgement(StrictModel):
    """The A/B verdict (``OUT/ab.json``'s ``judgement``)."""

    schema_version: Literal[1] = AB_SCHEMA_VERSION
    verdict: Overall
    exit_code: int
    headline: str
    confidence: float
    limit: float
    detect: float
    block_pairs: int
    resamples: int
    seed: int
    metrics: list[MetricVerdict]
    error_rate: ErrorVerdict
    problems: list[str]
    """Why the block runs cannot be judged (empty: they can)."""
    left_out: list[str] = Field(default_factory=list)
    """Metrics the design could not judge, each with why (:func:`reachable`)."""
    family_alpha: float | None = None
    """The false-alarm rate the whole verdict holds: the chance that a candidate no slower than
    ``limit`` (and erring no more than ``max_error_rate``) fails anything, over every look and every
    test (:func:`levels`)."""
    look: int = 1
    looks: int = 1
    """This verdict's look at the data, of at most :attr:`looks` (each spends ``1/looks`` of α)."""
    tests: int = 0
    """Tests the family's α is shared among: these metrics, the error rate and ``other_tests``."""


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


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


def judge_ab(
    pairs: Sequence[tuple[ResultSet, ResultSet]],
    *,
    metrics: Sequence[Metric] | str = DEFAULT_METRICS,
    limit: float = 1.10,
    detect: float = 1.30,
    max_error_rate: float = 0.01,
    detect_error_rate: float | None = None,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    left_out: Sequence[str] = (),
    look: int = 1,
    looks: int = 1,
    other_tests: int = 0,
    more_errors: Sequence[tuple[ResultSet, ResultSet]] = (),
) -> ABJudgement:
    """Judge block pairs ``(base, candidate)`` of result sets (one per block) by the module's rule;
    ``left_out``: the metrics the design left out, and why (carried into the judgement).

    The family's false-alarm rate ``α = 1 − confidence`` is held over every test and look
    (:func:`levels`): ``look`` of at most ``looks``, and ``other_tests`` judged elsewhere on the same
    candidate (a gate file's) taking their share. ``more_errors``: further runs of both arms (a warm
    pass) whose errors count in the candidate's error rate, not in the latency ratios."""
    if not pairs:
        raise ValueError("no block pairs to judge")
    if not 0 < limit < detect:
        raise ValueError(f"need 0 < limit < detect, got limit {limit:g}, detect {detect:g}")
    chosen = parse_ab_metrics(metrics) if isinstance(metrics, str) else list(metrics)
    problems = [
        f"{arm} block {j + 1} ({rs.path}): {p}"
        for j, pair in enumerate([*pairs, *more_errors])
        for arm, rs in zip(ARMS, pair, strict=True)
        for p in rs.problems
    ]
    alpha = 1.0 - confidence
    own = len(chosen) + 1  # every latency metric and the error rate
    tests = own + other_tests
    level = levels(alpha, tests, looks)  # the Bonferroni step of one test: Holm's smallest level
    frames = [(b.frame, c.frame) for b, c in pairs]
    ratios = [_ratio(m, frames, confidence=confidence, resamples=resamples, seed=seed) for m in chosen]
    error_frames = frames + [(b.frame, c.frame) for b, c in more_errors]
    e_counts = _error_counts(error_frames)
    p_error = error_rate_test(e_counts[2], e_counts[3], max_error_rate, confidence)[0]
    p_values = [r.p_above(limit) if r is not None else 1.0 for _, _, r in ratios] + [p_error]
    rejected = holm(p_values, alpha * own / tests / looks)
    results = [
        _judge_metric(
            m, frames, sample, r, limit=limit, detect=detect, confidence=confidence,
            level=rejected[k] or level, rejected=rejected[k] is not None, problems=problems,
        )
        for k, (m, sample, r) in enumerate(ratios)
    ]  # fmt: skip
    errors = _judge_errors(
        e_counts, p=p_error, rejected=rejected[-1] is not None, max_rate=max_error_rate,
        detect=detect_error_rate, confidence=confidence, level=rejected[-1] or level, problems=problems,
    )  # fmt: skip
    verdicts: set[Overall] = {r.verdict for r in results} | {errors.verdict}
    overall: Overall = "fail" if "fail" in verdicts else "unjudgeable" if verdicts - {"pass"} else "pass"
    every = [r.verdict for r in results] + [errors.verdict]
    counts = {v: every.count(v) for v in ("pass", "fail", "unjudgeable")}
    headline = (
        f"{VERDICT_WORDS[overall]}: {counts['pass']} passed, {counts['fail']} failed, "
        f"{counts['unjudgeable']} cannot be judged ({len(pairs)} block pairs"
        + (f", look {look} of at most {looks}" if looks > 1 else "")
        + f"; family-wise false-alarm rate {alpha:.0%}"
        + (f"; {len(left_out)} metric(s) left out by design" if left_out else "")
        + ")"
    )
    return ABJudgement(
        verdict=overall, exit_code=int(EXIT_CODES[overall]), headline=headline, confidence=confidence,
        limit=limit, detect=detect, block_pairs=len(pairs), resamples=resamples, seed=seed,
        metrics=results, error_rate=errors, problems=problems, left_out=list(left_out),
        family_alpha=alpha, look=look, looks=looks, tests=tests,
    )  # fmt: skip


Sample = tuple[list[FloatArray], list[FloatArray], int]


def _ratio(
    metric: Metric,
    frames: Sequence[tuple[RunFrame, RunFrame]],
    *,
    confidence: float,
    resamples: int,
    seed: int,
) -> tuple[Metric, Sample, RatioInterval | None]:
    assert metric.column is not None and metric.q is not None
    sample = paired_samples(frames, metric.column, pooled=metric.kind == "pooled")
    if sum(b.shape[0] for b in sample[0]) == 0:
        return metric, sample, None
    r = ratio_interval(sample[0], sample[1], metric.q, confidence=confidence, resamples=resamples, seed=seed)
    return metric, sample, r


def _judge_metric(
    metric: Metric,
    frames: Sequence[tuple[RunFrame, RunFrame]],
    sample: Sample,
    r: RatioInterval | None,
    *,
    limit: float,
    detect: float,
    confidence: float,
    level: float,
    rejected: bool,
    problems: Sequence[str],
) -> MetricVerdict:
    assert metric.column is not None and metric.q is not None
    q, unit = metric.q, metric.unit
    base, _, left_out = sample
    n = sum(b.shape[0] for b in base)
    need = min_pairs(q)
    lo, hi = r.bounds(level) if r is not None else (math.nan, math.nan)

    def verdict(v: Overall, why: str, then: int | None = None) -> MetricVerdict:
        if r is None:
            numbers = f"{n} request pairs"
        else:
            numbers = (
                f"base {format_value(r.base, unit)}, candidate {format_value(r.candidate, unit)}, ratio "
                f"{format_value(r.ratio, 'x')} {format_interval(lo, hi, 'x')} (one-sided {level:.2g} each "
                f"side), {n} request pairs"
            )
        return MetricVerdict(
            metric=metric.name, unit=unit,
            base=_finite(r.base) if r else None, candidate=_finite(r.candidate) if r else None,
            ratio=_finite(r.ratio) if r else None, lo=_finite(lo), hi=_finite(hi), pairs=n,
            unpaired=left_out, min_pairs=need,
            bootstrap_lo=_finite(r.boot_lo) if r else None, bootstrap_hi=_finite(r.boot_hi) if r else None,
            block_spread=_finite(math.expm1(r.spread)) if r else None, verdict=v,
            reason=f"{v}: {numbers}; {why}", why=why, block_pairs_needed=then,
            p_value=_finite(r.p_above(limit)) if r else None, tested_at=level,
            power=_finite(r.power(limit, detect, level)) if r else None,
        )  # fmt: skip

    if r is None or n == 0:
        return verdict("unjudgeable", f"no request was answered with a {metric.column} by both arms")
    if problems:
        return verdict("unjudgeable", f"the block runs cannot be judged: {problems[0]}")
    if n < need:
        per_block = n / len(frames)
        then = math.ceil(need / per_block) if per_block > 0 else None
        why = f"a P{q:g} needs ≥ {need} request pairs ({TAIL_SAMPLES} beyond it), this run has {n}"
        if then is not None:
            why += f": about {then} block pairs of this size, or larger blocks"
        return verdict("unjudgeable", why, then)
    if rejected:
        why = (
            f"the candidate is slower: proven above the limit {limit:g}× (p = {r.p_above(limit):.2g}, "
            "Holm–Bonferroni over the verdict's tests)"
        )
        return verdict("fail", why)
    # Not rejected, so ``lo ≤ limit`` (Holm rejects every p below its first level, the bounds'):
    # decide_ratio can only pass it or leave it undecided here.
    v, why, then = decide_ratio(r.ratio, lo, hi, limit=limit, detect=detect, pairs=len(frames))
    if r.spread > 0:
        why += f" (the block pairs' ratios scatter {math.expm1(r.spread):.0%} beyond their requests' noise)"
    return verdict(v, why, then)


def _error_counts(frames: Sequence[tuple[RunFrame, RunFrame]]) -> tuple[int, int, int, int]:
    """``(base errors, base requests, candidate errors, candidate requests)``."""
    b_err = sum(int((~b.ok).sum()) for b, _ in frames)
    b_n = sum(b.n for b, _ in frames)
    c_err = sum(int((~c.ok).sum()) for _, c in frames)
    c_n = sum(c.n for _, c in frames)
    return b_err, b_n, c_err, c_n


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


def _judge_errors(
    counts: tuple[int, int, int, int],
    *,
    p: float,
    rejected: bool,
    max_rate: float,
    detect: float | None,
    confidence: float,
    level: float,
    problems: Sequence[str],
) -> ErrorVerdict:
    b_err, b_n, c_err, c_n = counts
    lo, hi = rate_interval(c_err, c_n, confidence)
    rate = c_err / c_n if c_n else math.nan
    numbers = (
        f"candidate {c_err} of {c_n} requests failed ({format_value(rate, 'ratio')}, "
        f"{format_interval(lo, hi, 'ratio')}), base {b_err} of {b_n}"
    )
    v: Overall
    if c_n == 0:
        v, why = "unjudgeable", "the candidate recorded no request"
    elif rejected:
        # Errors are the candidate's answers, whatever else went wrong: proven is proven.
        v, why = "fail", f"proven above {format_value(max_rate, 'ratio')} (exact binomial test, p = {p:.2g})"
    elif problems:
        v, why = "unjudgeable", f"the block runs cannot be judged: {problems[0]}"
    elif detect is not None and (upper := rate_upper(c_err, c_n, level)) >= detect:
        # As for latency, a pass rules out the regression it is sized for; "not proven above the
        # limit" from a few requests is not that (3 errors in 32, a 20 % error rate, prove nothing).
        zero = math.ceil(math.log(level) / math.log1p(-detect))
        v, why = (
            "unjudgeable",
            (
                f"not proven above {format_value(max_rate, 'ratio')} (p = {p:.2g}), nor "
                f"{format_value(detect, 'ratio')} ruled out (the bound at {level:.2g} is "
                f"{format_value(upper, 'ratio')}): that needs ≥ {zero} requests without an error"
            ),
        )
    else:
        v, why = (
            "pass",
            f"not proven above {format_value(max_rate, 'ratio')} (p = {p:.2g})"
            + (f"; {format_value(detect, 'ratio')} ruled out" if detect is not None else ""),
        )
    return ErrorVerdict(
        base_errors=b_err, base_requests=b_n, candidate_errors=c_err, candidate_requests=c_n,
        rate=_finite(rate), lo=_finite(lo), hi=_finite(hi), max_error_rate=max_rate, p_value=p,
        verdict=v, reason=f"{v}: {numbers}; {why}", tested_at=level, detect=detect,
        power=error_power(c_n, max_rate, detect, level) if detect is not None else None,
    )  # fmt: skip


VERDICT_STYLE = {"pass": "green", "fail": "bold red", "unjudgeable": "yellow"}


def ab_table(j: ABJudgement) -> Table:
    """One row per metric (base, candidate, ratio, interval, p-value, power, pairs, verdict) and one for
    errors; the caption states the family-wise false-alarm rate and the levels."""
    alpha = j.family_alpha if j.family_alpha is not None else 1.0 - j.confidence
    # The first (Bonferroni) level is every test's smallest; a failed test's bounds are at the larger
    # Holm level it was rejected at.
    tested = [m.tested_at for m in j.metrics] + [j.error_rate.tested_at]
    level = min((t for t in tested if t), default=None)
    t = Table(
        title=escape(f"A/B: candidate ÷ base — {j.headline}"),
        title_justify="left",
        caption=f"family-wise false-alarm rate {alpha:.0%} over {j.tests or len(j.metrics) + 1} tests and "
        f"{j.looks} look(s) (Holm–Bonferroni); bounds one-sided at {level or 0:.2g} each (a failed "
        f"test's at the level Holm rejected it at); fail when proven above {j.limit:g}×, pass when "
        f"{j.detect:g}× is ruled out; power: the chance of failing a "
        f"candidate {j.detect:g}× slower (errors: at {j.error_rate.detect or 0:.0%}) at this run's size",
        caption_justify="left",
    )
    for col, just in (
        ("metric", "left"), ("base", "right"), ("candidate", "right"), ("ratio", "right"),
        ("interval", "right"), ("p", "right"), ("power", "right"), ("pairs", "right"), ("verdict", "left"),
        ("why", "left"),
    ):  # fmt: skip
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for m in j.metrics:
        t.add_row(
            m.metric,
            format_value(m.base, m.unit),
            format_value(m.candidate, m.unit),
            format_value(m.ratio, "x"),
            format_interval(m.lo, m.hi, "x"),
            f"{m.p_value:.2g}" if m.p_value is not None else "—",
            f"{m.power:.2f}" if m.power is not None else "—",
            str(m.pairs),
            f"[{VERDICT_STYLE[m.verdict]}]{m.verdict}[/]",
            escape(m.why),
        )
    e = j.error_rate
    base_rate = e.base_errors / e.base_requests if e.base_requests else None
    t.add_row(
        "error_rate",
        format_value(base_rate, "ratio"),
        format_value(e.rate, "ratio"),
        "—",
        format_interval(e.lo, e.hi, "ratio"),
        f"{e.p_value:.2g}",
        f"{e.power:.2f}" if e.power is not None else "—",
        str(e.candidate_requests),
        f"[{VERDICT_STYLE[e.verdict]}]{e.verdict}[/]",
        escape(e.reason.split("; ", 1)[-1]),
    )
    return t
