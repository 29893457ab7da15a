"""Which machine, target and recipe a baseline was calibrated on, and whether a run matches them.

A baseline written by ``harness baseline update`` or ``calibrate`` keeps a :class:`BaselineFingerprint`
taken from its runs' ``summary.json``: the :class:`~harness.common.fingerprint.Environment` that
measured them, the target's identity (its ``GET /v1/models`` answer,
:func:`~harness.load.run_summary.target_identity`) and each result set's
:class:`~harness.load.run_summary.Recipe`. ``harness gate`` compares every result set with it
(:func:`compare`): when the hardware, the target or the recipe differs, the gates on metrics that
depend on the machine's speed (:attr:`~harness.gates.metrics.Metric.speed_dependent`: absolute
latencies) are skipped on that set, with the reason (they neither fail nor refuse:
:mod:`harness.gates.judge`); the rest (error and hit rates, warm rate, bytes, the ``*_rel`` ratios)
are judged as usual. A baseline without a fingerprint (written before it existed, or by hand) is
judged as before, with a note.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from harness.common.fingerprint import Environment
from harness.common.host import HostLoad
from harness.common.model import StrictModel
from harness.gates.runs import ResultSet
from harness.load.run_summary import Recipe, RunSummary

RECALIBRATE = "recalibrate: harness baseline calibrate"
IDENTITY_IGNORED = frozenset({"harness.version"})
"""Identity fields that do not make another target: the harness version is software, and a gate
must catch what an upgrade does to latency, not stop judging."""

Match = Literal["same", "different", "unknown"]


class BaselineFingerprint(StrictModel):
    """Where a baseline was calibrated (``fingerprint:`` in the baseline file)."""

    environment: Environment | None = None
    """The machine and software of the calibration runs."""
    target: dict[str, Any] | None = None
    """The target's identity (``summary.json``: ``target.identity``)."""
    recipes: dict[str, Recipe] = Field(default_factory=dict)
    """Each result set's recipe, by label (``cold``, ``warm``, ``reference`` …); a set with another
    label is compared with the recipe when all of them are one."""
    interference: dict[str, HostLoad] = Field(default_factory=dict)
    """Per result set label, the calibration run in which other work took the most of the machine
    (:mod:`harness.common.host`); a label is absent when any of its runs did not measure it."""
    notes: list[str] = Field(default_factory=list)
    """Where the runs disagreed (different machines, targets or recipes among them)."""


class EnvironmentMatch(StrictModel):
    """One result set compared with the baseline's fingerprint (``gate.json``:
    ``results[].environment_match``)."""

    judged: bool
    """Whether gates on speed-dependent metrics are judged on this set."""
    hardware: Match
    target: Match
    recipe: Match
    """``same``; ``different`` (speed-dependent gates are skipped); ``unknown``: the baseline
    does not record it, so it is not compared."""
    busier: bool = False
    """Other work took clearly more of the machine during this run than during any calibration run
    (:func:`busier_than_calibrated`): a speed-dependent gate's *fail* cannot be judged (the
    neighbour, not the target, may be what is slower); its pass still stands, won against a handicap."""
    busier_reason: str | None = None
    calibrated_on: str | None = None
    measured_on: str | None = None
    differences: list[str] = Field(default_factory=list)
    """Each field that differs: ``CPU model: A vs B``, ``recipe.rate: 4 vs 2``."""
    reason: str | None = None
    """Why speed-dependent gates are skipped (the start of those gates' ``why``)."""
    note: str | None = None
    """What was not compared, and why (an old baseline without a fingerprint)."""


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def identity_differences(calibrated: dict[str, Any], measured: dict[str, Any]) -> list[str]:
    """Fields of two target identities that differ (``models[tiny].harness.weights: a vs b``).

    Models are matched by ``id``; the ids served are a field of their own."""

    def by_id(identity: dict[str, Any]) -> dict[str, dict[str, Any]]:
        models = identity.get("models") or []
        return {str(m.get("id")): m for m in models if isinstance(m, dict)}

    a, b = by_id(calibrated), by_id(measured)
    if sorted(a) != sorted(b):
        return [f"models: {', '.join(sorted(a)) or 'none'} vs {', '.join(sorted(b)) or 'none'}"]
    out: list[str] = []
    for mid in sorted(a):
        fa, fb = _flatten(a[mid]), _flatten(b[mid])
        for key in sorted(set(fa) | set(fb)):
            if key in IDENTITY_IGNORED or fa.get(key) == fb.get(key):
                continue
            out.append(f"models[{mid}].{key}: {fa.get(key, 'absent')} vs {fb.get(key, 'absent')}")
    return out


