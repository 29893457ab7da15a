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

**The rule**, for a metric with interval ``[lo, hi]`` at confidence ``c``:

- **fail** when ``lo > limit``: the candidate is proven slower than ``limit`` × the base;
- **pass** when not, and ``hi ≤ detect``: a slowdown of ``detect`` × is ruled out;
- **cannot be judged** otherwise, with how many block pairs would likely decide it: the interval's
  half-width on the side that decides shrinks as ``1/√pairs``.

The candidate's **error rate** is judged absolutely: fail when an exact one-sided binomial test proves
it above ``max_error_rate`` at level ``(1 − c)/2`` (the one-sided level of the latency intervals), pass
otherwise. Overall: fail > cannot be judged > pass, exit 1 / 6 / 0 (:data:`harness.gates.judge.EXIT_CODES`).
A block run that cannot be judged itself (client-bound, interrupted, its counts disagreeing) makes every
verdict *cannot be judged*: its numbers are not the target's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

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

AB_SCHEMA_VERSION: Literal[1] = 1
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
DEFAULT_METRICS = "ttft_p50,tpot_p50,e2e_p50,tpot_p95"
TAIL_SAMPLES = 10
"""Pairs a percentile needs on its far side (``n · min(q, 1 − q) ≥ 10``) before its bootstrap
interval means anything: 20 for a median, 200 for a P95, 1 000 for a P99."""
_CELLS_PER_CHUNK = 4_000_000
"""Bootstrap cells (resamples × pairs) drawn at once: bounds the memory of a large run (~64 MB)."""
ARMS = ("base", "candidate")


def ab_metric(name: str) -> Metric:
    """The latency metric ``name`` an A/B run can judge: a percentile of a latency field the client
    timed (``ttft_p50``, ``tpot_p95``, ``e2e_from_intended_p99`` …). ``ValueError`` names the others."""
    known = ab_metric_names()
    if name not in known:
        raise ValueError(f"{name!r} is not a latency percentile an A/B run judges; known: {', '.join(known)}")
    return METRICS.get(name)


