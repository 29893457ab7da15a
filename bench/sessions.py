"""Session replay benchmark: think-time precision and live history on loopback (docs/load.md, #19).

Builds a session corpus from the bundled CrossWOZ sample (``--sessions``, a constant think time),
replays it headless (``locustfiles/replay.py``, ``--rate`` sessions/s) against the tests' SSE server
with ``tag_replies`` (every reply unique to its request), then reports, from the server's own log and
the records: turns whose history was not exactly the server's earlier replies (goal 0), turns that
reached the server before the previous turn's stream ended (goal 0), think times cut short (goal
0), and the client's lateness against ``end of turn k + think time`` for turns ≥ 2 (p50, p99, max;
goal p99 ≤ 5 ms). The load average is printed beside it (other jobs share the CPUs).

Usage: ``python bench/sessions.py [--sessions 16] [--think 0.2] [--rate 4]`` (about 30 s).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.common import headers as H  # noqa: E402
from harness.common.settings import load_settings  # noqa: E402
from harness.common.stats import percentile  # noqa: E402
from harness.corpus.sessions import SessionBuildInputs, build_sessions  # noqa: E402
from harness.corpus.settings import CorpusSettings  # noqa: E402
from harness.corpus.timing import ThinkTime  # noqa: E402
from harness.load.results import read_records  # noqa: E402
from harness.load.run_summary import read_summary  # noqa: E402
from harness.load.runner import LoadSpec, run_locust  # noqa: E402
from tests.load.sse_server import Behaviour, SSEServer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--think", type=float, default=0.2)
    ap.add_argument("--rate", type=float, default=4.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        build_sessions(
            SessionBuildInputs(
                out=d / "c", n=args.sessions, think_time=ThinkTime.parse(f"constant:{args.think}")
            ),
            load_settings(CorpusSettings, seed=5),
        )
        with SSEServer(Behaviour(first_token_s=0.01, gap_s=0.002, tokens=16, tag_replies=True)) as srv:
            spec = LoadSpec(host=srv.url, corpus=d / "c", rate=args.rate, duration=args.sessions / args.rate,
                            results_dir=d / "r", start_delay=1.0, concurrency=args.sessions)  # fmt: skip
            code = run_locust(spec, timeout_s=600)
            served = srv.requests
        by_session: dict[str, list] = {}
        for x in served:
            by_session.setdefault(x.headers[H.SESSION_ID], []).append(x)
        wrong_history = early = cut = 0
        for turns in by_session.values():
            turns.sort(key=lambda x: x.received)
            for k, x in enumerate(turns):
                answers = [m["content"] for m in x.body["messages"] if m["role"] == "assistant"]
                wrong_history += answers != [t.reply for t in turns[:k]]
                if k:
                    early += x.received <= turns[k - 1].done
                    cut += x.received - turns[k - 1].done < args.think
        recs = list(read_records(d / "r"))
        late = [r.lateness_ms for r in recs if r.turn is not None and r.turn > 1]
        s = read_summary(d / "r")
    load = os.getloadavg()
    print(
        f"exit {code}; {s.sessions} sessions, {len(recs)} turns, errors {s.errors}, "
        f"client CPU {s.client_cpu_pct or 0:.0f} %"
    )
    print(f"history not the server's replies: {wrong_history}; sent before the previous turn ended: {early}; "
          f"think time cut short: {cut}")  # fmt: skip
    print(f"lateness of turns >= 2 (ms): p50 {percentile(late, 50):.2f}, p99 {percentile(late, 99):.2f}, "
          f"max {max(late):.2f} (n={len(late)}; think {args.think} s)")  # fmt: skip
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
