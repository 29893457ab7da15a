"""An agent's conversations replayed: ``harness corpus build --sessions`` on a log with tool calls, then
real headless ``locust -f locustfiles/replay.py`` runs.

Against the ground-truth SSE server, which answers every request that offers tools with a call of
``get_weather`` on Paris (the call the log's weather conversation makes first), and logs every body:
each turn's history carries the earlier turns' tool calls and results, a result answers the
target's own call (its id), the log's result where the call is the log's, a stated synthetic one
where it is not; the records count them. Against ``harness serve --preset tiny``, whose model
cannot call tools: 0 errors, and the log's calls go in the history so its recorded results answer
something (``log_call``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from harness.common import headers as H
from harness.corpus.model import read_corpus
from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from harness.load.sessions import SYNTHETIC_TOOL_RESULT
from tests.gates.factory import harness_cli
from tests.load.sse_server import Behaviour, SSEServer
from tests.server.conftest import harness_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "fixtures" / "corpus" / "agent_sessions.jsonl"
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("agent") / "corpus"
    done = harness_cli(
        "corpus", "build", "--sessions", "--fewshot", str(LOG), "--think-time", "constant:0.05",
        "--seed", "2", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _sessions(served: list[Any]) -> dict[str, list[Any]]:
    by: dict[str, list[Any]] = {}
    for x in sorted(served, key=lambda x: x.received):
        by.setdefault(x.headers[H.SESSION_ID], []).append(x)
    return by


def test_the_corpus_carries_tools_calls_and_results(corpus: Path) -> None:
    recs = list(read_corpus(corpus))
    assert len(recs) == 12 and len({r.session.session_id for r in recs if r.session}) == 4
    tool_turns = [r for r in recs if r.session is not None and r.session.inputs]
    assert len(tool_turns) == 5 and all(r.tools for r in tool_turns)
    assert all(m.role == "tool" for r in tool_turns for m in r.session.inputs or [])  # type: ignore[union-attr]
    called = [r for r in recs if r.session is not None and r.session.log_tool_calls]
    assert sorted(c.function.name for r in called for c in r.session.log_tool_calls or []) == [  # type: ignore[union-attr]
        "book_flight", "get_weather", "get_weather", "run_sql", "search_flights",
    ]  # fmt: skip


def test_live_tool_turns_answer_the_targets_own_calls(tmp_path: Path, corpus: Path) -> None:
    b = Behaviour(first_token_s=0.005, gap_s=0.002, tokens=6, tool_call="get_weather",
                  tool_arguments='{"city": "Paris", "unit": "c"}', tool_only_with_tools=True)  # fmt: skip
    with SSEServer(b) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=4, duration=1, results_dir=tmp_path / "r",
                        start_delay=1.0, concurrency=8)  # fmt: skip
        assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
        served = srv.requests
    s = read_summary(tmp_path / "r")
    assert s.errors == 0 and s.requests == 12 == len(served)
    results: dict[str, int] = {}
    for sid, turns in _sessions(served).items():
        for k, x in enumerate(turns):
            msgs = x.body["messages"]
            assert bool(x.body.get("tools")) == bool(turns[0].body.get("tools")), sid
            # Every call in the history is answered, by its own id, before anything else is said.
            for i, m in enumerate(msgs):
                for j, call in enumerate(m.get("tool_calls") or []):
                    assert msgs[i + 1 + j]["role"] == "tool" and msgs[i + 1 + j]["tool_call_id"] == call["id"]
            # The history holds the target's calls, exactly as it streamed them, and their results.
            live_calls = [c for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []]
            assert live_calls == [c for t in turns[:k] for c in t.calls], (sid, k)
            # What this turn sent to answer the previous turn's calls: the tool messages past those
            # its predecessor already carried (a body is its predecessor's, answered, then opened).
            tools = [m for m in msgs if m["role"] == "tool"]
            before = sum(1 for m in turns[k - 1].body["messages"] if m["role"] == "tool") if k else 0
            for m in tools[before:]:
                kind = "synthetic" if m["content"] == SYNTHETIC_TOOL_RESULT else "recorded"
                results[kind] = results.get(kind, 0) + 1
    # Weather: turn 2 answers the log's own call (recorded), turns 3 and 4 a Paris call where the log
    # asked a question / called Rome (synthetic); flights: 3 synthetic; SQL: 1 synthetic.
    assert results == {"recorded": 1, "synthetic": 6}, results
    recs = list(read_records(tmp_path / "r"))
    counted = {k: sum((r.tool_results or {}).get(k, 0) for r in recs) for k in ("recorded", "synthetic")}
    assert counted == results
    assert s.tool_calls is not None and s.tool_calls.names == {"get_weather": 10} == {
        "get_weather": s.tool_calls.calls
    }
    assert s.tool_calls.results == results
    paris = next(
        x for x in served if any(m["role"] == "tool" and "rain" in m["content"] for m in x.body["messages"])
    )
    tool_msg = next(m for m in paris.body["messages"] if m["role"] == "tool" and "rain" in m["content"])
    assert tool_msg["tool_call_id"].startswith("call_") and tool_msg["tool_call_id"] != "call_w1"


def test_our_server_serves_an_agents_traffic_without_errors(tmp_path: Path, corpus: Path) -> None:
    with harness_server(tmp_path / "serve") as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=4, duration=1, results_dir=tmp_path / "r",
                        start_delay=1.0, concurrency=8, max_tokens_cap=6)  # fmt: skip
        assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
    s = read_summary(tmp_path / "r")
    recs = list(read_records(tmp_path / "r"))
    assert s.errors == 0 and s.requests == 12 and all(r.error is None for r in recs)
    # The tiny model answers in words: the log's calls carried its recorded results, turn after turn.
    assert sum((r.tool_results or {}).get("log_call", 0) for r in recs) == 5
    assert s.tool_calls is not None and s.tool_calls.calls == 0 and s.tool_calls.results == {"log_call": 5}
    assert orjson.dumps(s.target.identity).count(b"no tool-call syntax") == 1
