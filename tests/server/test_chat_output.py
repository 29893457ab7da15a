"""The chat output parser: thinking, answer and tool calls split from a model's text as it streams."""

from __future__ import annotations

import orjson
import pytest

from harness.target.server.chat_output import ChatOutput, ChatSyntax, OutputDelta

HERMES = "{% if tools %}wrap each call in <tool_call></tool_call>{% endif %}"
THINKING = "{{ '<think>' }}"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'


def _feed(out: ChatOutput, text: str, size: int) -> tuple[list[OutputDelta], OutputDelta]:
    """Feed ``text`` in pieces of ``size`` characters; every delta, and all of them merged."""
    deltas = [out.feed(text[i : i + size]) for i in range(0, len(text), size)]
    deltas.append(out.finish())
    merged = OutputDelta()
    for d in deltas:
        merged.add(d)
    return deltas, merged


def _assembled(merged: OutputDelta) -> list[tuple[str, str, str]]:
    calls: dict[int, list[str]] = {}
    for c in merged.tool_calls:
        slot = calls.setdefault(c["index"], ["", "", ""])
        slot[0] = c.get("id", slot[0])
        slot[1] += c["function"].get("name", "")
        slot[2] += c["function"]["arguments"]
    return [(a, b, c) for a, b, c in calls.values()]


def test_the_syntax_is_read_from_the_template() -> None:
    assert ChatSyntax.of(HERMES).tools is not None and not ChatSyntax.of(HERMES).thinking
    assert ChatSyntax.of(THINKING).thinking and ChatSyntax.of(THINKING).tools is None
    plain = ChatSyntax.of("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert plain == ChatSyntax() and plain.describe()["tool_calls"] is None
    assert "no tool-call syntax" in plain.describe()["note"] and plain.describe()["tools_accepted"]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_a_hermes_call_streams_its_name_then_argument_fragments(size: int) -> None:
    out = ChatOutput(ChatSyntax.of(HERMES), parse_tools=True)
    deltas, merged = _feed(out, "Let me check.\n" + CALL, size)
    assert merged.content == "Let me check." and merged.reasoning == ""  # the newline before the call dropped
    [(cid, name, args)] = _assembled(merged)
    assert name == "get_weather" and orjson.loads(args) == {"city": "Paris", "unit": "c"}
    assert args == '{"city": "Paris", "unit": "c"}' and cid.startswith("call_")
    assert out.calls == [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}]
    if size < 10:  # streamed: the arguments came in several fragments, not at the end in one
        assert sum(1 for d in deltas for c in d.tool_calls if c["function"]["arguments"]) > 3


def test_two_calls_and_the_whitespace_between_them() -> None:
    out = ChatOutput(ChatSyntax.of(HERMES), parse_tools=True)
    second = CALL.replace("Paris", "Rome")
    _, merged = _feed(out, CALL + "\n" + second + "\n", 4)
    assert merged.content == "" and [c[1] for c in _assembled(merged)] == ["get_weather"] * 2
    assert [c["index"] for c in merged.tool_calls if "id" in c] == [0, 1]


def test_without_tools_offered_or_with_bad_json_the_text_is_the_answer() -> None:
    _, merged = _feed(ChatOutput(ChatSyntax.of(HERMES), parse_tools=False), CALL, 3)
    assert merged.content == CALL and not merged.tool_calls
    broken = '<tool_call>{"oops": </tool_call> done'
    _, merged = _feed(ChatOutput(ChatSyntax.of(HERMES), parse_tools=True), broken, 2)
    assert merged.content == broken and not merged.tool_calls


def test_other_key_order_and_string_arguments_come_whole_at_the_close() -> None:
    text = '<tool_call>{"arguments": "{\\"q\\": 1}", "name": "search"}</tool_call>'
    _, merged = _feed(ChatOutput(ChatSyntax.of(HERMES), parse_tools=True), text, 5)
    assert _assembled(merged)[0][1:] == ("search", '{"q": 1}')


@pytest.mark.parametrize("size", [1, 4, 100])
def test_thinking_then_answer(size: int) -> None:
    out = ChatOutput(ChatSyntax.of(THINKING))
    _, merged = _feed(out, "<think>\nweigh it up\n</think>\n\nIt is 4.", size)
    assert merged.reasoning == "\nweigh it up\n" and merged.content == "\n\nIt is 4."


def test_a_template_that_opens_the_tag_starts_thinking_and_counts_thinking_tokens() -> None:
    out = ChatOutput(ChatSyntax.of(THINKING, generation_prompt="<|assistant|><think>\n"))
    tokens = ["hm", "m ", "ok", "</think>", "Yes", "."]
    deltas = [out.feed(t) for t in tokens] + [out.finish()]
    assert "".join(d.reasoning for d in deltas) == "hmm ok" and "".join(d.content for d in deltas) == "Yes."
    assert out.reasoning_tokens == 4  # the close tag's token included


def test_a_plain_model_passes_every_token_through() -> None:
    out = ChatOutput(ChatSyntax(), parse_tools=True)
    assert out.passthrough
    assert out.feed("<think>x").content == "<think>x" and out.reasoning_tokens == 0


def test_cut_off_inside_a_call_keeps_what_was_written() -> None:
    out = ChatOutput(ChatSyntax.of(HERMES), parse_tools=True)
    _, merged = _feed(out, '<tool_call>{"name": "f", "arguments": {"a": [1, 2', 3)
    assert _assembled(merged)[0][1:] == ("f", '{"a": [1, 2') and out.calls == []


def test_tools_reach_the_template_the_cache_key_and_the_fingerprint() -> None:
    from harness.common.openai import ChatCompletionRequest
    from harness.target.cache.keys import KeyBuilder
    from harness.target.cache.settings import CacheSettings
    from harness.target.engine.tokenizer import preset_tokenizer
    from harness.target.server.prepare import prepare

    tok = preset_tokenizer()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "x"}'},
    }
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]  # fmt: skip
    kw = {"tokenizer": tok, "model_name": "tiny", "max_model_len": 512, "default_max_tokens": 8}
    with_tools = prepare(ChatCompletionRequest.model_validate({"messages": msgs, "tools": tools}), **kw)
    without = prepare(ChatCompletionRequest.model_validate({"messages": msgs}), **kw)
    none = prepare(
        ChatCompletionRequest.model_validate({"messages": msgs, "tools": tools, "tool_choice": "none"}), **kw
    )
    # The template got the tools and the call (its arguments as an object), so the prompt grew.
    assert '"get_weather"' in with_tools.prompt_text and 'get_weather{"city": "x"}' in with_tools.prompt_text
    assert len(with_tools.prompt_ids) > len(without.prompt_ids)
    assert with_tools.parse_tools and not without.parse_tools and not none.parse_tools
    assert with_tools.prompt_fp != without.prompt_fp
    keys = KeyBuilder(CacheSettings())
    key = [
        keys.normalize("chat.completions", p.cache_body, "default").key for p in (with_tools, without, none)
    ]
    assert len(set(key)) == 3  # tools, and what tool_choice asks, change the answer
