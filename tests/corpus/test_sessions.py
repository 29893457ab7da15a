"""Session corpora (``harness corpus build --sessions``): dialogues in, one record per user turn out."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import orjson
import pytest

from harness.common.errors import ConfigError, InputError
from harness.common.settings import load_settings
from harness.corpus.model import read_corpus
from harness.corpus.sessions import SessionBuildInputs, build_sessions, transcript
from harness.corpus.settings import CorpusSettings
from harness.corpus.timing import ThinkTime, read_timing_trace

ROOT = Path(__file__).resolve().parents[2]


def _log(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _dialogues(path: Path) -> Path:
    rows: list[dict[str, object]] = []
    for sid, first, t0 in (("a", "我想订一家海淀区的酒店", 100.0), ("b", "我想订一家海淀区的酒店", 500.0),
                           ("c", "故宫的门票多少钱", 900.0)):  # fmt: skip
        rows += [
            {
                "session_id": sid,
                "turn": 1,
                "text": first,
                "response": f"{sid}答一",
                "ts": t0,
                "replied_at": t0 + 2,
            },
            {
                "session_id": sid,
                "turn": 2,
                "text": f"{sid}的第二个问题",
                "response": f"{sid}答二",
                "ts": t0 + 9.5,
            },
            {"session_id": sid, "turn": 3, "text": f"{sid}的第三个问题", "ts": t0 + 20},
        ]
    return _log(path, rows)


def _settings() -> CorpusSettings:
    return load_settings(CorpusSettings, seed=1)


def test_sessions_keep_turns_verbatim_with_think_times_from_the_log(tmp_path: Path) -> None:
    log = _dialogues(tmp_path / "d.jsonl")
    got = build_sessions(SessionBuildInputs(out=tmp_path / "c", logs=[log]), _settings())
    recs = list(read_corpus(tmp_path / "c"))
    # "a" and "b" open with the same request: one whole conversation goes, never a part of one.
    assert got.dropped == 1 and got.metrics["sessions"] == 2 and len(recs) == 6
    for r in recs:
        st = r.session
        assert st is not None and r.messages is not None
        assert r.messages[-1].content == st.user  # the user turn verbatim, last
        a, b = st.history_at
        assert b - a == 2 * (st.turn - 1)
        assert [m.role for m in r.messages[a:b]] == ["user", "assistant"] * (st.turn - 1)
    by_turn = {(r.session.session_id, r.session.turn): r.session for r in recs if r.session}
    sid = recs[0].session.session_id if recs[0].session else ""
    assert by_turn[(sid, 1)].think_time_s == 0.0
    assert by_turn[(sid, 2)].think_time_s == pytest.approx(7.5)  # ts − the previous reply's time
    assert by_turn[(sid, 3)].think_time_s == pytest.approx(10.5)  # no reply time: ts − previous ts
    assert by_turn[(sid, 3)].think_source == "log"
    quality = orjson.loads((tmp_path / "c" / "quality.json").read_bytes())
    assert [s["turns"] for s in quality["sessions"]] == [3, 3]
    assert all(s["history_tokens_max"] > 0 for s in quality["sessions"])


def test_a_completions_template_gets_the_transcript_and_says_where_it_is(tmp_path: Path) -> None:
    log = _dialogues(tmp_path / "d.jsonl")
    inputs = SessionBuildInputs(
        out=tmp_path / "c", logs=[log], template=ROOT / "templates/prompts/session.j2"
    )
    build_sessions(inputs, _settings())
    third = next(r for r in read_corpus(tmp_path / "c") if r.session and r.session.turn == 3)
    assert third.prompt is not None and third.session is not None
    a, b = third.session.history_at
    d = third.session.user[0]  # the dialogue's id ("a", "c"), as the log's texts carry it
    assert third.prompt[a:b] == transcript([(_first(d), f"{d}答一"), (f"{d}的第二个问题", f"{d}答二")], "zh")
    assert third.prompt.rstrip().endswith("助手:")


def _first(sid: str) -> str:
    return "我想订一家海淀区的酒店" if sid in "ab" else "故宫的门票多少钱"


def test_crosswoz_sample_builds_whole_dialogues_with_a_stated_think_time(tmp_path: Path) -> None:
    got = build_sessions(
        SessionBuildInputs(out=tmp_path / "c", n=3, think_time=ThinkTime.parse("lognormal:6,0.5")),
        _settings(),
    )
    recs = list(read_corpus(tmp_path / "c"))
    assert got.metrics["sessions"] == 3 and len({r.session.session_id for r in recs if r.session}) == 3
    later = [r.session for r in recs if r.session and r.session.turn > 1]
    assert later and all(s.think_source.startswith("lognormal(median 6 s") for s in later)
    again = build_sessions(
        SessionBuildInputs(out=tmp_path / "d", n=3, think_time=ThinkTime.parse("lognormal:6,0.5")),
        _settings(),
    )
    assert [r.model_dump() for r in again.records] == [r.model_dump() for r in got.records]  # seeded


def test_corpus_stats_recomputes_the_per_session_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import main

    out = tmp_path / "c"
    build_sessions(
        SessionBuildInputs(out=out, n=3, template=ROOT / "templates/prompts/session.j2"), _settings()
    )
    quality = orjson.loads((out / "quality.json").read_bytes())
    with pytest.raises(SystemExit) as st:
        main(["corpus", "stats", str(out), "--json"])
    assert st.value.code == 0
    doc = orjson.loads(capsys.readouterr().out)
    # From the corpus on disk alone, the same rows and metrics its build wrote.
    assert doc["sessions"] == quality["sessions"] and len(doc["sessions"]) == 3
    assert {k: doc["session_metrics"][k] for k in ("sessions", "records", "history_tokens_max")} == {
        k: quality["metrics"][k] for k in ("sessions", "records", "history_tokens_max")
    }
    recs = list(read_corpus(out))
    first = recs[0].session
    assert first is not None
    row = next(r for r in doc["sessions"] if r["session_id"] == first.session_id)
    mine = [r for r in recs if r.session and r.session.session_id == first.session_id]
    assert row["turns"] == first.turns == len(mine)
    assert row["prompt_tokens_max"] == max(r.prompt_tokens or 0 for r in mine)
    assert row["history_tokens_max"] > 0 and row["dialogue"] == (recs[0].provenance.query_id or "")[:-2]
    with pytest.raises(SystemExit):
        main(["corpus", "stats", str(out)])
    assert "per session (3)" in capsys.readouterr().out


def test_think_time_specs_and_timing_traces(tmp_path: Path) -> None:
    assert ThinkTime.parse("constant:2").draw(0, "s", 2) == 2.0
    assert ThinkTime.parse("exponential:3").draw(0, "s", 2) == ThinkTime.parse("exponential:3").draw(
        0, "s", 2
    )
    with pytest.raises(ConfigError, match="think-time"):
        ThinkTime.parse("normal:1")
    plain = _log(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1}])
    with pytest.raises(InputError, match=r"no line has a session id .* or hash_ids"):
        read_timing_trace(plain)
    timed = _log(tmp_path / "s.jsonl", [{"timestamp": 5000, "chat_id": 7}, {"timestamp": 9000, "chat_id": 8},
                                        {"timestamp": 6500, "chat_id": 7}])  # fmt: skip
    got = read_timing_trace(timed)
    assert got.how == "ids" and got.think_source == "trace"
    assert [(s.start_s, s.think_s) for s in got.sessions] == [(0.0, (1.5,)), (4.0, ())]


def _req(ts_ms: int, inp: int, out: int, ids: list[int]) -> dict[str, object]:
    return {"timestamp": ts_ms, "input_length": inp, "output_length": out, "hash_ids": ids}


def test_sessions_are_inferred_from_growing_hash_id_prefixes(tmp_path: Path) -> None:
    # 512-token blocks: 1,100 tokens are 2 full blocks (1, 2) and a partial one that a longer
    # prompt hashes differently (3 → 9). Among equally long shared prefixes the latest request is
    # taken, so the lengths here leave one reading each.
    trace = _log(tmp_path / "m.jsonl", [
        _req(1000, 1100, 100, [1, 2, 3]),          # A turn 1
        _req(9000, 1700, 50, [1, 2, 9, 10]),       # A turn 3: extends turn 2 (longest), in file before it
        _req(4000, 1600, 80, [1, 2, 9, 11]),       # A turn 2: A1's blocks + its answer
        _req(2000, 1150, 500, [1, 2, 8]),          # a sibling: A1's document, its own question
        _req(3000, 400, 10, [20]),                 # B: under one block, nothing can be seen to extend it
        _req(5000, 1250, 10, [1, 2, 7]),           # a second continuation of A1: a fork
        _req(6000, 600, 10, [20, 21]),             # not B's next turn: B has no full block
    ])  # fmt: skip
    got = read_timing_trace(trace)
    assert got.how == "prefix" and got.think_source == "trace-prefix" and got.requests == 7
    assert [(s.start_s, s.think_s) for s in got.sessions] == [
        (0.0, (3.0, 5.0)), (1.0, ()), (2.0, ()), (4.0, ()), (5.0, ())
    ]  # fmt: skip
    assert got.forks == 1
    assert got.summary()["multi_turn_sessions"] == 1 and got.summary()["turns_max"] == 3
    built = build_sessions(
        SessionBuildInputs(out=tmp_path / "c", logs=[_dialogues(tmp_path / "d.jsonl")], trace=trace),
        _settings(),
    )
    assert built.metrics["timing_trace"]["sessions"] == 5
    first = [r for r in built.records if r.session and r.session.session_id.endswith("00000")]
    # the log's own timestamps win over the trace's; the trace gives the start
    assert first[0].arrival_offset_s == 0.0 and first[1].session and first[1].session.think_source == "log"


def test_a_timing_trace_without_log_timestamps_times_turns_by_arrival_gaps(tmp_path: Path) -> None:
    trace = _log(tmp_path / "m.jsonl", [_req(0, 1100, 100, [1, 2, 3]), _req(2500, 1300, 80, [1, 2, 9])])
    log = _log(tmp_path / "d.jsonl", [{"session_id": "x", "turn": 1, "text": "你好"},
                                      {"session_id": "x", "turn": 2, "text": "谢谢"}])  # fmt: skip
    built = build_sessions(SessionBuildInputs(out=tmp_path / "c", logs=[log], trace=trace), _settings())
    second = built.records[1].session
    assert second is not None and (second.think_time_s, second.think_source) == (2.5, "trace-prefix")


def test_the_mooncake_fixture_head_has_no_request_extending_another(tmp_path: Path) -> None:
    path = ROOT / "fixtures/traces/mooncake_synthetic_head20.jsonl"
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    got = read_timing_trace(path)
    # Independently: no two of these 20 lines share even a first block, so each is its own session.
    assert len({r["hash_ids"][0] for r in rows}) == len(rows) == 20
    assert len(got.sessions) == 20 and got.summary()["multi_turn_sessions"] == 0
    assert got.sessions[-1].start_s == rows[-1]["timestamp"] / 1000


@pytest.mark.realdata
def test_real_mooncake_trace_sessions_are_growing_prefixes(realdata: Path) -> None:
    from harness.corpus.timing import TraceRequest, chain_by_prefix

    path = realdata / "mooncake" / "synthetic_trace.jsonl"
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    reqs = [TraceRequest(r["timestamp"] / 1000, r["input_length"], r["output_length"], tuple(r["hash_ids"]))
            for r in rows]  # fmt: skip
    chains, forks = chain_by_prefix(reqs, 512)
    assert sorted(i for c in chains for i in c) == list(range(len(rows)))  # every line in one session
    multi = [c for c in chains if len(c) > 1]
    assert multi, "the synthetic trace keeps multi-turn conversations in order (its README)"
    for c in multi:
        for a, b in pairwise(c):
            full = rows[a]["input_length"] // 512
            assert full >= 1 and rows[b]["hash_ids"][:full] == rows[a]["hash_ids"][:full]
            assert rows[b]["input_length"] >= rows[a]["input_length"] + max(rows[a]["output_length"], 1)
            assert rows[b]["timestamp"] >= rows[a]["timestamp"]
    got = read_timing_trace(path)
    assert len(got.sessions) == len(chains) and got.forks == forks


def test_a_dialogue_log_with_a_gap_in_its_turns_is_refused(tmp_path: Path) -> None:
    log = _log(tmp_path / "d.jsonl", [{"session_id": "a", "turn": 1, "text": "你好"},
                                      {"session_id": "a", "turn": 3, "text": "再见"}])  # fmt: skip
    with pytest.raises(InputError, match="turn 3 where turn 2") as err:
        build_sessions(SessionBuildInputs(out=tmp_path / "c", logs=[log]), _settings())
    assert err.value.line == 2


# ----------------------------------------------------------------------- an agent's log (openai)

AGENT_LOG = ROOT / "fixtures" / "corpus" / "agent_sessions.jsonl"


def test_an_agents_log_turns_at_each_assistant_message_with_its_calls_and_results(tmp_path: Path) -> None:
    from harness.corpus.dialogues import detect_session_format

    assert detect_session_format(AGENT_LOG) == "openai"
    settings = load_settings(CorpusSettings, seed=5)
    result = build_sessions(
        SessionBuildInputs(out=tmp_path / "c", logs=[AGENT_LOG], think_time=ThinkTime.parse("constant:1")),
        settings,
    )
    recs = list(read_corpus(tmp_path / "c"))
    assert recs == result.records and len(recs) == 12
    weather = [r for r in recs if r.provenance.query_id and r.provenance.query_id.startswith("weather-1-")]
    assert [r.session.turn for r in weather if r.session] == [1, 2, 3, 4]
    t1, t2, t3, t4 = weather
    assert t1.messages is not None and t1.messages[0].content.startswith(
        "You are a travel assistant"
    )  # the log's
    assert t1.tools and t1.tool_choice == "auto" and t1.session is not None
    assert [c.function.name for c in t1.session.log_tool_calls or []] == ["get_weather"] and t1.session.user
    # Turn 2 is opened by the tool result alone; its history is turn 1: the question and the call.
    assert t2.session is not None and t2.session.user == "" and t2.intent == "tool_result"
    assert [m.role for m in t2.session.inputs or []] == ["tool"]
    assert t2.messages is not None and [m.role for m in t2.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert t2.session.history_at == (1, 3) and t2.messages[2].tool_calls is not None
    assert t3.session is not None and t3.session.user == "And what about Rome?" and t3.session.inputs is None
    assert t4.messages is not None and t4.messages[-1].tool_call_id == "call_w2"
    # The request: tools with every turn, an assistant's call with null content (OpenAI's shape).
    _, body = t2.to_request()
    assert body["tools"] == t2.tools and body["tool_choice"] == "auto"
    assert body["messages"][2]["content"] is None and body["messages"][3]["tool_call_id"] == "call_w1"


def test_an_agents_log_that_breaks_the_shape_is_refused_naming_line_and_field(tmp_path: Path) -> None:
    settings = load_settings(CorpusSettings, seed=5)
    ok = {"messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]}
    bad_first = {"messages": [{"role": "assistant", "content": "hi"}]}
    log = _log(tmp_path / "a.jsonl", [ok, bad_first])
    with pytest.raises(InputError) as err:
        build_sessions(SessionBuildInputs(out=tmp_path / "o", logs=[log]), settings)
    assert err.value.line == 2 and err.value.field == "messages[0]"
    no_id = {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]}
    log = _log(tmp_path / "b.jsonl", [no_id])
    with pytest.raises(InputError, match="tool_call_id") as err:
        build_sessions(SessionBuildInputs(out=tmp_path / "o", logs=[log]), settings)
    assert err.value.line == 1 and err.value.field == "messages[1]"
    from harness.corpus.sandbox import TemplateError

    with pytest.raises(TemplateError, match="chat template"):
        build_sessions(
            SessionBuildInputs(
                out=tmp_path / "o", logs=[AGENT_LOG], template=ROOT / "templates" / "prompts" / "session.j2"
            ),
            settings,
        )


def test_a_mooncake_agent_trace_becomes_tool_sessions_of_its_lengths_and_times(tmp_path: Path) -> None:
    """Session A: three requests, each prompt its predecessor's plus its answer plus a tool result
    (300 and 50 tokens); session B: one request sharing A's first 512-token block."""
    from harness.corpus.dialogues import detect_session_format
    from harness.corpus.tokens import load_tokenizer

    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 3]},
        {"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 7]},
        {"timestamp": 2000, "input_length": 1420, "output_length": 30, "hash_ids": [1, 2, 9]},
        {"timestamp": 5000, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 9]},
    ]
    trace = _log(tmp_path / "toolagent_trace.jsonl", rows)
    assert detect_session_format(trace) == "mooncake"
    settings = load_settings(CorpusSettings, seed=1)
    build_sessions(SessionBuildInputs(out=tmp_path / "c", logs=[trace]), settings)
    recs = list(read_corpus(tmp_path / "c"))
    assert len(recs) == 4  # A: 3 turns, B: 1
    by = {(r.session.turns, r.session.turn): r for r in recs if r.session}
    a1, a2, a3, b1 = by[(3, 1)], by[(3, 2)], by[(3, 3)], by[(1, 1)]
    tok = load_tokenizer(None, settings.seed)
    assert a1.session is not None and tok.count(a1.session.user) == 1100
    assert b1.session is not None and tok.count(b1.session.user) == 600
    assert a1.session.user[:200] == b1.session.user[:200]  # the shared first block: the same text
    assert a2.session is not None and a2.session.inputs is not None
    assert tok.count(a2.session.inputs[0].content) == 300 and a2.session.inputs[0].tool_call_id == "call_0_0"
    assert (
        a3.session is not None
        and a3.session.inputs is not None
        and tok.count(a3.session.inputs[0].content) == 50
    )
    call = (a1.session.log_tool_calls or [])[0]
    assert call.function.name == "act" and tok.count(orjson.loads(call.function.arguments)["input"]) == 20
    assert a3.session.log_tool_calls is None and b1.session.log_tool_calls is None
    assert a1.tools and a1.tools[0]["function"]["name"] == "act"
    assert [r.session.think_time_s for r in (a1, a2, a3)] == [0.0, 2.0, 3.0]  # type: ignore[union-attr]
    assert a2.session.think_source == "trace-prefix"
    assert (a1.arrival_offset_s, b1.arrival_offset_s) == (0.0, 1.0)
