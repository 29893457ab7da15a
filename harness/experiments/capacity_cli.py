"""``harness capacity``: the highest open-loop rate that meets an SLO (:mod:`harness.experiments.capacity`).

Exit codes: 0 a rate meets the SLO (printed as "at least" when no probe failed up to ``--max-rate``);
1 not even the lowest rate does; 6 the lowest rate cannot be judged; 2 bad command line; 3 bad input
file; 4 bad option, SLO or ``--serve-args``, or ``--out`` holding an earlier search; 5 the target
could not be started or reached (it answered none of the calibration's requests: one that answers
errors is judged on its error rate, 1 or 6, the reason naming it); 130 interrupted (the running probe
finalized, the server stopped, ``capacity.json`` holds the probes so far).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from harness.common import console as cons
from harness.common.errors import CannotJudge, CheckFailed, ExitCode
from harness.common.options import old_spellings, with_options
from harness.experiments.recipe import (
    RecipeFile,
    check_corpus,
    recipe_options,
    resolve,
)
from harness.load.options import LOAD_PANEL

if TYPE_CHECKING:
    from rich.table import Table

    from harness.experiments.capacity_result import CapacityResult

stderr = cons.err()
COMMAND_SETTINGS = {
    "capacity": {
        "epilog": "Example: harness capacity --corpus runs/corpus --max-tokens-cap 16 "
        '--slo "ttft_from_intended_p95<=3x" -o runs/capacity',
    }
}
"""How ``harness/cli.py`` registers the command."""


CAPACITY_OPTIONS = recipe_options(uses=("send", "precision"), sections=("capacity", "confidence"))
"""``harness capacity``'s recipe options (every one is a field of :class:`Recipe`)."""


@with_options(CAPACITY_OPTIONS, panel=LOAD_PANEL, defaults={"concurrency": "a probe's requests, ≤ 512"})
@old_spellings(json_out="--json")  # --json took a path before it became a switch on every command
def capacity(
    *,
    given: dict[str, Any],
    recipe: RecipeFile = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for the probes and capacity.json.")
    ] = Path("runs/capacity"),
    json_out: Annotated[
        Path | None,
        typer.Option("--json-out", help="Also write the answer (capacity.json) here.", show_default=False),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an earlier search's results in OUT.")
    ] = False,
) -> None:
    """Find the highest open-loop arrival rate at which the target meets the SLO.

    Probes at constant rates (×2 until one fails, then bisection), each judged with the gates' intervals.

    Prints a table and the answer, writes OUT/capacity.json (docs/capacity.md).

    Exit 0 found, 1 no rate meets the SLO, 6 cannot be judged.
    """
    from harness.common.io import write_json
    from harness.experiments.capacity import CapacityRunner, CapacitySpec
    from harness.experiments.capacity_result import answer_line

    resolved = check_corpus(resolve(recipe, given, CAPACITY_OPTIONS), recipe)
    spec = CapacitySpec(resolved, out=out, force=force)
    result = CapacityRunner(spec, stderr).run()
    if json_out is not None:
        write_json(json_out, result.model_dump(mode="json"))
    cons.wide(150).print(result_table(result))
    where = f"{out / 'capacity.json'}" + (f" and {json_out}" if json_out is not None else "")
    stderr.print(f"results in {out} ({where}; probes/NN-<rate>rps/)", highlight=False, soft_wrap=True)
    line = answer_line(result)
    typer.echo(line)
    if result.exit_code == int(ExitCode.CHECK_FAILED):
        raise CheckFailed(result.reason, file=out / "capacity.json")
    if result.exit_code == int(ExitCode.UNJUDGEABLE):
        raise CannotJudge(result.reason, file=out / "capacity.json")


def result_table(result: CapacityResult) -> Table:
    """One row per probe: rate, requests, each term's value with its interval, the verdict."""
    from harness.gates.metrics import format_interval, format_value

    terms = [
        f"{t.metric} ≤ {format_value(lim, t.unit)}"
        for t, lim in zip(result.terms, result.limits, strict=True)
    ]
    table = cons.table(
        f"capacity probes (SLO {result.slo}, {result.confidence:.0%} intervals)",
        ["#", "offered req/s", "achieved", "requests", "errors", *terms, "verdict"],
        left={"verdict"},
    )
    colours = {"pass": "green", "fail": "red", "inconclusive": "yellow"}
    cal = result.calibration
    if cal is not None:  # its errors are the target's too: a row, not a footnote
        errors = f"[red]{cal.errors}[/]" if cal.errors else "0"
        verdict = "calibration" if cal.start_rate is not None else "[red]calibration: every request failed[/]"
        table.add_row("–", "one at a time", "—", str(cal.requests), errors, *["—"] * len(terms), verdict)
    for p in sorted(result.probes, key=lambda p: p.rate):
        cells = [
            str(p.index),
            f"{p.rate:.4g}",
            "—" if p.achieved_rate is None else f"{p.achieved_rate:.4g}",
            str(p.requests),
            str(p.errors),
        ]
        for r in p.terms:
            u = r.unit
            cells.append(f"{format_value(r.value, u)} {format_interval(r.lo, r.hi, u)}")
        cells.append(f"[{colours[p.verdict]}]{p.verdict}[/]")
        table.add_row(*cells)
    return table
