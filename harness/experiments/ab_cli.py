"""``harness ab``: a latency verdict from two targets measured side by side (:mod:`harness.experiments.ab`,
judged by :mod:`harness.gates.ab`).

Exit codes: 0 pass; 1 a latency ratio is proven above ``--limit`` or the candidate's error rate above
``--max-error-rate``; 6 cannot be judged (an interval too wide to rule out ``--detect``, too few
pairs, a block that cannot be judged); 2 bad command line; 3 bad input file; 4 bad option or serve
arguments, or ``--out`` holding an earlier run; 5 a target could not be started or reached; 7 a target
died during a block; 130 interrupted (the running block finalized, the servers stopped, ``ab.json``
written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.common import console as cons
from harness.common.errors import CannotJudge, CheckFailed, ExitCode
from harness.common.options import options_of, with_options
from harness.experiments.recipe import (
    CapacityRecipe,
    RecipeFile,
    check_corpus,
    recipe_options,
    resolve,
)
from harness.load.options import LOAD_PANEL

stderr = cons.err()
COMMAND_SETTINGS = {
    "ab": {
        "epilog": "Example: harness ab --recipe fixtures/recipes/ci.yaml "
        '--candidate-serve-args "--preset tiny --cache --inject-slowdown 1.3" -o runs/ab',
    }
}
"""How ``harness/cli.py`` registers the command."""


AB_OPTIONS = [
    *recipe_options(
        uses=("send", "rate", "share", "start", "budget"),
        sections=("ab", "gate", "phase_timeout"),
        target=False,
    ),
    # The base's capacity search (--rate N%): its probes take the blocks' path (--bypass-cache/--use-cache).
    *options_of(CapacityRecipe, at=("capacity",), exclude=("bypass_cache",)),
]
"""``harness ab``'s recipe options (every one a field of :class:`~harness.experiments.recipe.Recipe`)."""


@with_options(
    AB_OPTIONS, panel=LOAD_PANEL, defaults={"block_requests": "corpus ÷ blocks, ≤ 50", "start_delay": 1.0}
)
def ab(
    *,
    given: dict[str, Any],
    recipe: RecipeFile = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for every result.")] = Path("runs/ab"),
    force: Annotated[
        bool, typer.Option("--force", help="Replace an earlier A/B run's results in OUT.")
    ] = False,
) -> None:
    """A/B verdict: a base and a candidate target, block pairs interleaved A B B A …, judged in the job.

    --rate 70% loads both at that share of the base's capacity, measured first. Each block pair sends
    the same distinct requests to both (one target loaded at a time), and each latency percentile's
    ratio candidate/base gets a stratified bootstrap interval: fail when proven above --limit, pass
    when --detect is ruled out; --looks looks stop at the first that decides. --warm-requests sends
    requests again, cached; --gate FILE judges its rates and bytes on the candidate. One family-wise
    false-alarm rate (1 − --confidence) covers every test and look. No stored latency: drift hits
    both arms alike.

    Writes OUT/ab.json, OUT/gate.json, OUT/recipe.yaml and one run directory per block (docs/ci.md).

    Exit 0 pass, 1 fail, 6 cannot be judged.
    """
    from harness.experiments.ab import ABRunner
    from harness.experiments.ab_record import AB_FILE
    from harness.experiments.ab_spec import ABSpec
    from harness.gates.ab import ab_table

    resolved = check_corpus(resolve(recipe, given, AB_OPTIONS), recipe)
    runner = ABRunner(ABSpec(resolved, out=out, force=force, source=recipe), stderr)
    record = runner.run()
    if record.judgement is not None:
        cons.wide(160).print(ab_table(record.judgement))
        for m in record.judgement.metrics:
            if m.verdict != "pass":
                stderr.print(f"  {m.metric}: {m.reason}", highlight=False, soft_wrap=True, markup=False)
    if record.gate is not None:
        from harness.gates.judge import read_report_json
        from harness.gates.output import gate_table

        cons.wide(160).print(gate_table(read_report_json(record.gate.file)))
    stderr.print(f"results in {out} (ab.json; base/NN, candidate/NN)", highlight=False)
    code = record.exit_code or 0
    message = record.message or ""
    if code == int(ExitCode.CHECK_FAILED):
        raise CheckFailed(message, file=out / AB_FILE)
    if code == int(ExitCode.UNJUDGEABLE):
        raise CannotJudge(message, file=out / AB_FILE)
    stderr.print(f"[green]✓[/] {message}", highlight=False)
