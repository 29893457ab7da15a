"""``harness capacity``: the highest open-loop rate that meets an SLO (:mod:`harness.experiments.capacity`).

Exit codes: 0 a rate meets the SLO (printed as "at least" when no probe failed up to ``--max-rate``);
1 not even the lowest rate does; 6 the lowest rate cannot be judged; 2 bad command line; 3 bad input
file; 4 bad option, SLO or ``--serve-args``, or ``--out`` holding an earlier search; 5 the target
could not be started or reached; 130 interrupted (the running probe finalized, the server stopped,
``capacity.json`` holds the probes so far).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from harness.common import console as cons
from harness.common.errors import CannotJudge, CheckFailed, ExitCode
from harness.experiments.slo import DEFAULT_SLO
from harness.experiments.target_options import ServeArgs, Url, check_one_target
from harness.load.options import typer_options

if TYPE_CHECKING:
    from rich.table import Table

    from harness.experiments.capacity_result import CapacityResult

stderr = cons.err()

_LOAD = "Load (every probe)"
_SEARCH = "Search"


@typer_options(
    "corpus", "max_tokens_cap", "concurrency", "processes", "api", "model", "token_counting", "seed_policy",
    "tokenizer",
    "api_key", "admin_token", "header", "ca_bundle", "insecure",
    required={"corpus"},
    panel=_LOAD,
    help_for={"concurrency": "Users per Locust process (default: a probe's requests, ≤ 512)."},
)  # fmt: skip
def capacity(
    *,
    load: dict[str, Any],
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo",
            help=f'Comma-separated metric<=value terms (default "{DEFAULT_SLO}"); '
            "ttft/e2e/tpot/itl_p50|90|95|99 in ms or Nx the reference probe's, error_rate a share.",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for the probes and capacity.json.")
    ] = Path("runs/capacity"),
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the answer (capacity.json) here.")
    ] = None,
    serve_args: ServeArgs = None,
    url: Url = None,
    min_rate: Annotated[
        float | None,
        typer.Option(
            "--min-rate",
            help="First (reference) probe's rate; default: half of what one stream sustains (calibrated).",
            rich_help_panel=_SEARCH,
        ),
    ] = None,
    max_rate: Annotated[
        float | None, typer.Option("--max-rate", help="Probe no faster than this.", rich_help_panel=_SEARCH)
    ] = None,
    resolution: Annotated[
        float,
        typer.Option("--resolution", help="Stop when high/low ≤ 1 + this.", rich_help_panel=_SEARCH),
    ] = 0.10,
    max_probes: Annotated[
        int, typer.Option("--max-probes", min=1, help="Probes at most.", rich_help_panel=_SEARCH)
    ] = 12,
    growth: Annotated[
        float, typer.Option("--growth", help="Rate factor while bracketing.", rich_help_panel=_SEARCH)
    ] = 2.0,
    probe_requests: Annotated[
        int,
        typer.Option(
            "--probe-requests", min=1, help="Requests per probe (at least).", rich_help_panel=_SEARCH
        ),
    ] = 100,
    probe_seconds: Annotated[
        float,
        typer.Option(
            "--probe-seconds", min=0.0, help="A probe lasts at least this long.", rich_help_panel=_SEARCH
        ),
    ] = 5.0,
    until_precision: Annotated[
        str | None,
        typer.Option(
            "--until-precision",
            help="A probe stops early once every SLO percentile is known within ±this (10% or 0.1); "
            "--probe-requests stays the most it sends.",
            rich_help_panel=_SEARCH,
        ),
    ] = None,
    confidence: Annotated[
        float,
        typer.Option(
            "--confidence", min=0.5, max=0.999, help="Confidence of every interval.", rich_help_panel=_SEARCH
        ),
    ] = 0.95,
    flush: Annotated[
        bool,
        typer.Option("--flush/--no-flush", help="Empty the target's cache levels before each probe."),
    ] = True,
    bypass_cache: Annotated[
        bool,
        typer.Option(
            "--bypass-cache/--use-cache",
            help="Send probes with Cache-Control: no-cache (measure serving, not the response cache).",
        ),
    ] = True,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an earlier search's results in OUT.")
    ] = False,
) -> None:
    """Find the highest open-loop arrival rate at which the target meets the SLO.

    Probes at constant rates (×2 until one fails, then bisection), each judged with the gates'
    intervals; prints a table and the answer, writes OUT/capacity.json (docs/capacity.md).

    Exit 0 found, 1 no rate meets the SLO, 6 cannot be judged.
    """
    from harness.common.io import write_json
    from harness.experiments.capacity import CapacityRunner, CapacitySpec
    from harness.experiments.capacity_result import answer_line
    from harness.experiments.driver import DEFAULT_SERVE_ARGS, parse_serve_args
    from harness.load.runner import LoadSpec

    check_one_target(serve_args, url)
    # The load options of every probe, validated once here (each probe sets its rate and size).
    probe_load = LoadSpec(host="", results_dir=out, **load)
    spec = CapacitySpec(
        out=out,
        load=probe_load,
        slo=slo if slo is not None else DEFAULT_SLO,
        serve_args=parse_serve_args(serve_args) if serve_args is not None else DEFAULT_SERVE_ARGS,
        url=url,
        min_rate=min_rate,
        max_rate=max_rate,
        growth=growth,
        resolution=resolution,
        max_probes=max_probes,
        probe_requests=probe_requests,
        probe_seconds=probe_seconds,
        until_precision=until_precision,
        confidence=confidence,
        flush=flush,
        bypass_cache=bypass_cache,
        force=force,
    )
    result = CapacityRunner(spec, stderr).run()
    if json_path is not None:
        write_json(json_path, result.model_dump(mode="json"))
    cons.wide(150).print(result_table(result))
    where = f"{out / 'capacity.json'}" + (f" and {json_path}" if json_path is not None else "")
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
