"""The report's plots: a registry of matplotlib figures, each drawn from the result sets.

Every plot is a :class:`Plot` (an id, a title, alt text and a ``draw`` function) registered in
:data:`PLOTS`; the HTML report embeds each as a PNG (base64, so the file opens offline) inside
``<figure id="fig-…">``. ``draw`` returns a matplotlib :class:`~matplotlib.figure.Figure`, or a
sentence saying why the plot does not apply (no cold and warm pair, no prefill bytes reported) —
the report shows that sentence in the figure's place rather than an empty chart.

Every axes has a title, axis labels with units and a legend (checked by the tests). Figures are
built with :class:`~matplotlib.figure.Figure` directly, not pyplot, so no global state is touched.
Percentiles come from :mod:`harness.common.stats` only; scatter plots draw at most
:data:`MAX_POINTS` points per run (chosen evenly), while percentile lines use every record.

The figures drawn from an experiment's result file rather than from result sets (the capacity search's
``capacity.json``, the warmup effect's ``effect.json``) are not registered here: they are in
:mod:`harness.reports.experiment_plots`, which uses this module's :class:`Plot` and drawing helpers.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from harness.common.headers import CACHE_STATUSES
from harness.common.prometheus import counter_increase
from harness.common.registry import Registry
from harness.common.stats import percentile, percentile_interval
from harness.gates.measurement import rate_interval
from harness.gates.metrics import format_value
from harness.gates.runs import FloatArray, ResultSet
from harness.load.results import cache_counts, prefix_counts, warm_counts
from harness.load.run_summary import CLIENT_BOUND_LATENESS_MS
from harness.load.server_metrics import SERVER_METRICS_FILE, ServerSample, read_server_metrics

MAX_POINTS = 20_000
DPI = 100
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
LABEL_COLOURS = {"cold": "#4c72b0", "warm": "#dd8452"}
TIER_COLOURS = {"HIT-L1": "#2ca02c", "HIT-L2": "#98df8a", "HIT-L3": "#17becf", "prefix": "#9467bd"}

Drawn = Figure | str


@dataclass(frozen=True)
class Plot:
    """One figure of the report."""

    id: str
    """The HTML element id (``fig-latency-cdf``); stable, tests and links use it."""
    title: str
    alt: str
    """Alt text: what the figure shows, for screen readers and for a report whose images are off."""
    draw: Callable[[Sequence[ResultSet]], Drawn]


PLOTS: Registry[Plot] = Registry("report plot")


def _plot(id: str, title: str, alt: str) -> Callable[[Callable[[Sequence[ResultSet]], Drawn]], Plot]:
    def deco(fn: Callable[[Sequence[ResultSet]], Drawn]) -> Plot:
        plot = Plot(id=id, title=title, alt=alt, draw=fn)
        PLOTS.register(id)(plot)
        return plot

    return deco


def colour(rs: ResultSet, index: int) -> str:
    """A run's colour: cold and warm have fixed ones, others follow the palette."""
    return LABEL_COLOURS.get(rs.label, PALETTE[index % len(PALETTE)])


