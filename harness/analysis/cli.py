"""``harness analysis``: the warmup analyses (see ``docs/analysis.md``).

Every command reads real inputs (request traces, load runs, corpora, scrapes, cache state), prints a
table (or ``--json``), writes its files atomically, and reports bad input as one line with the
documented exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from harness.common.errors import InputError
from harness.common.io import write_json

app = typer.Typer(
    help="Warmup analyses: hit-rate ceiling, warmup plan, hot-zone tiers, QPS decay, avalanche/RTO, "
    "index warmup, GPU fragmentation, anomaly attribution.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

JSON_HELP = "Print JSON instead of a table."
UNIT_HELP = "Cache unit: 'entries' (whole prompts) or 'blocks' (KV blocks from hash_ids)."


def _echo_json(obj: Any) -> None:
    typer.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())


def _say(text: str) -> None:
    err_console.print(text, highlight=False, markup=False, soft_wrap=True)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f} %"


def _unit(unit: str) -> Any:
    from harness.analysis.references import UNITS

    if unit not in UNITS:
        raise typer.BadParameter(f"{unit!r} is not one of {', '.join(UNITS)}", param_hint="--unit")
    return unit


def _api(value: str) -> Any:
    """``--api`` checked against the load stage's choices."""
    from typing import get_args

    from harness.load.arrivals import ApiChoice

    choices = get_args(ApiChoice)
    if value not in choices:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}", param_hint="--api")
    return value


def _warn_sampled(lines: list[dict[str, Any]]) -> None:
    from harness.load.arrivals import is_sampled

    n = sum(is_sampled(line) for line in lines)
    if n:
        _say(
            f"harness: warning: {n} of {len(lines)} preload lines sample (temperature > 0 without a seed): "
            "a response cache does not serve those by default (harness serve: HARNESS__CACHE__CACHE_SAMPLED)"
        )


# --------------------------------------------------------------------------- hitrate


