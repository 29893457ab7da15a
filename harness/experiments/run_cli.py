"""``harness run``: a paired cold / warm run in one command (:mod:`harness.experiments.paired`).

Exit codes: 0 pass; 1 a gate proved a regression (an ``error_rate`` gate may prove it on the errors
the capacity search or the warm check saw, before the phases); 6 the warm phase could not be called
warm, or a gate could not judge; 2 bad command line; 3 bad input file; 4 bad option or ``--serve-args``, or
``--out`` holds an earlier run; 5 the target could not be started or reached; 130 interrupted
(the running phase finalized, the server stopped, ``run.json`` written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.common import console as cons
from harness.common.options import options_of, with_options
from harness.experiments.recipe import (
    CapacityRecipe,
    RecipeFile,
    check_corpus,
    recipe_options,
    resolve,
)
from harness.load.options import LOAD_PANEL, RUN_USES

stderr = cons.err()
COMMAND_SETTINGS = {
    "run": {
        "epilog": "Example: harness run --recipe fixtures/recipes/ci.yaml --duration 30 -o runs/run",
    }
}
"""How ``harness/cli.py`` registers the command."""

RUN_OPTIONS = [
    *recipe_options(uses=RUN_USES, sections=("warmup", "gate", "phase_timeout")),
    *options_of(CapacityRecipe, at=("capacity",), only=["slo"]),
]
"""``harness run``'s recipe options (every one is a field of :class:`Recipe`)."""


@with_options(RUN_OPTIONS, panel=LOAD_PANEL)
def run(
    *,
    given: dict[str, Any],
    recipe: RecipeFile = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for every result.")] = Path("runs/run"),
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier run's results in OUT.")] = False,
) -> None:
    """Paired cold/warm run: replay cold, warm up, check warm, replay warm; compare and gate.

    Every cache level is flushed first; the warm-up is --preload then the --plan ladder.

    The recipe it ran is written to OUT/recipe.yaml (run it again with --recipe).

    Exit 0 pass, 1 a gate failed, 6 not warm or cannot be judged (docs/ci.md).
    """
    from harness.common.errors import CheckFailed
    from harness.experiments.paired import PairedRunner
    from harness.experiments.paired_record import conclude
    from harness.experiments.paired_spec import PairedSpec
    from harness.gates.output import comparison_table, gate_table

    resolved = check_corpus(resolve(recipe, given, RUN_OPTIONS), recipe)
    spec = PairedSpec(resolved, out=out, force=force, source=recipe)
    runner = PairedRunner(spec, stderr)
    console = cons.wide(150)
    try:
        record = runner.run()
    except CheckFailed:
        # A gate proved before the phases ended (the target's errors): its table, then the error.
        if runner.gate_report is not None:
            console.print(gate_table(runner.gate_report))
        raise
    if runner.comparison is not None:
        console.print(comparison_table(runner.comparison))
    if runner.gate_report is not None:
        console.print(gate_table(runner.gate_report))
    stderr.print(f"results in {out} (run.json, comparison.json, warm-check.json)", highlight=False)
    verdict = f" --verdict {out / 'gate.json'}" if runner.gate_report is not None else ""
    stderr.print(
        f"report: harness report cold={out / 'cold'} warm={out / 'warm'}{verdict} -o {out / 'report.html'}",
        highlight=False,
        soft_wrap=True,
    )
    conclude(record, out, stderr)


def parse_run_args(args: list[str]) -> tuple[Path | None, dict[str, Any]]:
    """``harness run`` arguments (the deprecated ``calibrate -- ARGS`` form) → the recipe file and the
    options given, parsed by ``harness run``'s own command line (``--out``, ``--force`` and
    ``--gate`` are calibration's to set, and refused)."""
    from harness.common.errors import ConfigError
    from harness.common.options import options_given, parse_command_line

    ctx = parse_command_line(run, args, prog="harness run", field="--")
    for name in ("--out", "-o", "--force", "--gate"):
        if any(a.split("=", 1)[0] == name for a in args):
            raise ConfigError(
                f"{name} is set by calibrate itself (each run goes to WORKDIR/cal-K; no gate)", field=name
            )
    given = options_given(ctx.params, RUN_OPTIONS)  # an old spelling among them: with its warning
    recipe = ctx.params.get("recipe")
    return recipe, given
