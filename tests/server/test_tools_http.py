"""Tools and thinking through a real ``harness serve``: accepted, passed to the chat template, keyed by
the response cache, and answered as ``tool_calls`` / ``reasoning_content`` where the model's template
has the syntax.

Two servers: the ``tiny`` preset (its template has no tool-call syntax: the answer is content, and
``GET /v1/models`` says so), and a small random checkpoint whose template marks thinking and Hermes
tool calls. A random model never writes a tool call of its own, so the second server's answer is
preloaded into its response cache: a hit replays the cached raw text through the same parser an
engine answer goes through, which is the path under test. Streams are read back with the load
stage's own reader (:func:`harness.load.client.read_response`), the one that measures them in a run.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import orjson
import pytest

from harness.common.openai import ChatCompletionResponse
from harness.load.client import read_response
from tests.engine.conftest import make_checkpoint
from tests.server.conftest import ServerProc, harness_server

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
CALL = {
    "id": "call_a",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "w4"}'},
}
HISTORY = [
    {"role": "user", "content": "w1 w2 w3"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_a", "content": "w5 w6"},
]
TEMPLATE = (
    "{{ bos_token }}{% if tools %}tools {% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
    "answer with <tool_call></tool_call> or think in <think></think> {% endif %}"
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)


def _stream(url: str, body: dict[str, Any]) -> tuple[httpx.Headers, list[tuple[float, bytes]]]:
    lines: list[tuple[float, bytes]] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            lines.append((time.perf_counter(), line.encode()))
        return r.headers, lines


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ServerProc:
    with harness_server(tmp_path_factory.mktemp("tools-tiny"), "--cache") as srv:
        yield srv


def test_a_model_without_tool_syntax_says_so_and_still_serves_tools(tiny: ServerProc) -> None:
    card = httpx.get(tiny.url + "/v1/models").json()["data"][0]
    chat = card["harness"]["chat"]
    assert chat["tool_calls"] is None and chat["reasoning"] is None and chat["tools_accepted"] is True
    assert "no tool-call syntax" in chat["note"]
    body = {"messages": HISTORY, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 5, "temperature": 0,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers, lines = _stream(tiny.url, body)
    out = read_response(lines, "auto")
    assert out.error is None and out.timing is not None and out.timing.completion_tokens == 5
    assert out.parsed is not None and out.parsed.tool_calls == [] and out.text()
    # Tools change the prompt, so the answer: the response cache keys them.
    no_tools = {k: v for k, v in body.items() if k != "tools"}
    plain = httpx.post(tiny.url + "/v1/chat/completions", json=no_tools, timeout=60)
    assert plain.status_code == 200 and plain.headers["x-cache-key"] != headers["x-cache-key"]
    again, _ = _stream(tiny.url, body)
    assert again["x-cache"].startswith("HIT-") and again["x-cache-key"] == headers["x-cache-key"]
    # The legacy functions / function_call are accepted too.
    legacy = {"messages": [{"role": "user", "content": "w1"}], "functions": [TOOLS[0]["function"]],
              "function_call": "auto", "max_tokens": 3}  # fmt: skip
    assert httpx.post(tiny.url + "/v1/chat/completions", json=legacy, timeout=60).status_code == 200


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> ServerProc:
    ckpt = make_checkpoint(tmp_path_factory.mktemp("agent-model"), "llama")
    cfg_file = ckpt / "tokenizer_config.json"
    cfg_file.write_text(json.dumps(json.loads(cfg_file.read_text()) | {"chat_template": TEMPLATE}))
    with harness_server(tmp_path_factory.mktemp("tools-agent"), "--model", str(ckpt), "--cache") as srv:
        yield srv


ANSWER = (
    "<think>w7 w8 w9</think>\n"
    + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "w10"}}\n</tool_call>'
)


def test_a_tool_call_in_the_template_syntax_streams_as_tool_calls(agent: ServerProc) -> None:
    card = httpx.get(agent.url + "/v1/models").json()["data"][0]
    assert (
        card["harness"]["chat"]["tool_calls"] == "hermes" and card["harness"]["chat"]["reasoning"] == "think"
    )
    body = {"messages": HISTORY, "tools": TOOLS, "max_tokens": 40, "temperature": 0}
    r = httpx.post(
        agent.url + "/cache/preload", content=orjson.dumps(body | {"completion": ANSWER}), timeout=60
    )
    assert r.status_code == 200 and r.json()["stored"] == 1, r.text
    headers, lines = _stream(agent.url, body | {"stream_options": {"include_usage": True}})
    assert headers["x-cache"].startswith("HIT-")
    out = read_response(lines, "auto")
    assert out.error is None and out.parsed is not None and out.timing is not None
    [call] = out.parsed.tool_calls
    assert (call.name, orjson.loads(call.arguments)) == ("get_weather", {"city": "w10"})
    assert call.id is not None and call.id.startswith("call_")
    assert out.parsed.finish_reason == "tool_calls" and out.text() == ""
    thinking = "".join(p for c in out.parsed.chunks for k, p in c.parts if k == "reasoning")
    assert thinking == "w7 w8 w9" and out.timing.reasoning_tokens > 0
    assert out.usage.reasoning_tokens is not None and out.usage.reasoning_tokens > 0
    # The arguments came in fragments, as the model's tokens would have brought them.
    fragments = [p for c in out.parsed.chunks for k, p in c.parts if k == "tool_call"]
    assert len(fragments) > 2 and out.timing.first_answer_t is not None
    assert out.timing.first_token_t is not None and out.timing.first_answer_t > out.timing.first_token_t
    # Not streamed: one message with the thinking, no content and the call.
    whole = httpx.post(agent.url + "/v1/chat/completions", json=body, timeout=60)
    choice = ChatCompletionResponse.model_validate(whole.json()).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content == "w7 w8 w9"
    assert choice.message.tool_calls is not None
    assert choice.message.tool_calls[0]["function"]["arguments"] == call.arguments
    # Without tools offered the same text is the answer (the model's words, thinking still apart).
    plain = {"messages": HISTORY, "max_tokens": 40, "temperature": 0}
    r = httpx.post(
        agent.url + "/cache/preload", content=orjson.dumps(plain | {"completion": ANSWER}), timeout=60
    )
    assert r.status_code == 200
    msg = (
        ChatCompletionResponse.model_validate(
            httpx.post(agent.url + "/v1/chat/completions", json=plain, timeout=60).json()
        )
        .choices[0]
        .message
    )
    assert msg.tool_calls is None and msg.content is not None and msg.content.startswith("\n<tool_call>")
