"""The replay graph of agent traces (:mod:`harness.traces.graph`): calls, dependencies, gaps, requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.traces.api import read_traces
from harness.traces.graph import SessionGraph, replay_graph, replay_graphs
from harness.traces.model import Span, TagValue
from harness.traces.tree import build_trace

ROOT = Path(__file__).resolve().parents[2]
GENAI_TRACE = ROOT / "fixtures" / "traces" / "genaiTestTrace.json"
KAGENT_OTLP = ROOT / "fixtures" / "traces" / "genai" / "kagent_adk_go_1turn_otlp.json"
KAGENT_JAEGER = ROOT / "fixtures" / "traces" / "genai" / "kagent_helm_agent_jaeger.json"
CLAUDE_SUBAGENT = ROOT / "fixtures" / "traces" / "genai" / "usage_only" / "kagent_claude_subagent_otlp.json"


def span(
    sid: str, start_ms: float, end_ms: float, *, parent: str | None = "a0", op: str = "", **tags: TagValue
) -> Span:
    return Span(
        trace_id="t1", span_id=sid, parent_span_id=parent, service="agent", operation=op or sid,
        start_us=int(start_ms * 1000), duration_us=int((end_ms - start_ms) * 1000), tags=dict(tags),
    )  # fmt: skip


def chat(sid: str, start_ms: float, end_ms: float, *, said: str = "", heard: str = "", **tags: Any) -> Span:
    """An LLM call span in the current semantic conventions' form (messages as JSON attributes)."""
    extra: dict[str, TagValue] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}
    if heard:
        extra["gen_ai.input.messages"] = json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": heard}]}]
        )
    if said:
        extra["gen_ai.output.messages"] = json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": said}]}]
        )
    return span(sid, start_ms, end_ms, op=f"chat {sid}", **extra, **tags)


def graph(*spans: Span, **kw: Any) -> SessionGraph:
    agent: dict[str, TagValue] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triage"}
    root = span("a0", 0, 10_000, parent=None, op="invoke_agent", **agent)
    return replay_graph(build_trace("t1", [root, *spans]), **kw)


def by_id(g: SessionGraph) -> dict[str, Any]:
    return {c.id: c for c in g.calls}


def test_a_sequential_agent_is_a_chain_with_its_tool_time_as_gaps() -> None:
    g = graph(
        chat("c1", 100, 200), span("tool", 200, 400, op="execute_tool search"), chat("c2", 400, 500),
        chat("c3", 550, 600, **{"gen_ai.usage.input_tokens": 90, "gen_ai.usage.output_tokens": 12}),
    )  # fmt: skip
    calls = by_id(g)
    assert [c.id for c in g.calls] == ["c1", "c2", "c3"]  # the tool span is not a call
    assert (
        calls["c1"].depends_on == [] and calls["c2"].depends_on == ["c1"] and calls["c3"].depends_on == ["c2"]
    )
    assert [c.gap_ms for c in g.calls] == [100.0, 200.0, 50.0]
    assert [c.depth for c in g.calls] == [0, 1, 2] and all(c.agent == "triage" for c in g.calls)
    assert g.critical_path_ms == g.makespan_ms == 600.0
    assert g.edges_by == {"time": 2, "content": 0}
    assert calls["c3"].request.max_tokens == 12 and calls["c3"].input_tokens == 90


def test_parallel_branches_fan_out_and_a_join_waits_for_all_of_them_directly() -> None:
    g = graph(chat("c1", 0, 100), chat("b1", 150, 300), chat("b2", 160, 280), chat("c4", 400, 500))
    calls = by_id(g)
    assert calls["b1"].depends_on == ["c1"] and calls["b2"].depends_on == ["c1"]
    assert calls["c4"].depends_on == ["b1", "b2"]  # not c1 too: the graph keeps direct dependencies only
    assert g.fan_out() == 2 and g.fan_in() == 2
    assert calls["c4"].gap_ms == 100.0  # from the later branch's end
    assert g.critical_path_ms == g.makespan_ms == 500.0


def test_an_output_carried_into_a_later_input_is_a_dependency_whatever_the_clocks_say() -> None:
    answer = "The rollout of pod checkout-7 slowed every request"
    g = graph(
        chat("c1", 0, 200, said=answer),
        chat("c2", 150, 300, heard=f"Earlier you said: {answer}. Summarise."),  # starts before c1 ends: skew
        chat("c3", 160, 250, heard="unrelated"),
    )  # fmt: skip
    calls = by_id(g)
    assert calls["c2"].depends_on == ["c1"] and calls["c2"].uses_output == ["c1"]
    assert calls["c2"].gap_ms == 0.0  # clipped, not negative
    assert calls["c3"].depends_on == []  # overlaps c1 and shares nothing: parallel
    assert g.edges_by == {"time": 0, "content": 1}