def _same_number(a: float | None, b: float | None, rel_tol: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)


SHARE_REL_TOL = 1e-3
"""``rate_of_capacity`` is the sent rate over the capacity, and the sent rate is rounded to 4
significant digits (a rate a person can type again): 70 % of two capacities comes out as 0.7001 and
0.6999. Shares this close are the same recipe."""


def recipe_differences(calibrated: Recipe, measured: Recipe) -> list[str]:
    """Fields of two recipes that differ (``rate: 4 vs 2``). When both give ``rate_of_capacity`` it is
    compared instead of ``rate`` (whose value then depends on the machine's capacity)."""
    skip = (
        {"rate"}
        if calibrated.rate_of_capacity is not None and measured.rate_of_capacity is not None
        else set()
    )
    out: list[str] = []
    for name in Recipe.model_fields:
        if name in skip:
            continue
        a, b = getattr(calibrated, name), getattr(measured, name)
        tol = SHARE_REL_TOL if name == "rate_of_capacity" else 1e-9
        same = _same_number(a, b, tol) if isinstance(a, float) or isinstance(b, float) else a == b
        if not same:
            out.append(f"{name}: {a if a is not None else 'none'} vs {b if b is not None else 'none'}")
    return out


def summary_differences(calibrated: RunSummary, measured: RunSummary) -> list[str]:
    """What makes two phases' latencies incomparable: the machine (:meth:`Hardware.key`), the target's
    identity and the recipe, each difference named; fields a summary does not record are not compared.
    """
    out: list[str] = []
    a, b = calibrated.environment, measured.environment
    if a is not None and b is not None and a.hardware.key() != b.hardware.key():
        out.append(f"machine: {a.hardware.key()} vs {b.hardware.key()}")
    if calibrated.target.identity is not None and measured.target.identity is not None:
        out += identity_differences(calibrated.target.identity, measured.target.identity)
    if calibrated.recipe is not None and measured.recipe is not None:
        out += [f"recipe.{d}" for d in recipe_differences(calibrated.recipe, measured.recipe)]
    return out


BUSIER_SHARE = 0.15
"""A run is *busier* when the CPU other work left it is this share below what the median calibration
run had (near saturation a 15 % loss of CPU is already a many-fold change in latency) …"""
BUSIER_MIN_CORES = 0.1
"""… and other work took at least this many cores more (below it the difference is the machine's own
daemons and the measurement's ticks)."""


def busier_than_calibrated(calibrated: HostLoad, measured: HostLoad) -> str | None:
    """Why ``measured`` ran on a clearly busier machine than ``calibrated`` (the median calibration
    run), or ``None`` when it did not (:data:`BUSIER_SHARE`, :data:`BUSIER_MIN_CORES`)."""
    left_then = calibrated.cpus - calibrated.taken_cores
    left_now = measured.cpus - measured.taken_cores
    more = measured.taken_cores - calibrated.taken_cores
    if more < BUSIER_MIN_CORES or left_now >= (1.0 - BUSIER_SHARE) * left_then:
        return None
    return (
        f"this machine was busier than in its calibration runs: {measured.describe()} "
        f"({calibrated.taken_cores:.2f} in the median run), so a slower latency may be the neighbour's, "
        "not the target's; rerun where nothing else runs, or calibrate beside the same load"
    )


def _agree(values: Sequence[tuple[str, Any]], what: str, notes: list[str], key: Any = None) -> Any:
    """The first value; a note when the others differ from it."""
    if not values:
        return None
    keyed = [(label, key(v) if key else v) for label, v in values]
    first = keyed[0][1]
    others = [f"{label}: {k}" for label, k in keyed if k != first]
    if others:
        notes.append(
            f"the runs disagree on the {what} ({keyed[0][0]}: {first}; {'; '.join(others)}); "
            f"the baseline keeps {keyed[0][0]}'s"
        )
    return values[0][1]


