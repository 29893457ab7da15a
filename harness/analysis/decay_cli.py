"""``harness analysis decay`` and ``decay-sweep``: the QPS decay with the cache-miss rate, fitted to
measured points or to a live sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.analysis.cli_common import JSON_HELP, console, echo_json, err_console, say
from harness.analysis.decay_sweep import SWEEP_LOAD_DEFAULTS, SweepOptions
from harness.common.console import table
from harness.common.io import write_json
from harness.common.options import options_of, validated, with_options
from harness.experiments.recipe import GateRecipe, RecipeFile, TargetRecipe
from harness.load.options import LoadOptions, load_flags


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
    rows = [
        (f"{p.cmr:.3f}", f"{p.qps:.3f}", f"{p.qps - r:.3f}", f"{r:+.3f}", p.stage or "")
        for p, r in zip(fit.points, fit.residuals, strict=True)
    ]
    columns = ("CMR", "QPS", "fitted", "residual", "stage")
    console.print(table("QPS decay: QPS = QPS0 · exp(−k · CMR²)", columns, rows, left=()))
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


SWEEP_OPTIONS = [
    *options_of(TargetRecipe, at=("target",), only=["url"]),
    *options_of(LoadOptions, at=("load",), only=load_flags("send", "rate", "start", "length")),
    *options_of(GateRecipe, at=("gate",), only=["confidence"]),
    *options_of(SweepOptions, at=("sweep",)),
]
"""The sweep's options: a recipe's target and load, and the sweep's own (:class:`SweepOptions`)."""


@with_options(SWEEP_OPTIONS, panel="Load", defaults=SWEEP_LOAD_DEFAULTS)
def decay_sweep(
    *,
    given: dict[str, Any],
    recipe: RecipeFile = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("decay-sweep"),
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Live QPS-decay sweep: one saturating stage per cache-miss rate, then QPS = QPS0·exp(−k·CMR²).

    Warms the cache, runs one saturating Locust stage per bypass fraction (that share sends no-cache).

    Measures each stage's cache-miss rate and completed requests/s, fits and plots.

    Example: harness analysis decay-sweep --url http://127.0.0.1:8000 --corpus runs/corpus --duration 10
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from harness.analysis.decay_sweep import FIT_FILE, PLOT_FILE, SweepPlan, run_sweep
    from harness.experiments.recipe import resolve

    sweep = validated(SweepOptions, given.pop("sweep", {}), SWEEP_OPTIONS, at=("sweep",))
    plan = SweepPlan.of(resolve(recipe, given, SWEEP_OPTIONS), sweep)
    url, duration = plan.url, plan.duration_s
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("decay sweep", total=None)
        result = run_sweep(plan, out, progress=lambda msg: bar.update(task, description=msg))
    fit = result.fit
    assert fit is not None  # run_sweep raises when it cannot fit
    if as_json:
        echo_json(result.model_dump(mode="json"))
        return
    shown = table(
        f"QPS decay sweep at {url} — {plan.load.concurrency} in flight, {duration:g} s stages",
        ("stage", "bypass asked", "bypass sent", "CMR", "QPS", "exp fit", "residual", "mixture",
         "sent", "errors", "lateness p50 ms", "saturated", "client CPU"),
        left={"stage"},
    )  # fmt: skip
    fitted = {p.stage: p.qps - r for p, r in zip(fit.points, fit.residuals, strict=True)}
    mixed = (
        {p.stage: p.qps - r for p, r in zip(fit.points, result.mixture.residuals, strict=True)}
        if result.mixture is not None
        else {}
    )
    for st in result.stages:
        fv = fitted.get(st.name)
        mv = mixed.get(st.name)
        shown.add_row(
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
    console.print(shown)
    lo, hi = fit.k_interval
    console.print(
        f"k = {fit.k:.4g} ({int(fit.confidence * 100)} % interval {lo:.4g} … {hi:.4g}), "
        f"QPS0 = {fit.qps0:.4g}, RMSE {fit.rmse:.3g}, R² {fit.r2:.4f}, n = {fit.n}; "
        f"wrote {out}/{FIT_FILE}, {out}/{PLOT_FILE}",
        highlight=False,
    )
    if result.mixture is not None:
        _print_mixture(result.mixture)
    for w in result.warnings:
        say(f"harness: warning: {w}")
