"""The report's agent-session figures: the makespan distribution and the slowest session's waterfall.

A run that replayed agent sessions (:mod:`harness.load.session_summary`: each session's LLM calls sent
as its call graph allows) gets an *Agent sessions* section; these are its two figures. They are not in
:data:`~harness.reports.plots.PLOTS`: a registered plot is drawn for every report, and a run without
sessions must get no trace of them (not even a sentence saying why), so, like the experiment figures
(:mod:`harness.reports.experiment_plots`), :data:`MAKESPAN_PLOT` and :data:`WATERFALL_PLOT` hold their
ids, titles and alt text and :mod:`harness.reports.render` draws them only when a run has sessions.

Which runs have sessions is the summary's word (``summary.json``: ``agent_sessions``), as the *Per
turn* section takes its turns from the summary; the per-session numbers behind the two figures are not
in the summary, so :func:`session_runs` reads those runs' ``records.jsonl`` once, and only theirs.

Figures are built on :class:`~matplotlib.figure.Figure` directly (not pyplot) with the helpers of
:mod:`harness.reports.plots`, and like its plots every axes has a title, units and a legend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.common.stats import percentile
from harness.gates.metrics import format_value
from harness.gates.runs import ResultSet
from harness.load.results import RECORDS_FILE, RequestRecord, read_records
from harness.load.session_summary import AgentSessions, SessionOutcome, session_outcomes
from harness.reports.plots import Drawn, Plot, colour, finish_cdf

MAX_WATERFALL_CALLS = 60
"""Rows of one waterfall: a session with more calls shows its first ones (by call index), so that a
thousand-call session still gives a readable figure; the panel's title says how many were left out."""
MAX_ERROR_CHARS = 48
"""A failed call's error is printed beside its bar, cut to this many characters."""

GAP_COLOUR = "#d9d9d9"
LATE_COLOUR = "#333333"
TTFT_COLOUR = "#4c72b0"
STREAM_COLOUR = "#9dbbe0"
FAILED_COLOUR = "#d62728"
FAILED_STREAM_COLOUR = "#f2a3a3"


@dataclass(frozen=True)
class SessionRun:
    """One run's agent sessions as the section draws them."""

    label: str
    colour: str
    """The run's colour in every other plot of the report (:func:`harness.reports.plots.colour`)."""
    stats: AgentSessions
    """The summary's ``agent_sessions``."""
    outcomes: list[SessionOutcome]
    """Every session of the run, from its records (``[]``: its ``records.jsonl`` is not there)."""
    calls: list[RequestRecord]
    """The slowest session's calls, by call index (``[]``: no slowest session, or no records)."""


def session_runs(sets: Sequence[ResultSet]) -> list[SessionRun]:
    """The runs whose summary counts agent sessions, with each session's outcome and the slowest
    session's calls read from the run's records (the summary keeps only their aggregates)."""
    out: list[SessionRun] = []
    for i, rs in enumerate(sets):
        stats = rs.summary.agent_sessions if rs.summary is not None else None
        if stats is None:
            continue
        path = rs.path / RECORDS_FILE
        # Only the calls of agent sessions matter here (a conversation's turns carry a session id
        # too, but no call index); keeping just those bounds the memory to the sessions' records.
        records = [r for r in read_records(path) if r.call is not None] if path.is_file() else []
        slowest = stats.slowest.session_id if stats.slowest is not None else None
        calls = sorted((r for r in records if r.session_id == slowest), key=lambda r: r.call or 0)
        out.append(SessionRun(rs.label, colour(rs, i), stats, session_outcomes(records), calls))
    return out


# ---------------------------------------------------------------------------- makespan distribution

MAKESPAN_PLOT = Plot(
    id="fig-session-makespan",
    title="Agent session makespan CDF",
    alt="Empirical cumulative distribution of agent session makespan (from the session's start to its "
    "last call's end) in milliseconds, one line per run, with each run's P95 marked and the sessions "
    "that had a failed or blocked call crossed in red.",
    draw=lambda sets: makespan_cdf(session_runs(sets)),
)


