"""Calibration: the baseline that N runs of one recipe on this machine all pass.

The runs are made by :mod:`harness.experiments.calibrate` (``harness baseline calibrate``).
:func:`calibrate` loads each run's measured result sets (``cold``, ``warm``, and
``reference`` when there is one; the ``ladder`` is a warm-up, not a phase) and writes one gate per
metric and phase that every run supports, by this rule (docs/gates.md, *Calibration*):

- ``threshold`` = the worst run's value (the largest for ``at_most``, the smallest for ``at_least``);
- ``tolerance`` = the largest of
  1. ``headroom · |threshold|`` (the drift a person allows),
  2. the metric's floor (1 ms of lateness, 1 point of error rate),
  3. the largest single-run rerun margin (:func:`~harness.gates.update.rerun_margin`): never tighter
     than ``harness baseline update`` from any one of the runs,
  4. the largest run's own interval half-width toward the limit **plus** ``k(N) ×`` the run-to-run
     range (``max v − min v``): a rerun's interval end is its value plus about that half-width, and
     its value lies beyond the worst of N runs by more than ``k(N)`` ranges with probability
     :data:`CALIBRATION_RISK` (1 %) when run values scatter normally (:func:`range_factor`: 3.7 for
     three runs, 1.2 for five); this term carries the machine's run-to-run drift, which no single
     run's interval can see;
- ``min_samples`` = half the smallest run's count (at least what the metric needs).

Every calibration run is then judged against the written baseline; one that does not pass is named
with the gate and why. The file's header says how it was made, and its ``fingerprint`` where.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from harness import __version__
from harness.common.errors import CannotJudge, ConfigError, InputError
from harness.gates.baseline import BASELINE_SCHEMA_VERSION, Baseline, Gate, Provenance, _round
from harness.gates.fingerprints import fingerprint_from_results
from harness.gates.judge import GateResult, judge
from harness.gates.metrics import format_value
from harness.gates.policy import GatePolicy
from harness.gates.runs import ResultSet, load_result_set
from harness.gates.update import Candidate, _gate_from, _provenance, candidates
from harness.load.results import RECORDS_FILE

NOT_PHASES = frozenset({"ladder", "server"})
"""Subdirectories of a ``harness run`` output that are not measured phases."""


CALIBRATION_RISK = 0.01
"""The chance the rule accepts that an unchanged rerun's *value* lands beyond the drift allowance."""
MIN_RUNS = 3
"""Two runs' range says too little about the spread: a third lands beyond max + 27 ranges 1 % of the time."""


@lru_cache(maxsize=32)
def range_factor(n: int, risk: float = CALIBRATION_RISK) -> float:
    """``k`` such that one more draw exceeds the largest of ``n`` by more than ``k`` times their range
    with probability ``risk``, for normally scattered run values. The ratio is location- and
    scale-free, so one seeded simulation (400 000 draws, deterministic) gives it for every metric:
    3.7 for n = 3, 1.2 for n = 5, 0.47 for n = 10 at 1 %."""
    import numpy as np

    if n < 2:
        return math.inf
    x = np.random.default_rng(12345).standard_normal((400_000, n + 1))
    top = x[:, :n].max(axis=1)
    spread = top - x[:, :n].min(axis=1)
    return float(np.quantile((x[:, n] - top) / spread, 1.0 - risk))


def load_phases(run_dir: Path) -> list[ResultSet]:
    """The measured result sets of one ``harness run`` output: each subdirectory holding records,
    but the ladder (labelled by its name: ``cold``, ``warm``, ``reference``)."""
    if not run_dir.is_dir():
        raise InputError("no such run directory", file=run_dir)
    dirs = sorted(
        p
        for p in run_dir.iterdir()
        if p.is_dir() and p.name not in NOT_PHASES and (p / RECORDS_FILE).exists()
    )
    if not dirs:
        raise InputError("no measured phase (cold/, warm/ with records.jsonl) in this run", file=run_dir)
    return [load_result_set(p, p.name) for p in dirs]


@dataclass
class Calibration:
    """What :func:`calibrate` made: the baseline, a comment per gate, what it skipped and why,
    the header lines, and what the check of the calibration runs found."""

    baseline: Baseline
    comments: dict[int, str]
    skipped: list[str]
    header: list[str]
    not_passed: list[str] = field(default_factory=list)
    """``cal-2: tpot_p95@warm: <reason>`` for every gate a calibration run does not pass."""
    warnings: list[str] = field(default_factory=list)
    spread_blind: list[str] = field(default_factory=list)
    """Where a latency gate came out blind because of the run-to-run spread (written blind or left
    out): more runs shrink that term (``--max-runs``), unlike one run's own rerun margin."""