def test_a_short_output_found_in_a_later_prompt_is_chance_not_a_dependency() -> None:
    g = graph(chat("c1", 0, 200, said="OK"), chat("c2", 100, 300, heard="OK, go on"))
    assert by_id(g)["c2"].depends_on == []


def test_nested_call_spans_are_one_call_timed_by_the_innermost() -> None:
    # A framework's span around the SDK's, which also times the tool the answer asked for.
    outer = chat("w", 0, 400, **{"gen_ai.usage.input_tokens": 50})
    inner = span("h", 10, 290, parent="w", op="openai.chat", **{"gen_ai.operation.name": "chat"})
    (call,) = graph(outer, inner, span("tool", 300, 390, parent="w", op="execute_tool x")).calls
    assert call.id == "h" and call.duration_ms == 280
    assert call.model == "m" and call.input_tokens == 50  # what the inner span lacks, from the wrapper


def test_the_requests_in_every_recorded_form() -> None:
    parts = [
        {"role": "user", "parts": [{"type": "text", "content": "weather in Paris?"}]},
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "call_1", "name": "weather", "arguments": {"city": "Paris"}}
            ],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"temp": 21}}]},
    ]
    tools = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    current = chat(
        "c1", 0, 100, **{
            "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be brief."}]),
            "gen_ai.input.messages": json.dumps(parts), "gen_ai.tool.definitions": json.dumps(tools),
            "gen_ai.request.temperature": 0.2, "gen_ai.request.max_tokens": 64,
        },
    )  # fmt: skip
    flattened = span(
        "c2", 200, 300, op="openai.chat", **{
            "gen_ai.request.model": "gpt", "gen_ai.usage.prompt_tokens": 7, "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": "Be brief.", "gen_ai.prompt.1.role": "user",
            "gen_ai.prompt.1.content": "and in Rome?",
            "gen_ai.completion.0.content": "Rome is 24 degrees today, sunny",
        },
    )  # fmt: skip
    calls = by_id(graph(current, flattened))
    req = calls["c1"].request
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[2].tool_calls == [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}
    ]
    assert req.messages[3].tool_call_id == "call_1" and req.messages[3].content == '{"temp":21}'
    assert req.tools == [
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    ]
    assert req.temperature == 0.2 and req.max_tokens == 64 and calls["c1"].content
    older = calls["c2"]  # OpenLLMetry's flattened attributes, and no operation name
    assert [(m.role, m.content) for m in older.request.messages] == [
        ("system", "Be brief."),
        ("user", "and in Rome?"),
    ]
    assert older.output == "Rome is 24 degrees today, sunny" and older.input_tokens == 7


def test_a_call_without_recorded_content_keeps_its_place_and_token_counts() -> None:
    bare = span("c1", 0, 100, **{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 300,
                                 "gen_ai.usage.output_tokens": 40})  # fmt: skip
    (call,) = graph(bare).calls
    assert not call.content and call.request.messages == [] and call.request.max_tokens == 40


def test_a_capped_gap_shortens_the_critical_path_below_the_recorded_makespan() -> None:
    g = graph(chat("c1", 0, 100), chat("c2", 5_100, 5_200), max_gap_ms=1_000)
    assert by_id(g)["c2"].gap_ms == 1_000
    assert g.critical_path_ms == 1_200 and g.makespan_ms == 5_200


def test_the_bundled_genai_trace() -> None:
    (g,) = replay_graphs(read_traces(GENAI_TRACE))
    assert len(g.calls) == 5 and {c.model for c in g.calls} == {"model-a", "model-b"}
    assert all(c.content and c.request.messages[0].role == "system" for c in g.calls)
    assert {c.agent for c in g.calls} == {"triage-agent", "summarizer"}
    assert all(c.request.max_tokens == c.output_tokens for c in g.calls)
    # Its recorded calls overlap in time (each starts within 60 ms of the trace's start and runs for
    # seconds) and share no output: read as recorded, they are parallel branches.
    spans = {c.id: c for c in g.calls}
    for c in g.calls:
        for p in c.depends_on:
            assert spans[p].offset_ms + spans[p].duration_ms <= c.offset_ms
    assert g.critical_path_ms == g.makespan_ms


def test_a_real_agent_run_over_otlp_two_calls_around_parallel_tools() -> None:
    """Go ADK against claude-haiku-4-5: the first answer asks for two tools, which run side by side;
    the second call holds both results and the first call's text."""
    (g,) = replay_graphs(read_traces(KAGENT_OTLP))
    first, second = g.calls
    assert second.depends_on == [first.id] and second.uses_output == [first.id]
    assert (first.input_tokens, first.output_tokens, second.input_tokens, second.output_tokens) == (
        14745,
        139,
        16066,
        81,
    )
    assert [m.role for m in second.request.messages].count("tool") == 2
    assert second.gap_ms > 0 and g.critical_path_ms == g.makespan_ms


