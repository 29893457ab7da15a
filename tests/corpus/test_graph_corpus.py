"""Agent-session corpora from traces' call graphs (:mod:`harness.corpus.graph`, ``harness corpus graph``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.common.errors import InputError
from harness.common.io import write_jsonl
from harness.corpus.graph import graph_records
from harness.corpus.model import CorpusRecord, Message, Provenance, read_corpus
from harness.traces.api import read_traces
from harness.traces.graph import CallRequest, ChatMessage, GraphCall, SessionGraph, replay_graphs

ROOT = Path(__file__).resolve().parents[2]
GENAI_TRACE = ROOT / "fixtures" / "traces" / "genaiTestTrace.json"
KAGENT_OTLP = ROOT / "fixtures" / "traces" / "genai" / "kagent_adk_go_1turn_otlp.json"
TRACES = [GENAI_TRACE, *sorted((ROOT / "fixtures" / "traces" / "genai").glob("*.json"))]


@pytest.fixture(scope="module")
def graphs() -> list[SessionGraph]:
    return [g for path in TRACES for g in replay_graphs(read_traces(path))]


def call(cid: str, *messages: ChatMessage, temperature: float | None = None, **kw: Any) -> GraphCall:
    request = CallRequest(messages=list(messages), temperature=temperature)
    return GraphCall(id=cid, name=f"chat {cid}", content=bool(messages), request=request, **kw)


def session(*calls: GraphCall, sid: str = "s" * 32, start_us: int = 0) -> SessionGraph:
    return SessionGraph(session=sid, source="t.json", start_us=start_us, calls=list(calls))


def user(text: str = "hello") -> ChatMessage:
    return ChatMessage(role="user", content=text)


def fill_record(rid: str, tokens: int | None, *, prompt: str | None = None) -> CorpusRecord:
    body: dict[str, Any] = (
        {"prompt": prompt}
        if prompt is not None
        else {"messages": [Message(role="user", content=f"fill {rid}")]}
    )
    provenance = Provenance(seed=0, candidate=0, template="t", template_sha256="0")
    return CorpusRecord(
        id=rid, max_tokens=8, expected_output_tokens=0, lang="en", domain="d", intent="i",
        prompt_tokens=tokens, provenance=provenance, **body,
    )  # fmt: skip


def test_every_call_of_the_real_traces_is_a_record_that_reads_back(
    graphs: list[SessionGraph], tmp_path: Path
) -> None:
    records = graph_records(graphs)
    assert len(records) == sum(len(g.calls) for g in graphs) == 9
    write_jsonl(tmp_path / "corpus.jsonl", (r.model_dump(mode="json", exclude_none=True) for r in records))
    assert list(read_corpus(tmp_path)) == records
    assert len({r.id for r in records}) == len(records)
    first = min(g.start_us for g in graphs)
    by_session = {g.session: g for g in graphs}
    for r in records:
        assert r.call is not None and r.messages
        g = by_session[r.call.session_id]
        c = g.calls[r.call.call - 1]
        index = {x.id: k for k, x in enumerate(g.calls, start=1)}
        assert r.call.after == [index[p] for p in c.depends_on]
        assert r.call.uses == [index[p] for p in c.uses_output]
        assert r.call.calls == len(g.calls) and r.call.gap_s == c.gap_ms / 1000 and r.call.depth == c.depth
        assert r.id == f"{g.session[:16]}-{r.call.call}" and r.provenance.source_trace_id == g.session
        assert r.max_tokens == c.request.max_tokens and r.prompt_tokens == c.input_tokens
        assert r.scenario == c.agent and r.intent == c.name and r.domain == "agent" and r.lang == "en"
        # Sessions arrive at their traces' starts: the first call carries it, the others wait in the graph.
        offset = (g.start_us - first) / 1e6 if r.call.call == 1 else None
        assert r.arrival_offset_s == offset
    assert sorted(r.arrival_offset_s for r in records if r.arrival_offset_s is not None)[0] == 0.0


def test_the_kagent_second_call_uses_the_first_answer_and_holds_it() -> None:
    (g,) = replay_graphs(read_traces(KAGENT_OTLP))
    first, second = graph_records([g])
    assert second.call is not None and first.call is not None
    assert second.call.after == [1] and second.call.uses == [1]
    assert first.call.log_output and first.call.log_output in second.text()
    roles = [m.role for m in second.messages or []]
    assert roles == ["system", "user", "assistant", "tool", "tool"]
    assert second.tools == g.calls[1].request.tools
    calls = second.messages[2].tool_calls if second.messages else None
    assert calls and [m.tool_call_id for m in (second.messages or [])[3:]] == [c.id for c in calls]


def test_a_call_without_content_needs_a_fill_corpus() -> None:
    g = session(call("c1", user()), call("c2", input_tokens=300, output_tokens=20, depends_on=["c1"]))
    with pytest.raises(InputError) as exc:
        graph_records([g], file=Path("g.jsonl"))
    text = str(exc.value)
    assert "call 2 (chat c2)" in text and "--fill CORPUS" in text and text.startswith("g.jsonl:")


def test_a_fill_corpus_lends_the_nearest_record_in_turn() -> None:
    bare = [call(f"c{k}", input_tokens=300) for k in range(3)]
    g = session(*bare, call("far", input_tokens=5000), call("unsized"))
    fill = [fill_record("a", 290), fill_record("b", 310), fill_record("big", 4000, prompt="a long prompt")]
    a, b, a2, big, unsized = graph_records([g], fill=fill)
    assert [r.provenance.query_id for r in (a, b, a2, big)] == ["a", "b", "a", "big"]  # ties in turn
    assert a.text() == "fill a" and a.prompt_tokens == 290 and a.target_input_tokens == 300
    assert big.messages == [Message(role="user", content="a long prompt")]  # a prompt as one user message
    assert unsized.provenance.query_id in {"a", "b", "big"} and a.provenance.fitted == "none"
    assert a.max_tokens == 256 and a.expected_output_tokens == 0  # nothing recorded: the default


def test_roles_tool_results_and_sampling() -> None:
    calls = [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"function": {"name": "g", "arguments": {"x": 1}}},  # no id, arguments as an object
    ]
    messages = [
        ChatMessage(role="developer", content="be brief"),
        user(),
        ChatMessage(role="assistant", tool_calls=calls),
        ChatMessage(role="tool", content="r1"),  # answers t1 by position
        ChatMessage(role="tool", content="r2"),  # answers the call that had no id
        ChatMessage(role="tool", content="r3"),  # answers no call: the user's words
    ]
    (r,) = graph_records([session(call("c1", *messages, output_tokens=9), start_us=5)])
    assert r.messages is not None
    assert [m.role for m in r.messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    made = r.messages[2].tool_calls or []
    assert [m.tool_call_id for m in r.messages[3:5]] == ["t1", made[1].id]
    assert made[1].function.arguments == '{"x":1}'
    assert r.messages[5].content == "r3" and r.sampling.temperature == 0.7 and r.max_tokens == 9
    hot = call("c1", user("你好，请帮我查一下北京明天的天气"), temperature=3.5)
    (z,) = graph_records([session(hot)])
    assert z.sampling.temperature == 2.0 and z.lang == "zh"


def test_a_role_chat_has_no_place_for_names_the_session_and_call() -> None:
    g = session(call("c1", user()), call("c2", ChatMessage(role="narrator", content="x")), sid="abc")
    with pytest.raises(InputError) as exc:
        graph_records([g])
    assert "session abc call 2" in str(exc.value) and "'narrator'" in str(exc.value)


def test_ids_keep_the_whole_trace_id_where_short_ones_clash_and_no_graphs_is_an_error() -> None:
    a, b = "0123456789abcdef" + "a" * 16, "0123456789abcdef" + "b" * 16
    records = graph_records([session(call("c1", user()), sid=a), session(call("c1", user()), sid=b)])
    assert [r.id for r in records] == [f"{a}-1", f"{b}-1"]
    with pytest.raises(InputError, match="given twice"):
        graph_records([session(call("c1", user()), sid=a)] * 2)
    with pytest.raises(InputError, match="no session graph"):
        graph_records([])


def test_the_cli_writes_a_corpus_and_names_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph, out = tmp_path / "graph.jsonl", tmp_path / "agent"
    for argv in (
        ["traces", "graph", *map(str, TRACES), "-o", str(graph)],
        ["corpus", "graph", str(graph), "-o", str(out)],
    ):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
    err = capsys.readouterr().err
    assert "9 calls in 3 sessions (1 with fan-out, 0 with fan-in; arrivals over" in err
    assert f"--corpus {out / 'corpus.jsonl'}" in err
    records = list(read_corpus(out))
    lines = graph.read_bytes().splitlines()
    # The provenance hash is the graph line's, as `harness traces graph` wrote it.
    assert {r.provenance.template_sha256 for r in records} == {hashlib.sha256(x).hexdigest() for x in lines}
    with pytest.raises(SystemExit) as bad:
        main(["corpus", "graph", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "x.jsonl")])
    err = capsys.readouterr().err
    assert bad.value.code == 3 and "nope.jsonl: no such file" in err and "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_the_cli_fills_content_less_calls_from_a_corpus_into_a_jsonl_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph, fill, out = tmp_path / "g.jsonl", tmp_path / "fill", tmp_path / "agent.jsonl"
    g = session(call("c1", user()), call("c2", input_tokens=300, depends_on=["c1"]))
    write_jsonl(graph, [g.model_dump(mode="json", exclude_none=True)])
    write_jsonl(fill / "corpus.jsonl", [fill_record("f1", 280).model_dump(mode="json", exclude_none=True)])
    with pytest.raises(SystemExit) as bare:
        main(["corpus", "graph", str(graph), "-o", str(out)])
    err = capsys.readouterr().err
    assert bare.value.code == 3 and f"{graph}: session {'s' * 32} call 2" in err and "--fill" in err
    with pytest.raises(SystemExit) as done:
        main(["corpus", "graph", str(graph), "--fill", str(fill), "-o", str(out)])
    assert done.value.code == 0 and "2 calls in 1 session (0 with fan-out" in capsys.readouterr().err
    first, second = read_corpus(out)
    assert second.provenance.query_id == "f1" and second.text() == "fill f1" and first.text() == "hello"