def makespan_cdf(runs: Sequence[SessionRun]) -> Drawn:
    """One ECDF of session makespan per run (the report's latency distributions are ECDFs too,
    ``fig-latency-cdf``), P95 marked; failed sessions are crossed where they sit on the curve, so
    whether failures make sessions slow (retries, timeouts) or fast (cut short) shows at a glance."""
    if not runs:
        return "No run replayed agent sessions."
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.subplots()
    # A session with a broken time in a call (a NaN the records carried) has no finite makespan: it
    # is left out of the curve, as the summary's percentiles leave a NaN out.
    timed = [[o for o in run.outcomes if np.isfinite(o.makespan_ms)] for run in runs]
    values = [np.asarray([o.makespan_ms for o in os], dtype=np.float64) for os in timed]
    failed_label = "session with a failed or blocked call"
    for run, os, v in zip(runs, timed, values, strict=True):
        if not v.size:
            continue
        order = np.argsort(v, kind="stable")
        xs = v[order]
        ys = np.arange(1, xs.size + 1) / xs.size
        p95 = percentile(v, 95)
        ax.step(xs, ys, where="post", color=run.colour,
                label=f"{run.label} (n={v.size}, P95 {format_value(p95, 'ms')})")  # fmt: skip
        ax.plot([p95], [0.95], marker="o", color=run.colour, markersize=5)
        bad = np.asarray([not os[j].ok for j in order], dtype=bool)
        if bad.any():
            ax.scatter(xs[bad], ys[bad], marker="x", s=28, color=FAILED_COLOUR, zorder=3, label=failed_label)
            failed_label = "_"  # one legend entry for every run's crosses
    finish_cdf(
        ax, values, title="Session makespan CDF (share of sessions done within a time)",
        xlabel="makespan: session start to its last call's end (ms)", ylabel="share of sessions ≤ x",
        empty=f"no {RECORDS_FILE} beside the summaries: no per-session makespans",
    )  # fmt: skip
    return fig


# ---------------------------------------------------------------------- the slowest session's waterfall

WATERFALL_PLOT = Plot(
    id="fig-session-waterfall",
    title="Slowest agent session: its calls as a trace waterfall",
    alt="Per run, the slowest agent session drawn like a trace view: one row per call in call order, "
    "indented by its depth in the call graph, against milliseconds from the session's start; a light "
    "bar for the gap from the call being ready to its intended send (tool or think time), a thin bar "
    "for send lateness, a dark bar from send to the first token and a light one from the first token to "
    "the end; failed calls in red and calls blocked by a failed predecessor as hatched markers.",
    draw=lambda sets: session_waterfall(session_runs(sets)),
)


def _row_labels(calls: Sequence[RequestRecord]) -> list[str]:
    """``call k`` indented two spaces per depth level. Tick labels are right-aligned, so the labels are
    padded on the right to one width: in a monospace font their left edges then line up and the
    indentation shows (leading spaces alone would be pushed off to the left)."""
    labels = ["  " * (r.depth or 0) + ("└ " if r.depth else "") + f"call {r.call}" for r in calls]
    width = max((len(s) for s in labels), default=0)
    return [s.ljust(width) for s in labels]


def _draw_call(ax: Axes, y: int, r: RequestRecord, start: float, span: float) -> None:
    """Row ``y``: one call, in ms from the session's ``start`` (s from the epoch); ``span`` is the
    session's makespan (ms), which sizes the marks that have no duration of their own."""

    def at(t: float) -> float:
        return (t - start) * 1000.0

    ready = at(r.ready_s if r.ready_s is not None else r.intended_s)
    if r.blocked_by is not None:
        # Never sent: nothing to time, so a fixed-width hatched box where it became ready, saying why.
        ax.barh(y, span * 0.012, left=ready, height=0.6, facecolor="white", edgecolor=FAILED_COLOUR,
                hatch="////", linewidth=0.8)  # fmt: skip
        ax.annotate(f"blocked by call {r.blocked_by}", (ready + span * 0.012, y), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7, color=FAILED_COLOUR)  # fmt: skip
        return
    intended, sent = at(r.intended_s), at(r.sent_s)
    ax.barh(y, max(0.0, intended - ready), left=ready, height=0.55, color=GAP_COLOUR)
    ax.barh(y, max(0.0, sent - intended), left=intended, height=0.14, color=LATE_COLOUR)
    failed = not r.ok
    first = sent + r.ttft_ms if r.ttft_ms is not None else None
    end = sent + r.e2e_ms if r.e2e_ms is not None else None
    # Without a first token (an error answer, a stream that broke before any) the whole span from
    # the send was spent waiting for one, so it is drawn as waiting, not streaming.
    waited = first if first is not None else end
    if waited is not None:
        ax.barh(y, max(0.0, waited - sent), left=sent, height=0.6,
                color=FAILED_COLOUR if failed else TTFT_COLOUR)  # fmt: skip
    if first is not None and end is not None:
        ax.barh(y, max(0.0, end - first), left=first, height=0.6,
                color=FAILED_STREAM_COLOUR if failed else STREAM_COLOUR)  # fmt: skip
    if failed:
        if first is None and end is None:
            # No answer at all (refused, reset): no duration to draw, so a cross at the send.
            ax.plot([sent], [y], marker="x", color=FAILED_COLOUR, markersize=7)
        error = (r.error or f"HTTP {r.status}")[:MAX_ERROR_CHARS]
        ax.annotate(error, (max(x for x in (sent, first, end) if x is not None), y), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7, color=FAILED_COLOUR)  # fmt: skip