def _tolerance(
    cands: Sequence[Candidate], *, headroom: float, counted: bool = False
) -> tuple[float, float, float, str]:
    """``(threshold, abs_tolerance, spread, which term set it)`` by the rule in the module docstring.
    ``counted``: a percentile judged by the exact count test, whose limit bounds the true percentile
    of a rerun: the runs' spread and the headroom, not an interval a rerun must fit inside (the count
    test needs none to pass), so neither the runs' interval half-widths nor their rerun margins."""
    metric = cands[0].metric
    values = [c.m.value for c in cands]
    at_most = metric.direction == "at_most"
    threshold = max(values) if at_most else min(values)
    spread = max(values) - min(values)
    if metric.kind in ("max", "counter"):
        half = 0.0
    elif at_most:
        half = max(c.m.hi - c.m.value for c in cands)
    else:
        half = max(c.m.value - c.m.lo for c in cands)
    margins = [c.margin for c in cands if math.isfinite(c.margin)]
    k = range_factor(len(cands)) if spread > 0 else 0.0
    if counted and metric.kind == "percentile":
        terms = {
            "headroom": headroom * abs(threshold),
            "the metric's floor": metric.abs_tolerance_floor,
            f"{k:.2g} × run-to-run range": k * spread,
        }
    else:
        terms = {
            "headroom": headroom * abs(threshold),
            "the metric's floor": metric.abs_tolerance_floor,
            "one run's rerun margin": max(margins, default=0.0),
            f"interval half-width + {k:.2g} × run-to-run range": half + k * spread,
        }
    which = max(terms, key=lambda t: terms[t])
    abs_tol = max(0.0, *(v for k, v in terms.items() if k != "headroom"))
    if metric.unit == "ratio":
        abs_tol = min(abs_tol, 1.0)
    return threshold, abs_tol, spread, which


def _is_latency(gate: Gate) -> bool:
    """A gate on how long the target took (ms the client timed, or a ratio of such times): what a
    slower target moves. Not the client's own lateness: a 2× slower target does not double it."""
    spec = gate.spec
    return gate.effective_direction == "at_most" and (
        spec.unit == "x" or (spec.unit == "ms" and spec.client_timed)
    )


SAME_QUANTITY = {"itl_ms": "tpot_ms", "ttft_from_intended_ms": "ttft_ms", "e2e_from_intended_ms": "e2e_ms"}
"""Columns a target's slowdown moves together: the gaps between tokens are what a request's TPOT
averages (a slower decode moves both), and a latency from the intended send time is the same latency
plus the client's lateness (``cold_start_p99`` is cold TTFT P99 so measured)."""


def _quantity(gate: Gate) -> str:
    """What a latency gate measures, whatever its quantile or phase (``tpot_ms`` for ``tpot_p50``,
    ``tpot_p95`` and the pooled ``itl_p95``, cold or warm): a slowdown of that quantity shows in any
    seeing gate on it."""
    column = gate.spec.column or gate.metric
    return SAME_QUANTITY.get(column, column)


def _drop_covered_blind(
    gates: list[Gate],
    comments: dict[int, str],
    blind_where: dict[int, str],
    skipped: list[str],
    warnings: list[str],
) -> tuple[list[Gate], dict[int, str]]:
    """Leave out a blind latency gate where a seeing gate measures the same quantity; keep it otherwise.

    A blind gate (a 2× slower run would be within its limit) cannot pass by design (judge.py), so
    one in a baseline makes every run of the unchanged target *cannot be judged*. On the first busy
    machine `make demo` met after that rule, warm TPOT over cache hits (0.03 ms, a stored answer's
    stream, where one run's own rerun margin exceeds the value) vetoed every verdict while cold TPOT,
    which a slower decode moves, judged fine. Such a gate is listed with the skipped metrics, naming
    the gates that watch the quantity instead, so the file shows what this machine cannot gate.
    Coverage is by quantity, not by any latency: a TTFT gate does not see a decode slowdown (at half
    of capacity a 2× slower engine moved cold TTFT by 25 %), so a blind TPOT with only TTFT beside it
    stays blind, and a regression is never passed because the gates that could see it were too wide.
    And a warm gate never covers a cold one: warm requests are answered from the cache, so a warm TTFT
    gate does not see the engine a cold one watches (covered by warm gates, a demo's blind cold gates
    were all left out, and a 2× slower engine passed). The other way holds: the slowdown the policy
    must catch is the target's, and it shows in the cold phase's seeing gate on the same quantity.
    """
    seeing: dict[tuple[str, str | None], list[str]] = {}
    for g in gates:
        if _is_latency(g) and not g.blind:
            seeing.setdefault((_quantity(g), g.effective_phase), []).append(
                f"{g.id}@{g.effective_phase or 'any'}"
            )
    kept: list[Gate] = []
    kept_comments: dict[int, str] = {}
    for i, g in enumerate(gates):
        where = blind_where.get(i, g.id)
        q, phase = _quantity(g), g.effective_phase
        watch = seeing.get((q, phase)) or (seeing.get((q, "cold")) if phase == "warm" else None)
        if g.blind and watch:
            skipped.append(
                f"{where}: its limit would hold a 2× slowdown (it cannot catch one on this machine); "
                f"{', '.join(watch)} gate {_quantity(g)} instead"
            )
            continue
        if g.blind:
            warnings.append(
                f"{where}: the limit {format_value(g.limit, g.spec.unit)} holds twice the fastest run's "
                f"value and no gate sees {_quantity(g)} better: this machine's run-to-run spread is too "
                "wide for the gate to catch a 2× slowdown, so a run within it cannot be judged (quiet "
                "the machine, add runs, or gate the _rel ratios)"
            )
        if i in comments:
            kept_comments[len(kept)] = comments[i]
        kept.append(g)
    return kept, kept_comments


