"""``harness analysis decay`` and ``decay-sweep``: the QPS decay with the cache-miss rate, fitted to
measured points or to a live sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from harness.analysis.cli_common import (
    ACCESS_OPTIONS,
    JSON_HELP,
    access_of,
    check_api,
    console,
    echo_json,
    err_console,
    say,
)
from harness.common.io import write_json
from harness.load.options import typer_options


def decay(
    *,
    points: Annotated[
        list[Path] | None, typer.Option("--points", help="JSONL/CSV of stages (cmr, qps); repeatable.")
    ] = None,
    run: Annotated[list[Path] | None, typer.Option("--run", help="Load run directory; repeatable.")] = None,
    confidence: Annotated[float, typer.Option("--confidence", help="Interval level for k.")] = 0.95,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the plot (PNG) here.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the fit as JSON here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Fit QPS = QPS0·exp(−k·CMR²) (Levenberg–Marquardt) to a bypass-fraction sweep."""
    from harness.analysis.decay import fit_decay, fit_mixture, plot_decay, points_from_run, read_points

    pts = [p for f in points or [] for p in read_points(f)] + [
        p for r in run or [] for p in points_from_run(r)
    ]
    if not pts:
        raise typer.BadParameter("give --points or --run", param_hint="--points")
    fit = fit_decay(pts, confidence)
    mixture = fit_mixture(pts)
    if out is not None:
        write_json(out, fit.model_dump())
    if plot is not None:
        plot_decay(fit, plot, mixture=mixture)
    if as_json:
        echo_json(fit.model_dump())
        return
    table = Table(title="QPS decay: QPS = QPS0 · exp(−k · CMR²)")
    for col in ("CMR", "QPS", "fitted", "residual", "stage"):
        table.add_column(col, justify="right")
    for p, r in zip(fit.points, fit.residuals, strict=True):
        table.add_row(f"{p.cmr:.3f}", f"{p.qps:.3f}", f"{p.qps - r:.3f}", f"{r:+.3f}", p.stage or "")
    console.print(table)
    lo, hi = fit.k_interval
    console.print(
        f"k = {fit.k:.4g} ({int(fit.confidence * 100)} % interval {lo:.4g} … {hi:.4g}), "
        f"QPS0 = {fit.qps0:.4g}, RMSE {fit.rmse:.3g}, R² {fit.r2:.4f}, n = {fit.n}",
        highlight=False,
    )
    if mixture is not None:
        _print_mixture(mixture)


def _print_mixture(m: Any) -> None:
    console.print(
        f"cost mixture 1/QPS = (1−CMR)/{m.qps_hit:.4g} + CMR/{m.qps_miss:.4g}: RMSE {m.rmse:.3g}, "
        f"R² {m.r2:.4f} (same number of parameters; compare the residuals)",
        highlight=False,
    )


