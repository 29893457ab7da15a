"""HTTP tests against a real ``harness serve --preset tiny`` subprocess on a free port.

One server serves the whole module (startup dominates the cost). It runs with ``--max-num-seqs 2
--max-waiting 1`` so that a 429 can be provoked with four requests, and a 64 KiB body limit so a
413 needs only a modest body. Expected values come from outside the server: the engine's preset
tokenizer loaded here for token counts, the request parameters for lengths, and a non-streamed
answer for the streamed one.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.common.openai import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionResponse,
    ErrorResponse,
    ModelList,
)
from harness.target.engine.loader import PRESETS
from harness.target.engine.tokenizer import preset_tokenizer
from tests.server.conftest import ServerProc, harness_server
from tests.server.sse import sse_payloads, typed_chunk

pytestmark = pytest.mark.slow

BODY_LIMIT = 65536
LONG = 1900  # output tokens of a request meant to be cut short (the tiny preset's context is 2048)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProc:
    log_dir = tmp_path_factory.mktemp("serve")
    with harness_server(
        log_dir,
        "--max-num-seqs",
        "2",
        "--max-waiting",
        "1",
        env={"HARNESS__SERVER__MAX_BODY_BYTES": str(BODY_LIMIT)},
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def tok():
    return preset_tokenizer()


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(url: str, name: str, **labels: str) -> float:
    m = metrics(url)
    total = 0.0
    found = False
    for (n, lab), v in m.items():
        if n == name and all(dict(lab).get(k) == val for k, val in labels.items()):
            total += v
            found = True
    assert found, f"metric {name}{labels} not exposed"
    return total


def wait_idle(url: str, timeout: float = 120.0) -> None:
    """Poll the engine gauges until it is idle; the deadline is generous (a busy CI machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            metric(url, "harness_engine_running_requests") == 0
            and metric(url, "harness_engine_waiting_requests") == 0
            and metric(url, "harness_engine_kv_blocks_used") == 0
        ):
            return
        time.sleep(0.05)
    raise AssertionError("engine did not return to idle (running/waiting/KV blocks used)")


def stream_payloads(resp: httpx.Response) -> list[str]:
    return sse_payloads(resp.iter_lines())


# -------------------------------------------------------------------------------------- happy paths


def test_models(server):
    r = httpx.get(server.url + "/v1/models")
    assert r.status_code == 200
    models = ModelList.model_validate(r.json())
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].max_model_len and models.data[0].max_model_len > 0
    # What a baseline compares to know the target (docs/gates.md): the preset and a weights hash.
    ours = r.json()["data"][0]["harness"]
    assert ours["preset"] == "tiny" and ours["seed"] == 0 and ours["device"] == "cpu"
    assert ours["response_cache"] is False and len(ours["weights"]) == 16


def test_openai_python_style_stream_matches_non_stream(server, tok):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Name three colours."}]},
    ]
    body = {
        "messages": messages,
        "model": "tiny",
        "max_completion_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
    }
    headers = {"X-Stainless-Lang": "python", "User-Agent": "OpenAI/Python 1.99.0", "X-Request-Id": "req-abc"}
    full = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert full.status_code == 200, full.text
    assert full.headers["x-request-id"] == "req-abc"
    assert full.headers["x-cache"] == "BYPASS"
    resp = ChatCompletionResponse.model_validate(full.json())
    expected_text = resp.choices[0].message.content

    stream_body = body | {"stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=stream_body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        payloads = stream_payloads(r)
    assert payloads[-1] == "[DONE]"
    chunks = [typed_chunk(p) for p in payloads[:-1]]
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == expected_text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]
    )
    assert usage_chunk.usage.prompt_tokens == len(tok.encode(rendered))
    assert usage_chunk.usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_non_stream_shape_and_usage(server, tok):
    prompt = "The quick brown fox jumps over the lazy dog. " * 6
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    first = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert first.status_code == 200, first.text
    r1 = CompletionResponse.model_validate(first.json())
    n_prompt = len(tok.encode(prompt))
    u = r1.usage
    assert u is not None and u.harness is not None
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (n_prompt, 5, n_prompt + 5)
    assert u.harness.prefill_ms > 0 and u.harness.ttft_ms > 0 and u.harness.prefill_kv_bytes > 0
    assert u.harness.device in {"cpu", "cuda"} or u.harness.device.startswith("cuda")
    assert r1.choices[0].finish_reason == "length"
    # The same prompt again: its full blocks come from the engine's prefix cache.
    r2 = CompletionResponse.model_validate(
        httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    )
    assert r2.usage is not None and r2.usage.prompt_tokens_details is not None
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= n_prompt
    assert r2.choices[0].text == r1.choices[0].text