def to_png_base64(fig: Figure) -> str:
    """The figure as a base64 PNG (for ``<img src="data:image/png;base64,…">``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _present(values: FloatArray) -> FloatArray:
    out: FloatArray = values[np.isfinite(values)]
    return out


def _thin(n: int) -> np.ndarray:
    """Indices of at most MAX_POINTS rows, evenly spread (deterministic, so reports are reproducible)."""
    if n <= MAX_POINTS:
        return np.arange(n)
    return np.linspace(0, n - 1, MAX_POINTS).astype(np.int64)


def _ms_axis(ax: Axes, values: Sequence[FloatArray]) -> None:
    """Log scale when the values span more than two decades (TTFT of cached vs prefilled requests)."""
    allv = np.concatenate([v for v in values if v.size]) if any(v.size for v in values) else np.empty(0)
    pos = allv[allv > 0]
    if pos.size and pos.max() / pos.min() > 100:
        ax.set_xscale("log")


def _no_data(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666", wrap=True)


# ------------------------------------------------------------------------------------ latency CDFs

_LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))


@_plot(
    "fig-latency-cdf",
    "Latency CDFs: TTFT, TPOT, E2E",
    "Empirical cumulative distributions of time to first token, time per output token and end-to-end "
    "latency in milliseconds, one line per run, with each run's P95 marked.",
)
def latency_cdf(sets: Sequence[ResultSet]) -> Drawn:
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    fig.suptitle("Latency CDFs (share of requests at or below a latency)")
    for ax, (column, name) in zip(axes, _LATENCIES, strict=True):
        values = [_present(rs.frame.col(column)) for rs in sets]
        for i, (rs, v) in enumerate(zip(sets, values, strict=True)):
            if not v.size:
                continue
            xs = np.sort(v)
            ys = np.arange(1, xs.size + 1) / xs.size
            p95 = percentile(v, 95)
            label = f"{rs.label} (n={v.size}, P95 {format_value(p95, 'ms')})"
            ax.step(xs, ys, where="post", color=colour(rs, i), label=label)
            ax.plot([p95], [0.95], marker="o", color=colour(rs, i), markersize=5)
        finish_cdf(
            ax, values, title=f"{name} CDF", xlabel=f"{name} (ms)", ylabel="share of requests ≤ x",
            empty=f"no {name} samples",
        )  # fmt: skip
    return fig


def finish_cdf(
    ax: Axes, values: Sequence[FloatArray], *, title: str, xlabel: str, ylabel: str, empty: str
) -> None:
    """The frame of a latency CDF drawn on ``ax``: the P95 level, a millisecond axis fitted to
    ``values``, titles, and ``empty`` said when no run had a sample."""
    ax.axhline(0.95, color="#999999", linestyle=":", linewidth=1, label="P95 level")
    _ms_axis(ax, values)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    if not any(v.size for v in values):
        _no_data(ax, empty)
    ax.legend(fontsize=8, loc="lower right")


# ------------------------------------------------------------------------------ latency over time


def _stage_marks(rs: ResultSet) -> tuple[list[tuple[float, str]], list[tuple[float, float, str]]]:
    """Stage starts ``(t, name)`` and rollbacks ``(start, end, text)``, from the summary's stages or,
    when it has none, from where the records' ``stage`` changes."""
    starts: list[tuple[float, str]] = []
    rollbacks: list[tuple[float, float, str]] = []
    summary = rs.summary
    if summary is not None and summary.stages:
        for st in summary.stages:
            starts.append((st.started_s, st.name))
            if st.verdict == "rolled_back":
                to = f" → {st.rolled_back_to}" if st.rolled_back_to else ""
                rollbacks.append(
                    (st.started_s, st.ended_s, f"rollback {st.name}{to} ({st.failure_rate:.0%} failed)")
                )
        return starts, rollbacks
    sent, stage = rs.frame.col("sent_s"), rs.frame.text["stage"]
    order = np.argsort(sent, kind="stable")
    last: object = None
    for idx in order:
        if stage[idx] != last:
            starts.append((float(sent[idx]), str(stage[idx])))
            last = stage[idx]
    return (starts if len(starts) > 1 else []), rollbacks


def _binned_percentile(t: FloatArray, v: FloatArray, q: float) -> tuple[FloatArray, FloatArray]:
    """``q``-th percentile of ``v`` per time bin (about 40 bins, ≥ 1 s, bins with ≥ 5 samples)."""
    ok = np.isfinite(t) & np.isfinite(v)
    t, v = t[ok], v[ok]
    if t.size < 5:
        return np.empty(0), np.empty(0)
    span = float(t.max() - t.min())
    width = max(1.0, span / 40)
    edges = np.arange(float(t.min()), float(t.max()) + width, width)
    which = np.digitize(t, edges)
    xs, ys = [], []
    for b in np.unique(which):
        sel = v[which == b]
        if sel.size >= 5:
            xs.append(float(edges[b - 1] + width / 2))
            ys.append(percentile(sel, q))
    return np.asarray(xs), np.asarray(ys)


