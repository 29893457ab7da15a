"""``harness baseline calibrate``: run a recipe N times on this machine and write the baseline they pass.

Exit 0: written, and every run passes it; 6: a run could not be measured from, or does not pass what
was written; a run's own error code stops calibration with that code (docs/exit-codes.md).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from harness.common import console as cons
from harness.common.errors import CannotJudge
from harness.common.options import options_of, validated, with_options
from harness.experiments.recipe import (
    CapacityRecipe,
    RecipeFile,
    check_corpus,
    recipe_args,
    recipe_options,
    resolve,
)
from harness.gates.policy import GatePolicy
from harness.load.options import LOAD_PANEL, RUN_USES

stderr = cons.err()


CALIBRATE_OPTIONS = [
    *recipe_options(uses=RUN_USES, sections=("warmup", "confidence", "phase_timeout")),
    *options_of(CapacityRecipe, at=("capacity",), only=["slo"]),
]
"""The recipe's options, as ``harness run`` takes them (no ``--gate``: calibration writes the baseline)."""
POLICY_OPTIONS = options_of(GatePolicy, at=("policy",))
"""What each gate of the written baseline must catch (:class:`~harness.gates.policy.GatePolicy`)."""

COMMAND_SETTINGS = {
    "context_settings": {"allow_interspersed_args": False},
    "epilog": "Example: harness baseline calibrate --runs 3 -o fixtures/baselines/tiny-cpu.yaml "
    "--recipe fixtures/recipes/ci.yaml",
}
"""How ``harness/cli.py`` registers :func:`calibrate` in the ``baseline`` group."""


@with_options([*CALIBRATE_OPTIONS, *POLICY_OPTIONS], panel=LOAD_PANEL)
def calibrate(
    *,
    given: dict[str, Any],
    run_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Deprecated: `harness run` arguments after `--`; give them as options, or --recipe.",
            show_default=False,
            hidden=True,
        ),
    ] = None,
    recipe: RecipeFile = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Baseline YAML to write.")],
    runs: Annotated[
        int,
        typer.Option("--runs", min=3, help="How many times to run the recipe (≥ 3: a spread needs them)."),
    ] = 3,
    max_runs: Annotated[
        int | None,
        typer.Option(
            "--max-runs",
            min=3,
            help="While the run-to-run spread leaves a latency gate blind (its limit would hold twice its "
            "fastest run), run the recipe once more, up to this many runs in all (default: --runs).",
        ),
    ] = None,
    headroom: Annotated[
        str, typer.Option("--headroom", help="Smallest relative tolerance of every gate (10% or 0.1).")
    ] = "10%",
    name: Annotated[
        str | None, typer.Option("--name", help="Baseline name (default: the file's stem).")
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Where the runs go (default: OUT.runs/, cal-1 … cal-N).")
    ] = None,
    per_scenario: Annotated[
        bool, typer.Option("--per-scenario", help="Also gate TTFT/TPOT/E2E P95 of every scenario.")
    ] = False,
    reuse: Annotated[
        bool,
        typer.Option(
            "--reuse", help="Do not run: calibrate from the runs already in WORKDIR (cal-1 … cal-N)."
        ),
    ] = False,
    past: Annotated[
        Path | None,
        typer.Option(
            "--from-runs",
            help="Do not run: calibrate from the earlier runs of the recipe in this directory (each "
            "subdirectory a `harness run` output, e.g. CI artifacts of main; the newest --max-runs).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a recipe N times on this machine; write the baseline they all pass, tolerances from their spread.

    Each run is what `harness run` does with the same recipe, into WORKDIR/cal-K (exit 0 or 6 measured).

    It records the machine, target and recipe (fingerprint): elsewhere its latency gates cannot be judged.

    Exit 0 written and every run passes it; 6 a run could not be measured from, or does not pass it.
    """
    from harness.common.options import merge, warn_deprecated
    from harness.experiments.calibrate import history_runs, run_recipe
    from harness.experiments.run_cli import parse_run_args
    from harness.gates.baseline import write_baseline
    from harness.gates.calibration import Calibration, load_phases
    from harness.gates.calibration import calibrate as make
    from harness.gates.output import baseline_table
    from harness.gates.update import parse_headroom

    policy = validated(GatePolicy, given.pop("policy", {}), POLICY_OPTIONS, at=("policy",))
    if run_args:
        warn_deprecated("`-- <harness run arguments>`", "the same options before --, or --recipe FILE")
        file, old = parse_run_args(run_args)
        recipe = recipe or file
        given = merge(old, given)
    resolved = resolve(recipe, given, CALIBRATE_OPTIONS)
    if resolved.gate.baseline is not None:  # only a recipe file can name one: the flag is not offered
        stderr.print(
            f"note: the recipe's gate ({resolved.gate.baseline}) is not used: calibration writes it",
            highlight=False, markup=False, soft_wrap=True,
        )  # fmt: skip
        resolved = resolved.model_copy(update={"gate": resolved.gate.model_copy(update={"baseline": None})})
    if past is None and not reuse:
        check_corpus(resolved, recipe)
    confidence = resolved.gate.confidence
    fraction = parse_headroom(headroom)
    most = max(runs, max_runs or runs)
    work = workdir or out.with_name(out.name + ".runs")

    def say(text: str) -> None:
        stderr.print(escape(text), highlight=False, soft_wrap=True)

    command = "harness run " + shlex.join(recipe_args(resolved, CALIBRATE_OPTIONS))  # the baseline records it
    if past is not None:
        dirs = history_runs(past, most=max_runs, say=say)
        command = f"the {len(dirs)} newest runs in {past}"
        say(f"calibrating from {command}: {', '.join(str(d.relative_to(past)) for d in dirs)}")
    elif reuse:
        dirs = [work / f"cal-{k}" for k in range(1, runs + 1)]
    else:
        dirs = run_recipe(resolved, runs=runs, workdir=work, source=recipe, say=say)

    phases = [load_phases(d) for d in dirs]  # each run read once, however many runs follow

    def calibrated() -> Calibration:
        return make(
            phases, headroom=fraction, name=name or out.stem, confidence=confidence,
            per_scenario=per_scenario, run_names=[d.name for d in dirs], command=command, policy=policy,
        )  # fmt: skip

    cal = calibrated()
    # More runs shrink the run-to-run allowance (3.8 ranges at 3 runs, 1.2 at 5): a run that a
    # neighbour slowed stays in, and is outweighed rather than dropped.
    while cal.spread_blind and len(dirs) < most and not reuse and past is None:
        which = "; ".join(cal.spread_blind)
        say(
            f"after {len(dirs)} runs the run-to-run spread leaves {which} unable to catch a 2× slowdown: "
            "one more run"
        )
        added = run_recipe(
            resolved, runs=1, workdir=work, source=recipe, say=say, first=len(dirs) + 1, of=most
        )
        dirs += added
        phases += [load_phases(d) for d in added]
        cal = calibrated()
    write_baseline(out, cal.baseline, cal.comments, cal.header)
    cons.wide(150).print(baseline_table(cal.baseline, cal.comments))
    for line in cal.skipped:
        stderr.print(f"skipped {escape(line)}", highlight=False, soft_wrap=True)
    for line in cal.warnings:
        stderr.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)
    stderr.print(f"wrote {out} from {len(dirs)} runs in {past or work}", highlight=False)
    if cal.not_passed:
        raise CannotJudge(
            f"{len(cal.not_passed)} gate(s) of the written baseline do not pass on a calibration run; first: "
            + cal.not_passed[0],
            file=out,
        )