def test_stream_without_include_usage_has_no_usage(server):
    body = {"prompt": "hello there", "max_tokens": 4, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        payloads = stream_payloads(r)
    assert payloads[-1] == "[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    assert all("usage" not in c or c["usage"] is None for c in chunks)
    parsed = [CompletionChunk.model_validate(c) for c in chunks]
    assert parsed[-1].choices[0].finish_reason == "length"


def test_echo_and_logprobs(server):
    prompt = "once upon a time"
    body = {
        "prompt": prompt,
        "max_tokens": 4,
        "echo": True,
        "logprobs": 0,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    resp = CompletionResponse.model_validate(r.json())
    choice = resp.choices[0]
    assert choice.text.startswith(prompt)
    assert choice.logprobs is not None
    assert len(choice.logprobs.token_logprobs) == 4
    assert all(lp is not None and lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert "".join(choice.logprobs.tokens) == choice.text[len(prompt) :]


# -------------------------------------------------------------------------------------- refusals


def _error(r: httpx.Response, status: int) -> ErrorResponse:
    assert r.status_code == status, r.text
    return ErrorResponse.model_validate(r.json())


def test_prompt_too_long_is_400(server):
    max_len = httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    words = "word " * (max_len + 10)  # each "word" is one token of this tokenizer, plus spaces folded in
    e = _error(httpx.post(server.url + "/v1/completions", json={"prompt": words, "max_tokens": 1}), 400)
    assert e.error.code == "context_length_exceeded" and e.error.param == "prompt"
    e = _error(httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": max_len}), 400)
    assert e.error.code == "context_length_exceeded" and e.error.param == "max_tokens"


def test_out_of_vocabulary_token_id_is_400_and_server_keeps_serving(server):
    """Such an id used to fail the engine step (a 500 for it and every batch-mate)."""
    vocab = PRESETS.get("tiny").vocab_size
    body = {"prompt": [5, vocab], "max_tokens": 2}
    e = _error(httpx.post(server.url + "/v1/completions", json=body), 400)
    assert e.error.param == "prompt" and str(vocab) in e.error.message
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": [5, vocab - 1], "max_tokens": 2})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokns": 3}, "max_tokns"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x", "colour": 1}]},
            "messages[0].colour",
        ),
        ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
    ],
)
def test_bad_fields_are_400_naming_the_field(server, path, body, param):
    e = _error(httpx.post(server.url + path, json=body), 400)
    assert e.error.param == param
    assert param.split(".")[-1].split("[")[0] in e.error.message