def test_a_real_agent_run_with_a_sub_agent_beside_the_main_thread_and_a_join() -> None:
    """kagent's Claude Code runtime: 28 calls in Claude Code's own tracing (no gen_ai.operation.name,
    usage in its own attributes, no content). A sub-agent's first call runs beside the main thread's
    fifth; the next call waits for both (fan-in), and the main thread's answer comes after the
    sub-agent's last call."""
    (g,) = replay_graphs(read_traces(CLAUDE_SUBAGENT))
    calls = by_id(g)
    assert len(g.calls) == 28 and g.fan_out() == 2 and g.fan_in() == 2
    sub, main_ = calls["8a5a0ab60fc6412a"], calls["13246baca68f60fd"]
    assert (
        sub.offset_ms < main_.offset_ms + main_.duration_ms
        and main_.offset_ms < sub.offset_ms + sub.duration_ms
    )
    assert set(calls["a0584aa905ddbc5f"].depends_on) == {sub.id, main_.id}
    assert calls["4eb779e827622274"].depends_on == ["7d67e2af9230a8ea"]  # after the sub-agent's last
    first = g.calls[0]  # 10 uncached + 0 read + 23,030 written to the provider's cache; 356 out
    assert (first.input_tokens, first.cached_tokens, first.output_tokens) == (23_040, 0, 356)
    assert (sub.input_tokens, sub.output_tokens, sub.request.max_tokens) == (13_135, 223, 223)
    assert not any(c.content for c in g.calls) and g.critical_path_ms == g.makespan_ms


def test_a_real_agent_run_in_jaeger_json_with_flattened_attributes() -> None:
    """kagent's Python agent against gpt-4.1-mini: ADK's call_llm spans wrap the instrumented
    openai.chat spans (and time the tool inside them); the calls carry OpenLLMetry's flattened form."""
    (g,) = replay_graphs(read_traces(KAGENT_JAEGER))
    first, second = g.calls
    assert first.name == second.name == "openai.chat" and second.depends_on == [first.id]
    assert second.gap_ms >= 57  # the helm_list_releases tool ran 57 ms between them
    roles = [m.role for m in second.request.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    call = second.request.messages[2].tool_calls
    assert call is not None and call[0]["function"]["name"] == "helm_list_releases"
    assert second.request.messages[3].tool_call_id == call[0]["id"]
    assert first.request.tools and {t["function"]["name"] for t in first.request.tools} >= {
        "helm_list_releases"
    }
    assert (first.output_tokens, second.output_tokens) == (13, 117) and g.critical_path_ms == g.makespan_ms


def test_the_cli_prints_the_graph_and_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "graph.jsonl"
    with pytest.raises(SystemExit) as exc:
        main(["traces", "graph", str(GENAI_TRACE), "-o", str(out)])
    assert exc.value.code == 0
    printed = capsys.readouterr()
    assert "5 calls" in printed.out and "5 LLM call(s) in 1 session(s) of 1 trace(s)" in printed.err
    (line,) = out.read_text().splitlines()
    g = SessionGraph.model_validate_json(line)
    assert len(g.calls) == 5 and g.source.endswith("genaiTestTrace.json")


def test_cold_paths_mark_sessions_and_select_the_cold_or_the_warm(tmp_path: Path) -> None:
    traces = list(read_traces(GENAI_TRACE))
    (tid,) = {t.trace_id for t in traces}
    (cold,) = replay_graphs(traces, cold={tid}, sessions="cold")
    assert cold.cold is True
    assert list(replay_graphs(traces, cold={tid}, sessions="warm")) == []
    (warm,) = replay_graphs(traces, cold=set(), sessions="warm")
    assert warm.cold is False
    (unknown,) = replay_graphs(traces)
    assert unknown.cold is None
    with pytest.raises(ValueError, match="cold traces"):
        list(replay_graphs(traces, sessions="cold"))


def test_the_cli_takes_the_cold_sessions_of_a_coldpaths_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cp, out = tmp_path / "cp.jsonl", tmp_path / "graph.jsonl"
    for argv in (
        [
            "coldpaths",
            str(GENAI_TRACE),
            "--hops",
            "all",
            "--protocol",
            "any",
            "--cache-scope",
            "hop",
            "-o",
            str(cp),
        ],
        ["graph", str(GENAI_TRACE), "--coldpaths", str(cp), "--sessions", "cold", "-o", str(out)],
    ):
        with pytest.raises(SystemExit) as exc:
            main(["traces", *argv])
        assert exc.value.code == 0
    assert "in 1 cold session(s) of 1 trace(s)" in capsys.readouterr().err
    assert SessionGraph.model_validate_json(out.read_text()).cold is True
    with pytest.raises(SystemExit) as exc:
        main(["traces", "graph", str(GENAI_TRACE), "--sessions", "warm"])
    assert exc.value.code == 4 and "needs --coldpaths" in capsys.readouterr().err
