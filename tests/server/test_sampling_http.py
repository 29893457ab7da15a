"""Peers' sampling parameters, top logprobs, per-chunk usage and mean entropy through HTTP.

A real ``harness serve --preset tiny --cache`` subprocess (L3 off). Requests carry the parameters
vLLM's and guidellm's clients send; the answers are checked for shape (the pydantic models of
:mod:`harness.common.openai`) and for content against values computed here: the preset's tokenizer
for ids and counts, and the preset model itself (same seed, loaded in the test process) for a
brute-force greedy decode's entropies.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

from harness.common.openai import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionResponse,
)
from harness.target.engine.factory import create_core
from harness.target.engine.settings import EngineSettings
from harness.target.engine.tokenizer import preset_tokenizer
from tests.server.conftest import ServerProc, harness_server
from tests.server.sse import sse_payloads, typed_chunk

pytestmark = pytest.mark.slow

NO_CACHE = {"Cache-Control": "no-cache"}
PEERS = {
    "presence_penalty": 0.5,
    "frequency_penalty": 0.3,
    "repetition_penalty": 1.2,
    "min_p": 0.05,
    "top_k": 40,
    "top_p": 0.9,
    "temperature": 0.8,
    "seed": 3,
    "logit_bias": {"2023": 2.5, "1996": -100},
    "min_tokens": 2,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProc:
    env = {"HARNESS__CACHE__L3_ENABLED": "false"}
    with harness_server(tmp_path_factory.mktemp("serve-sampling"), "--cache", env=env) as srv:
        yield srv


@pytest.fixture(scope="module")
def tok():
    return preset_tokenizer()


def post(
    server: ServerProc, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    r = httpx.post(server.url + path, json=body, headers=NO_CACHE if headers is None else headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


def stream(
    server: ServerProc, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[httpx.Headers, list[Any]]:
    with httpx.stream(
        "POST",
        server.url + path,
        json=body | {"stream": True},
        headers=NO_CACHE if headers is None else headers,
        timeout=60,
    ) as r:
        assert r.status_code == 200, r.read()
        payloads = list(sse_payloads(r.iter_lines()))
        headers_out = r.headers
    assert payloads[-1] == "[DONE]"
    return headers_out, [typed_chunk(p) for p in payloads[:-1]]


def chat_body(content: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **kw}


# ------------------------------------------------------------------ accepted and shaped


def test_peer_sampling_parameters_are_accepted_on_both_endpoints(server):
    comp = post(server, "/v1/completions", {"prompt": "write about the sea", "max_tokens": 6} | PEERS)
    c = CompletionResponse.model_validate(comp.json())
    assert c.usage is not None and c.usage.completion_tokens >= 2  # min_tokens 2
    chat = post(server, "/v1/chat/completions", chat_body("write about the sea", max_tokens=6, **PEERS))
    r = ChatCompletionResponse.model_validate(chat.json())
    assert r.usage is not None and r.usage.completion_tokens >= 2
    _, chunks = stream(server, "/v1/chat/completions", chat_body("and the sky", max_tokens=6, **PEERS))
    assert all(isinstance(ch, ChatCompletionChunk) for ch in chunks)
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}


def test_logit_bias_and_min_tokens_take_effect(server, tok):
    this = tok.token_to_id("this")
    sep = tok.eos_token_id
    forced = post(
        server,
        "/v1/completions",
        {
            "prompt": "hello",
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
            "logit_bias": {str(this): 100},
        },
    )
    assert CompletionResponse.model_validate(forced.json()).choices[0].text.split() == ["this"] * 4
    # EOS pushed up by +100: without a floor it comes first; with min_tokens=3 it comes fourth.
    eager = {"prompt": "hello", "max_tokens": 10, "temperature": 0, "logit_bias": {str(sep): 100}}
    for floor, want in ((0, 1), (3, 4)):
        r = CompletionResponse.model_validate(
            post(server, "/v1/completions", eager | {"min_tokens": floor}).json()
        )
        assert r.usage is not None and r.usage.completion_tokens == want
        assert r.choices[0].finish_reason == "stop"


def test_bad_logit_bias_and_min_tokens_are_400(server):
    for body, param in (
        ({"prompt": "x", "logit_bias": {"not-an-id": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"prompt": "x", "max_tokens": 3, "min_tokens": 4}, "min_tokens"),
    ):
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_completions_top_logprobs(server):
    body = {
        "prompt": "the weather today",
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 5,
    }
    r = CompletionResponse.model_validate(post(server, "/v1/completions", body).json())
    lp = r.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None and len(lp.top_logprobs) == 5
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top is not None and 5 <= len(top) <= 6  # the 5 alternatives, plus the sampled token
        assert top[token] == chosen
        assert chosen == max(top.values())  # greedy: the sampled token is the most likely
    assert "".join(lp.tokens) == r.choices[0].text
    # Streamed: one chunk per token, each with its own alternatives.
    _, chunks = stream(server, "/v1/completions", body)
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [s.top_logprobs[0] for s in streamed] == lp.top_logprobs


def test_chat_top_logprobs_streamed_and_not(server):
    body = chat_body(
        "name a colour", max_tokens=4, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3
    )
    r = ChatCompletionResponse.model_validate(post(server, "/v1/chat/completions", body).json())
    content = r.choices[0].logprobs.content
    assert content is not None and len(content) == 4
    for entry in content:
        tops = entry.top_logprobs
        assert len(tops) == 3 and [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert tops[0].logprob == entry.logprob  # greedy
        assert all(t.bytes == list(t.token.encode()) for t in tops)
    _, chunks = stream(server, "/v1/chat/completions", body)
    streamed = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, [t.token for t in e.top_logprobs]) for e in streamed] == [
        (e.token, [t.token for t in e.top_logprobs]) for e in content
    ]


# ------------------------------------------------------------------ per-chunk usage


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_counts_every_chunk(server, tok, path):
    opts = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if path == "/v1/completions":
        prompt = "count my tokens please"
        body = {"prompt": prompt, "logprobs": 0} | opts
        n_prompt = len(tok.encode(prompt))
    else:
        body = chat_body("count my tokens please", logprobs=True) | opts
        n_prompt = len(
            tok.encode(tok.apply_chat_template([{"role": "user", "content": "count my tokens please"}]))
        )
    body |= {"max_tokens": 7, "temperature": 0, "ignore_eos": True}
    _, chunks = stream(server, path, body)
    assert all(c.usage is not None for c in chunks)
    assert all(c.usage.prompt_tokens == n_prompt for c in chunks)
    assert all(c.usage.total_tokens == n_prompt + c.usage.completion_tokens for c in chunks)
    # With logprobs on, every token gets its own chunk, so the count rises by one per delta chunk.
    deltas = [c for c in chunks if c.choices and c.choices[0].finish_reason is None and c.choices[0].logprobs]
    assert [c.usage.completion_tokens for c in deltas] == list(range(1, 8))
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-2].usage.completion_tokens == 7
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7  # include_usage's chunk


def test_continuous_usage_without_include_usage_and_on_a_cache_hit(server, tok):
    prompt = "a cached answer with usage on each chunk"
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    post(server, "/v1/completions", body, headers={})  # MISS: stored
    opts = {"stream_options": {"continuous_usage_stats": True}}
    headers, chunks = stream(server, "/v1/completions", body | opts, headers={})
    assert headers["x-cache"] == "HIT-L1"
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(c.usage.prompt_tokens == len(tok.encode(prompt)) for c in chunks)
    assert all(c.choices for c in chunks)  # no include_usage: no usage-only chunk
    assert all(isinstance(c, CompletionChunk) for c in chunks)


# ------------------------------------------------------------------ mean entropy


@pytest.fixture(scope="module")
def preset_core():
    core, _ = create_core(EngineSettings(preset="tiny", device="cpu", dtype="float32", num_kv_blocks=64))
    return core


def brute_force_mean_entropy(core, prompt_ids: list[int], n: int) -> float:
    ids = list(prompt_ids)
    total = 0.0
    for _ in range(n):
        logits = core.model.dense_logits(torch.tensor(ids), last_only=True)[0].double()
        logp = torch.log_softmax(logits, -1)
        total += float(-(logp.exp() * logp).sum())
        ids.append(int(logits.argmax()))
    return total / n


def test_mean_entropy_engine_and_cache_hit_both_endpoints(server, tok, preset_core):
    prompt = "measure the uncertainty of these next words"
    want = brute_force_mean_entropy(preset_core, tok.encode(prompt), 5)
    body = {"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    miss = post(server, "/v1/completions", body, headers={})
    assert miss.headers["x-cache"] == "MISS"
    u = CompletionResponse.model_validate(miss.json()).usage
    assert u is not None and u.harness is not None and u.harness.mean_entropy == pytest.approx(want, abs=1e-3)
    hit = post(server, "/v1/completions", body, headers={})
    assert hit.headers["x-cache"] == "HIT-L1"
    hu = CompletionResponse.model_validate(hit.json()).usage
    assert (
        hu is not None
        and hu.harness is not None
        and hu.harness.mean_entropy == pytest.approx(u.harness.mean_entropy)
    )
    # Streamed, from the cache and from the engine (no-cache), on the include_usage chunk.
    opts = {"stream_options": {"include_usage": True}}
    for headers, status in (({}, "HIT-L1"), (NO_CACHE, "BYPASS")):
        h, chunks = stream(server, "/v1/completions", body | opts, headers=headers)
        assert h["x-cache"] == status
        assert chunks[-1].usage.harness.mean_entropy == pytest.approx(want, abs=1e-3)

    messages = [{"role": "user", "content": prompt}]
    chat_want = brute_force_mean_entropy(preset_core, tok.encode(tok.apply_chat_template(messages)), 5)
    cbody = {"messages": messages, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    for i in range(2):  # MISS, then HIT-L1
        r = post(server, "/v1/chat/completions", cbody, headers={})
        assert r.headers["x-cache"] == ("MISS" if i == 0 else "HIT-L1")
        cu = ChatCompletionResponse.model_validate(r.json()).usage
        assert cu is not None and cu.harness is not None
        assert cu.harness.mean_entropy == pytest.approx(chat_want, abs=1e-3)
    _, chunks = stream(server, "/v1/chat/completions", cbody | opts)
    assert chunks[-1].usage.harness.mean_entropy == pytest.approx(chat_want, abs=1e-3)