def test_malformed_json_and_unknown_model(server):
    e = _error(
        httpx.post(
            server.url + "/v1/completions",
            content=b'{"prompt": "x",',
            headers={"content-type": "application/json"},
        ),
        400,
    )
    assert e.error.code == "invalid_json"
    e = _error(httpx.post(server.url + "/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404)
    assert e.error.code == "model_not_found" and e.error.param == "model"


def test_body_too_large_is_413(server):
    body = orjson.dumps({"prompt": "a " * BODY_LIMIT, "max_tokens": 1})
    assert len(body) > BODY_LIMIT
    e = _error(
        httpx.post(
            server.url + "/v1/completions", content=body, headers={"content-type": "application/json"}
        ),
        413,
    )
    assert str(BODY_LIMIT) in e.error.message


async def test_queue_full_is_429_with_retry_after(server):
    """Two requests fill the batch (max_num_seqs 2), a third the waiting queue (max_waiting 1)."""
    body = {"prompt": "count with me", "max_tokens": LONG, "stream": True, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

        async def hold() -> None:
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    pass

        async def until(name: str, value: float) -> None:
            # metric() is blocking: run it off the loop so the held streams keep being read.
            deadline = time.monotonic() + 120
            while await asyncio.to_thread(metric, server.url, name) < value:
                assert time.monotonic() < deadline, f"{name} never reached {value}"
                await asyncio.sleep(0.05)

        # One at a time: requests not yet admitted to the batch count against max_waiting.
        holders: list[asyncio.Task[None]] = []
        try:
            for running in (1, 2):
                holders.append(asyncio.create_task(hold()))
                await until("harness_engine_running_requests", running)
            holders.append(asyncio.create_task(hold()))
            await until("harness_engine_waiting_requests", 1)
            r = await client.post("/v1/completions", json={"prompt": "one more", "max_tokens": 2})
            e = _error(r, 429)
            assert e.error.type == "rate_limit_error"
            assert int(r.headers["retry-after"]) >= 1
            rejected = await asyncio.to_thread(
                metric, server.url, "harness_server_rejections_total", reason="queue_full"
            )
            assert rejected >= 1
        finally:
            for t in holders:
                t.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
    await asyncio.to_thread(wait_idle, server.url)


# -------------------------------------------------------------------------------------- disconnects


def test_stream_disconnect_aborts_and_frees_blocks(server):
    wait_idle(server.url)
    steps0 = metric(server.url, "harness_engine_steps_total")
    gone0 = metric(server.url, "harness_server_client_disconnects_total")
    body = {"prompt": "tell me a long story", "max_tokens": LONG, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        seen = 0
        for line in lines:
            if line.startswith("data:"):
                seen += 1
            if seen >= 3:
                break
        assert metric(server.url, "harness_engine_running_requests") == 1
        assert metric(server.url, "harness_engine_kv_blocks_used") > 0
    wait_idle(server.url)
    steps = metric(server.url, "harness_engine_steps_total") - steps0
    # Aborted, not run to its end: how soon the server noticed depends on the machine's load.
    assert steps < LONG, f"the engine generated all {LONG} tokens although the client left"
    assert metric(server.url, "harness_server_client_disconnects_total") > gone0


def test_non_stream_disconnect_aborts(server):
    wait_idle(server.url)
    steps0 = metric(server.url, "harness_engine_steps_total")
    body = {"prompt": "tell me another long story", "max_tokens": LONG, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.5))
    wait_idle(server.url)
    steps = metric(server.url, "harness_engine_steps_total") - steps0
    # Aborted, not run to its end: how soon the server noticed depends on the machine's load.
    assert steps < LONG, f"the engine generated all {LONG} tokens although the client left"


# -------------------------------------------------------------------------------------- metrics


def test_metrics_names_and_stage_label(server):
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "metrics please", "max_tokens": 2},
        headers={"X-Traffic-Stage": "ladder-3", "X-Trace-ID": "t-1"},
        timeout=60,
    )
    assert r.status_code == 200
    text = httpx.get(server.url + "/metrics").text
    for name in [
        "harness_engine_running_requests",
        "harness_engine_waiting_requests",
        "harness_engine_kv_blocks_used",
        "harness_engine_kv_blocks_total",
        "harness_engine_kv_usage_ratio",
        "harness_engine_prefix_cache_query_tokens_total",
        "harness_engine_prefix_cache_hit_tokens_total",
        "harness_server_ttft_seconds_bucket",
        "harness_server_tpot_seconds_bucket",
        "harness_engine_prefill_seconds_bucket",
        "harness_engine_prefill_kv_bytes_bucket",
        "harness_server_rejections_total",
        "harness_server_requests_total",
    ]:
        assert name in text, name
    assert metric(server.url, "harness_server_requests_total", stage="ladder-3", status="200") == 1
    assert metric(server.url, "harness_engine_kv_blocks_total") > 0


def test_request_id_from_body_when_no_header(server):
    r = httpx.post(
        server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1, "request_id": "body-7"}
    )
    assert r.headers["x-request-id"] == "body-7"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert len(r.headers["x-request-id"]) == 32  # generated: a uuid4 hex


def test_cache_admin_without_cache_is_404(server):
    r = httpx.get(server.url + "/cache/stats")
    assert r.status_code == 404
    assert ErrorResponse.model_validate(r.json()).error.code == "cache_disabled"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.headers["x-cache"] == "BYPASS" and "x-cache-key" not in r.headers


