"""``harness report RESULTS… -o report.html``: the HTML report and its Markdown summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.common import console as cons
from harness.common.options import old_spellings

stderr = cons.err()
COMMAND_SETTINGS = {
    "report": {
        "epilog": "Example: harness report cold=runs/paired/cold warm=runs/paired/warm "
        "--verdict runs/paired/gate.json -o report.html",
    }
}
"""How ``harness/cli.py`` registers the command."""


@old_spellings(capacity="--capacity")
def report(  # noqa: PLR0917 - typer maps parameters to options
    results: Annotated[
        list[str] | None,
        typer.Argument(
            help="Run directories, as DIR or LABEL=DIR (cold=runs/cold warm=runs/warm); with "
            "--capacity-json and none given: its probes.",
            show_default=False,
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML report to write.")] = Path("report.html"),
    markdown: Annotated[
        Path | None,
        typer.Option("--markdown", "--md", help="Markdown summary (default: beside the HTML, .md)."),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", "-b", help="Judge the runs against this baseline and show the verdict."),
    ] = None,
    verdict: Annotated[
        list[str] | None,
        typer.Option(
            "--verdict",
            help="Show this verdict (gate.json of `harness gate` or `harness run --gate`, ab.json of "
            "`harness ab`), as FILE or NAME=FILE; repeatable: each is listed, the first gate in detail.",
            show_default=False,
        ),
    ] = None,
    title: Annotated[str, typer.Option("--title", help="Report title.")] = "harness load report",
    capacity: Annotated[
        Path | None,
        typer.Option(
            "--capacity-json",
            help="Add the capacity search's plot (OUT/capacity.json of harness capacity).",
        ),
    ] = None,
    effect: Annotated[
        Path | None,
        typer.Option(
            "--effect",
            help="Add the warmup effect (OUT/effect.json of harness analysis effect); with no RESULTS, its "
            "cold, planned and oracle passes are the runs.",
        ),
    ] = None,
) -> None:
    """Write a self-contained HTML report (plots inlined, opens offline) and a Markdown summary.

    The exit code is 0 whatever the verdict; `harness gate` is the command that gates.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harness.gates import judge, load_result_sets, read_baseline
    from harness.gates.judge import GateReport
    from harness.reports.plots import PLOTS
    from harness.reports.render import NamedVerdict, read_verdict, write_report

    if baseline is not None and verdict:
        raise typer.BadParameter("give --baseline or --verdict, not both", param_hint="--verdict")
    cap = None
    if capacity is not None:
        from harness.experiments.capacity_result import read_capacity

        cap = read_capacity(capacity)
    if not results and cap is not None:
        # The probes are ordinary run directories: the report's other plots show them side by side.
        results = [f"{p.index:02d}-{p.rate:.4g}rps={p.dir}" for p in sorted(cap.probes, key=lambda p: p.rate)]
    eff = None
    if effect is not None:
        from harness.analysis.effect import read_effect

        eff = read_effect(effect)
        if not results:
            results = [f"{name}={effect.parent / name}" for name in ("cold", "planned", "oracle")]
    sets = load_result_sets(results or [])
    gate: GateReport | None = None
    named: list[NamedVerdict] = []
    if baseline is not None:
        gate = judge(read_baseline(baseline), sets, baseline_path=baseline)
    for item in verdict or []:
        name, sep, file = item.partition("=")
        path = Path(file if sep else item)
        shown, report = read_verdict(name if sep else path.parent.name or path.stem, path)
        named.append(shown)
        gate = gate or report  # the first gate verdict is shown in detail
    md = markdown if markdown is not None else out.with_suffix(".md")
    with Progress(
        TextColumn("{task.description:>22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=stderr, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("plotting", total=len(PLOTS.names()))

        def tick(plot_id: str) -> None:
            bar.update(task, advance=1, description=plot_id)

        files = write_report(
            sets, out, markdown_path=md, gate=gate, title=title, tick=tick, capacity=cap,
            verdicts=named if len(named) > 1 else (), effect=eff,
        )  # fmt: skip
    stderr.print(f"wrote {files.html} and {files.markdown}", highlight=False)
    for v in named:
        stderr.print(f"{v.name}: {v.headline}", highlight=False)
    if gate is not None and not named:
        stderr.print(gate.headline(), highlight=False)