def _agree_recipes(values: Sequence[tuple[str, Recipe]], what: str, notes: list[str]) -> Recipe | None:
    """The first recipe; a note naming the fields where another differs (:func:`recipe_differences`,
    so that runs at one share of capacity agree whatever rate each machine's capacity gave)."""
    if not values:
        return None
    first_where, first = values[0]
    others = [f"{where}: {', '.join(d)}" for where, r in values[1:] if (d := recipe_differences(first, r))]
    if others:
        notes.append(f"the runs disagree on the {what} with {first_where} ({'; '.join(others)}); "
                     f"the baseline keeps {first_where}'s")  # fmt: skip
    return first


def fingerprint_from_results(
    runs: Sequence[Sequence[ResultSet]], *, names: Sequence[str] | None = None
) -> BaselineFingerprint:
    """The fingerprint of one or more runs' result sets (from their summaries); where they disagree
    (another machine, target or recipe among them) the first is kept and a note says so.

    ``runs``: the result sets of each run (``calibrate`` passes one list per run, ``update`` one);
    ``names`` name the runs in notes (default ``run 1`` … or the labels for a single run)."""
    notes: list[str] = []
    envs: list[tuple[str, Environment]] = []
    targets: list[tuple[str, dict[str, Any]]] = []
    recipes: dict[str, list[tuple[str, Recipe]]] = {}
    loads: dict[str, list[tuple[str, HostLoad | None]]] = {}
    for i, sets in enumerate(runs):
        run_name = names[i] if names else (f"run {i + 1}" if len(runs) > 1 else "")
        for rs in sets:
            s = rs.summary
            if s is None:
                continue
            where = f"{run_name} {rs.label}".strip()
            if s.environment is not None:
                envs.append((where, s.environment))
            if s.target.identity is not None:
                targets.append((where, s.target.identity))
            if s.recipe is not None:
                recipes.setdefault(rs.label, []).append((where, s.recipe))
            loads.setdefault(rs.label, []).append((where, s.interference))
    environment = _agree(envs, "machine", notes, key=lambda e: e.hardware.key())
    target = _agree(targets, "target", notes, key=lambda t: sorted(_flatten(t).items()))
    recipe_of = {label: _agree_recipes(vals, f"{label} recipe", notes) for label, vals in recipes.items()}
    interference: dict[str, HostLoad] = {}
    for label, values in loads.items():
        measured = [(where, h) for where, h in values if h is not None]
        if not measured or len(measured) < len(values):
            continue
        ranked = sorted(measured, key=lambda wh: wh[1].taken_cores)
        quiet, busy = ranked[0], ranked[-1]
        # The load the limits were set under is the typical run's, not the busiest's: one calibration
        # run beside a neighbour must not stretch what the baseline covers (near saturation a run as
        # busy as that outlier, judged, failed an unchanged target at 3x its calibrated latency).
        # The median run (the busier of the middle two).
        interference[label] = ranked[len(ranked) // 2][1]
        if busier_than_calibrated(quiet[1], busy[1]) is not None:
            # The limits then hold runs on two machines, in effect: the quiet runs' latencies and the
            # busy ones'; usually too far apart for a gate to catch a 2x slowdown.
            notes.append(
                f"the machine's load changed between the runs: during {quiet[0]} {quiet[1].describe()}, "
                f"during {busy[0]} {busy[1].describe()}; calibrate where the load stays as it is"
            )
    return BaselineFingerprint(
        environment=environment, target=target, recipes=recipe_of, interference=interference, notes=notes
    )


def compare(fp: BaselineFingerprint | None, rs: ResultSet) -> EnvironmentMatch:
    """Whether ``rs`` was measured where the baseline was calibrated; see :class:`EnvironmentMatch`."""
    s = rs.summary
    measured_env = s.environment if s is not None else None
    measured_on = measured_env.describe() if measured_env is not None else None
    if fp is None:
        return EnvironmentMatch(
            judged=True, hardware="unknown", target="unknown", recipe="unknown", measured_on=measured_on,
            note="the baseline has no fingerprint (written before baselines recorded one): latency gates "
            f"are judged as before, whatever machine measured this run; {RECALIBRATE} to record it",
        )  # fmt: skip
    differences: list[str] = []
    reasons: list[str] = []
    unknown: list[str] = []
    calibrated_on = fp.environment.describe() if fp.environment is not None else None

    hardware: Match = "unknown"
    if fp.environment is not None:
        if measured_env is None:
            hardware = "different"
            differences.append("machine: the run's summary.json does not record where it was measured")
            reasons.append(
                f"calibrated on {calibrated_on}, but this run does not say which machine measured it "
                "(summary.json has no environment): absolute latencies compare only on the same machine"
            )
        else:
            diff = fp.environment.hardware.differences(measured_env.hardware)
            hardware = "different" if diff else "same"
            differences += diff
            if diff:
                reasons.append(
                    f"calibrated on {calibrated_on}, measured on {measured_on}: absolute latencies do not "
                    "travel between machines"
                )
    else:
        unknown.append("machine")

    target: Match = "unknown"
    if fp.target is not None:
        identity = s.target.identity if s is not None else None
        if identity is None:
            target = "different"
            differences.append("target: the run does not record the target's identity (GET /v1/models)")
            reasons.append("the run does not record which target it measured (no GET /v1/models answer)")
        else:
            diff = [f"target {d}" for d in identity_differences(fp.target, identity)]
            target = "different" if diff else "same"
            differences += diff
            if diff:
                reasons.append(f"another target than the baseline's ({diff[0]})")
    else:
        unknown.append("target")

    recipe: Match = "unknown"
    base_recipe = fp.recipes.get(rs.label)
    distinct = {r.model_dump_json(): r for r in fp.recipes.values()}
    if base_recipe is None and len(distinct) == 1:
        # A set labelled otherwise (a rerun's directory name) against a baseline of one recipe.
        base_recipe = next(iter(distinct.values()))
    if base_recipe is not None:
        run_recipe = s.recipe if s is not None else None
        if run_recipe is None:
            recipe = "different"
            differences.append("recipe: the run's summary.json does not record its recipe")
            reasons.append("the run does not record its recipe (corpus, rate …)")
        else:
            diff = [f"recipe.{d}" for d in recipe_differences(base_recipe, run_recipe)]
            recipe = "different" if diff else "same"
            differences += diff
            if diff:
                reasons.append(f"another load than the baseline's ({diff[0]})")
    else:
        unknown.append(f"the {rs.label!r} recipe")

    busier_reason = None
    calibrated_load = fp.interference.get(rs.label)
    if calibrated_load is None and fp.interference:
        # A set labelled otherwise (a rerun's directory name): the busiest of every calibration set.
        calibrated_load = max(fp.interference.values(), key=lambda h: h.taken_cores)
    measured_load = s.interference if s is not None else None
    if calibrated_load is not None and measured_load is not None:
        busier_reason = busier_than_calibrated(calibrated_load, measured_load)
        if busier_reason is not None:
            differences.append(
                f"interference: {measured_load.taken_cores:.2f} vs {calibrated_load.taken_cores:.2f} "
                f"of {measured_load.cpus} cores"
            )
    elif calibrated_load is None:
        unknown.append("interference")

    reason = None
    if reasons:
        reason = "; ".join(reasons) + f" ({RECALIBRATE})"
    notes = [f"not compared (the baseline does not record it): {', '.join(unknown)}"] if unknown else []
    if calibrated_load is not None and measured_load is None:
        notes.append("this run did not measure what other work took of the machine (harness.common.host)")
    note = "; ".join(notes) or None
    return EnvironmentMatch(
        judged=not reasons, hardware=hardware, target=target, recipe=recipe,
        busier=busier_reason is not None, busier_reason=busier_reason,
        calibrated_on=calibrated_on, measured_on=measured_on, differences=differences,
        reason=reason, note=note,
    )  # fmt: skip
