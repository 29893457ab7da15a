"""Agent-session replay benchmark: how exactly a trace's call graph is kept on loopback (docs/load.md).

Builds the replay graphs of the three bundled agent traces (``fixtures/traces/genaiTestTrace.json``
with its gaps capped at 0, so its five calls are parallel branches; the two kagent traces as
recorded), turns them into a corpus (``harness corpus graph``'s function) and replays it headless at
``--rate`` sessions/s against a ground-truth server in a process of its own (``bench/_truth_server.py``:
one asyncio loop, known TTFT and ITL, every reply tagged, each request's arrival stamped as its head
is read). Reports:

* lateness of every call against its intended time (its predecessors' end plus its gap): p50, p99,
  max (goal p99 ≤ 5 ms);
* the spread of the send times of calls ready together (the five parallel branches): p99, max (goal
  ≤ 5 ms);
* each session's makespan against its critical path with the server's known latency: the largest
  excess (goal ≤ 2 %);
* dependants whose body did not hold the live answer they use (goal 0).

Usage: ``python bench/graph_replay.py [--rate 20] [--duration 10]`` (about 20 s). The load average is
printed beside it: other jobs share the CPUs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._publish import add_publish_flag, publish  # noqa: E402
from bench._truth_server import TruthServer  # noqa: E402
from harness.common.io import write_jsonl  # noqa: E402
from harness.common.stats import percentile  # noqa: E402
from harness.corpus.graph import graph_records  # noqa: E402
from harness.load.results import RequestRecord, read_records  # noqa: E402
from harness.load.runner import LoadSpec, run_locust  # noqa: E402
from harness.traces.api import read_traces  # noqa: E402
from harness.traces.graph import SessionGraph, replay_graphs  # noqa: E402

TRACES = ROOT / "fixtures" / "traces"
FIRST_TOKEN_S, ITL_S, TOKENS = 0.05, 0.01, 16
"""A call of 200 ms at the server: short for an LLM call, long enough that a session's excess is the
client's and the server's handling of requests that arrive together, not the call itself."""


def _graphs() -> list[SessionGraph]:
    genai = list(replay_graphs(read_traces(TRACES / "genaiTestTrace.json"), max_gap_ms=0.0))
    kagent = [g for f in sorted((TRACES / "genai").glob("*.json")) for g in replay_graphs(read_traces(f))]
    return genai + kagent


def _critical_path_s(g: SessionGraph, latency_s: list[float]) -> float:
    """The session's critical path: each call's recorded gap plus its latency at the server."""
    finish: list[float] = []
    for call, lat in zip(g.calls, latency_s, strict=True):
        after = [i for i, c in enumerate(g.calls) if c.id in call.depends_on]
        finish.append(max((finish[i] for i in after), default=0.0) + call.gap_ms / 1000.0 + lat)
    return max(finish)


def _ms(v: list[float]) -> str:
    return f"{percentile(v, 50):.2f} | {percentile(v, 99):.2f} | {max(v):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=20.0, help="sessions started per second")
    ap.add_argument("--duration", type=float, default=10.0)
    add_publish_flag(ap)
    args = ap.parse_args()
    graphs = _graphs()
    by_id = {g.session: g for g in graphs}
    latency_s = FIRST_TOKEN_S + (TOKENS - 1) * ITL_S
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_jsonl(
            d / "corpus.jsonl", (r.model_dump(mode="json", exclude_none=True) for r in graph_records(graphs))
        )
        with TruthServer(FIRST_TOKEN_S, ITL_S, TOKENS) as srv:
            spec = LoadSpec(host=srv.url, corpus=d / "corpus.jsonl", rate=args.rate, duration=args.duration,
                            results_dir=d / "r", start_delay=1.0, concurrency=64)  # fmt: skip
            code = run_locust(spec, timeout_s=600)
        served = srv.requests
        recs = list(read_records(d / "r"))
    plays: dict[str, dict[int, RequestRecord]] = {}
    for r in recs:
        plays.setdefault(r.session_id or "", {})[r.call or 0] = r
    by_session: dict[str, list] = {}
    for x in served:
        by_session.setdefault(x.session, []).append(x)
    late = [r.lateness_ms for r in recs]
    spread: list[float] = []
    excess: dict[str, list[float]] = {}
    over_ms: dict[str, list[float]] = {}
    for sid, play in plays.items():
        g = by_id[sid.split("~")[0]]
        start = min(r.ready_s or 0.0 for r in play.values())
        makespan = max(r.sent_s + (r.e2e_ms or 0.0) / 1000.0 for r in play.values()) - start
        # The server's own latency for each call: its requests in the order they arrived are the
        # calls in the order they were sent (calls sent together are parallel roots, interchangeable).
        arrived = sorted(by_session[sid], key=lambda x: x.received)
        order = sorted(play, key=lambda k: play[k].sent_s)
        measured = dict(zip(order, (x.done - x.received for x in arrived), strict=True))
        nominal = _critical_path_s(g, [latency_s] * len(g.calls))
        actual = _critical_path_s(g, [measured[k] for k in range(1, len(g.calls) + 1)])
        name = f"{len(g.calls)} calls, critical path {nominal * 1000:.0f} ms"
        excess.setdefault(f"{name}, the server's nominal latency", []).append(
            100.0 * (makespan / nominal - 1)
        )
        excess.setdefault(f"{name}, the server's logged latency", []).append(100.0 * (makespan / actual - 1))
        over_ms.setdefault(name, []).append(1000.0 * (makespan - actual))
        if g is graphs[0]:
            sent = [r.sent_s for r in play.values()]
            spread.append(1000.0 * (max(sent) - min(sent)))
    missing = 0
    for sid, xs in by_session.items():
        g = by_id[sid.split("~")[0]]
        for x in xs:
            text = "\n".join(m.get("content") or "" for m in x.body["messages"])
            if any(c.uses_output for c in g.calls) and x.body["messages"][-1]["role"] != "user":
                missing += not any(y is not x and y.reply and y.reply in text for y in xs)
    rows = "\n".join(
        f"| makespan over critical path: {name} (%) | {percentile(v, 50):.2f} | {percentile(v, 99):.2f} "
        f"| {max(v):.2f} | ≤ 2 |"
        for name, v in excess.items()
    )
    rows += "\n" + "\n".join(
        f"| makespan − critical path: {name}, the server's logged latency (ms) | {_ms(v)} | — |"
        for name, v in over_ms.items()
    )
    load = os.getloadavg()
    errors = sum(1 for r in recs if not r.ok)
    section = f"""
## Agent-session replay: the call graph kept (bench/graph_replay.py)

{len(plays)} sessions at {args.rate:g}/s for {args.duration:g} s ({len(recs)} calls, errors {errors},
exit {code}); server: TTFT {FIRST_TOKEN_S * 1000:.0f} ms, ITL {ITL_S * 1000:.0f} ms, {TOKENS} tokens;
load average {load[0]:.2f} on {os.cpu_count()} CPUs.

| measure | p50 | p99 | max | goal |
|---|---|---|---|---|
| call lateness vs predecessors' end + gap (ms) | {_ms(late)} | p99 ≤ 5 |
| spread of 5 parallel branches' sends (ms) | {_ms(spread)} | ≤ 5 |
{rows}

Dependants without the live answer they use: {missing} (goal 0).
"""
    publish(section, args)


if __name__ == "__main__":
    main()
