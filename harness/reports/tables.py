"""The report's tables as rows of formatted cells: one overview row per run, one row per scenario.

Shared by the HTML report and the Markdown summary, so both print the same numbers. Percentiles come
from :mod:`harness.common.stats`; hit rates use the gates' metric definitions
(:data:`harness.gates.metrics.METRICS`), so a report and a gate never disagree on a number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.analysis.effect import EffectReport
from harness.common.stats import Distribution, percentile
from harness.gates.measurement import MetricContext
from harness.gates.metrics import METRICS, format_value
from harness.gates.runs import FloatArray, ResultSet, RunFrame


@dataclass(frozen=True)
class Table:
    """A header row and body rows of text cells."""

    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]


def _p(values: FloatArray, q: float) -> str:
    v = values[np.isfinite(values)]
    return format_value(percentile(v, q), "ms") if v.size else "—"


def _metric(frame: RunFrame, name: str) -> str:
    m = METRICS.get(name).compute(frame, MetricContext(require_measured=False))
    return format_value(m.value, METRICS.get(name).unit) if m.n else "—"


def _errors(frame: RunFrame) -> str:
    if frame.n == 0:
        return "—"
    bad = int((~frame.ok).sum())
    return f"{bad} ({100 * bad / frame.n:.1f} %)"


OVERVIEW_COLUMNS = (
    "run", "requests", "errors", "rate (achieved / target)", "TTFT P50", "TTFT P95", "TTFT P99",
    "TPOT P95", "E2E P95", "lateness P99", "hit rate", "warm rate", "status",
)  # fmt: skip


def overview(sets: Sequence[ResultSet]) -> Table:
    """One row per run: size, errors, rate, the headline percentiles and whether it can be judged."""
    rows: list[tuple[str, ...]] = []
    for rs in sets:
        f, s = rs.frame, rs.summary
        if s is None:
            rate = "—"
        else:
            target = f"{s.target_rate:.1f}/s" if s.target_rate is not None else "closed loop"
            rate = f"{s.achieved_rate:.1f}/s / {target}"
        status = "ok" if rs.judgeable else f"cannot be judged ({len(rs.problems)} problem(s) below)"
        rows.append(
            (
                rs.label,
                str(f.n),
                _errors(f),
                rate,
                _p(f.col("ttft_ms"), 50),
                _p(f.col("ttft_ms"), 95),
                _p(f.col("ttft_ms"), 99),
                _p(f.col("tpot_ms"), 95),
                _p(f.col("e2e_ms"), 95),
                _p(f.col("lateness_ms"), 99),
                _metric(f, "hit_rate_any"),
                _metric(f, "warm_rate"),
                status,
            )
        )
    return Table(OVERVIEW_COLUMNS, rows)


SCENARIO_COLUMNS = (
    "run", "scenario", "requests", "errors", "TTFT P50", "TTFT P95", "TPOT P95", "E2E P95",
    "hit rate", "prefix hits", "KV bytes/token P95",
)  # fmt: skip


def per_scenario(sets: Sequence[ResultSet]) -> Table:
    """One row per run and scenario (records without a scenario are grouped as ``(none)``)."""
    rows: list[tuple[str, ...]] = []
    for rs in sets:
        scen = rs.frame.text["scenario"]
        names: list[str | None] = [*rs.frame.values("scenario")]
        if any(s is None for s in scen):
            names.append(None)
        for name in names:
            mask = np.asarray([s == name for s in scen], dtype=bool)
            f = rs.frame.take(mask)
            rows.append(
                (
                    rs.label,
                    name if name is not None else "(none)",
                    str(f.n),
                    _errors(f),
                    _p(f.col("ttft_ms"), 50),
                    _p(f.col("ttft_ms"), 95),
                    _p(f.col("tpot_ms"), 95),
                    _p(f.col("e2e_ms"), 95),
                    _metric(f, "hit_rate_any"),
                    _metric(f, "hit_rate_prefix"),
                    _metric(f, "prefill_kv_bytes_per_token_p95"),
                )
            )
    return Table(SCENARIO_COLUMNS, rows)


TURN_COLUMNS = (
    "run", "turn", "requests", "errors", "TTFT P50", "TTFT P95", "prompt tokens P50",
    "cached tokens P50", "cached share", "prefix hits", "hit rate",
)  # fmt: skip


def per_turn(sets: Sequence[ResultSet]) -> Table:
    """One row per run and turn index of a session run (``summary.json``'s ``turns``): a warm KV
    cache shows as TTFT falling and the cached share rising over the turns. Empty without sessions."""

    def num(v: float | None, unit: str = "") -> str:
        return "—" if v is None else f"{v:.1f}{unit}" if unit else f"{v:.0f}"

    def share(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:.1f} %"

    rows: list[tuple[str, ...]] = []
    for rs in sets:
        for t in rs.summary.turns if rs.summary is not None else []:
            rows.append(
                (
                    rs.label,
                    str(t.turn),
                    str(t.requests),
                    str(t.errors),
                    num(t.ttft_ms.p50, " ms"),
                    num(t.ttft_ms.p95, " ms"),
                    num(t.prompt_tokens.p50),
                    num(t.cached_tokens.p50),
                    share(t.cached_share),
                    share(t.hit_rate.get("prefix")),
                    share(t.hit_rate.get("any")),
                )
            )
    return Table(TURN_COLUMNS, rows)


THINKING_COLUMNS = (
    "run", "requests", "thinking", "reasoning tokens P50", "reasoning tokens P95", "TTFT P50", "TTFA P50",
    "TTFA P95", "ITL thinking P50", "ITL answer P50", "tool calls", "tool results",
)  # fmt: skip


def thinking_and_tools(sets: Sequence[ResultSet]) -> Table:
    """One row per run whose responses thought or called tools (or whose session turns sent tool
    results): how long the thinking was, when the answer came (TTFA) after the first token (TTFT),
    the inter-token gaps of each kind, and the tool calls by name. Empty when no run has any."""
    rows: list[tuple[str, ...]] = []
    for rs in sets:
        f, s = rs.frame, rs.summary
        think = f.col("reasoning_tokens")
        thought = int(np.nansum(think > 0))
        tools = s.tool_calls if s is not None else None
        if not thought and tools is None:
            continue
        split = s.metrics if s is not None else {}

        def itl(name: str, split: dict[str, Distribution] = split) -> str:
            d = split.get(name)
            return format_value(d.p50, "ms") if d is not None and d.p50 is not None else "—"

        calls = "—"
        results = "—"
        if tools is not None:
            names = ", ".join(f"{n} {c}" for n, c in tools.names.items())
            calls = f"{tools.calls} in {tools.requests}" + (f" ({names})" if names else "")
            results = ", ".join(f"{k} {v}" for k, v in tools.results.items()) or "—"
        present = think[np.isfinite(think)]
        rows.append(
            (
                rs.label,
                str(f.n),
                f"{thought} ({100 * thought / f.n:.1f} %)" if f.n else "—",
                format_value(percentile(present, 50), "tokens") if present.size else "—",
                format_value(percentile(present, 95), "tokens") if present.size else "—",
                _p(f.col("ttft_ms"), 50),
                _p(f.col("ttfa_ms"), 50),
                _p(f.col("ttfa_ms"), 95),
                itl("itl_reasoning_ms"),
                itl("itl_answer_ms"),
                calls,
                results,
            )
        )
    return Table(THINKING_COLUMNS, rows)


AGENT_SESSION_COLUMNS = (
    "run", "sessions", "calls", "success rate", "blocked calls", "makespan P50", "makespan P95",
    "makespan max", "session prefix hit rate", "critical chain vs trace P50", "failed sessions",
)  # fmt: skip
MAX_FAILED_NAMED = 5
"""Failed sessions named in the table (the rest counted): enough to look one up in the records."""


def agent_sessions_table(sets: Sequence[ResultSet]) -> Table:
    """One row per run that replayed agent sessions (``summary.json``'s ``agent_sessions``): how many
    sessions ran all their calls, how many calls never went because a predecessor failed, how long a
    session took end to end, how the target's time on a session's critical chain compares with the
    trace's, and the first failed sessions by name. Empty when no run has sessions."""
    rows: list[tuple[str, ...]] = []
    for rs in sets:
        a = rs.summary.agent_sessions if rs.summary is not None else None
        if a is None:
            continue
        rate = "—" if a.success_rate is None else f"{a.succeeded}/{a.sessions} ({100 * a.success_rate:.1f} %)"
        # Count the rest from the totals, not the list: the summary may keep only the first names.
        failed = a.sessions - a.succeeded
        named = ", ".join(a.failed_sessions[:MAX_FAILED_NAMED])
        more = failed - min(len(a.failed_sessions), MAX_FAILED_NAMED)
        if named and more > 0:
            named += f" (+{more} more)"
        rows.append(
            (
                rs.label,
                str(a.sessions),
                str(a.calls),
                rate,
                str(a.blocked_calls),
                format_value(a.makespan_ms.p50, "ms"),
                format_value(a.makespan_ms.p95, "ms"),
                format_value(a.makespan_ms.max, "ms"),
                "—" if a.prefix_hit_rate is None else f"{100 * a.prefix_hit_rate:.1f} %",
                # The target's time on each session's critical chain over production's (the trace's).
                "—" if (r := a.critical_vs_recorded) is None or r.p50 is None else f"{r.p50:.2f}×",
                named or (f"{failed} (unnamed)" if failed else "—"),
            )
        )
    return Table(AGENT_SESSION_COLUMNS, rows)


def speedup(cold: ResultSet, warm: ResultSet, column: str, q: float = 95) -> float:
    """``cold Pq / warm Pq`` of a latency column (NaN when either has no samples)."""
    a = cold.frame.col(column)
    b = warm.frame.col(column)
    pa, pb = percentile(a[np.isfinite(a)], q), percentile(b[np.isfinite(b)], q)
    return pa / pb if pb and math.isfinite(pa) and math.isfinite(pb) else math.nan


def effect_rows(report: EffectReport) -> Table:
    """``harness analysis effect``'s table (:meth:`EffectReport.rows`)."""
    return Table(report.COLUMNS, report.rows())


def effect_preload(report: EffectReport) -> str:
    """One sentence: what each pass preloaded and how much of it the window used."""
    parts = [
        f"{name}: {report.preload_requests.get(name, 0)} prefixes, "
        f"{report.preload_blocks.get(name, 0)} blocks"
        + (
            f", {report.preload_used[name]:.0%} of them used by the window"
            if name in report.preload_used
            else ""
        )
        for name in ("planned", "oracle")
    ]
    return (
        f"History {report.history_requests} requests, window {report.window_requests} "
        f"({report.window_span_s:.0f} s); capacity {report.capacity_blocks} blocks of {report.block_tokens} "
        f"tokens; preloaded: " + "; ".join(parts) + "."
    )
