"""The decision rule: a measured metric, its interval and a gate's limit → pass, fail or cannot judge.

**Rule** (documented with its measured false-alarm rate in docs/gates.md). Each gate has a *limit*
(``threshold ± tolerance``) and each measurement a two-sided interval at the baseline's confidence
``c`` (order statistics for percentiles, Clopper–Pearson for rates). For an ``at_most`` gate:

- **pass** when the interval's upper end is within the limit (``hi ≤ limit``): the run shows, at
  confidence ``(1 + c) / 2`` one-sided, that the true percentile is within the limit;
- **fail** when its lower end is beyond the limit (``lo > limit``): the run shows a regression;
- **inconclusive** otherwise: the interval straddles the limit, the run is too small to tell.

(``at_least`` mirrors it.) A run whose true value sits exactly at the limit fails with probability at
most ``(1 − c) / 2`` = 2.5 % per gate at the default 95 %, whatever the distribution, so a verdict
does not flip on noise; the point estimate alone would fail such a run half the time.

**Client jitter.** The interval of a latency the client timed is widened by the client's own
lateness at the same quantile (:func:`harness.gates.measurement.client_jitter`), and the reason says so:
jitter that is small against the margin changes nothing, jitter comparable to it makes the gate
inconclusive, and a regression beyond the widened interval still fails. A target that saturated
(requests waited for a free user) is judged like any other: the wait is its doing.

**Blind gates.** A gate ``harness baseline calibrate`` marked ``blind`` (its runs scattered so
widely that the limit holds twice the fastest run) cannot pass: within its limit it is inconclusive,
because a 2× slower target would be within it too; beyond the limit it still fails.

**Conservative judgement.** An inconclusive gate is not a pass: it counts as *cannot be judged*
(exit 6) like too few samples, NaN samples, a client-bound or interrupted run, a missing metric or
an estimated prefill peak where a measured one is required. A proven regression (exit 1) outranks
cannot-be-judged, which outranks pass (exit 0).

**Skipped gates.** On a result set whose machine, target or recipe is not the baseline's fingerprint
(:func:`harness.gates.fingerprints.compare`: ``judged`` false) a gate on a speed-dependent metric
(absolute latencies) is *skipped*: its numbers are shown, its ``why`` says what differs, and it
counts neither as a pass nor as cannot-be-judged. The other gates decide the overall verdict, so a
report whose other gates pass is a pass (exit 0); one whose every gate is skipped is a pass too (no
regression proven, nothing refused), and its headline says ``N skipped (every gate skipped: nothing
was judged on this run)`` so it is not mistaken for a judged pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from harness.common.errors import ExitCode
from harness.common.io import write_json
from harness.common.model import StrictModel
from harness.gates.baseline import Baseline, Gate, baseline_sha256
from harness.gates.fingerprints import RECALIBRATE, EnvironmentMatch, compare
from harness.gates.measurement import REFERENCE_LABEL, Measurement
from harness.gates.metrics import Direction, format_interval, format_value
from harness.gates.power import CountTest, describe_need, exceedance_test
from harness.gates.runs import ResultSet, RunFrame

GATE_REPORT_SCHEMA_VERSION: Literal[1] = 1

Verdict = Literal["pass", "fail", "inconclusive", "unjudgeable", "skipped"]
"""One gate's verdict; ``skipped``: a latency gate on a set measured elsewhere than the baseline."""
Overall = Literal["pass", "fail", "unjudgeable"]

VERDICT_WORDS: dict[Overall, str] = {"pass": "PASS", "fail": "FAIL", "unjudgeable": "CANNOT BE JUDGED"}
EXIT_CODES: dict[Overall, ExitCode] = {
    "pass": ExitCode.OK,
    "fail": ExitCode.CHECK_FAILED,
    "unjudgeable": ExitCode.UNJUDGEABLE,
}
SKIPPED_WHY = (
    f"its latency gates are skipped here (calibrate a baseline on this runner type to judge them: "
    f"{RECALIBRATE.removeprefix('recalibrate: ')})"
)
"""What a skipped gate's ``why`` adds to the fingerprint's reason."""