def _legend() -> list[Artist]:
    """Proxy artists for the figure's one legend (fresh ones per figure: an artist has one figure)."""
    return [
        Patch(facecolor=GAP_COLOUR, label="gap: ready → intended send (tool / think time)"),
        Patch(facecolor=LATE_COLOUR, label="lateness: intended → sent"),
        Patch(facecolor=TTFT_COLOUR, label="waiting: sent → first token (TTFT)"),
        Patch(facecolor=STREAM_COLOUR, label="streaming: first token → end"),
        Patch(facecolor=FAILED_COLOUR, label="failed call (error beside it)"),
        Patch(
            facecolor="white", edgecolor=FAILED_COLOUR, hatch="////", label="blocked: a predecessor failed"
        ),
        Line2D([], [], color="#555555", linestyle="--", label="session end (makespan)"),
    ]


def session_waterfall(runs: Sequence[SessionRun]) -> Drawn:
    """Per run, its slowest session as a Jaeger-style waterfall, one row per call by call index.

    The records do not carry the graph's edges, only each call's depth and when its last predecessor
    ended (``ready_s``), so there are no arrows: the gap bar starting at ``ready_s`` shows what each
    call waited for, and a row starting late shows a call held back by a slow predecessor."""
    shown = [run for run in runs if run.calls and run.stats.slowest is not None]
    if not shown:
        return "No slowest session to draw: no run's records.jsonl holds its agent sessions' calls."
    rows = [min(len(run.calls), MAX_WATERFALL_CALLS) for run in shown]
    fig = Figure(figsize=(13, sum(1.3 + 0.26 * n for n in rows) + 0.9), layout="constrained")
    axes = fig.subplots(len(shown), 1, squeeze=False, height_ratios=[1.3 + 0.26 * n for n in rows])
    fig.suptitle("Slowest agent session per run, call by call (x: ms from the session's start)")
    for ax, run, n in zip((row[0] for row in axes), shown, rows, strict=True):
        slowest = run.stats.slowest
        assert slowest is not None  # filtered above; mypy cannot follow the filter
        calls = run.calls[:n]
        span = max(slowest.makespan_ms, 1.0)
        for y, r in enumerate(calls):
            _draw_call(ax, y, r, slowest.start_s, span)
        ax.axvline(slowest.makespan_ms, color="#555555", linestyle="--", linewidth=1)
        ax.set_yticks(range(n), _row_labels(calls), family="monospace", fontsize=8)
        ax.set_ylim(n - 0.5, -0.5)  # call 1 at the top, as a trace view reads
        ax.set_xlim(left=0.0)
        cut = f", first {n} of {len(run.calls)} calls" if n < len(run.calls) else ""
        # The outcome's failed count includes the blocked calls; the title names the two apart.
        blocked = len(slowest.blocked)
        state = "ok" if slowest.ok else f"{slowest.failed - blocked} failed, {blocked} blocked"
        ax.set_title(
            f"{run.label}: session {slowest.session_id} ({slowest.calls} calls, {state}), makespan "
            f"{format_value(slowest.makespan_ms, 'ms')}{cut}"
        )
        ax.set_xlabel("time since the session's start (ms)")
        ax.set_ylabel("call (indented by depth)")
        ax.grid(alpha=0.3, axis="x")
    fig.legend(handles=_legend(), loc="outside lower center", ncols=4, fontsize=8)
    return fig
