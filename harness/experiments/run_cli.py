"""``harness run``: a paired cold / warm run in one command (:mod:`harness.experiments.paired`).

Exit codes: 0 pass; 1 a gate proved a regression; 6 the warm phase could not be called warm, or a
gate could not judge; 2 bad command line; 3 bad input file; 4 bad option or ``--serve-args``, or
``--out`` holds an earlier run; 5 the target could not be started or reached; 130 interrupted
(the running phase finalized, the server stopped, ``run.json`` written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.common import console as cons
from harness.common.errors import CannotJudge, CheckFailed, ConfigError, ExitCode
from harness.experiments.slo import DEFAULT_SLO
from harness.experiments.target_options import ServeArgs, Url, check_one_target
from harness.load.options import typer_options

stderr = cons.err()

_LOAD = "Load (both phases)"
_WARM = "Warm-up and warm check"


@typer_options(
    "corpus", "schedule", "duration", "max_requests", "arrival", "speedup", "max_tokens_cap", "concurrency",
    "processes", "api", "model", "token_counting", "seed_policy", "tokenizer", "start_delay",
    "until_precision",
    "max_duration", "precision_on", "api_key", "admin_token", "header", "ca_bundle", "insecure",
    required={"corpus"},
    panel=_LOAD,
    help_for={
        "until_precision": "Each phase sends until its watched percentiles are known to within this "
        "relative half-width (10% or 0.1); with --gate they are the baseline's percentile gates.",
        "max_duration": "Seconds each phase sends at most (bounds --until-precision).",
        "precision_on": "Percentiles --until-precision watches, FIELD:Q,… (default: the baseline's, "
        "else ttft_ms:95,tpot_ms:95).",
    },
)  # fmt: skip
def run(
    *,
    load: dict[str, Any],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for every result.")] = Path("runs/run"),
    serve_args: ServeArgs = None,
    url: Url = None,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="Constant arrivals/s (no schedule), or a share of capacity: 50%.",
            rich_help_panel=_LOAD,
        ),
    ] = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Warmup ladder plan (YAML).", rich_help_panel=_WARM)
    ] = None,
    preload: Annotated[
        Path | None,
        typer.Option(
            "--preload", help="JSONL for POST /cache/preload before the ladder.", rich_help_panel=_WARM
        ),
    ] = None,
    probes: Annotated[
        int, typer.Option("--probes", min=1, help="Probe requests of the warm check.", rich_help_panel=_WARM)
    ] = 20,
    min_warm_rate: Annotated[
        float,
        typer.Option(
            "--min-warm-rate", help="Warm rate needed to call the target warm.", rich_help_panel=_WARM
        ),
    ] = 0.92,
    gate: Annotated[
        Path | None,
        typer.Option("--gate", help="Baseline YAML: judge both phases (cold, warm); JUnit + JSON in OUT."),
    ] = None,
    confidence: Annotated[
        float,
        typer.Option("--confidence", min=0.5, max=0.999, help="Confidence of the comparison's intervals."),
    ] = 0.95,
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier run's results in OUT.")] = False,
    phase_timeout: Annotated[
        float, typer.Option("--phase-timeout", min=1.0, help="Seconds a load phase may take at most.")
    ] = 3600.0,
    capacity: Annotated[
        float | None,
        typer.Option(
            "--capacity",
            help="Target capacity, req/s, for --rate N% and plan stages in %; default: measured first.",
            rich_help_panel=_LOAD,
        ),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo",
            help=f'SLO of that capacity measurement (default "{DEFAULT_SLO}").',
            rich_help_panel=_LOAD,
        ),
    ] = None,
) -> None:
    """Paired cold/warm run: replay cold, warm up, check warm, replay warm; compare and gate.

    Every cache level is flushed first; the warm-up is --preload then the --plan ladder.

    Exit 0 pass, 1 a gate failed, 6 not warm or cannot be judged (docs/ci.md).
    """
    from harness.experiments.driver import DEFAULT_SERVE_ARGS, parse_serve_args
    from harness.experiments.paired import PairedRunner
    from harness.experiments.paired_spec import PairedSpec
    from harness.gates.output import comparison_table, gate_table
    from harness.load.runner import LoadSpec

    check_one_target(serve_args, url)
    rate_rps, rate_share = parse_rate(rate)
    if capacity is not None and not capacity > 0:
        raise ConfigError(f"must be a positive rate, got {capacity}", field="--capacity")
    if slo is not None:
        from harness.experiments.slo import parse_slo

        parse_slo(slo)
    # The load options, validated once here; --rate is this command's own (a share of capacity too).
    spec_load = LoadSpec(host="", results_dir=out, rate=rate_rps, **load)
    spec = PairedSpec(
        out=out,
        load=spec_load,
        serve_args=parse_serve_args(serve_args) if serve_args is not None else DEFAULT_SERVE_ARGS,
        url=url,
        plan=plan,
        preload=preload,
        gate=gate,
        probes=probes,
        min_warm_rate=min_warm_rate,
        confidence=confidence,
        force=force,
        phase_timeout_s=phase_timeout,
        rate_share=rate_share,
        capacity=capacity,
        slo=slo,
    )
    runner = PairedRunner(spec, stderr)
    record = runner.run()
    console = cons.wide(150)
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
    code = record.exit_code or 0
    message = record.message or ""
    if code == int(ExitCode.CHECK_FAILED):
        raise CheckFailed(message, file=out / "run.json")
    if code == int(ExitCode.UNJUDGEABLE):
        raise CannotJudge(message, file=out / "run.json")
    stderr.print(f"[green]✓[/] {message}", highlight=False)


def parse_rate(text: str | None) -> tuple[float | None, float | None]:
    """``--rate``: ``"4"`` → ``(4.0, None)`` requests/s; ``"50%"`` → ``(None, 0.5)``, a share of capacity."""
    from harness.load.plan import parse_share

    if text is None:
        return None, None
    try:
        share = parse_share(text)
    except ValueError as exc:
        raise ConfigError(str(exc), field="--rate") from None
    if share is not None:
        return None, share
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{text!r} is neither requests/s (4) nor a share of capacity (50%)", field="--rate"
        ) from None
    return value, None  # its range is the load options' to check, as before