def test_health(server):
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"


def test_echo_answers_its_body_and_keeps_the_body_rules(server):
    body = {"prompt": "echo me", "max_tokens": 16, "nested": {"b": [1, 2.5, None], "a": "ü"}}
    r = httpx.post(server.url + "/echo", json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == body
    bad = httpx.post(server.url + "/echo", content=b'{"x":', headers={"content-type": "application/json"})
    assert _error(bad, 400).error.code == "invalid_json"
    big = orjson.dumps({"prompt": "a " * BODY_LIMIT})
    e = _error(
        httpx.post(server.url + "/echo", content=big, headers={"content-type": "application/json"}), 413
    )
    assert e.error.code == "request_too_large"


def test_request_context_reads_the_first_of_repeated_headers(server):
    """The context reads the raw header list once; a repeated header counts once, the first (as
    Starlette's ``Headers.get`` reads it), and names match in any case."""
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "x", "max_tokens": 1},
        headers=[("X-REQUEST-ID", "first-id"), ("x-request-id", "second-id")],
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "first-id"


# -------------------------------------------------------------------------------------- lifecycle


def test_busy_port_is_a_one_line_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        p = subprocess.run(
            [sys.executable, "-m", "harness.cli", "serve", "--preset", "tiny", "--port", str(port)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    assert p.returncode == 5, p.stderr
    assert "cannot listen" in p.stderr and "Traceback" not in p.stderr


def test_sigterm_stops_cleanly(server):
    """Runs last in this module: it stops the shared server."""
    rc = server.stop()
    assert rc == 0, server.log_tail()
    assert "Traceback" not in server.log_tail(1000)
    assert Path(server.log_dir).is_dir()


def test_ready_file_is_written_once_serving(tmp_path):
    """--ready-file appears only after startup and names a URL that answers at once."""
    with harness_server(tmp_path / "ready") as srv:
        info = srv.info
        assert info.pid == srv.proc.pid and info.cache is False and info.model == srv.model
        assert httpx.get(info.url + "/health", timeout=5).status_code == 200
    assert srv.proc.returncode == 0


def test_launch_with_a_relative_log_dir(tmp_path, monkeypatch):
    """The child runs inside log_dir: a relative path must still find its ready file."""
    monkeypatch.chdir(tmp_path)
    with harness_server(Path("relative-logs")) as srv:
        assert srv.log_dir.is_absolute() and (tmp_path / "relative-logs" / "ready.json").is_file()
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200


def test_a_launched_server_yields_the_cpu_once_ready(tmp_path):
    """Every thread of the server, its engine process and its Redis child runs at NICE after startup,
    none before."""
    import os

    import psutil

    from harness.target.server.launch import NICE

    with harness_server(tmp_path / "nice", "--cache") as srv:
        root = psutil.Process(srv.proc.pid)
        procs = [root, *root.children(recursive=True)]
        assert any("redis" in p.name() for p in procs), [p.name() for p in procs]
        tids = [t.id for p in procs for t in p.threads()]
        assert len(tids) > 2  # torch and the event loop run threads of their own
        assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in tids} == {NICE}
        # A thread the server starts later (a request's worker) inherits the priority.
        assert httpx.post(srv.url + "/cache/drain", timeout=30).status_code == 200
        body = {"model": srv.model, "prompt": "hi", "max_tokens": 2}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200
        later = {os.getpriority(os.PRIO_PROCESS, t.id) for p in procs for t in p.threads()}
        assert later == {NICE}


def test_a_server_killed_after_its_grace_takes_its_redis_along(tmp_path):
    """stop() that runs out of grace kills the server and its embedded Redis, leaving no orphan."""
    import psutil

    with harness_server(tmp_path / "kill", "--cache") as srv:
        kids = psutil.Process(srv.proc.pid).children(recursive=True)
        redis = [k for k in kids if "redis" in k.name()]
        assert redis, [k.name() for k in kids]
        assert srv.stop(timeout_s=0) == -9  # no grace at all: SIGTERM, then SIGKILL at once
        _, alive = psutil.wait_procs(redis, timeout=30)
        assert alive == []
