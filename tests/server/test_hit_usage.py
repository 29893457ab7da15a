"""Cache hits report the right ``usage`` although the server no longer tokenizes their prompts.

A hit on the very prompt that produced the entry takes ``prompt_tokens`` from the entry (the prompt
fingerprint matches); a hit whose prompt differs from the cached one only in normalized whitespace
(same cache key, other tokens) is tokenized. Expected counts come from the preset's tokenizer,
called here independently of the server. Real ``harness serve --preset tiny --cache`` subprocess.
"""

from __future__ import annotations

import httpx
import pytest

from harness.common.openai import ChatCompletionResponse, CompletionResponse
from harness.target.engine.tokenizer import preset_tokenizer
from harness.target.server.prepare import prepare, prompt_fingerprint, tokenize_prepared
from tests.server.conftest import ServerProc, harness_server
from tests.server.sse import sse_payloads, typed_chunk

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProc:
    env = {"HARNESS__CACHE__L3_ENABLED": "false"}
    with harness_server(tmp_path_factory.mktemp("serve-hit-usage"), "--cache", env=env) as srv:
        yield srv


@pytest.fixture(scope="module")
def tok():
    return preset_tokenizer()


def post(server: ServerProc, path: str, body: dict) -> httpx.Response:
    r = httpx.post(server.url + path, json={"max_tokens": 5, "temperature": 0} | body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_completion_hit_usage_same_and_respaced_prompt(server, tok):
    prompt = "count the tokens of this prompt"
    respaced = "  count the tokens of this prompt   "  # same key (indent, trailing blanks), tokenized
    miss = post(server, "/v1/completions", {"prompt": prompt})
    assert miss.headers["x-cache"] == "MISS"
    hit = post(server, "/v1/completions", {"prompt": prompt})
    other = post(server, "/v1/completions", {"prompt": respaced})
    assert hit.headers["x-cache"] == other.headers["x-cache"] == "HIT-L1"
    assert other.headers["x-cache-key"] == hit.headers["x-cache-key"] == miss.headers["x-cache-key"]
    for r, text in ((miss, prompt), (hit, prompt), (other, respaced)):
        u = CompletionResponse.model_validate(r.json()).usage
        assert u is not None
        n = len(tok.encode(text))
        assert (u.prompt_tokens, u.total_tokens) == (n, n + u.completion_tokens)
    u_hit = CompletionResponse.model_validate(hit.json()).usage
    assert u_hit is not None and u_hit.prompt_tokens_details is not None
    assert u_hit.prompt_tokens_details.cached_tokens == len(tok.encode(prompt))


def test_chat_hit_usage_streamed_and_not(server, tok):
    # JSON content is keyed canonically (1.0 and 1 are one number) but tokenized as written, so
    # the second request shares the first one's entry and has fewer prompt tokens.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": '{"n": 1.0}'}]
    respaced = [messages[0], {"role": "user", "content": '{"n": 1}'}]
    expected = len(tok.encode(tok.apply_chat_template(messages)))
    expected_respaced = len(tok.encode(tok.apply_chat_template(respaced)))
    assert expected != expected_respaced
    first = post(server, "/v1/chat/completions", {"messages": messages})
    assert first.headers["x-cache"] == "MISS"
    hit = post(server, "/v1/chat/completions", {"messages": messages})
    assert hit.headers["x-cache"] == "HIT-L1"
    u = ChatCompletionResponse.model_validate(hit.json()).usage
    assert u is not None and u.prompt_tokens == expected
    other = post(server, "/v1/chat/completions", {"messages": respaced})
    assert other.headers["x-cache"] == "HIT-L1"
    u2 = ChatCompletionResponse.model_validate(other.json()).usage
    assert u2 is not None and u2.prompt_tokens == expected_respaced
    stream = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json={"max_tokens": 5, "temperature": 0} | stream
    ) as r:
        assert r.headers["x-cache"] == "HIT-L1"
        payloads = sse_payloads(r.iter_lines())
    assert payloads[-1] == "[DONE]"
    chunks = [typed_chunk(d) for d in payloads[:-1]]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.prompt_tokens == expected


def test_prepare_without_tokenizing_matches_prepare(tok):
    """``prepare(tokenize=False)`` + ``tokenize_prepared`` gives what ``prepare`` gives."""
    from harness.common.openai import ChatCompletionRequest, CompletionRequest

    reqs = [
        CompletionRequest.model_validate({"prompt": "hello  there", "max_tokens": 3}),
        CompletionRequest.model_validate({"prompt": ["one prompt"], "max_tokens": 3}),
        ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4}
        ),
    ]
    kw = {"tokenizer": tok, "model_name": "m", "max_model_len": 512, "default_max_tokens": 16}
    for req in reqs:
        eager = prepare(req, **kw)
        lazy = prepare(req, tokenize=False, **kw)
        assert not lazy.tokenized and lazy.prompt_ids == []
        assert lazy.cache_body == eager.cache_body and lazy.prompt_fp == eager.prompt_fp
        tokenize_prepared(lazy, tok, 512)
        assert lazy.prompt_ids == eager.prompt_ids and lazy.prompt_text == eager.prompt_text
    # Without max_tokens the default depends on the prompt length: prepare tokenizes anyway.
    no_max = prepare(CompletionRequest.model_validate({"prompt": "x"}), tokenize=False, **kw)
    assert no_max.tokenized and no_max.prompt_ids == tok.encode("x")
    assert prompt_fingerprint("a b") != prompt_fingerprint("a  b")
    assert prompt_fingerprint(([{"role": "user", "content": "a"}], True)) != prompt_fingerprint(
        ([{"role": "user", "content": "a"}], False)
    )