_LABEL_BOX = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}


def _mark_stages(ax: Axes, rs: ResultSet) -> None:
    """Dashed lines where stages start (named at the top), red bands over rolled-back stages."""
    starts, rollbacks = _stage_marks(rs)
    for j, (t, name) in enumerate(starts):
        ax.axvline(t, color="#555555", linestyle="--", linewidth=0.8, label="stage start" if j == 0 else None)
        ax.annotate(name, (t, 0.97), xycoords=("data", "axes fraction"), xytext=(3, 0),
                    textcoords="offset points", fontsize=7, va="top", ha="left", color="#333333",
                    bbox=_LABEL_BOX)  # fmt: skip
    for j, (t0, t1, text) in enumerate(rollbacks):
        ax.axvspan(t0, t1, color="#d62728", alpha=0.12, label="rolled-back stage" if j == 0 else None)
        ax.annotate(text, ((t0 + t1) / 2, 0.03), xycoords=("data", "axes fraction"), fontsize=7,
                    va="bottom", ha="center", color="#a11d1d", bbox=_LABEL_BOX)  # fmt: skip


def _figure_legend(fig: Figure, axes: Sequence[Axes]) -> None:
    """One legend for the whole figure, below the panels, with every label any panel uses once."""
    seen: dict[str, Artist] = {}
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        for h, label in zip(handles, labels, strict=True):
            seen.setdefault(label, h)
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen),
            loc="outside lower center",
            ncols=min(6, len(seen)),
            fontsize=8,
            markerscale=3,
        )