class GateResult(StrictModel):
    """One gate on one result set (one JUnit test case). Unbounded or unknown numbers are ``None``."""

    id: str
    metric: str
    label: str
    """The result set it was judged on (``""`` when no set of the gate's phase was given)."""
    unit: str
    direction: Direction
    scenario: str | None = None
    stage: str | None = None
    baseline: float
    """The gate's threshold."""
    limit: float
    measured: float | None
    delta: float | None
    """``measured − baseline``, in the unit."""
    delta_pct: float | None
    lo: float | None
    hi: float | None
    confidence: float
    n: int
    min_samples: int
    verdict: Verdict
    reason: str
    """One sentence with the numbers and the cause (the JUnit failure message)."""
    why: str
    """The cause alone (``interval entirely above the limit``, ``the run was client-bound …``)."""
    jitter: float = 0.0
    """The client's own lateness (ms) at the metric's quantile by which ``lo``/``hi`` were widened
    (0: not widened)."""
    detect: float | None = None
    """The regression the gate was to catch (:attr:`harness.gates.baseline.Gate.detect`)."""
    power: float | None = None
    """The exact test's power against ``detect`` at this run's size (``None``: no count test)."""
    needed: int | None = None
    """The samples that would give the baseline's power (``None``: none reach it, or no count test)."""

    @property
    def case_name(self) -> str:
        return self.id

    def interval_text(self) -> str:
        lo = -math.inf if self.lo is None and self.measured is not None else self.lo
        hi = math.inf if self.hi is None and self.measured is not None else self.hi
        return format_interval(lo, hi, self.unit)


class ResultRef(StrictModel):
    label: str
    path: str
    requests: int
    problems: list[str]
    started_at: str | None = None
    target: str | None = None
    environment_match: EnvironmentMatch | None = None
    """This set compared with the baseline's fingerprint (machine, target, recipe): whether gates on
    absolute latencies were judged on it, and why not."""


class BaselineRef(StrictModel):
    name: str
    path: str | None = None
    sha256: str | None = None


class GateReport(StrictModel):
    """The JSON verdict of ``harness gate``."""

    schema_version: Literal[1] = GATE_REPORT_SCHEMA_VERSION
    verdict: Overall
    exit_code: int
    baseline: BaselineRef
    confidence: float
    results: list[ResultRef]
    gates: list[GateResult]

    def counts(self) -> dict[Verdict, int]:
        out: dict[Verdict, int] = {"pass": 0, "fail": 0, "inconclusive": 0, "unjudgeable": 0, "skipped": 0}
        for g in self.gates:
            out[g.verdict] += 1
        return out

    @property
    def all_skipped(self) -> bool:
        """Every gate was skipped (measured elsewhere than the baseline): a pass that judged nothing."""
        return bool(self.gates) and all(g.verdict == "skipped" for g in self.gates)

    def tally(self) -> str:
        """``14 passed, 0 failed, 0 cannot be judged``, then ``, 9 skipped (…)`` when any was."""
        c = self.counts()
        cannot = c["inconclusive"] + c["unjudgeable"]
        text = f"{c['pass']} passed, {c['fail']} failed, {cannot} cannot be judged"
        if c["skipped"]:
            text += f", {c['skipped']} skipped " + (
                "(every gate skipped: nothing was judged on this run)"
                if self.all_skipped
                else "(latency gates on a machine, target or recipe other than the baseline's)"
            )
        return text

    def headline(self) -> str:
        """``FAIL: 13 passed, 1 failed, 0 cannot be judged (failed: tpot_p95@warm)``; skipped gates
        are counted after the rest (:meth:`tally`)."""
        text = f"{VERDICT_WORDS[self.verdict]}: {self.tally()}"
        failed = [f"{g.id}@{g.label}" if g.label else g.id for g in self.gates if g.verdict == "fail"]
        if failed:
            text += f" (failed: {', '.join(failed)})"
        return text


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def decide(m: Measurement, limit: float, direction: Direction, min_samples: int) -> tuple[Verdict, str]:
    """The verdict on one measurement and why (without the gate's name; see :func:`judge_gate`)."""
    if m.problems:
        return "unjudgeable", "; ".join(m.problems)
    if m.n == 0 or math.isnan(m.value):
        return "unjudgeable", "no samples: the metric is missing from these records"
    if m.n < min_samples:
        return "unjudgeable", f"{m.n} samples, fewer than min_samples {min_samples}"
    if math.isnan(m.lo) or math.isnan(m.hi):
        return "unjudgeable", "no interval could be computed"
    if direction == "at_most":
        if m.hi <= limit:
            return "pass", "interval within the limit"
        if m.lo > limit:
            return "fail", "interval entirely above the limit"
    else:
        if m.lo >= limit:
            return "pass", "interval within the limit"
        if m.hi < limit:
            return "fail", "interval entirely below the limit"
    return (
        "inconclusive",
        "interval straddles the limit: too few samples to decide, counted as cannot be judged",
    )


