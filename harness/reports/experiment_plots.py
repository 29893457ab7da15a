"""Figures of an experiment's result file, not of result sets: the capacity search and the warmup effect.

Neither is in :data:`~harness.reports.plots.PLOTS` (whose plots are each drawn from the result sets
alone): :func:`capacity_plot` draws a :class:`~harness.experiments.capacity_result.CapacityResult`
(``harness report --capacity-json OUT/capacity.json``), :func:`effect_plot` an
:class:`~harness.analysis.effect.EffectReport` beside its passes' result sets (``harness report --effect
OUT/effect.json``). :data:`CAPACITY_PLOT` and :data:`EFFECT_PLOT` are their ids, titles and alt text;
the report shows them before the registered plots. Like those, they are built on
:class:`~matplotlib.figure.Figure` directly (not pyplot), with the helpers of :mod:`harness.reports.plots`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from harness.analysis.effect import EffectReport
from harness.experiments.capacity_result import CapacityResult
from harness.gates.runs import ResultSet
from harness.reports.plots import _LABEL_BOX, Drawn, Plot, _binned_percentile

# ------------------------------------------------------------------------ capacity: latency vs rate

CAPACITY_PLOT = Plot(
    id="fig-capacity",
    title="SLO terms vs offered rate (capacity search)",
    alt="For each SLO term of the capacity search, the value each probe measured (with its confidence "
    "interval, coloured by that term's verdict) against the offered open-loop rate in requests per "
    "second, the SLO limit as a line, the bracket between the highest passing and the lowest failing "
    "rate shaded, the capacity found as a vertical line and a cliff, if any, marked.",
    draw=lambda sets: "drawn from capacity.json (harness report --capacity-json FILE), not from result sets",
)
"""Not in :data:`~harness.reports.plots.PLOTS`: it is drawn from a
:class:`~harness.experiments.capacity_result.CapacityResult` (``harness report --capacity-json
OUT/capacity.json``) by :func:`capacity_plot`, not from result sets."""
VERDICT_COLOURS = {"pass": "#2ca02c", "fail": "#d62728", "inconclusive": "#e6a817"}


def capacity_plot(result: CapacityResult) -> Drawn:
    """One panel per SLO term: each probe's value and interval against the offered rate, the limit,
    the bracket ``[low, high]`` shaded, the capacity line, and the cliff marked."""
    if not result.probes:
        return "The capacity search ran no probe."
    n = len(result.terms)
    fig = Figure(figsize=(6.5 * min(n, 2), 4.2 * math.ceil(n / 2) + 0.6), layout="constrained")
    axes: list[Axes] = list(fig.subplots(math.ceil(n / 2), min(n, 2), squeeze=False).flat)
    fig.suptitle(f"Capacity search: SLO {result.slo} ({result.confidence:.0%} intervals)")
    rates = np.asarray([p.rate for p in result.probes])
    for i, (ax, term, limit) in enumerate(zip(axes, result.terms, result.limits, strict=False)):
        scale, unit = (100.0, "%") if term.kind == "rate" else (1.0, "ms")
        for verdict, c in VERDICT_COLOURS.items():
            pick = [p for p in result.probes if (t := p.terms[i]).verdict == verdict and t.value is not None]
            if not pick:
                continue
            x = np.asarray([p.rate for p in pick])
            y = np.asarray([float(p.terms[i].value or 0.0) for p in pick]) * scale
            lo = np.asarray([np.nan if p.terms[i].lo is None else p.terms[i].lo for p in pick], float) * scale
            hi = np.asarray([np.nan if p.terms[i].hi is None else p.terms[i].hi for p in pick], float) * scale
            # An unbounded side (too few samples for it) is drawn as no bar on that side.
            err = np.vstack([np.nan_to_num(y - lo, nan=0.0), np.nan_to_num(hi - y, nan=0.0)])
            ax.errorbar(x, y, yerr=err, fmt="o", color=c, capsize=3, label=f"term {verdict}")
        if limit is not None:
            ax.axhline(limit * scale, color="#333333", linestyle="--", linewidth=1, label="SLO limit")
        if result.high is not None and result.low > 0:
            ax.axvspan(result.low, result.high, color="#1f77b4", alpha=0.12, label="bracket [low, high]")
        if result.capacity_rps > 0:
            ax.axvline(result.capacity_rps, color="#1f77b4", linewidth=1.2, label="capacity")
        if result.cliff and result.cliff_term == term.metric and result.cliff_rates:
            mid = math.sqrt(result.cliff_rates[0] * result.cliff_rates[1])
            ax.annotate("cliff", (mid, 0.9), xycoords=("data", "axes fraction"), ha="center", color="#a11d1d",
                        fontsize=9, fontweight="bold", bbox=_LABEL_BOX)  # fmt: skip
        if rates.max() / rates.min() > 4:
            ax.set_xscale("log")
        ax.set_title(f"{term.metric} ({term.text})")
        ax.set_xlabel("offered rate (requests/s)")
        what = "errors" if term.kind == "rate" else f"P{term.q} {term.column}"
        ax.set_ylabel(f"{what} ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig


# ------------------------------------------------------------------ warmup effect: three passes, one axis

EFFECT_PLOT = Plot(
    id="fig-effect",
    title="Warmup effect: TTFT over the window, cold / planned / oracle",
    alt="TTFT P95 per time bin over the replayed window for the three passes of harness analysis effect "
    "on one axis (cold: nothing preloaded; planned: the plan's preload from the history; oracle: the "
    "best preload knowing the window), with the first 10 % and 25 % of the window marked, and beside it "
    "the realized P95 gain of the planned and oracle passes over cold per window head with its paired "
    "interval.",
    draw=lambda sets: "drawn from effect.json (harness report --effect FILE), not from result sets",
)
"""Not in :data:`~harness.reports.plots.PLOTS`: drawn from an
:class:`~harness.analysis.effect.EffectReport` and its passes by :func:`effect_plot`."""
PASS_COLOURS = {"cold": "#4c72b0", "planned": "#2ca02c", "oracle": "#9467bd"}


def effect_plot(report: EffectReport, sets: Sequence[ResultSet]) -> Drawn:
    """Left: each pass's TTFT P95 per time bin over the window (send time from the pass's start), the
    heads marked; right: the P95 gain per head, planned and oracle, with paired intervals."""
    by_label = {rs.label: rs for rs in sets}
    if not any(name in by_label for name in PASS_COLOURS):
        return "no cold / planned / oracle result set beside effect.json"
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(2, 1))
    fig.suptitle(
        f"Warmup effect: {report.window_requests} window requests, capacity {report.capacity_blocks} blocks"
    )
    for name, c in PASS_COLOURS.items():
        rs = by_label.get(name)
        if rs is None:
            continue
        t = rs.frame.col("intended_s")
        bx, by = _binned_percentile(t - np.nanmin(t), rs.frame.col("ttft_ms"), 95)
        if bx.size:
            left.plot(bx, by, color=c, linewidth=1.6, label=f"{name}: TTFT P95 per bin")
    for head in report.heads:
        if head.head < 1.0:
            left.axvline(head.head * report.window_span_s, color="#777777", linestyle=":", linewidth=1)
            at = (head.head * report.window_span_s, 0.95)
            left.annotate(f"first {head.head:.0%}", at, xycoords=("data", "axes fraction"), fontsize=8,
                          ha="left", bbox=_LABEL_BOX)  # fmt: skip
    left.set_xlabel("time in the window (s)")
    left.set_ylabel("TTFT P95 (ms)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    x = np.arange(len(report.heads))
    for k, name in enumerate(("planned", "oracle")):
        vals = [h.gain_p95.get(name) for h in report.heads]
        y = np.asarray([v.value if v is not None and v.value is not None else np.nan for v in vals]) * 100
        lo = np.asarray([v.lo if v is not None and v.lo is not None else np.nan for v in vals]) * 100
        hi = np.asarray([v.hi if v is not None and v.hi is not None else np.nan for v in vals]) * 100
        err = np.vstack([np.nan_to_num(y - lo), np.nan_to_num(hi - y)])
        right.errorbar(x + (k - 0.5) * 0.2, y, yerr=err, fmt="o", capsize=3, color=PASS_COLOURS[name],
                       label=f"{name} vs cold")  # fmt: skip
    right.axhline(0, color="#333333", linewidth=0.8)
    right.set_xticks(x, [f"first {h.head:.0%}" if h.head < 1 else "whole window" for h in report.heads])
    right.set_ylabel("P95 TTFT cut vs cold (%)")
    right.set_title(f"realized gain ({report.confidence:.0%} paired intervals)")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    return fig