@_plot(
    "fig-latency-time",
    "TTFT and TPOT over time, with stage boundaries and rollbacks",
    "Scatter of each request's time to first token and time per output token in milliseconds against "
    "its send time in seconds, with the P95 per time bin, dashed lines where traffic stages start and red "
    "bands over stages the warmup ladder rolled back.",
)
def latency_over_time(sets: Sequence[ResultSet]) -> Drawn:
    fig = Figure(figsize=(13, 3.2 * len(sets) + 0.6), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(sets), 2, squeeze=False))
    fig.suptitle("TTFT and TPOT over the run (dots: requests; line: P95 per time bin)")
    for row, rs in enumerate(sets):
        t = rs.frame.col("sent_s")
        for col, (column, name) in enumerate((("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))):
            ax = axes[row][col]
            v = rs.frame.col(column)
            idx = _thin(rs.frame.n)
            ok = np.isfinite(v[idx]) & np.isfinite(t[idx])
            c = colour(rs, row)
            ax.scatter(t[idx][ok], v[idx][ok], s=4, alpha=0.35, color=c, label=f"{rs.label}: requests")
            bx, by = _binned_percentile(t, v, 95)
            if bx.size:
                ax.plot(bx, by, color="black", linewidth=1.4, label="P95 per time bin")
            _mark_stages(ax, rs)
            if not ok.any():
                _no_data(ax, f"no {name} samples")
            ax.set_title(f"{rs.label}: {name} over time")
            ax.set_xlabel("send time since the run's start (s)")
            ax.set_ylabel(f"{name} (ms)")
            ax.grid(alpha=0.3)
    _figure_legend(fig, list(axes.flat))
    return fig


# --------------------------------------------------------------------------- the server's telemetry


def server_samples(rs: ResultSet) -> list[ServerSample]:
    """The scrapes of a run's ``server_metrics.jsonl`` that carry server values (``[]``: none)."""
    path = rs.path / SERVER_METRICS_FILE
    if not path.is_file():
        return []
    return [s for s in read_server_metrics(path) if s.kind is not None]


def _interval_hit_rate(samples: Sequence[ServerSample]) -> tuple[FloatArray, FloatArray]:
    """The server's prefix hit rate between consecutive scrapes (hits grown / queries grown), at the
    interval's end, each growth by the one counter rule (a reset counts from 0, as in the summary's
    per-phase deltas); intervals with no lookups are skipped."""
    xs, ys = [], []
    prev: tuple[float, float] | None = None
    for s in samples:
        if s.prefix_queries is None or s.prefix_hits is None:
            continue
        if prev is not None:
            dq = counter_increase(prev[0], s.prefix_queries)
            dh = counter_increase(prev[1], s.prefix_hits)
            if dq > 0:
                xs.append(s.t_s)
                ys.append(100.0 * dh / dq)
        prev = (s.prefix_queries, s.prefix_hits)
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def _series(samples: Sequence[ServerSample], field: str) -> tuple[FloatArray, FloatArray]:
    pts = [(s.t_s, v) for s in samples if (v := getattr(s, field)) is not None]
    return np.asarray([p[0] for p in pts]), np.asarray([p[1] for p in pts])


@_plot(
    "fig-server-metrics",
    "The target's own metrics over time, beside TTFT",
    "Per run, on one time axis in seconds since the run's start: each request's time to first token in "
    "milliseconds with its P95 per time bin; the requests the server was running and queueing; and the "
    "server's prefix-cache hit rate per scrape interval and KV cache usage in percent, from its /metrics "
    "scraped during the run, with dashed lines where stages start.",
)
def server_metrics_over_time(sets: Sequence[ResultSet]) -> Drawn:
    scraped = [(i, rs, server_samples(rs)) for i, rs in enumerate(sets)]
    shown = [(i, rs, ss) for i, rs, ss in scraped if ss]
    if not shown:
        return (
            f"No run has server metrics ({SERVER_METRICS_FILE}): the target had no Prometheus /metrics, "
            "or the runs were made with --server-metrics-interval 0 or before it existed."
        )
    fig = Figure(figsize=(13, 3.0 * len(shown) + 0.6), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(shown), 3, squeeze=False, sharex="row"))
    missing = [rs.label for _, rs, ss in scraped if not ss]
    note = f"; no server metrics for {', '.join(missing)}" if missing else ""
    fig.suptitle(f"The target's own metrics (scraped /metrics) on the requests' time axis{note}")
    for row, (i, rs, ss) in enumerate(shown):
        kind = ss[0].kind
        c = colour(rs, i)
        ttft, running, cache = axes[row]
        t, v = rs.frame.col("sent_s"), rs.frame.col("ttft_ms")
        idx = _thin(rs.frame.n)
        ok = np.isfinite(v[idx]) & np.isfinite(t[idx])
        ttft.scatter(t[idx][ok], v[idx][ok], s=4, alpha=0.35, color=c, label=f"{rs.label}: requests")
        bx, by = _binned_percentile(t, v, 95)
        if bx.size:
            ttft.plot(bx, by, color="black", linewidth=1.4, label="P95 per time bin")
        ttft.set_title(f"{rs.label}: TTFT")
        ttft.set_ylabel("TTFT (ms)")
        for field, style, name in (("running", "-", "running"), ("waiting", "--", "waiting")):
            x, y = _series(ss, field)
            if x.size:
                running.step(x, y, where="post", linestyle=style, color=c, label=f"server: {name}")
        running.set_title(f"{rs.label}: requests at the server ({kind})")
        running.set_ylabel("requests (count)")
        hx, hy = _interval_hit_rate(ss)
        if hx.size:
            cache.plot(hx, hy, marker="o", markersize=3, color="#9467bd", label="server prefix hit rate")
        kx, ky = _series(ss, "kv_usage")
        if kx.size:
            cache.plot(kx, 100.0 * ky, color="#8c564b", linestyle="--", label="KV cache usage")
        if not hx.size and not kx.size:
            _no_data(cache, f"the target ({kind}) reports no prefix counters or KV usage")
        cache.set_title(f"{rs.label}: prefix cache and KV usage")
        cache.set_ylabel("share (%)")
        cache.set_ylim(-2, 102)
        for ax in (ttft, running, cache):
            _mark_stages(ax, rs)
            ax.set_xlabel("time since the run's start (s)")
            ax.grid(alpha=0.3)
    _figure_legend(fig, list(axes.flat))
    return fig


# ------------------------------------------------------------------------------- hit rate over time


@_plot(
    "fig-hit-rate-time",
    "Cache hit rate by tier over time",
    "Stacked share of requests answered by the L1, L2 and L3 response-cache tiers per time bin, and the "
    "share with prefix-cache hits, in percent against send time in seconds, one panel per run.",
)
def hit_rate_over_time(sets: Sequence[ResultSet]) -> Drawn:
    fig = Figure(figsize=(13, 3.0 * len(sets) + 0.6), layout="constrained")
    axes = fig.subplots(len(sets), 1, squeeze=False)
    fig.suptitle("Hit rate by cache tier over the run")
    for row, rs in enumerate(sets):
        ax = axes[row][0]
        t = rs.frame.col("sent_s")
        told = rs.frame.cache_told()
        reported, prefix_hit = rs.frame.prefix_hit()
        finite_t = np.isfinite(t)
        if not (told | reported).any() or not finite_t.any():
            _no_data(ax, "the target sent neither x-cache headers nor cached_tokens")
        else:
            span = float(np.nanmax(t) - np.nanmin(t))
            width = max(1.0, span / 40)
            edges = np.arange(float(np.nanmin(t)), float(np.nanmax(t)) + width, width)
            which = np.digitize(t, edges)
            centres = edges[:-1] + width / 2 if edges.size > 1 else edges
            bins = range(1, max(2, edges.size))
            tiers: list[str] = [tier for tier in CACHE_STATUSES if tier.startswith("HIT")]
            tier_hits = {tier: rs.frame.cache_hit(tier) for tier in tiers}
            shares: dict[str, list[float]] = {tier: [] for tier in tiers}
            prefix: list[float] = []
            for b in bins:
                in_bin = which == b
                n_told = int((in_bin & told).sum())
                for tier, out in shares.items():
                    hits = int((in_bin & tier_hits[tier]).sum())
                    out.append(100.0 * hits / n_told if n_told else math.nan)
                n_rep = int((in_bin & reported).sum())
                prefix.append(100.0 * int((in_bin & prefix_hit).sum()) / n_rep if n_rep else math.nan)
            xs = centres[: len(prefix)]
            ax.stackplot(
                xs,
                *[np.nan_to_num(np.asarray(v)) for v in shares.values()],
                labels=[f"{tier} (response cache)" for tier in shares],
                colors=[TIER_COLOURS[tier] for tier in shares],
                alpha=0.8,
            )
            ax.plot(
                xs,
                prefix,
                color=TIER_COLOURS["prefix"],
                linewidth=1.6,
                marker=".",
                label="prefix cache (cached_tokens > 0)",
            )
            _mark_stages(ax, rs)
        ax.set_title(f"{rs.label}: hit rate by tier")
        ax.set_xlabel("send time since the run's start (s)")
        ax.set_ylabel("share of requests (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    _figure_legend(fig, [row[0] for row in axes])
    return fig


# ---------------------------------------------------------------------------------------- lateness


@_plot(
    "fig-lateness",
    "Send lateness histogram",
    "Histogram of how late the client sent each request relative to its schedule, in milliseconds, one "
    "outline per run, with each run's P99 and the 5 ms line above which a P99 of the client's own part "
    "(lateness less the wait for a free user) draws a client-jitter warning.",
)
def lateness_histogram(sets: Sequence[ResultSet]) -> Drawn:
    fig = Figure(figsize=(9, 4), layout="constrained")
    ax = fig.subplots()
    values = [_present(rs.frame.col("lateness_ms")) for rs in sets]
    top = max([float(v.max()) for v in values if v.size] + [CLIENT_BOUND_LATENESS_MS * 1.2])
    bins = np.linspace(0.0, top, 60)
    for i, (rs, v) in enumerate(zip(sets, values, strict=True)):
        if not v.size:
            continue
        p99 = percentile(v, 99)
        ax.hist(
            v,
            bins=bins.tolist(),
            histtype="step",
            linewidth=1.5,
            color=colour(rs, i),
            label=f"{rs.label} (P99 {p99:.2f} ms)",
        )
        ax.axvline(p99, color=colour(rs, i), linestyle=":", linewidth=1)
    ax.axvline(CLIENT_BOUND_LATENESS_MS, color="#d62728", linestyle="--", linewidth=1,
               label=f"client jitter warned above own P99 {CLIENT_BOUND_LATENESS_MS:g} ms")  # fmt: skip
    ax.set_yscale("log")
    ax.set_title("Send lateness (how late the client sent each request)")
    ax.set_xlabel("lateness (ms)")
    ax.set_ylabel("requests (log scale)")
    ax.grid(alpha=0.3)
    if not any(v.size for v in values):
        _no_data(ax, "no lateness samples")
    ax.legend(fontsize=8)
    return fig


# ----------------------------------------------------------------------------------- cold vs warm


def pair(sets: Sequence[ResultSet]) -> tuple[ResultSet, ResultSet] | None:
    """The runs labelled ``cold`` and ``warm``, when both were given."""
    by = {rs.label: rs for rs in sets}
    if "cold" in by and "warm" in by:
        return by["cold"], by["warm"]
    return None


def _rate_of(rs: ResultSet, kind: str) -> tuple[int, int]:
    """``(hits, requests that reported)`` for the response cache, the prefix cache, or either, counted
    as the gates' ``hit_rate_any``, ``hit_rate_prefix`` and ``warm_rate`` count them."""
    statuses, cached, ok = rs.frame.text["cache"], rs.frame.col("cached_tokens"), rs.frame.ok
    if kind == "response cache":
        return cache_counts(statuses, None, ok)
    if kind == "prefix cache":
        return prefix_counts(cached, ok)
    return warm_counts(statuses, cached, ok)


@_plot(
    "fig-cold-warm",
    "Cold vs warm",
    "Side-by-side bars of P50, P95 and P99 time to first token, time per output token and end-to-end "
    "latency in milliseconds for the cold and the warm run with 95 % intervals, and their hit rates in "
    "percent.",
)
def cold_vs_warm(sets: Sequence[ResultSet]) -> Drawn:
    both = pair(sets)
    if both is None:
        return "Not a paired run: pass cold=DIR warm=DIR (as `harness run` writes them) to compare them."
    fig = Figure(figsize=(14, 4.2), layout="constrained")
    axes = fig.subplots(1, 4)
    fig.suptitle("Cold vs warm (bars: nearest-rank percentiles; whiskers: 95 % intervals)")
    qs = (50, 95, 99)
    x = np.arange(len(qs))
    width = 0.38
    for ax, (column, name) in zip(axes[:3], _LATENCIES, strict=True):
        for j, rs in enumerate(both):
            v = _present(rs.frame.col(column))
            if not v.size:
                continue
            vals = np.asarray([percentile(v, q) for q in qs])
            ivs = [percentile_interval(v, q) for q in qs]
            lo = np.asarray(
                [
                    max(0.0, val - iv[0]) if math.isfinite(iv[0]) else 0.0
                    for val, iv in zip(vals, ivs, strict=True)
                ]
            )
            hi = np.asarray(
                [iv[1] - val if math.isfinite(iv[1]) else 0.0 for val, iv in zip(vals, ivs, strict=True)]
            )
            ax.bar(
                x + (j - 0.5) * width,
                vals,
                width,
                yerr=[lo, hi],
                capsize=3,
                color=colour(rs, j),
                label=rs.label,
            )
        ax.set_xticks(x, [f"P{q}" for q in qs])
        ax.set_title(f"{name}: cold vs warm")
        ax.set_xlabel("percentile")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(alpha=0.3, axis="y")
    ax = axes[3]
    kinds = ("response cache", "prefix cache", "warm (either)")
    xk = np.arange(len(kinds))
    for j, rs in enumerate(both):
        shares: list[float] = []
        below: list[float] = []
        above: list[float] = []
        for kind in kinds:
            k, n = _rate_of(rs, kind)
            r = k / n if n else math.nan
            a, b = rate_interval(k, n) if n else (math.nan, math.nan)
            shares.append(100 * r)
            below.append(100 * (r - a) if n else 0.0)
            above.append(100 * (b - r) if n else 0.0)
        ax.bar(
            xk + (j - 0.5) * width,
            np.nan_to_num(shares),
            width,
            yerr=[below, above],
            capsize=3,
            color=colour(rs, j),
            label=rs.label,
        )
    ax.set_xticks(xk, kinds, fontsize=8)
    ax.set_title("Hit rates: cold vs warm")
    ax.set_xlabel("cache level")
    ax.set_ylabel("share of requests (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3, axis="y")
    # One legend for the four panels, below them: in a panel it would cover bars at 100 %.
    _figure_legend(fig, [axes[0]])
    return fig


# ----------------------------------------------------------------------- prefill bytes vs prompt


def _byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit that keeps axis ticks readable (0.1, 0.1, 0.2 MiB would repeat)."""
    for unit, scale in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if largest >= 4 * scale:
            return unit, scale
    return "B", 1.0


@_plot(
    "fig-kv-bytes",
    "Prefill KV bytes vs prompt tokens",
    "Scatter of each request's prefill KV-cache bytes against its prompt length in tokens, "
    "split into requests with and without prefix-cache hits, one marker per run.",
)
def kv_bytes_vs_prompt(sets: Sequence[ResultSet]) -> Drawn:
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    drawn = False
    markers = ("o", "s", "^", "D", "v")
    # Plot in the unit the ticks are read in, so matplotlib picks round ticks in that unit.
    largest = max(float(np.nanmax(rs.frame.col("prefill_kv_bytes"), initial=0.0)) for rs in sets)
    unit, scale = _byte_unit(largest)
    for i, rs in enumerate(sets):
        kv, tokens, cached = (rs.frame.col(c) for c in ("prefill_kv_bytes", "prompt_tokens", "cached_tokens"))
        idx = _thin(rs.frame.n)
        kv, tokens, cached = kv[idx], tokens[idx], cached[idx]
        ok = np.isfinite(kv) & np.isfinite(tokens) & (kv > 0)
        if not ok.any():
            continue
        drawn = True
        hit = np.nan_to_num(cached) > 0
        for sel, what, marker in (
            (~hit, "no prefix hit", markers[i % len(markers)]),
            (hit, "prefix-cache hit", "x"),
        ):
            pick = ok & sel
            if pick.any():
                label = f"{rs.label}: {what}"
                c = colour(rs, i)
                ax.scatter(
                    tokens[pick], kv[pick] / scale, s=10, alpha=0.5, marker=marker, color=c, label=label
                )
    if not drawn:
        return (
            "No prefill KV bytes in these records "
            "(the target does not report usage.harness.prefill_kv_bytes)."
        )
    ax.set_title("Prefill KV bytes vs prompt length")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel(f"prefill KV bytes ({unit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