def calibrate(
    runs: Sequence[Sequence[ResultSet]],
    *,
    headroom: float,
    name: str = "baseline",
    confidence: float = 0.95,
    per_scenario: bool = False,
    run_names: Sequence[str] | None = None,
    command: str | None = None,
    policy: GatePolicy | None = None,
) -> Calibration:
    """The baseline that every one of ``runs`` (each: its result sets by label) passes, with tolerances
    from their run-to-run spread (module docstring), rates and percentiles declared by ``policy``
    (:class:`~harness.gates.policy.GatePolicy`); checked against the runs themselves."""
    policy = policy or GatePolicy()
    if policy.drift_room is None:  # calibration measures the drift it makes room for: on by default
        policy = policy.model_copy(update={"drift_room": True})
    if len(runs) < MIN_RUNS:
        raise ConfigError(
            f"{len(runs)} calibration run(s): at least {MIN_RUNS} are needed to measure a run-to-run spread",
            field="--runs",
        )
    names = list(run_names or [f"run {i + 1}" for i in range(len(runs))])
    for rn, sets in zip(names, runs, strict=True):
        for rs in sets:
            if rs.problems:
                raise CannotJudge(
                    f"calibration {rn} cannot be measured from: {'; '.join(rs.problems)}",
                    file=rs.path,
                    hint="a baseline from a client-bound or interrupted run would be wrong; "
                    "run on a quieter machine, or lower the rate",
                )
    per_run = [
        {c.key: c for c in candidates(sets, confidence=confidence, per_scenario=per_scenario)}
        for sets in runs
    ]
    order = list(dict.fromkeys(k for cands in per_run for k in cands))
    gates: list[Gate] = []
    comments: dict[int, str] = {}
    skipped: list[str] = []
    warnings: list[str] = []
    blind_where: dict[int, str] = {}  # a blind gate's index in gates → where its runs measured it
    spread_blind: list[str] = []
    for key in order:
        present = [(rn, cands[key]) for rn, cands in zip(names, per_run, strict=True) if key in cands]
        first = present[0][1]
        if len(present) < len(runs):
            skipped.append(f"{first.where}: only in {', '.join(rn for rn, _ in present)}")
            continue
        why_not = None
        singles: list[Gate] = []
        counted = policy.applies(first.metric)
        for rn, c in present:
            gate, note = _gate_from(
                c.metric, c.m, c.margin, headroom=headroom, confidence=confidence, phase=c.phase,
                scenario=c.scenario, counted=counted, several=True,
            )  # fmt: skip
            if gate is None:
                why_not = f"{rn}: {note}"
                break
            singles.append(gate)
        if why_not is not None:
            skipped.append(f"{first.where}: {why_not}")
            continue
        cands = [c for _, c in present]
        metric = first.metric
        threshold, abs_tol, spread, which = _tolerance(cands, headroom=headroom, counted=counted)
        gate = singles[0].model_copy(
            update={
                "threshold": _round(threshold),
                "abs_tolerance": _round_up(abs_tol),
                "min_samples": max(
                    1 if counted else singles[0].spec.default_min_samples(confidence),
                    min(c.m.n for c in cands) // 2,
                ),
            }
        )
        if metric.measured_option:
            gate = gate.model_copy(update={"require_measured": all(c.measured for c in cands)})
        if metric.direction == "at_least" and gate.limit <= 0:
            skipped.append(
                f"{first.where}: {format_value(threshold, metric.unit)} leaves nothing to gate "
                "(the limit would be ≤ 0)"
            )
            continue
        vals = " / ".join(format_value(c.m.value, metric.unit) for c in cands)
        source = which if gate.tolerance > headroom * abs(threshold) else "headroom"
        rel_spread = f" ({spread / abs(threshold):.0%})" if threshold else ""
        note = (
            f"{vals} over {len(cands)} runs (n ≥ {min(c.m.n for c in cands)}); spread "
            f"{format_value(spread, metric.unit)}{rel_spread}; "
            f"tolerance {format_value(gate.tolerance, metric.unit)} from {source}"
        )
        if counted:
            declared, notes = policy.declare(gate, [c.measurement() for c in cands], confidence=confidence)
            if declared is None:
                skipped.append(f"{first.where}: {notes[0]}")
                continue
            gate = declared
            if metric.kind == "rate":  # the policy declared its limit: the runs' spread did not set it
                note = f"{vals} over {len(cands)} runs (n ≥ {min(c.m.n for c in cands)})"
            note = "; ".join([note, *notes])
            warnings += [
                f"{first.where}: {n.removeprefix('LOOSE: ')}" for n in notes if n.startswith("LOOSE")
            ]
        # Blind: a 2× slower target that ran as the fastest run did would pass: its limit holds twice
        # that run's value (judged against the worst run's value, the threshold, a limit of 1.6× it
        # let a 2× slower decode through: TPOT 10.7 → 21.8 ms under a 23.7 ms limit), or its count
        # test cannot reach the power asked against a 2× slowdown.
        fastest = min(c.m.value for c in cands)
        reach = gate.detect if counted and gate.detect is not None else None
        if _is_latency(gate) and (gate.limit >= 2 * fastest or (reach is not None and reach > 2)):
            note += "; cannot catch a 2× slowdown: a run within it cannot be judged"
            gate = gate.model_copy(update={"blind": True})
            blind_where[len(gates)] = first.where
            # More runs shrink the run-to-run term, not one run's own margin, and not a worst run
            # that is itself twice the fastest (it stays the threshold).
            if "run-to-run range" in which and threshold < 2 * fastest:
                spread_blind.append(first.where)
        comments[len(gates)] = note
        gates.append(gate)
    gates, comments = _drop_covered_blind(gates, comments, blind_where, skipped, warnings)
    if not gates:
        raise InputError(
            "no metric of these runs has enough data for a gate", file=runs[0][0].path,
            hint="; ".join(skipped[:3]),
        )  # fmt: skip
    fingerprint = fingerprint_from_results(runs, names=names)
    warnings += fingerprint.notes
    baseline = Baseline(
        schema_version=BASELINE_SCHEMA_VERSION,
        name=name,
        confidence=confidence,
        power=policy.power,
        gates=gates,
        provenance=Provenance(
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            harness_version=__version__,
            headroom=headroom,
            results=[_provenance(rs) for sets in runs for rs in sets],
        ),
        fingerprint=fingerprint,
    )
    not_passed: list[str] = []
    # A blind gate cannot pass by design (judge.py): its runs are within its limit, the warning says why.
    blind = {g.id for g in baseline.gates if g.blind}
    for rn, sets in zip(names, runs, strict=True):
        report = judge(baseline, sets)
        not_passed += [
            f"{rn}: {_gate_where(g)}: {g.reason}"
            for g in report.gates
            if g.verdict != "pass" and not (g.id in blind and g.verdict == "inconclusive")
        ]
    machine = fingerprint.environment.describe() if fingerprint.environment else "an unknown machine"
    header = [
        f"Calibrated by `harness baseline calibrate` on {machine}, "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, harness {__version__}.",
        *([f"Recipe: {command}"] if command else []),
        f"{len(runs)} runs: " + ", ".join(str(sets[0].path.parent) for sets in runs) + ".",
        "Rule (docs/gates.md#calibration-harness-baseline-calibrate): threshold = the worst run; "
        f"tolerance = max(headroom {headroom:.0%}, floor, one run's rerun margin, largest interval "
        f"half-width + {range_factor(len(runs)):.2g} × run-to-run range)"
        + (
            f"; then latency limits moved out as far as catching {policy.detect_slowdown:g}× at power "
            f"{policy.power:g} allows (drift room)."
            if policy.drift_room
            else "."
        ),
        "Each gate's comment gives the runs' values and spread. Latency gates judge only runs on",
        "this machine, target and recipe (fingerprint at the end); recalibrate rather than edit.",
        *(f"Skipped {s}" for s in skipped),
        "",
    ]
    return Calibration(baseline, comments, skipped, header, not_passed, warnings, spread_blind)


def _round_up(value: float, digits: int = 3) -> float | int:
    """``value`` rounded *up* to ``digits`` significant digits: a written tolerance never falls below
    what the rule asked for."""
    if value <= 0 or not math.isfinite(value):
        return _round(value, digits)
    scale = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return _round(math.ceil(value / scale - 1e-9) * scale, digits + 2)


def _gate_where(g: GateResult) -> str:
    return f"{g.id}@{g.label}" if g.label else g.id
