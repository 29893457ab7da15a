"""The A/B verdict: is a candidate target slower than a base target measured beside it, block by block?

``harness ab`` (:mod:`harness.experiments.ab`) replays block pairs of distinct requests against two
targets, alternating A B B A …, each block pair sending the same requests to both. This module judges
what it measured; it needs no stored latency, only the two arms' records. The statistics it rests on
(request pairs, each metric's ratio ``R = Q_candidate ÷ Q_base`` with its stratified bootstrap
interval widened by the block pairs' excess spread, the ratio's ``t`` test, the error rate's exact
binomial test, Holm–Bonferroni) are :mod:`harness.gates.ab_stats`'s.

**The metrics** are percentiles of a latency field the client timed, of every inter-token gap pooled,
or of the prefill KV bytes the target counted (:func:`ab_metric`); one a design of too few request
pairs can never judge is left out and said (:func:`reachable`).

**The family.** α = ``1 − confidence`` is the chance that a candidate no slower than ``limit`` and
erring no more than ``max_error_rate`` fails anything, over every test and every look
(:func:`~harness.gates.ab_stats.levels`): with ``m`` tests in all (these metrics, the error rate, and
``other_tests`` judged elsewhere on the candidate, a gate file's) and ``K`` looks, the metrics and the
error rate are rejected by Holm–Bonferroni (:func:`~harness.gates.ab_stats.holm`) at
``α · own / m / K``. For a metric:

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
from typing import Literal

from pydantic import Field
from rich.markup import escape
from rich.table import Table

from harness.common.model import StrictModel
from harness.gates.ab_stats import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    TAIL_SAMPLES,
    RatioInterval,
    error_power,
    error_rate_test,
    holm,
    levels,
    min_pairs,
    paired_samples,
    rate_upper,
    ratio_interval,
)
from harness.gates.judge import EXIT_CODES, VERDICT_WORDS, Overall
from harness.gates.measurement import rate_interval
from harness.gates.metrics import METRICS, Metric, format_interval, format_value
from harness.gates.runs import FloatArray, ResultSet, RunFrame
from harness.load.results import BYTES_FIELDS

AB_SCHEMA_VERSION: Literal[1] = 1
DEFAULT_METRICS = "ttft_p50,tpot_p50,itl_p50,e2e_p50,tpot_p95,itl_p95"
"""The engine's latencies: first token, decode (per request and every gap pooled) at the median and
the P95, and the whole answer."""
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
    (:meth:`~harness.gates.ab_stats.RatioInterval.p_above`)."""
    tested_at: float | None = None
    """The one-sided level ``lo`` and ``hi`` are at (the family's share of this test:
    :func:`~harness.gates.ab_stats.levels`)."""
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
    test (:func:`~harness.gates.ab_stats.levels`)."""
    look: int = 1
    looks: int = 1
    """This verdict's look at the data, of at most :attr:`looks` (each spends ``1/looks`` of α)."""
    tests: int = 0
    """Tests the family's α is shared among: these metrics, the error rate and ``other_tests``."""


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _looks_text(look: int, looks: int, *, warm: bool) -> str:
    """Where this judgement stands among those the family's α is split over. The one after a warm
    pass is one more than the blocks' looks (``--looks 2`` with a warm pass: at most 3), so it says
    which look it follows rather than "look 3 of at most 3" beside a recipe that asked for 2."""
    if warm:
        return f" after look {look - 1} and the warm pass, judgement {look} of at most {looks}"
    return f", look {look} of at most {looks}" if looks > 1 else ""


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
    (:func:`~harness.gates.ab_stats.levels`): ``look`` of at most ``looks``, and ``other_tests`` judged
    elsewhere on the same candidate (a gate file's) taking their share. ``more_errors``: further runs of
    both arms (a warm pass) whose errors count in the candidate's error rate, not in the latency ratios."""
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
        + _looks_text(look, looks, warm=bool(more_errors))
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
