"""``harness load``: launch replays and ladders headless, and summarize their results.

* ``harness load summarize RUN_DIR`` — the latency table of a run, computed from ``records.jsonl``
  with the project's one percentile definition (``--json`` for the whole summary, ``--write`` to
  (re)write ``summary.json`` from the records, e.g. for records converted from another tool);
* ``harness load replay --url URL --corpus C (--schedule S | --rate R --duration D) -o R``
  — ``locust -f locustfiles/replay.py --headless …`` in a child process, then the table;
* ``harness load ladder --url URL --corpus C --plan P -o R`` — the same for ``locustfiles/warmup.py``.

Their ``--help`` is where a Locust user finds the load options: ``locust -f … --help`` prints Locust's
own before it loads the locustfile that adds ours.

The launched run's exit code is passed through (``docs/exit-codes.md``: 130 interrupted, 1 the
ladder stopped on a failed stage or requests failed, 3/4/5 bad input, configuration, target).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.common import console as cons
from harness.common.errors import InputError
from harness.common.options import old_spellings
from harness.load.options import load_flags, typer_options
from harness.load.results import read_records
from harness.load.run_summary import (
    SUMMARY_FILE,
    RunSummary,
    TargetInfo,
    read_summary,
    summarize,
    summary_table,
    write_summary,
)
from harness.load.runner import LoadSpec, run_locust

app = typer.Typer(
    help="Replay corpora open-loop, run warmup ladders, summarize load runs.", no_args_is_help=True
)
console = cons.out()


RECOMPUTED_WARNINGS = (
    "client-bound",
    "client jitter",
    "saturated",
    "ITL/TPOT approximate",
    "unread stream fields",
)
"""Warnings :func:`summarize` writes from the records: dropped from the old summary, then recomputed."""


def load_summary(run_dir: Path) -> RunSummary:
    """The run's summary with every metric recomputed from its records (metadata from summary.json)."""
    if not run_dir.is_dir():
        raise InputError("not a run directory", file=run_dir)
    records = list(read_records(run_dir))
    if (run_dir / SUMMARY_FILE).exists():
        old = read_summary(run_dir)
        fresh = summarize(
            records,
            started_at=old.started_at,
            duration_s=old.duration_s,
            target=old.target,
            target_rate=old.target_rate,
            client_cpu_pct=old.client_cpu_pct,
            interrupted=old.interrupted,
            corpus=old.corpus,
            schedule=old.schedule,
            stages=old.stages,
            workers=old.workers,
            warnings=[w for w in old.warnings if not w.startswith(RECOMPUTED_WARNINGS)],
            warmup_id=old.warmup_id,
            plan=old.plan,
            preload=old.preload,
            stop_reason=old.stop_reason,
            precision=old.precision,
            target_died=old.target_died,
        )
        return fresh
    span = max((r.sent_s for r in records), default=0.0) - min((r.sent_s for r in records), default=0.0)
    return summarize(records, started_at="unknown", duration_s=span, target=TargetInfo(url="unknown"))


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f} ms"


def print_summary(s: RunSummary, title: str) -> None:
    columns = ("metric", "n", "p50", "p90", "p95", "p99", "max", "mean")
    console.print(cons.table(title, columns, summary_table(s.metrics), left={"metric"}))
    rate = f"{s.achieved_rate:.2f}/s"
    if s.target_rate and s.sessions:  # --rate starts sessions: requests/s is not comparable with it
        rate += f", sessions offered at {s.target_rate:.2f}/s"
    elif s.target_rate:
        rate += f" of {s.target_rate:.2f}/s"
    hit = s.hit_rate.get("any")
    console.print(
        f"requests {s.requests}, errors {s.errors}, rate {rate}"
        + (f", cache hits {hit:.1%}" if hit is not None else "")
        + (f", client CPU {s.client_cpu_pct:.0f} %" if s.client_cpu_pct is not None else "")
        + (", INTERRUPTED" if s.interrupted else "")
        + (", CLIENT-BOUND" if s.client_bound else "")
    )
    if s.target_died is not None:  # the errors are the death's: say so before anything else
        console.print(f"[red]TARGET DIED:[/] {s.target_died.describe()}", highlight=False)
    if s.stop_reason:
        console.print(f"stopped: {s.stop_reason}", highlight=False)
    for st in s.stages:
        back = f" → {st.rolled_back_to}" if st.rolled_back_to else ""
        console.print(
            f"  stage {st.name}: {st.target_rate:g} qps, {st.requests} requests, "
            f"{st.failure_rate:.1%} failed (≤ {st.tolerance:.0%}): {st.verdict}{back}"
        )
    for w in s.workers:
        if w.missing:
            console.print(f"  worker {w.worker}: LOST, {w.recorded} of {w.scheduled} recorded")
    if s.turns:
        turns = cons.table(
            f"per turn ({s.sessions} sessions)",
            ("turn", "requests", "errors", "TTFT p50", "TTFT p95", "cached share", "prefix hits"),
            left=(),
        )
        for t in s.turns:
            p50, p95, share, prefix = t.ttft_ms.p50, t.ttft_ms.p95, t.cached_share, t.hit_rate.get("prefix")
            turns.add_row(
                str(t.turn), str(t.requests), str(t.errors),
                "–" if p50 is None else f"{p50:.1f}", "–" if p95 is None else f"{p95:.1f}",
                "–" if share is None else f"{share:.1%}", "–" if prefix is None else f"{prefix:.1%}",
            )  # fmt: skip
        console.print(turns)
    if (a := s.agent_sessions) is not None:
        m = a.makespan_ms
        vs = a.critical_vs_recorded
        console.print(
            f"agent sessions: {a.succeeded} of {a.sessions} succeeded ({a.calls} calls, {a.blocked_calls} "
            f"blocked by a failed predecessor); makespan p50 {_ms(m.p50)}, p95 {_ms(m.p95)}"
            + (f"; session prefix hits {a.prefix_hit_rate:.1%}" if a.prefix_hit_rate is not None else "")
            + (f"; critical chain {vs.p50:.2f}× the trace's (p50)" if vs is not None and vs.p50 else ""),
            highlight=False,
        )
    if s.tool_calls is not None:
        tc = s.tool_calls
        names = ", ".join(f"{n} {c}" for n, c in tc.names.items())
        results = ", ".join(f"{k} {v}" for k, v in tc.results.items())
        console.print(
            f"tool calls: {tc.calls} in {tc.requests} responses" + (f" ({names})" if names else "")
            + (f"; tool results sent: {results}" if results else ""),
            highlight=False,
        )  # fmt: skip
    if s.reasoning_counting:
        how = ", ".join(f"{k} {v}" for k, v in s.reasoning_counting.items())
        console.print(f"thinking tokens of {sum(s.reasoning_counting.values())} responses, from: {how}")
    for text in s.warnings:
        console.print(f"[yellow]warning:[/] {text}", highlight=False)


