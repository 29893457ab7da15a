"""Session corpora in the load stage, without Locust: plans, live-history bodies, salts, per-turn summary."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from harness.common.errors import ConfigError, InputError
from harness.corpus.model import CorpusRecord
from harness.corpus.sessions import transcript
from harness.load.arrivals import prepare_requests
from harness.load.inputs import Inputs
from harness.load.options import LoadOptions
from harness.load.results import RequestRecord
from harness.load.run_summary import turn_summaries
from harness.load.sessions import (
    SYNTHETIC_TOOL_RESULT,
    LiveHistory,
    TurnBody,
    live_outputs,
    plan_sessions,
    salted_body,
)


def _turn(sid: str, k: int, *, chat: bool = True, offset: float | None = None) -> CorpusRecord:
    pairs = [(f"{sid} q{j}", f"{sid} log answer {j}") for j in range(1, k)]
    rec: dict[str, object] = {
        "id": f"{sid}-t{k}", "max_tokens": 8, "expected_output_tokens": 4, "lang": "en", "domain": "d",
        "intent": "i", "arrival_offset_s": offset,
        "provenance": {"seed": 0, "candidate": 0, "template": "t", "template_sha256": "0" * 64},
    }  # fmt: skip
    if chat:
        msgs = [{"role": "system", "content": "SYS"}]
        for u, a in pairs:
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        rec["messages"] = [*msgs, {"role": "user", "content": f"{sid} q{k}"}]
        at = (1, 1 + 2 * len(pairs))
    else:
        hist = transcript(pairs, "en")
        rec["prompt"] = "SYS\n" + hist + f"User: {sid} q{k}\nAssistant:"
        at = (4, 4 + len(hist))
    rec["session"] = {"session_id": sid, "turn": k, "turns": 3, "user": f"{sid} q{k}", "think_time_s": 0.5,
                      "think_source": "log", "history_at": at}  # fmt: skip
    return CorpusRecord.model_validate(rec)


def _corpus(path: Path, records: list[CorpusRecord]) -> Path:
    path.write_bytes(
        b"".join(orjson.dumps(r.model_dump(mode="json", exclude_none=True)) + b"\n" for r in records)
    )
    return path


@pytest.mark.parametrize("chat", [True, False])
def test_live_history_replaces_the_logs_answers(chat: bool) -> None:
    rec = _turn("s", 3, chat=chat)
    (spec,) = prepare_requests([rec])
    live = [("s q1", "LIVE-1"), ("s q2", "LIVE-2")]
    history = LiveHistory()
    for u, a in live:
        history.answered(
            TurnBody(b"", [{"role": "user", "content": u}]), u, {"role": "assistant", "content": a}
        )
    body = orjson.loads(history.body_for(rec, spec.body, live=True).body)
    if chat:
        assert [m["content"] for m in body["messages"]] == ["SYS", "s q1", "LIVE-1", "s q2", "LIVE-2", "s q3"]
    else:
        assert body["prompt"] == "SYS\n" + transcript(live, "en") + "User: s q3\nAssistant:"
    assert body["stream"] is True and body["max_tokens"] == 8  # the rest of the body as prepared
    assert history.body_for(rec, spec.body, live=False).body == spec.body  # log history: the bytes as built


def test_a_salt_starts_every_pass_after_the_first() -> None:
    (spec,) = prepare_requests([_turn("s", 1)])
    assert salted_body(spec.body, 0) == spec.body
    first = orjson.loads(salted_body(spec.body, 2))["messages"][0]["content"]
    assert first == "[pass 2] SYS"
    (plain,) = prepare_requests([_turn("s", 1, chat=False)])
    assert orjson.loads(salted_body(plain.body, 1))["prompt"].startswith("[pass 1] SYS\n")


def test_session_plans_and_their_checks() -> None:
    recs = [_turn("a", 2), _turn("b", 1), _turn("a", 1)]
    plans = plan_sessions(recs)
    assert plans is not None and [(p.id, p.turns) for p in plans] == [("a", (2, 0)), ("b", (1,))]
    assert plan_sessions([r.model_copy(update={"session": None}) for r in recs]) is None
    with pytest.raises(InputError, match="turns \\[2\\]"):
        plan_sessions([_turn("a", 2)])
    with pytest.raises(InputError, match="not a session turn"):
        plan_sessions([_turn("a", 1), _turn("b", 1).model_copy(update={"session": None})])


def test_a_rate_starts_sessions_and_a_plan_lists_their_turns(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl", [_turn("a", 1), _turn("a", 2), _turn("b", 1)])
    inputs = Inputs.load(LoadOptions(corpus=corpus, rate=10, max_requests=3), ladder=False)
    assert inputs.sessions is not None and len(inputs.sessions) == 2
    assert inputs.planned() == [0, 1, 2, 0, 1]  # session a, b, a again: each start plays its turns
    with pytest.raises(
        ConfigError, match=r"record 'a-t1' holds its history in 'messages'.*--api completions"
    ) as e:
        Inputs.load(LoadOptions(corpus=corpus, rate=10, max_requests=3, api="completions"), ladder=False)
    assert (e.value.line, e.value.field, e.value.exit_code) == (1, "messages", 4)
    # The first record of the other shape is named, wherever it is; --history log sends bodies as built.
    mixed = _corpus(tmp_path / "m.jsonl", [_turn("a", 1), _turn("b", 1, chat=False)])
    with pytest.raises(ConfigError, match="record 'b-t1' holds its history in 'prompt'") as e:
        Inputs.load(LoadOptions(corpus=mixed, rate=10, max_requests=3, api="chat"), ladder=False)
    assert (e.value.line, e.value.field) == (2, "prompt")
    Inputs.load(
        LoadOptions(corpus=corpus, rate=10, max_requests=3, api="completions", history="log"), ladder=False
    )
    # Offsets on the first turns are enough to schedule the starts.
    timed = _corpus(
        tmp_path / "t.jsonl", [_turn("a", 1, offset=0.0), _turn("a", 2), _turn("b", 1, offset=1.0)]
    )
    timed_inputs = Inputs.load(LoadOptions(corpus=timed), ladder=False)
    assert timed_inputs.planned() == [0, 1, 2]
    assert timed_inputs.source(0, 1)[1] == 3  # requests it will send: every turn of its two sessions


def test_the_summary_breaks_ttft_and_cached_tokens_down_by_turn() -> None:
    def rec(turn: int, ttft: float, cached: int) -> RequestRecord:
        return RequestRecord(
            id="x", stage="s", intended_s=0.0, sent_s=0.0, lateness_ms=0.0, status=200, ttft_ms=ttft,
            prompt_tokens=100, cached_tokens=cached, session_id="a", turn=turn,
        )  # fmt: skip

    turns = turn_summaries([rec(1, 50.0, 0), rec(2, 20.0, 80), rec(2, 30.0, 60), rec(1, 40.0, 0)])
    assert [(t.turn, t.requests, t.ttft_ms.p50, t.cached_share) for t in turns] == [
        (1, 2, 40.0, 0.0),
        (2, 2, 20.0, 0.7),
    ]
    assert turns[1].hit_rate["prefix"] == 1.0


def test_the_recipe_records_history_and_salt_per_pass() -> None:
    from harness.load.summary import recipe_of

    def recipe(sessions: bool, **kw: object) -> tuple[object, object]:
        r = recipe_of(LoadOptions(rate=1, duration=1, **kw), api="chat", corpus=None, schedule=None,  # type: ignore[arg-type]
                      sessions=sessions)  # fmt: skip
        return r.history, r.salt_per_pass

    assert recipe(True) == ("live", None)
    assert recipe(True, history="log", salt_per_pass=True) == ("log", True)
    # Neither applies to a corpus of single requests without a salt: old baselines compare equal.
    assert recipe(False, history="log") == (None, None)


# ----------------------------------------------------------------------------- tool-call turns

CALL = {
    "id": "call_log",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
RESULT = {"role": "tool", "tool_call_id": "call_log", "content": "rain, 14 C"}


def _tool_turn() -> CorpusRecord:
    """Turn 2 of an agent's session: the log called get_weather(Paris) in turn 1; its result opens turn 2."""
    rec: dict[str, object] = {
        "id": "a-t2", "max_tokens": 8, "expected_output_tokens": 4, "lang": "en", "domain": "agent",
        "intent": "tool_result", "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        "provenance": {"seed": 0, "candidate": 0, "template": "t", "template_sha256": "0" * 64},
        "messages": [{"role": "system", "content": "SYS"}, {"role": "user", "content": "umbrella?"},
                     {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT],
        "session": {"session_id": "a", "turn": 2, "turns": 2, "think_time_s": 0.0, "think_source": "log",
                    "history_at": [1, 3], "inputs": [RESULT]},
    }  # fmt: skip
    return CorpusRecord.model_validate(rec)


def _after(answer: dict[str, object]) -> tuple[list[dict[str, object]], dict[str, int] | None]:
    rec = _tool_turn()
    (spec,) = prepare_requests([rec])
    assert orjson.loads(spec.body)["tools"] == rec.tools  # the tools go with every turn
    history = LiveHistory()
    history.answered(TurnBody(b"", [{"role": "user", "content": "umbrella?"}]), "umbrella?", answer)
    turn = history.body_for(rec, spec.body, live=True, log_calls=[CALL])
    return orjson.loads(turn.body)["messages"], turn.tool_results


def _live(name: str, args: str, cid: str = "call_live") -> dict[str, object]:
    call = {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def test_the_targets_own_call_gets_the_recorded_result_under_its_own_id() -> None:
    msgs, results = _after(_live("get_weather", '{ "city":"Paris" }'))  # same arguments, other spacing
    assert results == {"recorded": 1}
    assert msgs[2]["tool_calls"][0]["id"] == "call_live"  # type: ignore[index]
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_live", "content": "rain, 14 C"}


def test_another_call_gets_a_stated_synthetic_result() -> None:
    msgs, results = _after(_live("get_weather", '{"city": "Rome"}'))
    assert results == {"synthetic": 1} and msgs[3]["content"] == SYNTHETIC_TOOL_RESULT
    assert msgs[3]["tool_call_id"] == "call_live" and "synthetic" in SYNTHETIC_TOOL_RESULT


def test_an_answer_without_the_call_gets_the_logs_call_so_the_results_answer_something() -> None:
    msgs, results = _after({"role": "assistant", "content": "I think it may rain."})
    assert results == {"log_call": 1}
    assert msgs[2] == {"role": "assistant", "content": "I think it may rain.", "tool_calls": [CALL]}
    assert msgs[3] == RESULT


def _call(sid: str, k: int, n: int, *, after: list[int], uses: list[int] | None = None) -> CorpusRecord:
    return CorpusRecord.model_validate({
        "id": f"{sid}-{k}", "max_tokens": 8, "expected_output_tokens": 4, "lang": "en", "domain": "agent",
        "intent": "chat", "messages": [{"role": "user", "content": f"{sid} call {k} after answer {after}"}],
        "provenance": {"seed": 0, "candidate": k, "template": "t", "template_sha256": "0" * 64},
        "call": {"session_id": sid, "call": k, "calls": n, "after": after, "uses": uses or [], "gap_s": 0.1,
                 "log_output": f"recorded answer {k}"},
    })  # fmt: skip


def test_agent_session_plans_and_their_checks() -> None:
    recs = [_call("a", 1, 3, after=[]), _call("a", 2, 3, after=[]), _call("a", 3, 3, after=[1, 2]),
            _call("b", 1, 1, after=[])]  # fmt: skip
    plans = plan_sessions(recs)
    assert plans is not None and [(p.id, p.turns, p.graph) for p in plans] == [
        ("a", (0, 1, 2), True), ("b", (3,), True)
    ]  # fmt: skip
    with pytest.raises(InputError, match="call 2 twice"):
        plan_sessions([*recs, _call("a", 2, 3, after=[1])])
    with pytest.raises(InputError, match=r"calls \[1, 3\]; expected"):
        plan_sessions([recs[0], recs[2]])
    with pytest.raises(InputError, match="is not a call"):  # a conversation's turn among graph calls
        plan_sessions([recs[0], _turn("s", 1)])
    with pytest.raises(ValueError, match="must name earlier calls"):  # a wait for a later call
        _call("a", 2, 3, after=[3])


def test_live_outputs_replace_the_recorded_answers_where_the_body_holds_them() -> None:
    body = orjson.dumps({"messages": [
        {"role": "user", "content": "plan it"}, {"role": "assistant", "content": "recorded one"},
        {"role": "tool", "tool_call_id": "c1", "content": "weather: sun; recorded two"},
    ]})  # fmt: skip
    out, made = live_outputs(body, [("recorded one", "LIVE 1"), ("recorded two", "LIVE 2"), ("absent", "x")])
    assert made == 2
    assert [m["content"] for m in orjson.loads(out)["messages"]] == [
        "plan it",
        "LIVE 1",
        "weather: sun; LIVE 2",
    ]
    assert live_outputs(body, [("nowhere", "x")]) == (body, 0)  # nothing held: the prepared bytes
    prompt = orjson.dumps({"prompt": "A said: recorded one. B?"})
    assert orjson.loads(live_outputs(prompt, [("recorded one", "live")])[0])["prompt"] == "A said: live. B?"