def count_test(
    gate: Gate, frame: RunFrame, m: Measurement, confidence: float, want: float
) -> CountTest | None:
    """The exact count test of a gate with ``detect`` on these records (:mod:`harness.gates.power`);
    ``None`` where the gate has none (no ``detect``, or a metric that is not a rate or a percentile).

    A rate counts the requests on the wrong side of the limit (``error_rate``: errors; a hit rate:
    hits, tested from below). A percentile ``q`` counts the samples above the limit (above the limit
    plus the client's own jitter for client-timed latencies, so jitter can only make a fail harder):
    at the limit that share is ``1 − q``. Its power is the plug-in one: were this run's samples scaled
    so that the percentile sat at ``detect ×`` the threshold, the share above the limit would be the
    one the test must catch."""
    spec, detect = gate.spec, gate.detect
    if detect is None:
        return None
    alpha = 1.0 - confidence
    if spec.kind == "rate" and spec.counts is not None:
        k, n = spec.counts(frame)
        upper = gate.effective_direction == "at_most"
        if not upper:  # at-least: k counts hits, tested from below against the hit-rate limit
            return CountTest(k, n, gate.limit, detect, alpha, upper=False, want=want)
        return CountTest(k, n, gate.limit, detect, alpha, upper=True, want=want)
    if spec.kind == "percentile" and spec.samples is not None and spec.q is not None:
        values, _ = spec.samples(frame)
        if values.size == 0 or not math.isfinite(m.value) or m.value <= 0:
            return None
        bar = gate.limit + (m.jitter if math.isfinite(m.jitter) else 0.0)
        scale = detect * gate.threshold / m.value
        test = exceedance_test(values, spec.q, bar, scale=scale, alpha=alpha, want=want)
        if gate.detect_share is not None:  # the calibration runs' share: the power before the run
            test = replace(test, p1=gate.detect_share if gate.detect_share > test.p0 else None)
        return test
    return None


def decide_count(test: CountTest, gate: Gate) -> tuple[Verdict, str]:
    """Fail when the count proves the limit exceeded; pass when it does not and the test had the power
    asked for against ``detect``; otherwise cannot be judged, naming the run size that would decide."""
    spec = gate.spec
    if spec.kind == "rate":
        wrong = spec.counted or ("errors" if test.upper else "hits")
        shown = f"{test.k} {wrong} of {test.n}"
        target = format_value(gate.detect, spec.unit)
    else:
        shown = f"{test.k} of {test.n} samples above the limit (at most {test.p0:.0%} expected at it)"
        target = f"{gate.detect:g}× the baseline"
    if test.failed:
        return "fail", f"{shown}: p = {test.p_value():.2g} ≤ {test.alpha:g}, proven beyond the limit"
    if test.powered:
        return (
            "pass",
            f"{shown}: not beyond the limit, and the test had power {test.power:.2f} against {target}",
        )
    if test.p1 is None:
        why = f"{shown}: not beyond the limit, but this run gives the test no power against {target}"
        return "inconclusive", why
    return (
        "inconclusive",
        f"{shown}: not beyond the limit, but too small to catch {target}: {describe_need(test)}",
    )


def _decide_pooled(gate: Gate, m: Measurement) -> tuple[Verdict, str]:
    """A pooled percentile (every token's gap) with ``detect``: its gaps are not independent draws, so
    there is no exact count; the interval resampling whole requests stands in. Not proven beyond the
    limit (the interval's low end within it), it passes when its high end rules out the regression to
    catch (``detect ×`` the threshold): such a regression passes at most ``(1 − c) / 2`` of the time."""
    assert gate.detect is not None
    bar = gate.detect * gate.threshold
    unit = gate.spec.unit
    if m.hi <= bar:
        return "pass", f"interval within {gate.detect:g}× the baseline ({format_value(bar, unit)}): ruled out"
    return "inconclusive", (
        f"the interval reaches {format_value(m.hi, unit)}, past {gate.detect:g}× the baseline "
        f"({format_value(bar, unit)}): too few requests to rule that regression out"
    )


def _message(gate: Gate, m: Measurement, verdict: Verdict, why: str, confidence: float) -> str:
    unit = gate.spec.unit
    sign = "≤" if gate.effective_direction == "at_most" else "≥"
    tol = gate.tolerance
    rel = (
        f"{gate.rel_tolerance:.0%}"
        if gate.rel_tolerance * abs(gate.threshold) >= gate.abs_tolerance
        else None
    )
    tol_text = rel if rel else format_value(tol, unit)
    pm = "+" if gate.effective_direction == "at_most" else "−"
    numbers = (
        f"{gate.metric} = {format_value(m.value, unit)}, required {sign} {format_value(gate.limit, unit)} "
        f"(baseline {format_value(gate.threshold, unit)} {pm} {tol_text}); "
        f"{confidence:.0%} interval {format_interval(m.lo, m.hi, unit)}, n = {m.n}"
    )
    if m.jitter > 0:
        q = f"p{gate.spec.q:g} " if gate.spec.q is not None else ""
        numbers += f" (interval widened by the client's own {q}lateness {format_value(m.jitter, 'ms')})"
    return f"{verdict}: {numbers}; {why}"