@app.command()
def hitrate(
    *,
    trace: Annotated[
        Path, typer.Option("--trace", help="Request trace (Mooncake, …) or load run directory.")
    ],
    capacity: Annotated[list[int], typer.Option("--capacity", help="Cache capacity in units; repeatable.")],
    unit: Annotated[str, typer.Option("--unit", help=UNIT_HELP)] = "entries",
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", help="Simulators (min, lru, lfu); repeatable; default all."),
    ] = None,
    head: Annotated[
        float | None, typer.Option("--head", help="Only the first fraction of the requests (0–1].")
    ] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="Trace format (default: detected).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Belady (MIN) hit-rate ceiling beside LRU and LFU at each capacity, from an empty cache."""
    from harness.analysis.references import load_refs
    from harness.analysis.sim import SIMULATORS, hitrate_report

    policies = policy or ["min", "lru", "lfu"]
    for p in policies:
        SIMULATORS.get(p)  # unknown names: a ConfigError listing the known ones
    refs = load_refs(trace, _unit(unit), format=fmt)
    if head is not None:
        refs = refs.head(head)
    report = hitrate_report(refs, capacity, policies)
    if as_json:
        _echo_json(report.model_dump())
        return
    table = Table(
        title=f"{trace} — {report.requests:,} requests, {report.refs:,} {unit}, {report.distinct:,} distinct"
    )
    for col in ("capacity", "policy", "hits", "hit rate", "requests/s"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for r in report.results:
        table.add_row(
            f"{r.capacity:,}", r.policy, f"{r.hits:,}", _pct(r.hit_rate), f"{r.requests_per_s:,.0f}"
        )
    console.print(table)
    console.print(f"cold ceiling (infinite capacity): {_pct(report.cold_ceiling)}", highlight=False)


# --------------------------------------------------------------------------- plan


@app.command()
def plan(
    *,
    trace: Annotated[Path, typer.Option("--trace", help="History: request trace or load run directory.")],
    capacity: Annotated[int, typer.Option("--capacity", help="Capacity of the cache to warm, in units.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("warmup-plan"),
    unit: Annotated[str, typer.Option("--unit", help=UNIT_HELP)] = "entries",
    window: Annotated[
        float, typer.Option("--window", help="Evaluation window: first fraction of the history.")
    ] = 0.1,
    eval_trace: Annotated[
        Path | None, typer.Option("--eval", help="Evaluate on this trace instead (out of sample).")
    ] = None,
    predictor: Annotated[str, typer.Option("--predictor", help="replay, recent or frequency.")] = "replay",
    tau_s: Annotated[
        float | None, typer.Option("--tau-s", help="Decay time of the predictor (default: window span / 10).")
    ] = None,
    policy: Annotated[str, typer.Option("--policy", help="Replacement policy of the warmed cache.")] = "lru",
    corpus: Annotated[
        Path | None, typer.Option("--corpus", help="Corpus replaying the history: enables preload.jsonl.")
    ] = None,
    stage_s: Annotated[float, typer.Option("--stage-s", help="Duration of each ladder stage.")] = 60.0,
    max_failure_rate: Annotated[
        float, typer.Option("--max-failure-rate", help="Tolerated failure rate per stage.")
    ] = 0.01,
    on_failure: Annotated[
        str, typer.Option("--on-failure", help="Ladder policy after a rollback: retry or stop.")
    ] = "retry",
    api: Annotated[
        str, typer.Option("--api", help="As the replay will send: auto, chat or completions.")
    ] = "auto",
    model: Annotated[str | None, typer.Option("--model", help="As the replay will send.")] = None,
    max_tokens_cap: Annotated[
        int | None, typer.Option("--max-tokens-cap", help="As the replay will send (the cache keys on it).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Rank keys by predicted reuse, pick the preload set, write preload JSONL and the ladder plan.

    ``ladder.yaml`` is the load stage's plan (``locust -f locustfiles/warmup.py --plan DIR/ladder.yaml``),
    naming ``preload.jsonl`` beside it, which the ladder posts to ``/cache/preload`` first.
    """
    from harness.analysis.references import load_refs
    from harness.analysis.warmup import PREDICTORS, ladder_plan, plan_warmup, preload_lines, write_preload
    from harness.load.plan import Policy, write_plan

    PREDICTORS.get(predictor)
    if on_failure not in ("retry", "stop"):
        raise typer.BadParameter("expected 'retry' or 'stop'", param_hint="--on-failure")
    _api(api)  # a bad value fails before any work
    u = _unit(unit)
    history = load_refs(trace, u)
    win = load_refs(eval_trace, u).head(window) if eval_trace is not None else history.head(window)
    report, _, requests = plan_warmup(
        history, capacity, window=win, predictor=predictor, tau_s=tau_s, policy=policy
    )
    out.mkdir(parents=True, exist_ok=True)
    preload_name: str | None = None
    if corpus is not None:
        lines, missing = preload_lines(
            history,
            requests,
            corpus,
            api=_api(api),
            model=model,
            max_tokens_cap=max_tokens_cap,
        )
        if not lines:
            raise InputError(
                "no request of the preload set has a corpus record (ids or provenance.source_line)",
                file=corpus,
            )
        write_preload(out / "preload.jsonl", lines)
        report = report.model_copy(update={"preload_lines_written": len(lines)})
        preload_name = "preload.jsonl"
        if missing:
            _say(f"harness: warning: {missing} preload requests have no corpus record and were left out")
        _warn_sampled(lines)
    ladder = ladder_plan(
        history,
        stage_s=stage_s,
        max_failure_rate=max_failure_rate,
        preload=preload_name,
        policy=Policy(on_failure="retry" if on_failure == "retry" else "stop", max_retries=1),
    )
    write_plan(
        out / "ladder.yaml",
        ladder,
        comment=f"warmup ladder from {trace}: stages at 10/25/50/75/100 % of its p95 arrival rate "
        "(10 s bins)\nlocust -f locustfiles/warmup.py --plan THIS_FILE --corpus … --host …",
    )
    write_json(out / "plan.json", report.model_dump())
    if as_json:
        _echo_json(report.model_dump())
        return
    table = Table(
        title=f"warmup plan — capacity {capacity:,} {unit}, window {report.window_requests:,} requests"
    )
    table.add_column("measure")
    table.add_column("hit rate", justify="right")
    table.add_row(f"expected: preload + {policy.upper()}", _pct(report.expected_hit_rate))
    table.add_row("preload + MIN (plan quality)", _pct(report.plan_min_hit_rate))
    table.add_row("Belady ceiling (optimal preload + MIN)", _pct(report.ceiling))
    for p, v in report.cold.items():
        table.add_row(f"cold {p.upper()}", _pct(v))
    console.print(table)
    console.print(
        f"expected / ceiling = {report.ratio:.3f}; preload {report.preload_keys:,} {unit} via "
        f"{report.preload_requests:,} requests; wrote {out}/plan.json, {out}/ladder.yaml"
        + (f", {out}/preload.jsonl ({report.preload_lines_written} lines)" if preload_name else ""),
        highlight=False,
    )


# --------------------------------------------------------------------------- tiers


@app.command()
def tiers(
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="Tier policy file to write (JSON).")] = Path(
        "tiers.json"
    ),
    corpus: Annotated[Path | None, typer.Option("--corpus", help="Corpus whose queries to classify.")] = None,
    run: Annotated[
        list[Path] | None,
        typer.Option("--run", help="Load run(s) that replayed the corpus: counts, entropy."),
    ] = None,
    queries: Annotated[
        Path | None, typer.Option("--queries", help="JSONL of {query, count?, mean_entropy?, api?}.")
    ] = None,
    entropy: Annotated[
        Path | None, typer.Option("--entropy", help="JSONL of {query|id|prompt_fp, mean_entropy}.")
    ] = None,
    cache_state: Annotated[
        Path | None, typer.Option("--cache-state", help="Saved cache state dir: fallback entropy.")
    ] = None,
    radius: Annotated[float, typer.Option("--radius", help="Zone radius (cosine distance).")] = 0.3,
    density_min: Annotated[float, typer.Option("--density-min", help="Hot needs density ≥ this.")] = 50.0,
    entropy_max: Annotated[float, typer.Option("--entropy-max", help="Hot needs entropy ≤ this.")] = 2.1,
    ttl_hot: Annotated[float | None, typer.Option("--ttl-hot", help="Seconds (default: cache's).")] = None,
    ttl_warm: Annotated[float | None, typer.Option("--ttl-warm", help="Seconds.")] = None,
    ttl_cold: Annotated[float | None, typer.Option("--ttl-cold", help="Seconds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Hot-zone tiers: cluster queries, density and entropy per zone → tier policy file for the cache."""
    from pydantic import ValidationError

    from harness.analysis.tiers import (
        TierThresholds,
        apply_cache_state,
        apply_entropy_file,
        build_tiers,
        default_ttls,
        embed_queries,
        queries_from_corpus,
        queries_from_rows,
    )
    from harness.cache.policy import TierTTLs

    if corpus is not None and queries is None:
        qs = queries_from_corpus(corpus, run or [])
    elif queries is not None and corpus is None:
        qs = queries_from_rows(queries)
    else:
        raise typer.BadParameter("give exactly one of --corpus and --queries", param_hint="--corpus")
    if entropy is not None:
        apply_entropy_file(qs, entropy)
    if cache_state is not None:
        apply_cache_state(qs, cache_state)
    try:
        th = TierThresholds(radius=radius, density_min=density_min, entropy_max=entropy_max)
        base = default_ttls()
        ttl = TierTTLs(hot=ttl_hot or base.hot, warm=ttl_warm or base.warm, cold=ttl_cold or base.cold)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc.errors()[0]["msg"])) from None
    vectors = embed_queries(qs, show_progress=sys.stderr.isatty())
    tier_file, report = build_tiers(qs, vectors, th, ttl)
    write_json(out, tier_file.model_dump(mode="json"))
    if as_json:
        _echo_json(report.model_dump())
        return
    table = Table(title=f"hot zones — {report.queries:,} queries, {report.requests:,} requests")
    for col in ("zone", "tier", "density", "entropy", "queries", "example"):
        table.add_column(col, justify="left" if col in ("tier", "example") else "right")
    for z in report.zones[:30]:
        ent = "—" if z.entropy is None else f"{z.entropy:.2f}"
        table.add_row(str(z.id), z.tier, f"{z.density:,.0f}", ent, f"{z.queries:,}", z.example[:60])
    console.print(table)
    console.print(
        f"tiers: {report.tiers}; entropy known for {_pct(report.entropy_known)} of requests; "
        f"TTLs hot/warm/cold {ttl.hot:g}/{ttl.warm:g}/{ttl.cold:g} s; wrote {out} "
        f"(harness serve --cache --tiers {out})",
        highlight=False,
    )


# --------------------------------------------------------------------------- decay


@app.command()
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
        _echo_json(fit.model_dump())
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


@app.command("decay-sweep")
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
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Requests in flight at saturation (the user pool).")
    ] = 32,
    max_tokens_cap: Annotated[
        int | None, typer.Option("--max-tokens-cap", help="Cap every request's max_tokens.")
    ] = None,
    api: Annotated[str, typer.Option("--api", help="auto, chat or completions.")] = "auto",
    model: Annotated[str | None, typer.Option("--model", help="model sent with every request.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of which arrivals bypass.")] = 0,
    preload: Annotated[
        bool, typer.Option("--preload/--no-preload", help="Warm the cache with the corpus first.")
    ] = True,
    rewarm: Annotated[
        bool, typer.Option("--rewarm/--no-rewarm", help="Warm it again before every later stage.")
    ] = True,
    confidence: Annotated[float, typer.Option("--confidence", help="Interval level for k.")] = 0.95,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("decay-sweep"),
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Live QPS-decay sweep: one saturating stage per cache-miss rate, then QPS = QPS0·exp(−k·CMR²).

    Warms the cache with the corpus, runs one headless Locust stage per bypass fraction (that share of
    requests sends Cache-Control: no-cache) at an offered rate far above capacity with a fixed pool of
    users, measures each stage's cache-miss rate and completed requests/s, fits and plots.
    """
    from pydantic import ValidationError
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from harness.analysis.decay_sweep import FIT_FILE, PLOT_FILE, SweepSettings, run_sweep

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
            concurrency=concurrency,
            max_tokens_cap=max_tokens_cap,
            api=_api(api),
            model=model,
            seed=seed,
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
        sweep = run_sweep(settings, out, progress=lambda msg: bar.update(task, description=msg))
    fit = sweep.fit
    assert fit is not None  # run_sweep raises when it cannot fit
    if as_json:
        _echo_json(sweep.model_dump(mode="json"))
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
        _say(f"harness: warning: {w}")


# --------------------------------------------------------------------------- avalanche and RTO


@app.command()
def avalanche(
    *,
    classes: Annotated[
        Path | None, typer.Option("--classes", help="JSONL of {name, keys, ttl_s, write_span_s, jitter_s}.")
    ] = None,
    cache_state: Annotated[
        Path | None, typer.Option("--cache-state", help="Saved cache state dir: measured expiry.")
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="Live server: TTLs from /cache/stats, writes from /metrics.")
    ] = None,
    write_span_s: Annotated[
        float, typer.Option("--write-span-s", help="With --url: seconds the keys were written over.")
    ] = 0.0,
    window_s: Annotated[float, typer.Option("--window-s", help="Critical window Δ in seconds.")] = 60.0,
    target: Annotated[
        float | None, typer.Option("--target", help="Target P: print the TTL jitter that reaches it.")
    ] = None,
    by: Annotated[str, typer.Option("--by", help="With --cache-state: 'tier' or 'tenant-tier'.")] = "tier",
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Avalanche probability P = 1 − Π(1 − p_i) over key classes, with the jitter advice."""
    from harness.analysis.avalanche import (
        assess,
        classes_from_server,
        read_classes,
        risks_from_classes,
        risks_from_state,
    )

    if sum(x is not None for x in (classes, cache_state, url)) != 1:
        raise typer.BadParameter(
            "give exactly one of --classes, --cache-state, --url", param_hint="--classes"
        )
    if by not in ("tier", "tenant-tier"):
        raise typer.BadParameter("expected 'tier' or 'tenant-tier'", param_hint="--by")
    spans: dict[str, float] = {}
    if classes is not None:
        described = read_classes(classes)
        spans = {c.name: c.write_span_s for c in described}
        risks = risks_from_classes(described, window_s)
    elif cache_state is not None:
        risks = risks_from_state(cache_state, window_s, by)
    else:
        assert url is not None
        stats, metrics = _fetch_server(url)
        described = classes_from_server(stats, metrics, write_span_s)
        spans = {c.name: c.write_span_s for c in described}
        risks = risks_from_classes(described, window_s)
    report = assess(risks, window_s, target, spans)
    if as_json:
        _echo_json(report.model_dump())
        return
    table = Table(title=f"cache avalanche — window Δ = {window_s:g} s")
    for col in ("class", "keys", "TTL s", "spread s", "p_i", "together", "jitter s", "source"):
        table.add_column(col, justify="left" if col in ("class", "source") else "right")
    for r in report.classes:
        table.add_row(
            r.name,
            f"{r.keys:,}",
            "—" if r.ttl_s is None else f"{r.ttl_s:,.0f}",
            f"{r.spread_s:,.0f}",
            f"{r.p:.3f}",
            f"{r.together:,.0f}",
            "—" if r.jitter_s is None else f"{r.jitter_s:,.0f}",
            r.source,
        )
    console.print(table)
    msg = f"P = 1 − Π(1 − p_i) = {report.probability:.4f}"
    if report.target is not None:
        msg += f"; target {report.target:g} needs p_i ≤ {report.per_class_target:.4f} per class"
    console.print(msg, highlight=False)


def _fetch_server(url: str) -> tuple[dict[str, Any], str]:
    import httpx

    from harness.common.errors import UnavailableError

    base = url.rstrip("/")
    try:
        with httpx.Client(timeout=10.0) as client:
            stats = client.get(base + "/cache/stats")
            stats.raise_for_status()
            metrics = client.get(base + "/metrics")
            metrics.raise_for_status()
    except httpx.HTTPError as exc:
        raise UnavailableError(f"cannot read the server's cache stats: {exc}", field="--url") from None
    return stats.json(), metrics.text


@app.command()
def rto(
    *,
    expired_keys: Annotated[int, typer.Option("--expired-keys", help="Keys expiring at once (N).")],
    gen_s: Annotated[float, typer.Option("--gen-s", help="Mean generation time of a miss, seconds.")],
    slots: Annotated[int, typer.Option("--slots", help="Requests the engine decodes together.")],
    utilization: Annotated[
        float, typer.Option("--utilization", help="Engine share busy with normal traffic (0–1).")
    ] = 0.0,
    coefficients: Annotated[
        Path | None, typer.Option("--coefficients", help="Calibrated coefficients (rto-calibrate -o).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Predict the recovery time after N keys expire at once: RTO = c0 + c1 · N·g/(s·(1 − ρ))."""
    from pydantic import ValidationError

    from harness.analysis.avalanche import RtoCase, RtoCoefficients, predict_rto, read_coefficients

    try:
        case = RtoCase(expired_keys=expired_keys, gen_s=gen_s, slots=slots, utilization=utilization)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise typer.BadParameter(f"{err['loc'][0]}: {err['msg']}") from None
    coef = read_coefficients(coefficients) if coefficients is not None else RtoCoefficients()
    value = predict_rto(case, coef)
    if as_json:
        _echo_json(
            {
                "rto_s": value,
                "work_s": case.work_s,
                "coefficients": coef.model_dump(),
                "case": case.model_dump(),
            }
        )
        return
    table = Table(title="RTO prediction")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("rebuild work W = N·g/(s·(1 − ρ))", f"{case.work_s:,.1f} s")
    table.add_row("c0 (fixed), c1 (contention)", f"{coef.c0:g} s, {coef.c1:g}")
    table.add_row("calibrated on", f"{coef.calibrated_on} runs")
    table.add_row("RTO = c0 + c1 · W", f"{value:,.1f} s")
    console.print(table)


@app.command("rto-calibrate")
def rto_calibrate(
    cases: Annotated[
        Path, typer.Argument(help="JSONL of measured runs: {expired_keys, gen_s, slots, utilization, rto_s}.")
    ],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the coefficients here.")] = None,
) -> None:
    """Fit RTO = c0 + c1·W to measured runs (non-negative least squares)."""
    from harness.analysis.avalanche import calibrate, read_cases

    coef = calibrate(read_cases(cases))
    if out is not None:
        write_json(out, coef.model_dump())
    _echo_json(coef.model_dump())


@app.command("rto-measure")
def rto_measure(
    run: Annotated[Path, typer.Argument(help="Load run directory (records with x-cache).")],
    event_s: Annotated[float, typer.Option("--event-s", help="When the keys expired (run seconds).")],
    window_s: Annotated[float, typer.Option("--window-s", help="Trailing window of the hit rate.")] = 10.0,
    recover: Annotated[
        float, typer.Option("--recover", help="Recovered at this share of the baseline.")
    ] = 0.95,
) -> None:
    """Measure a run's RTO: seconds until the windowed hit rate is back to a share of its baseline."""
    from harness.analysis.avalanche import measure_rto_run

    value = measure_rto_run(run, event_s, window_s=window_s, recover=recover)
    _echo_json({"rto_s": value, "event_s": event_s, "window_s": window_s, "recover": recover})


# --------------------------------------------------------------------------- index warmup


@app.command()
def index(
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the saved indexes.")] = Path(
        ".harness/index-warmup"
    ),
    corpus: Annotated[Path | None, typer.Option("--corpus", help="Corpus to embed (MiniLM).")] = None,
    vectors: Annotated[Path | None, typer.Option("--vectors", help="(n, d) float32 .npy matrix.")] = None,
    sizes: Annotated[str, typer.Option("--sizes", help="Comma-separated index sizes.")] = "1000,10000",
    kinds: Annotated[
        str, typer.Option("--kinds", help="Comma-separated: flat, ivf, hnsw.")
    ] = "flat,ivf,hnsw",
    repeats: Annotated[int, typer.Option("--repeats", help="Timed loads per index.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Build, save, load (timed) and check FAISS Flat/IVF/HNSW indexes from corpus embeddings."""
    import numpy as np

    from harness.analysis.index_warmup import INDEX_KINDS, corpus_texts, index_warmup, load_vectors

    if corpus is None and vectors is None:
        raise typer.BadParameter("give --corpus or --vectors", param_hint="--corpus")
    kind_list = [k.strip() for k in kinds.split(",") if k.strip()]
    for k in kind_list:
        INDEX_KINDS.get(k)
    try:
        size_list = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"{sizes!r} is not a list of integers", param_hint="--sizes") from None
    mats = []
    if vectors is not None:
        mats.append(load_vectors(vectors))
    if corpus is not None:
        from harness.common.embeddings import shared_embedder

        mats.append(shared_embedder().encode(corpus_texts(corpus), show_progress=sys.stderr.isatty()))
    x = np.ascontiguousarray(np.vstack(mats), dtype=np.float32)
    results = index_warmup(x, size_list, kind_list, out, repeats=repeats)
    if as_json:
        _echo_json([r.model_dump() for r in results])
        return
    table = Table(title=f"FAISS index warmup — {x.shape[0]:,} real vectors, dim {x.shape[1]}")
    for col in (
        "kind",
        "n",
        "synthetic",
        "build s",
        "load ms",
        "fresh load ms",
        "file MiB",
        "RSS MiB",
        "reconstruct",
        "self-recall",
    ):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for r in results:
        rec = (
            "n/a"
            if r.reconstruct_ok is None
            else ("ok" if r.reconstruct_ok else f"FAIL {r.reconstruct_max_err:.1e}")
        )
        table.add_row(
            r.kind,
            f"{r.n:,}",
            f"{r.synthetic:,}",
            f"{r.build_s:.2f}",
            f"{r.load_s * 1000:.1f}",
            f"{r.fresh_load_s * 1000:.1f}",
            f"{r.file_bytes / 2**20:.1f}",
            f"{r.rss_growth_bytes / 2**20:.1f}",
            rec,
            f"{r.self_recall:.3f}",
        )
    console.print(table)
    if any(r.reconstruct_ok is False for r in results):
        from harness.common.errors import CheckFailed

        raise CheckFailed("a loaded index does not reconstruct its vectors within 1e-5")


# --------------------------------------------------------------------------- GPU fragmentation


@app.command("gpu-frag")
def gpu_frag(
    *,
    size_mb: Annotated[int, typer.Option("--size-mb", help="Bytes copied per transfer, MiB.")] = 256,
    cycles: Annotated[int, typer.Option("--cycles", help="Alloc/free rounds (16 tensors each).")] = 2000,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed copies per scenario.")] = 5,
    device: Annotated[str, typer.Option("--device", help="CUDA device.")] = "cuda",
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """H2D copy throughput into contiguous vs fragmented GPU memory (CUDA only; exit 5 without)."""
    from harness.analysis.gpu_frag import run_fragmentation

    report = run_fragmentation(size_mb=size_mb, cycles=cycles, repeats=repeats, device=device)
    if as_json:
        _echo_json(report.model_dump())
        return
    table = Table(title=f"GPU fragmentation — {report.device}, {size_mb} MiB transfers")
    for col in ("scenario", "pieces", "ms", "GB/s", "vs contiguous"):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for r in report.rows:
        table.add_row(
            r.scenario,
            f"{r.pieces:,}",
            f"{r.seconds * 1000:.2f}",
            f"{r.gb_per_s:.2f}",
            f"{r.vs_contiguous:.2f}×",
        )
    console.print(table)
    console.print(
        f"allocator after fragmenting: reserved {report.reserved_bytes / 2**20:.0f} MiB, "
        f"allocated {report.allocated_bytes / 2**20:.0f} MiB, "
        f"inactive split {report.inactive_split_bytes / 2**20:.0f} MiB ({_pct(report.fragmentation)})",
        highlight=False,
    )


# --------------------------------------------------------------------------- anomaly tree


@app.command()
def scrape(
    *,
    url: Annotated[str, typer.Option("--url", help="The /metrics URL to scrape.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Scrapes JSONL to write.")],
    every_s: Annotated[float, typer.Option("--every-s", help="Seconds between scrapes.")] = 5.0,
    count: Annotated[int, typer.Option("--count", help="Number of scrapes.")] = 60,
) -> None:
    """Scrape /metrics periodically into a JSONL for `harness analysis anomaly`."""
    from harness.analysis.anomaly import collect_scrapes

    scrapes = collect_scrapes(url, every_s=every_s, count=count, out=out)
    _say(f"wrote {len(scrapes)} scrapes to {out}")


def _span(text: str | None, t0: float, t1: float, name: str) -> Any:
    """``A:B`` seconds from the first sample (either end may be empty) → a Window."""
    from harness.analysis.anomaly import Window

    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        start = t0 + float(a) if a else t0
        end = t0 + float(b) if b else t1
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not START:END in seconds", param_hint=name) from None
    if not sep:
        raise typer.BadParameter(f"{text!r} is not START:END in seconds", param_hint=name)
    return Window(start=start, end=end)


@app.command()
def anomaly(
    *,
    scrapes: Annotated[
        Path | None, typer.Option("--scrapes", help="Scrapes JSONL (harness analysis scrape).")
    ] = None,
    prometheus: Annotated[str | None, typer.Option("--prometheus", help="Prometheus base URL.")] = None,
    start: Annotated[float | None, typer.Option("--start", help="With --prometheus: unix start.")] = None,
    end: Annotated[float | None, typer.Option("--end", help="With --prometheus: unix end.")] = None,
    step_s: Annotated[float, typer.Option("--step-s", help="With --prometheus: resolution.")] = 15.0,
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="START:END seconds from the first sample.")
    ] = None,
    window: Annotated[str | None, typer.Option("--window", help="START:END seconds (test window).")] = None,
    z_min: Annotated[
        float, typer.Option("--z-min", help="Deviation (in baseline scales) that counts.")
    ] = 3.0,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the tree JSON here.")] = None,
    schema: Annotated[bool, typer.Option("--schema", help="Print the JSON schema and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Attribute HitRate/FillRate/ThermalDrift deviations to tier/tenant/scenario and leaf causes."""
    from harness.analysis.anomaly import (
        AnomalyReport,
        attribute,
        read_scrapes,
        render_tree,
        series_from_prometheus,
    )
    from harness.analysis.anomaly import series_from_scrapes as from_scrapes

    if schema:
        _echo_json(AnomalyReport.model_json_schema())
        return
    if (scrapes is None) == (prometheus is None):
        raise typer.BadParameter("give exactly one of --scrapes and --prometheus", param_hint="--scrapes")
    if prometheus is not None:
        if start is None or end is None:
            raise typer.BadParameter("--prometheus needs --start and --end", param_hint="--start")
        series = series_from_prometheus(prometheus, start, end, step_s)
        source = prometheus
    else:
        assert scrapes is not None
        series = from_scrapes(read_scrapes(scrapes))
        source = str(scrapes)
    times = [t for s in series.values() for t, _ in s]
    if not times:
        raise InputError("no samples of the cache or server metrics", file=source)
    t0, t1 = min(times), max(times)
    report = attribute(
        series,
        source=source,
        baseline=_span(baseline, t0, t1, "--baseline"),
        window=_span(window, t0, t1, "--window"),
        z_min=z_min,
    )
    if out is not None:
        write_json(out, report.model_dump(mode="json"))
    if as_json:
        _echo_json(report.model_dump(mode="json"))
        return
    console.print("\n".join(render_tree(report.root)), highlight=False, markup=False)
    console.print(f"{report.anomalies} anomalous series of {report.series}", highlight=False)