@typer_options(
    "concurrency", "max_tokens_cap", "api", "model", "seed", *ACCESS_OPTIONS,
    help_for={"concurrency": "Requests in flight at saturation (the user pool; default 32)."},
)  # fmt: skip
def decay_sweep(
    *,
    url: Annotated[str, typer.Option("--url", help="Target base URL (a server with a response cache).")],
    corpus: Annotated[Path, typer.Option("--corpus", help="corpus.jsonl (or its directory) to replay.")],
    cmr: Annotated[
        str, typer.Option("--cmr", help="Bypass fractions to sweep, one stage each (≥ 3 values).")
    ] = "0,0.25,0.5,0.75,1",
    duration: Annotated[float, typer.Option("--duration", help="Seconds each stage sends.")] = 30.0,
    settle: Annotated[
        float, typer.Option("--settle", help="Seconds at each stage's start left out of the measurement.")
    ] = 5.0,
    rate: Annotated[
        float, typer.Option("--rate", help="Offered arrivals/s per stage: far above the capacity.")
    ] = 1000.0,
    preload: Annotated[
        bool, typer.Option("--preload/--no-preload", help="Warm the cache with the corpus first.")
    ] = True,
    rewarm: Annotated[
        bool, typer.Option("--rewarm/--no-rewarm", help="Warm it again before every later stage.")
    ] = True,
    confidence: Annotated[float, typer.Option("--confidence", help="Interval level for k.")] = 0.95,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("decay-sweep"),
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    load: dict[str, Any],
) -> None:
    """Live QPS-decay sweep: one saturating stage per cache-miss rate, then QPS = QPS0·exp(−k·CMR²).

    Warms the cache with the corpus, runs one headless Locust stage per bypass fraction (that share of
    requests sends Cache-Control: no-cache) at an offered rate far above capacity with a fixed pool of
    users, measures each stage's cache-miss rate and completed requests/s, fits and plots. The preload
    takes --admin-token, the stages --api-key.
    """
    from pydantic import ValidationError
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from harness.analysis.decay_sweep import FIT_FILE, PLOT_FILE, SweepSettings, run_sweep

    if "api" in load:
        check_api(str(load["api"]))
    # The secrets go to the target and the stages' Locust runs, never into the settings (fit.json).
    credentials = access_of({k: load.pop(k) for k in ACCESS_OPTIONS if k in load})
    try:
        fractions = [float(x) for x in cmr.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{cmr!r} is not a list of numbers", param_hint="--cmr") from None
    try:
        settings = SweepSettings(
            url=url,
            corpus=corpus,
            fractions=fractions,
            duration_s=duration,
            settle_s=settle,
            rate=rate,
            **load,  # the load options given (the sweep's own defaults for the rest)
            preload=preload,
            rewarm=rewarm,
            confidence=confidence,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"])) or "settings"
        raise typer.BadParameter(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("decay sweep", total=None)
        sweep = run_sweep(
            settings, out, progress=lambda msg: bar.update(task, description=msg), credentials=credentials
        )
    fit = sweep.fit
    assert fit is not None  # run_sweep raises when it cannot fit
    if as_json:
        echo_json(sweep.model_dump(mode="json"))
        return
    table = Table(title=f"QPS decay sweep at {url} — {settings.concurrency} in flight, {duration:g} s stages")
    for col in ("stage", "bypass asked", "bypass sent", "CMR", "QPS", "exp fit", "residual", "mixture",
                "sent", "errors", "lateness p50 ms", "saturated", "client CPU"):  # fmt: skip
        table.add_column(col, justify="left" if col == "stage" else "right")
    fitted = {p.stage: p.qps - r for p, r in zip(fit.points, fit.residuals, strict=True)}
    mixed = (
        {p.stage: p.qps - r for p, r in zip(fit.points, sweep.mixture.residuals, strict=True)}
        if sweep.mixture is not None
        else {}
    )
    for st in sweep.stages:
        fv = fitted.get(st.name)
        mv = mixed.get(st.name)
        table.add_row(
            st.name,
            f"{st.bypass_fraction:.3f}",
            "—" if st.bypass_share is None else f"{st.bypass_share:.3f}",
            "—" if st.cmr is None else f"{st.cmr:.3f}",
            f"{st.qps:.2f}",
            "—" if fv is None else f"{fv:.2f}",
            "—" if fv is None else f"{st.qps - fv:+.2f}",
            "—" if mv is None else f"{mv:.2f}",
            f"{st.sent:,}",
            f"{st.errors:,}",
            "—" if st.lateness_p50_ms is None else f"{st.lateness_p50_ms:,.0f} (expected)",
            "yes" if st.saturated else "NO",
            "—" if st.client_cpu_pct is None else f"{st.client_cpu_pct:.0f} %",
        )
    console.print(table)
    lo, hi = fit.k_interval
    console.print(
        f"k = {fit.k:.4g} ({int(fit.confidence * 100)} % interval {lo:.4g} … {hi:.4g}), "
        f"QPS0 = {fit.qps0:.4g}, RMSE {fit.rmse:.3g}, R² {fit.r2:.4f}, n = {fit.n}; "
        f"wrote {out}/{FIT_FILE}, {out}/{PLOT_FILE}",
        highlight=False,
    )
    if sweep.mixture is not None:
        _print_mixture(sweep.mixture)
    for w in sweep.warnings:
        say(f"harness: warning: {w}")