def _reference_problem(rs: ResultSet, reference: ResultSet | None) -> str | None:
    """Why a ``*_rel`` gate cannot use ``reference`` for ``rs``: its run cannot be judged, or another
    machine measured it (a ratio of two machines' latencies says nothing about the code)."""
    if reference is None:
        return None
    if reference.problems:
        return f"the {REFERENCE_LABEL!r} set cannot be judged: {'; '.join(reference.problems)}"
    env = rs.summary.environment if rs.summary else None
    ref_env = reference.summary.environment if reference.summary else None
    if env is not None and ref_env is not None:
        diff = ref_env.hardware.differences(env.hardware)
        if diff:
            return (
                f"the {REFERENCE_LABEL!r} set was measured on {ref_env.describe()}, this one on "
                f"{env.describe()}: a ratio needs both on one machine"
            )
    return None


def judge_gate(
    gate: Gate,
    rs: ResultSet | None,
    confidence: float,
    *,
    reference: ResultSet | None = None,
    match: EnvironmentMatch | None = None,
    want: float = 0.95,
) -> GateResult:
    """Judge one gate on one result set (``None``: no result set of the gate's phase was given).

    ``reference``: the set labelled ``reference`` (the ``*_rel`` metrics divide by it); ``match``: the
    set compared with the baseline's fingerprint: when it does not match, a speed-dependent gate is
    ``skipped`` (its numbers are still shown); ``want``: the power a gate with ``detect`` must have
    had to pass (the baseline's ``power``)."""
    unit = gate.spec.unit
    min_n = gate.effective_min_samples(confidence)
    base = {
        "id": gate.id,
        "metric": gate.metric,
        "unit": unit,
        "direction": gate.effective_direction,
        "scenario": gate.scenario,
        "stage": gate.stage,
        "baseline": gate.threshold,
        "limit": gate.limit,
        "confidence": confidence,
        "min_samples": min_n,
        "detect": gate.detect,
    }
    if rs is None:
        phase = gate.effective_phase
        return GateResult(
            label="",
            measured=None, delta=None, delta_pct=None, lo=None, hi=None, n=0,
            verdict="unjudgeable",
            reason=f"unjudgeable: no result set labelled {phase!r} was given (pass {phase}=DIR)",
            why=f"no result set labelled {phase!r} was given (pass {phase}=DIR)",
            **base,
        )  # fmt: skip
    frame = rs.frame.select(scenario=gate.scenario, stage=gate.stage)
    ctx = gate.context(confidence)
    relative = gate.spec.kind == "relative"
    if relative and reference is not None:
        # The same scenario of the reference; its stage label is its own (``replay``), not the phase's.
        ctx = replace(ctx, reference=reference.frame.select(scenario=gate.scenario))
    m = gate.spec.compute(frame, ctx)
    verdict, why = decide(m, gate.limit, gate.effective_direction, min_n)
    test = count_test(gate, frame, m, confidence, want) if verdict != "unjudgeable" else None
    if test is not None:
        verdict, why = decide_count(test, gate)
    elif gate.detect is not None and gate.spec.kind == "pooled" and verdict in ("pass", "inconclusive"):
        verdict, why = _decide_pooled(gate, m)
    if m.n == 0 and not m.problems and (gate.scenario or gate.stage):
        sel = ", ".join(f"{k}={v!r}" for k, v in (("scenario", gate.scenario), ("stage", gate.stage)) if v)
        why = f"no records with {sel}"
    if rs.problems:
        # Fail closed: the numbers of an untrustworthy run are shown, never passed.
        verdict = "unjudgeable"
        why = "; ".join([*rs.problems, why] if why and not why.startswith("interval") else rs.problems)
    elif gate.spec.speed_dependent and match is not None and not match.judged:
        # Another machine, target or recipe: an absolute latency says nothing about the code here.
        # Skipped, whatever the numbers: neither a failure nor a refusal (the job runs on).
        verdict = "skipped"
        where = (match.reason or "measured elsewhere than the baseline").removesuffix(f" ({RECALIBRATE})")
        why = f"{where}; {SKIPPED_WHY}"
    elif gate.spec.speed_dependent and match is not None and match.busier and verdict == "fail":
        # Other work took clearly more of the machine than in any calibration run: the slower number
        # may be the neighbour's. Only the fail is voided; a pass won against that handicap stands.
        verdict = "unjudgeable"
        why = match.busier_reason or "the machine was busier than when calibrated"
    elif relative and (ref_why := _reference_problem(rs, reference)) is not None:
        verdict = "unjudgeable"
        why = ref_why
    elif verdict == "pass" and gate.blind:
        # A gate a 2× slower target would pass too: its pass says nothing about the code.
        verdict = "inconclusive"
        why = (
            "the baseline's limit holds twice its fastest calibration run (calibrated where runs "
            "scattered that widely): a 2× slowdown would pass too, so this pass proves nothing"
        )
    value = _finite(m.value)
    delta = value - gate.threshold if value is not None else None
    delta_pct = delta / abs(gate.threshold) * 100 if delta is not None and gate.threshold != 0 else None
    return GateResult(
        label=rs.label,
        measured=value,
        delta=delta,
        delta_pct=delta_pct,
        lo=_finite(m.lo),
        hi=_finite(m.hi),
        n=m.n,
        verdict=verdict,
        reason=_message(gate, m, verdict, why, confidence),
        why=why,
        jitter=m.jitter if math.isfinite(m.jitter) else 0.0,
        power=test.power if test is not None else None,
        needed=test.needed if test is not None and not test.powered else None,
        **base,
    )


