"""``harness gate`` (judge runs against a baseline) and ``harness baseline …`` (write, check, list).

``harness baseline calibrate`` runs a recipe, so it lives with the runs:
:mod:`harness.experiments.calibrate_cli`.

``harness gate --baseline FILE RESULTS…`` exits 0 when every gate passes, 1 when one proved a
regression (:class:`~harness.common.errors.CheckFailed`) and 6 when a run cannot be judged
(:class:`~harness.common.errors.CannotJudge`); a bad command line stays 2 and a bad file 3 or 4
(docs/exit-codes.md, docs/gates.md). The table, JUnit XML and JSON verdict are written in every case.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from harness.common import console as cons
from harness.common.errors import CannotJudge, CheckFailed
from harness.common.options import old_spellings, options_of, validated, with_options
from harness.gates.policy import GatePolicy

if TYPE_CHECKING:
    pass

app = typer.Typer(help="Baselines for `harness gate`: write one from a run, check one, list metrics.",
                  no_args_is_help=True)  # fmt: skip
stderr = cons.err()

COMMAND_SETTINGS = {
    "gate": {
        "epilog": "Example: harness gate --baseline fixtures/baselines/tiny-cpu.yaml cold=runs/paired/cold "
        "warm=runs/paired/warm --junit gate.junit.xml --json-out gate.json",
    }
}
"""How ``harness/cli.py`` registers ``harness gate``."""
RESULTS_HELP = "Run directories (records.jsonl + summary.json), as DIR or LABEL=DIR (cold=runs/cold)."


@old_spellings(json_out="--json")
def gate(
    results: Annotated[list[str], typer.Argument(help=RESULTS_HELP, show_default=False)],
    baseline: Annotated[Path, typer.Option("--baseline", "-b", help="Baseline YAML file.")],
    junit: Annotated[
        Path | None,
        typer.Option("--junit", help="JUnit XML to write (default: FIRST_RESULTS/gate.junit.xml)."),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option("--json-out", help="JSON verdict to write (default: FIRST_RESULTS/gate.json)."),
    ] = None,
) -> None:
    """Judge runs against a baseline: exit 0 pass, 1 a gate failed, 6 a run cannot be judged."""
    from harness.gates.baseline import read_baseline
    from harness.gates.judge import judge, write_report_json
    from harness.gates.output import gate_table, write_junit
    from harness.gates.runs import load_result_sets

    spec = read_baseline(baseline)
    sets = load_result_sets(results)
    report = judge(spec, sets, baseline_path=baseline)
    cons.wide(150).print(gate_table(report))
    first = sets[0].path
    junit_path = junit or first / "gate.junit.xml"
    json_path = json_out or first / "gate.json"
    write_junit(junit_path, report)
    write_report_json(json_path, report)
    stderr.print(f"wrote {junit_path} and {json_path}", highlight=False)
    if report.verdict == "fail":
        raise CheckFailed(report.headline(), file=baseline)
    if report.verdict == "unjudgeable":
        reasons = [
            f"{g.id}@{g.label or '—'}: {g.reason}"
            for g in report.gates
            if g.verdict not in ("pass", "skipped")
        ]
        raise CannotJudge(report.headline() + ". First: " + reasons[0], file=baseline)


POLICY_OPTIONS = options_of(GatePolicy)
"""What each gate of a written baseline must catch (:class:`~harness.gates.policy.GatePolicy`)."""


@app.command(
    epilog="Example: harness baseline update cold=runs/paired/cold warm=runs/paired/warm --headroom 10% "
    "-o baseline.yaml"
)
@with_options(POLICY_OPTIONS)
def update(
    *,
    given: dict[str, Any],
    results: Annotated[list[str], typer.Argument(help=RESULTS_HELP, show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Baseline YAML to write.")],
    headroom: Annotated[
        str, typer.Option("--headroom", help="Relative tolerance of every gate (10% or 0.1).")
    ] = "10%",
    name: Annotated[
        str | None, typer.Option("--name", help="Baseline name (default: the file's stem).")
    ] = None,
    confidence: Annotated[
        float, typer.Option("--confidence", min=0.51, max=0.999, help="Interval confidence of the gates.")
    ] = 0.95,
    per_scenario: Annotated[
        bool, typer.Option("--per-scenario", help="Also gate TTFT/TPOT/E2E P95 of every scenario.")
    ] = False,
) -> None:
    """Write a baseline from runs: measured values as thresholds, HEADROOM as tolerance.

    Skipped metrics say why (a P99 needs ≥ 1164 samples for a stable gate …). The file records the
    runs' machine, target and recipe (fingerprint): elsewhere its latency gates cannot be judged.
    """
    from harness.gates.baseline import write_baseline
    from harness.gates.output import baseline_table
    from harness.gates.runs import load_result_sets
    from harness.gates.update import baseline_from_results, parse_headroom

    sets = load_result_sets(results)
    spec, comments, skipped = baseline_from_results(
        sets,
        headroom=parse_headroom(headroom),
        name=name or out.stem,
        confidence=confidence,
        per_scenario=per_scenario,
        policy=validated(GatePolicy, given, POLICY_OPTIONS),
    )
    write_baseline(out, spec, comments)
    cons.wide(150).print(baseline_table(spec, comments))
    for line in skipped:
        stderr.print(f"skipped {line}", highlight=False, soft_wrap=True)
    for note in spec.fingerprint.notes if spec.fingerprint else ():
        stderr.print(f"[yellow]warning:[/] {escape(note)}", highlight=False, soft_wrap=True)
    stderr.print(f"wrote {out}", highlight=False)


@app.command(epilog="Example: harness baseline check fixtures/baselines/tiny-cpu.yaml")
def check(baseline: Annotated[Path, typer.Argument(help="Baseline YAML file.")]) -> None:
    """Validate a baseline and show its gates with their limits."""
    from harness.gates.baseline import read_baseline
    from harness.gates.metrics import format_value

    spec = read_baseline(baseline)
    t = cons.table(
        escape(f"baseline {spec.name} (confidence {spec.confidence:.0%})"),
        ("gate", "phase", "threshold", "limit", "min samples"),
        title_justify="left",
    )
    for g in spec.gates:
        sign = "≤" if g.effective_direction == "at_most" else "≥"
        t.add_row(
            escape(g.id), escape(g.effective_phase or "any"), format_value(g.threshold, g.spec.unit),
            f"{sign} {format_value(g.limit, g.spec.unit)}", str(g.effective_min_samples(spec.confidence)),
        )  # fmt: skip
    cons.wide(120).print(t)


@app.command(epilog="Example: harness baseline metrics")
def metrics() -> None:
    """List the metrics a baseline can gate on."""
    from harness.gates.metrics import METRICS

    rows = [
        (name, m.unit, m.direction, m.default_phase or "any", m.description) for name, m in METRICS.items()
    ]
    columns = ("metric", "unit", "direction", "phase", "what")
    cons.wide(160).print(cons.table("gate metrics", columns, rows, title_justify="left"))


@app.command(
    epilog="Example: harness baseline noise --baseline fixtures/baselines/tiny-cpu.yaml "
    "cold=fixtures/runs/tiny-cpu/cold warm=fixtures/runs/tiny-cpu/warm --repeats 200"
)
@old_spellings(repeats="--reps")
def noise(
    results: Annotated[list[str], typer.Argument(help=RESULTS_HELP, show_default=False)],
    baseline: Annotated[Path, typer.Option("--baseline", "-b", help="Baseline YAML file.")],
    repeats: Annotated[int, typer.Option("--repeats", min=10, help="Bootstrap replicates.")] = 200,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the resampling.")] = 0,
) -> None:
    """Estimate how often an identical rerun would fail or be inconclusive (bootstrap of these runs)."""
    from rich.progress import track

    from harness.gates.baseline import read_baseline
    from harness.gates.noise import NoiseEstimate, rerun_verdicts
    from harness.gates.runs import load_result_sets

    spec = read_baseline(baseline)
    sets = load_result_sets(results)
    est = NoiseEstimate(reps=repeats)
    # One replicate per call so the bar moves; each replicate draws from its own seeded stream.
    for i in track(range(repeats), description="resampling", console=stderr, transient=True):
        part = rerun_verdicts(spec, sets, reps=1, seed=seed * 1_000_003 + i)
        est.overall.update(part.overall)
        for key, counts in part.per_gate.items():
            est.per_gate.setdefault(key, type(counts)()).update(counts)
    verdicts = ("pass", "fail", "inconclusive", "unjudgeable", "skipped")
    t = cons.table(
        f"{repeats} bootstrap reruns against {escape(spec.name)}: "
        f"{est.rate('pass'):.1%} pass, {est.rate('fail'):.1%} fail, "
        f"{est.rate('unjudgeable'):.1%} cannot be judged",
        ("gate", "pass", "fail (false alarm)", "inconclusive", "unjudgeable", "skipped"),
        [(escape(key), *(f"{est.rate(v, key):.1%}" for v in verdicts)) for key in est.per_gate],
        left={"gate"},
        title_justify="left",
    )
    cons.wide(120).print(t)