@app.command("summarize", epilog="Example: harness load summarize runs/replay --json")
def summarize_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A results directory (records.jsonl, summary.json).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole summary as JSON.")] = False,
    write: Annotated[bool, typer.Option("--write", help="(Re)write summary.json from the records.")] = False,
) -> None:
    """Print a run's latency table, computed from its records."""
    s = load_summary(run_dir)
    if write:
        write_summary(run_dir, s)
    if as_json:
        typer.echo(s.model_dump_json(indent=2))
    else:
        print_summary(s, str(run_dir))


URL = Annotated[
    str | None,
    typer.Option("--url", help="Target base URL (any OpenAI-compatible server).", show_default=False),
]
RENAMED = old_spellings(url="--host")
"""``--host``, the old spelling of ``--url`` (Locust's own name for it, on ``locust -f`` only)."""
REPLAY_OPTIONS = ("processes", *load_flags(but="ladder"))
LADDER_OPTIONS = ("processes", *load_flags(but="arrivals"))
"""A ladder's plan sets its stages (and names them), their rates and lengths: it refuses the options
of a replay's own arrivals."""


def _launch(spec: LoadSpec) -> None:
    # As a shell would take it again: the options are one quoted JSON argument.
    console.print(shlex.join(spec.command()[1:]), style="dim", highlight=False, markup=False)
    code = run_locust(spec)
    results = spec.options.results_dir
    if (results / SUMMARY_FILE).exists():
        print_summary(read_summary(results), str(results))
    else:
        # A mistake found before any load (exit 3 / 4) is one "harness: error:" line in Locust's
        # log: show it here, where the user looks, rather than only pointing at the file.
        log_file = results / "locust.log"
        lines = log_file.read_text(errors="replace").splitlines() if log_file.is_file() else []
        for line in [x for x in lines if x.startswith("harness: error:")][-1:]:
            cons.err().print(line, highlight=False, markup=False, soft_wrap=True)
        console.print(f"no summary written; see {log_file}")
    raise typer.Exit(code)


@app.command(
    "replay",
    epilog="Example: harness load replay --url http://127.0.0.1:8000 --corpus runs/corpus --rate 2 "
    "--duration 30 -o runs/replay",
)
@typer_options(*REPLAY_OPTIONS, required={"corpus", "results_dir"})
@RENAMED
def replay_cmd(*, url: URL = None, load: dict[str, Any]) -> None:
    """Replay a corpus open-loop (headless Locust, locustfiles/replay.py)."""
    _launch(LoadSpec(host=_target(url), **load))


@app.command(
    "ladder",
    epilog="Example: harness load ladder --url http://127.0.0.1:8000 --corpus runs/corpus "
    "--plan fixtures/plans/tiny.yaml -o runs/ladder",
)
@typer_options(*LADDER_OPTIONS, required={"corpus", "plan", "results_dir"})
@RENAMED
def ladder_cmd(*, url: URL = None, load: dict[str, Any]) -> None:
    """Run the staged warmup ladder with rollback (headless Locust, locustfiles/warmup.py)."""
    _launch(LoadSpec(host=_target(url), locustfile="warmup", **load))


def _target(url: str | None) -> str:
    """``--url`` (or ``--host``, its old spelling); required."""
    if url is None:
        raise typer.BadParameter("Missing option '--url'.", param_hint="--url")
    return url