def targets(gate: Gate, result_sets: Sequence[ResultSet]) -> list[ResultSet | None]:
    """The result sets a gate applies to: its phase's, or every one but the ``reference`` when it has
    no phase (the reference is what the ``*_rel`` metrics divide by, not a run to gate)."""
    phase = gate.effective_phase
    if phase is None:
        return [rs for rs in result_sets if rs.label != REFERENCE_LABEL]
    match = [rs for rs in result_sets if rs.label == phase]
    return list(match) if match else [None]


def judge(
    baseline: Baseline, result_sets: Sequence[ResultSet], *, baseline_path: str | Path | None = None
) -> GateReport:
    """Judge every gate of ``baseline`` on the result sets it applies to, each set compared with the
    baseline's fingerprint first (:func:`harness.gates.fingerprints.compare`)."""
    matches = {rs.label: compare(baseline.fingerprint, rs) for rs in result_sets}
    reference = next((rs for rs in result_sets if rs.label == REFERENCE_LABEL), None)
    results = [
        judge_gate(
            g, rs, baseline.confidence, reference=reference,
            match=matches.get(rs.label) if rs is not None else None, want=baseline.power,
        )
        for g in baseline.gates
        for rs in targets(g, result_sets)
    ]  # fmt: skip
    # Skipped gates count neither way: the judged ones decide (all skipped: a pass, said so).
    verdicts = {r.verdict for r in results}
    overall: Overall = (
        "fail" if "fail" in verdicts else "unjudgeable" if verdicts - {"pass", "skipped"} else "pass"
    )
    return GateReport(
        verdict=overall,
        exit_code=int(EXIT_CODES[overall]),
        baseline=BaselineRef(
            name=baseline.name,
            path=str(baseline_path) if baseline_path is not None else None,
            sha256=baseline_sha256(baseline_path) if baseline_path is not None else None,
        ),
        confidence=baseline.confidence,
        results=[
            ResultRef(
                label=rs.label,
                path=str(rs.path),
                requests=rs.frame.n,
                problems=list(rs.problems),
                started_at=rs.summary.started_at if rs.summary else None,
                target=rs.summary.target.url if rs.summary else None,
                environment_match=matches[rs.label],
            )
            for rs in result_sets
        ],
        gates=results,
    )


def write_report_json(path: str | Path, report: GateReport) -> None:
    """The JSON verdict, atomically (infinite or NaN numbers are ``null``)."""
    write_json(path, report.model_dump(mode="json"))


def read_report_json(path: str | Path) -> GateReport:
    """A JSON verdict written by :func:`write_report_json` (for ``harness report --verdict``)."""
    from pydantic import ValidationError

    from harness.common.errors import InputError
    from harness.common.io import check_input_file, validation_input_error

    p = check_input_file(path)
    try:
        return GateReport.model_validate_json(p.read_bytes())
    except ValidationError as exc:
        raise validation_input_error(exc, file=p, expected="a gate verdict (harness gate --json)") from None
    except ValueError as exc:
        raise InputError(f"not a gate verdict: {exc}", file=p) from None