def ab_metric_names() -> list[str]:
    """Every metric :func:`ab_metric` accepts."""
    return [
        name
        for name, m in METRICS.items()
        if m.kind == "percentile" and m.column is not None and m.client_timed and m.default_phase is None
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

    ``base[j][i]`` and ``candidate[j][i]`` are the same request's latency in block pair ``j``; each
    resample draws, with replacement, as many pairs from every block pair as it holds (stratified).
    Block pairs without pairs are skipped. ``ValueError`` when there are none at all, or arrays of a
    block pair differ in length."""
    if len(base) != len(candidate):
        raise ValueError("base and candidate have different numbers of block pairs")
    pairs = zip(base, candidate, strict=True)
    blocks = [(np.asarray(b, np.float64), np.asarray(c, np.float64)) for b, c in pairs]
    for j, (b, c) in enumerate(blocks):
        if b.shape != c.shape or b.ndim != 1:
            raise ValueError(
                f"block pair {j + 1}: base and candidate are not paired ({b.shape} vs {c.shape})"
            )
    blocks = [(b, c) for b, c in blocks if b.size]
    if not blocks:
        raise ValueError("no request pairs")
    b_all = np.concatenate([b for b, _ in blocks])
    c_all = np.concatenate([c for _, c in blocks])
    n = int(b_all.size)
    base_q, cand_q = percentile(b_all, q), percentile(c_all, q)
    ratio = cand_q / base_q if base_q > 0 else math.nan
    k = interval_ranks(n, q)[1]
    rng = np.random.default_rng(seed)
    sizes = [b.size for b, _ in blocks]
    starts = [int(x) for x in np.cumsum([0, *sizes[:-1]])]
    ratios = np.empty(resamples, dtype=np.float64)
    chunk = max(1, _CELLS_PER_CHUNK // n)
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
        bs, cs = b32[idx], c32[idx]
        qb = np.partition(bs, k, axis=1)[:, k]
        qc = np.partition(cs, k, axis=1)[:, k]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[first : first + rows] = np.where(qb > 0, qc.astype(np.float64) / qb, np.nan)
        if first == 0:  # each block pair's own log ratio over the same resamples (a few hundred do)
            per_block = _block_log_ratios(bs[:SPREAD_RESAMPLES], cs[:SPREAD_RESAMPLES], starts, sizes, q)
    alpha = 1.0 - confidence
    if np.isnan(ratios).any() or not math.isfinite(ratio):
        nan = math.nan
        return RatioInterval(base_q, cand_q, ratio, nan, nan, n, nan, nan, nan)
    boot_lo, boot_hi = percentile(ratios, 100.0 * alpha / 2), percentile(ratios, 100.0 * (1 - alpha / 2))
    theta = [_log_ratio(b, c, q) for b, c in blocks]
    tau = block_spread(theta, [float(np.var(v, ddof=1)) if v.size > 1 else 0.0 for v in per_block])
    lo, hi = boot_lo, boot_hi
    if tau > 0 and math.isfinite(tau):
        from scipy.stats import t

        # A per-pair shift moves the pooled quantile by about its share of the requests.
        shares = np.asarray(sizes, dtype=np.float64) / n
        extra = float(t.ppf(1 - alpha / 2, len(blocks) - 1)) * tau * math.sqrt(float((shares**2).sum()))
        centre = math.log(ratio)
        lo = math.exp(centre - math.hypot(centre - math.log(boot_lo), extra))
        hi = math.exp(centre + math.hypot(math.log(boot_hi) - centre, extra))
    elif not math.isfinite(tau):
        lo, hi = math.nan, math.nan
    return RatioInterval(base_q, cand_q, ratio, lo, hi, n, boot_lo, boot_hi, tau)


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
) -> list[FloatArray]:
    """Each block pair's resampled log ratio, from the columns of the pooled resamples that hold it."""
    out: list[FloatArray] = []
    for start, size in zip(starts, sizes, strict=True):
        k = interval_ranks(size, q)[1]
        qb = np.partition(bs[:, start : start + size], k, axis=1)[:, k]
        qc = np.partition(cs[:, start : start + size], k, axis=1)[:, k]
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


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def paired_samples(
    pairs: Sequence[tuple[RunFrame, RunFrame]], column: str
) -> tuple[list[FloatArray], list[FloatArray], int]:
    """Per block pair, the ``column`` values of the requests both arms answered with a value, in the
    same order (by request id); and how many requests of either arm were left out."""
    base_out: list[FloatArray] = []
    cand_out: list[FloatArray] = []
    left_out = 0
    for base, cand in pairs:
        b, c = _by_id(base, column), _by_id(cand, column)
        common = [i for i in b if i in c]
        left_out += (len(b) - len(common)) + (len(c) - len(common))
        left_out += (base.n - len(b)) + (cand.n - len(c))
        base_out.append(np.asarray([b[i] for i in common], dtype=np.float64))
        cand_out.append(np.asarray([c[i] for i in common], dtype=np.float64))
    return base_out, cand_out, left_out


def _by_id(frame: RunFrame, column: str) -> dict[str, float]:
    """Request id → value, for the requests that succeeded with a finite value (an id seen twice in a
    block is ambiguous and left out)."""
    values = frame.col(column)
    usable = frame.ok & np.isfinite(values) & ~frame.bad(column)
    ids = frame.text["id"]
    seen: dict[str, int] = {}
    for i in ids:
        seen[str(i)] = seen.get(str(i), 0) + 1
    return {str(i): float(v) for i, v, u in zip(ids, values, usable, strict=True) if u and seen[str(i)] == 1}


def judge_ab(
    pairs: Sequence[tuple[ResultSet, ResultSet]],
    *,
    metrics: Sequence[Metric] | str = DEFAULT_METRICS,
    limit: float = 1.10,
    detect: float = 1.30,
    max_error_rate: float = 0.01,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    left_out: Sequence[str] = (),
) -> ABJudgement:
    """Judge block pairs ``(base, candidate)`` of result sets (one per block) by the module's rule;
    ``left_out``: the metrics the design left out, and why (carried into the judgement)."""
    if not pairs:
        raise ValueError("no block pairs to judge")
    if not 0 < limit < detect:
        raise ValueError(f"need 0 < limit < detect, got limit {limit:g}, detect {detect:g}")
    chosen = parse_ab_metrics(metrics) if isinstance(metrics, str) else list(metrics)
    problems = [
        f"{arm} block {j + 1} ({rs.path}): {p}"
        for j, pair in enumerate(pairs)
        for arm, rs in zip(ARMS, pair, strict=True)
        for p in rs.problems
    ]
    frames = [(b.frame, c.frame) for b, c in pairs]
    results = [
        _judge_metric(
            m,
            frames,
            limit=limit,
            detect=detect,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
            problems=problems,
        )
        for m in chosen
    ]
    errors = _judge_errors(frames, max_error_rate, confidence, problems)
    verdicts: set[Overall] = {r.verdict for r in results} | {errors.verdict}
    overall: Overall = "fail" if "fail" in verdicts else "unjudgeable" if verdicts - {"pass"} else "pass"
    every = [r.verdict for r in results] + [errors.verdict]
    counts = {v: every.count(v) for v in ("pass", "fail", "unjudgeable")}
    headline = (
        f"{VERDICT_WORDS[overall]}: {counts['pass']} passed, {counts['fail']} failed, "
        f"{counts['unjudgeable']} cannot be judged ({len(pairs)} block pairs"
        + (f"; {len(left_out)} metric(s) left out by design" if left_out else "")
        + ")"
    )
    return ABJudgement(
        verdict=overall, exit_code=int(EXIT_CODES[overall]), headline=headline, confidence=confidence,
        limit=limit, detect=detect, block_pairs=len(pairs), resamples=resamples, seed=seed,
        metrics=results, error_rate=errors, problems=problems, left_out=list(left_out),
    )  # fmt: skip


def _judge_metric(
    metric: Metric,
    frames: Sequence[tuple[RunFrame, RunFrame]],
    *,
    limit: float,
    detect: float,
    confidence: float,
    resamples: int,
    seed: int,
    problems: Sequence[str],
) -> MetricVerdict:
    assert metric.column is not None and metric.q is not None
    q, unit = metric.q, metric.unit
    base, cand, left_out = paired_samples(frames, metric.column)
    n = sum(b.size for b in base)
    need = min_pairs(q)

    def verdict(
        v: Overall, why: str, r: RatioInterval | None = None, then: int | None = None
    ) -> MetricVerdict:
        if r is None:
            numbers = f"{n} request pairs"
        else:
            numbers = (
                f"base {format_value(r.base, unit)}, candidate {format_value(r.candidate, unit)}, ratio "
                f"{format_value(r.ratio, 'x')} {format_interval(r.lo, r.hi, 'x')} at {confidence:.0%}, "
                f"{n} request pairs"
            )
        return MetricVerdict(
            metric=metric.name, unit=unit,
            base=_finite(r.base) if r else None, candidate=_finite(r.candidate) if r else None,
            ratio=_finite(r.ratio) if r else None, lo=_finite(r.lo) if r else None,
            hi=_finite(r.hi) if r else None, pairs=n, unpaired=left_out, min_pairs=need,
            bootstrap_lo=_finite(r.boot_lo) if r else None, bootstrap_hi=_finite(r.boot_hi) if r else None,
            block_spread=_finite(math.expm1(r.spread)) if r else None, verdict=v,
            reason=f"{v}: {numbers}; {why}", why=why, block_pairs_needed=then,
        )  # fmt: skip

    if n == 0:
        return verdict("unjudgeable", f"no request was answered with a {metric.column} by both arms")
    r = ratio_interval(base, cand, q, confidence=confidence, resamples=resamples, seed=seed)
    if problems:
        return verdict("unjudgeable", f"the block runs cannot be judged: {problems[0]}", r)
    if n < need:
        per_block = n / len(frames)
        then = math.ceil(need / per_block) if per_block > 0 else None
        why = f"a P{q:g} needs ≥ {need} request pairs ({TAIL_SAMPLES} beyond it), this run has {n}"
        if then is not None:
            why += f": about {then} block pairs of this size, or larger blocks"
        return verdict("unjudgeable", why, r, then)
    v, why, then = decide_ratio(r.ratio, r.lo, r.hi, limit=limit, detect=detect, pairs=len(frames))
    if r.spread > 0:
        why += (
            f" (widened from {format_interval(r.boot_lo, r.boot_hi, 'x')}: the block pairs' ratios scatter "
            f"{math.expm1(r.spread):.0%} beyond their requests' noise)"
        )
    return verdict(v, why, r, then)


def _judge_errors(
    frames: Sequence[tuple[RunFrame, RunFrame]], max_rate: float, confidence: float, problems: Sequence[str]
) -> ErrorVerdict:
    b_err = sum(int((~b.ok).sum()) for b, _ in frames)
    b_n = sum(b.n for b, _ in frames)
    c_err = sum(int((~c.ok).sum()) for _, c in frames)
    c_n = sum(c.n for _, c in frames)
    p, proven = error_rate_test(c_err, c_n, max_rate, confidence)
    lo, hi = rate_interval(c_err, c_n, confidence)
    rate = c_err / c_n if c_n else math.nan
    numbers = (
        f"candidate {c_err} of {c_n} requests failed ({format_value(rate, 'ratio')}, "
        f"{format_interval(lo, hi, 'ratio')}), base {b_err} of {b_n}"
    )
    v: Overall
    if c_n == 0:
        v, why = "unjudgeable", "the candidate recorded no request"
    elif problems:
        v, why = "unjudgeable", f"the block runs cannot be judged: {problems[0]}"
    elif proven:
        v, why = "fail", f"proven above {format_value(max_rate, 'ratio')} (exact binomial test, p = {p:.2g})"
    else:
        v, why = "pass", f"not proven above {format_value(max_rate, 'ratio')} (p = {p:.2g})"
    return ErrorVerdict(
        base_errors=b_err, base_requests=b_n, candidate_errors=c_err, candidate_requests=c_n,
        rate=_finite(rate), lo=_finite(lo), hi=_finite(hi), max_error_rate=max_rate, p_value=p,
        verdict=v, reason=f"{v}: {numbers}; {why}",
    )  # fmt: skip


VERDICT_STYLE = {"pass": "green", "fail": "bold red", "unjudgeable": "yellow"}


def ab_table(j: ABJudgement) -> Table:
    """One row per metric (base, candidate, ratio, interval, pairs, verdict) and one for errors."""
    t = Table(
        title=escape(f"A/B: candidate ÷ base — {j.headline}"),
        title_justify="left",
        caption=f"intervals at {j.confidence:.0%} (stratified bootstrap, {j.resamples} resamples); fail when "
        f"the interval is above {j.limit:g}×, pass when it ends at or below {j.detect:g}×",
        caption_justify="left",
    )
    for col, just in (
        ("metric", "left"), ("base", "right"), ("candidate", "right"), ("ratio", "right"),
        ("interval", "right"), ("pairs", "right"), ("verdict", "left"), ("why", "left"),
    ):  # fmt: skip
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for m in j.metrics:
        t.add_row(
            m.metric,
            format_value(m.base, m.unit),
            format_value(m.candidate, m.unit),
            format_value(m.ratio, "x"),
            format_interval(m.lo, m.hi, "x"),
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
        str(e.candidate_requests),
        f"[{VERDICT_STYLE[e.verdict]}]{e.verdict}[/]",
        escape(e.reason.split("; ", 1)[-1]),
    )
    return t
