"""``harness analysis effect``: a warmup planned from a history, measured on the window after it
(:mod:`harness.analysis.effect_run`).

Exit codes: 0 measured (and the gates passed); 1 a gate proved a regression; 6 a gate could not judge;
2 bad command line; 3 bad input file; 4 bad option or ``--out`` holds an earlier run; 5 the target could
not be started or reached; 130 interrupted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.common import console as cons
from harness.common.options import with_options
from harness.experiments.recipe import RecipeFile, check_corpus, recipe_options, resolve
from harness.load.options import LOAD_PANEL

EFFECT_OPTIONS = recipe_options(uses=("send", "start", "speed"), sections=("effect", "gate", "phase_timeout"))


@with_options(EFFECT_OPTIONS, panel=LOAD_PANEL)
def effect(
    *,
    given: dict[str, Any],
    recipe: RecipeFile = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for every result.")] = Path(
        "runs/effect"
    ),
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier run's results in OUT.")] = False,
) -> None:
    """Plan a warmup from the history, replay the window cold, planned and oracle: the realized cut in TTFT.

    The history is --history-corpus, or the --corpus before --split (a fraction of its time span).
    Each pass starts from flushed caches; planned and oracle preload KV prefixes first (the plan's,
    and the best one knowing the window). Results: OUT/{cold,planned,oracle}, OUT/effect.json.
    """
    from harness.analysis.effect_run import EFFECT_FILE, EffectRunner, effect_table, read_split
    from harness.experiments.paired_record import conclude
    from harness.experiments.paired_spec import PairedSpec

    resolved = check_corpus(resolve(recipe, given, EFFECT_OPTIONS), recipe)
    eff = resolved.effect
    from harness.analysis.sim import SIMULATORS
    from harness.analysis.warmup import PREDICTORS

    PREDICTORS.get(eff.predictor)  # an unknown name fails now (exit 4), not after the model loaded
    SIMULATORS.get(eff.policy)
    assert resolved.load.corpus is not None
    split = read_split(resolved.load.corpus, eff.history_corpus, eff.split)
    runner = EffectRunner(PairedSpec(resolved, out=out, force=force, source=recipe), split, stderr)
    record = runner.run()
    console = cons.wide(150)
    if runner.report is not None:
        console.print(effect_table(runner.report))
    if runner.gate_report is not None:
        from harness.gates.output import gate_table

        console.print(gate_table(runner.gate_report))
    stderr.print(f"results in {out} ({EFFECT_FILE}, run.json, cold/, planned/, oracle/)", highlight=False)
    conclude(record, out, stderr)


stderr = cons.err()
