"""Fault injection on a real ``harness serve --preset tiny --cache``: ``--inject-error-rate`` and
``--inject-cache-miss-rate`` inject at the rate they are given, an injected miss misses both caches
and still answers right, P = 0 changes nothing, and a rate out of range is exit 4. The same server
runs with ``--inject-kv-overalloc``: every engine prefill reports ``ceil(1.2 × n)`` blocks of KV
where it needs ``n`` (the block manager's count), with the same answers and prefix-cache hits.

Rates are judged with exact binomial acceptance intervals: the server draws each request
independently, so the realized count over n requests is Binomial(n, P), and a count outside the
central interval of probability 1 − 1e-6 fails the test (a false failure at most once in a million
runs of a correct server; the seed makes a given run reproducible, the bound holds for any seed).
Which requests were hit is read from the response itself (``x-harness-fault``, ``x-cache``,
``cached_tokens``) and checked against the server's own counters.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from scipy.stats import binom

from harness.common import headers as H
from harness.common.errors import ConfigError
from harness.common.openai import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    HarnessUsage,
    Usage,
)
from harness.common.settings import load_settings
from harness.target.server.settings import ServerSettings
from tests.server.conftest import ServerProc, harness_server
from tests.server.sse import sse_payloads, typed_chunk

pytestmark = pytest.mark.slow

ERROR_RATE = 0.2
MISS_RATE = 0.3
KV_OVERALLOC = 0.2
FALSE_FAILURE = 1e-6
BLOCK = 16  # the engine's default block size
NO_L3 = {"HARNESS__CACHE__L3_ENABLED": "false"}  # L3 loads MiniLM; a forced miss never asks a tier


def acceptance(n: int, p: float) -> tuple[int, int]:
    """The counts a Binomial(n, p) falls outside of with probability at most ``FALSE_FAILURE``:
    below ``lo`` with at most half of it (``ppf``: the smallest k with CDF(k) ≥ q), above ``hi``
    with at most the other half (``isf``: the smallest k with SF(k) ≤ q)."""
    q = FALSE_FAILURE / 2
    return int(binom.ppf(q, n, p)), int(binom.isf(q, n, p))


def overallocated(blocks: int) -> int:
    """The blocks a prefill needing ``blocks`` takes with ``--inject-kv-overalloc KV_OVERALLOC``:
    ``ceil((1 + F) × blocks)``, in exact decimals."""
    return math.ceil((1 + Fraction(str(KV_OVERALLOC))) * blocks)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    args = [
        "--cache",
        "--inject-error-rate",
        str(ERROR_RATE),
        "--inject-cache-miss-rate",
        str(MISS_RATE),
        "--inject-kv-overalloc",
        str(KV_OVERALLOC),
    ]
    # L1 keeps an entry 60 s by default: 400 requests beside other tests' load can take longer, and
    # a hit after that comes from L2 (which keeps it for the cold tier's 300 s) instead of L1.
    env = {**NO_L3, "HARNESS__CACHE__L1_TTL_S": "3600"}
    with harness_server(tmp_path_factory.mktemp("serve-faults"), *args, "--inject-seed", "7", env=env) as srv:
        yield srv


@pytest.fixture
def client(server: ServerProc) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@dataclass
class Answer:
    status: int
    fault: str | None
    cache: str | None
    text: str = ""
    usage: Usage | None = None
    error_code: str | None = None

    @property
    def hx(self) -> HarnessUsage:
        assert self.usage is not None and self.usage.harness is not None
        return self.usage.harness

    @property
    def cached_tokens(self) -> int:
        assert self.usage is not None and self.usage.prompt_tokens_details is not None
        return self.usage.prompt_tokens_details.cached_tokens


def ask(
    client: httpx.Client,
    prompt: str,
    *,
    chat: bool = False,
    stream: bool = False,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One greedy request of 2 tokens, answered as text, usage and the headers that matter here."""
    body: dict[str, Any] = {"max_tokens": 2, "temperature": 0}
    body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with client.stream("POST", path, json=body, headers=headers) as r:
        a = Answer(r.status_code, r.headers.get(H.FAULT), r.headers.get(H.CACHE_STATUS))
        if r.status_code != 200 or not stream:
            raw = r.read()
        else:
            payloads = sse_payloads(r.iter_lines())
    if r.status_code != 200:
        # Streamed or not, a refusal before generation is one JSON error, not a stream.
        a.error_code = ErrorResponse.model_validate(orjson.loads(raw)).error.code
        return a
    if not stream:
        resp = (ChatCompletionResponse if chat else CompletionResponse).model_validate(orjson.loads(raw))
        choice = resp.choices[0]
        a.text = (choice.message.content or "") if chat else choice.text  # type: ignore[union-attr]
        a.usage = resp.usage
        return a
    assert payloads[-1] == "[DONE]"
    for payload in payloads[:-1]:
        chunk = typed_chunk(payload)
        for c in chunk.choices:
            a.text += (c.delta.content or "") if isinstance(chunk, ChatCompletionChunk) else c.text  # type: ignore[union-attr]
        if chunk.usage is not None:
            a.usage = chunk.usage
    return a


def counters(client: httpx.Client) -> Counter[str]:
    """``harness_server_injected_faults_total`` by kind."""
    out: Counter[str] = Counter()
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("harness_server_injected_faults_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = int(float(line.split()[-1]))
    return out


def kv_block_bytes(client: httpx.Client) -> int:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("harness_engine_kv_bytes_per_token{"):
            return int(float(line.split()[-1])) * BLOCK
    raise AssertionError("harness_engine_kv_bytes_per_token is not in /metrics")


def test_the_realized_rates_are_binomial_and_an_injected_miss_misses_both_caches(
    client: httpx.Client,
) -> None:
    n = 400
    prompt = (
        "every injected fault of this test is counted against this one prompt, which is long "
        "enough to fill two whole blocks of sixteen tokens each in the tokenizer of the tiny preset"
    )
    before = counters(client)
    stats_before = client.get("/cache/stats").json()["requests"]
    answers = [ask(client, prompt) for _ in range(n)]

    errors = [a for a in answers if a.status != 200]
    assert all((a.status, a.fault, a.error_code) == (500, "error", "injected_fault") for a in errors)
    served = [a for a in answers if a.status == 200]
    injected = [a for a in served if a.fault is not None]
    genuine_misses = [a for a in served if a.fault is None and a.cache == "MISS"]
    hits = [a for a in served if a.fault is None and a.cache != "MISS"]
    lo, hi = acceptance(n, ERROR_RATE)
    assert lo <= len(errors) <= hi, (len(errors), lo, hi)
    # Drawn only for the requests that were not failed first: Binomial(served, P_miss).
    lo, hi = acceptance(len(served), MISS_RATE)
    assert lo <= len(injected) <= hi, (len(injected), len(served), lo, hi)
    print(f"errors {len(errors)}/{n}, injected misses {len(injected)}/{len(served)}")

    # One genuine miss (the first request served without a fault), which stored the answer; an
    # injected miss before it stored nothing, one after it did not get the stored answer.
    assert len(genuine_misses) == 1 and genuine_misses[0] is next(a for a in served if a.fault is None)
    assert all(a.fault == "cache-miss" and a.cache == "MISS" for a in injected)
    assert {a.cache for a in hits} == {"HIT-L1"}
    truth = genuine_misses[0]
    prompt_tokens = truth.usage.prompt_tokens if truth.usage else 0
    assert prompt_tokens > 2 * BLOCK
    block_bytes = kv_block_bytes(client)
    prompt_blocks = -(-prompt_tokens // BLOCK)
    for a in injected:
        # The whole prompt computed and allocated (no prefix reuse), over-allocated by the
        # injection, and the same greedy answer.
        assert a.text == truth.text and a.cached_tokens == 0 and a.hx.cache == "MISS"
        assert a.hx.prefill_kv_measured
        assert a.hx.prefill_kv_bytes == overallocated(prompt_blocks) * block_bytes
        assert a.hx.prefill_kv_bytes > prompt_blocks * block_bytes
    for a in hits:  # a response-cache hit allocated nothing, exactly
        assert a.text == truth.text and a.hx.prefill_kv_bytes == 0 and a.hx.prefill_kv_measured

    # The prefix cache does hold the prompt's full blocks: an engine run that is not injected, with
    # the response cache bypassed, reuses them (so the injected misses' 0 was the injection's).
    bypasses: list[Answer] = []  # they draw too: counted below with the rest
    while not bypasses or bypasses[-1].fault is not None:
        assert len(bypasses) < 100, "the injection spared none of 100 requests"
        bypasses.append(ask(client, prompt, headers={"Cache-Control": "no-cache"}))
    spared = bypasses[-1]
    assert spared.cache == "BYPASS" and spared.text == truth.text
    assert spared.cached_tokens == (prompt_tokens - 1) // BLOCK * BLOCK
    # Only the blocks after the cached prefix are taken, over-allocated too (none of the extra
    # blocks of the requests before was registered as holding the prompt: the hits are the same).
    assert (
        spared.hx.prefill_kv_bytes
        == overallocated(prompt_blocks - spared.cached_tokens // BLOCK) * block_bytes
    )

    # The server counted what the responses say, and the cache counted each injected miss as a miss
    # (a bypass wins over an injected miss: it never looks either).
    after = counters(client)
    drawn = Counter(a.fault for a in [*answers, *bypasses])
    assert after["error"] - before["error"] == drawn["error"]
    assert after["cache-miss"] - before["cache-miss"] == drawn["cache-miss"]
    stats = client.get("/cache/stats").json()["requests"]
    assert stats.get("MISS", 0) - stats_before.get("MISS", 0) == len(injected) + 1
    assert stats.get("HIT-L1", 0) - stats_before.get("HIT-L1", 0) == len(hits)
    bypassed = sum(1 for a in bypasses if a.status == 200)
    assert stats.get("BYPASS", 0) - stats_before.get("BYPASS", 0) == bypassed


def test_every_endpoint_and_mode_is_injected_and_an_injected_miss_stores_nothing(
    client: httpx.Client,
) -> None:
    """Per endpoint, streamed or not, fresh prompts until each has shown an injected error and a
    prompt whose first request was an injected miss: the next request of that prompt the injection
    spared is a genuine miss of both caches (nothing was stored, in either), with the same answer."""
    seen: dict[tuple[bool, bool], set[str]] = {(c, s): set() for c in (False, True) for s in (False, True)}
    for i in range(80):
        for (chat, stream), got in seen.items():
            if got == {"error", "miss-then-miss"}:
                continue
            # What makes it fresh comes first: a prompt must share no block with an earlier one.
            prompt = (
                f"{i} {int(chat)} {int(stream)}: a fresh prompt of the pair test, "
                "long enough to fill a whole block of sixteen tokens"
            )
            first = ask(client, prompt, chat=chat, stream=stream)
            if first.fault == "error":
                assert (first.status, first.error_code) == (500, "injected_fault")
                got.add("error")
                continue
            if first.fault != "cache-miss":
                assert (first.status, first.cache) == (200, "MISS")
                continue
            assert (first.status, first.cache, first.cached_tokens) == (200, "MISS", 0)
            for _ in range(100):
                second = ask(client, prompt, chat=chat, stream=stream)
                if second.fault is None:
                    break
            assert second.fault is None, "the injection spared none of 100 requests"
            assert (second.status, second.cache) == (200, "MISS")
            assert second.cached_tokens == 0  # the injected miss registered no prefix block
            assert second.text == first.text
            got.add("miss-then-miss")
        if all(got == {"error", "miss-then-miss"} for got in seen.values()):
            break
    assert all(got == {"error", "miss-then-miss"} for got in seen.values()), seen


def test_the_injections_are_said_at_start_in_health_and_in_metrics(server: ServerProc) -> None:
    log = (server.log_dir / "server.log").read_text()
    assert "fault injection: 20 % of generation requests answer HTTP 500" in log
    assert "fault injection: 30 % of generation requests miss the response and prefix caches" in log
    assert (
        "fault injection: every prefill takes 20 % more KV blocks than it needs (--inject-kv-overalloc): "
        "a regression on purpose" in log
    )
    health = httpx.get(server.url + "/health", timeout=10).json()
    assert health["fault_injection"] == {
        "active": ["error_rate", "cache_miss_rate", "kv_overalloc"],
        "slowdown": 1.0,
        "error_rate": ERROR_RATE,
        "cache_miss_rate": MISS_RATE,
        "kv_overalloc": KV_OVERALLOC,
        "seed": 7,
    }
    text = httpx.get(server.url + "/metrics", timeout=10).text
    for kind, on in (("slowdown", 0), ("error_rate", 1), ("cache_miss_rate", 1), ("kv_overalloc", 1)):
        assert f'harness_server_fault_injection_active{{kind="{kind}"}} {on}.0' in text
    # Not part of the identity a baseline compares: the injected target is the same target.
    card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    assert "fault" not in orjson.dumps(card).decode()


def test_rates_of_zero_change_nothing(tmp_path: Path) -> None:
    args = ["--cache", "--inject-error-rate", "0", "--inject-cache-miss-rate", "0", "--inject-seed", "3"]
    with harness_server(tmp_path, *args, env=NO_L3) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        prompt = "nothing is injected into the answers to this prompt, which fills one block and more"
        answers = [ask(c, prompt) for _ in range(40)]
        assert all(a.status == 200 and a.fault is None for a in answers)
        assert [a.cache for a in answers] == ["MISS"] + ["HIT-L1"] * 39
        assert len({a.text for a in answers}) == 1
        n_prompt = answers[0].usage.prompt_tokens if answers[0].usage else 0
        engine = ask(c, prompt, headers={"Cache-Control": "no-cache"})
        assert engine.fault is None and engine.cached_tokens == (n_prompt - 1) // BLOCK * BLOCK
        assert counters(c) == Counter({"error": 0, "cache-miss": 0})
        metrics = c.get("/metrics").text
        assert 'harness_server_fault_injection_active{kind="error_rate"} 0.0' in metrics
        assert c.get("/health").json()["fault_injection"]["active"] == []
        assert "fault injection" not in (srv.log_dir / "server.log").read_text()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("inject_error_rate", 1.0),  # every request failing is an outage, not a regression
        ("inject_error_rate", -0.01),
        ("inject_error_rate", float("nan")),
        ("inject_cache_miss_rate", 1.5),
        ("inject_cache_miss_rate", -1.0),
    ],
)
def test_a_rate_out_of_range_is_a_config_error_naming_the_option(field: str, value: float) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(ServerSettings, **{field: value})
    assert info.value.field == f"HARNESS__SERVER__{field.upper()}"
    assert "--" + field.replace("_", "-") in str(info.value) and "fraction" in str(info.value)


def test_the_edges_of_the_ranges_are_accepted() -> None:
    s = load_settings(ServerSettings, inject_error_rate=0.0, inject_cache_miss_rate=1.0)
    assert (s.inject_error_rate, s.inject_cache_miss_rate) == (0.0, 1.0)


def test_the_cli_reports_a_rate_out_of_range_as_exit_4_before_loading(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--preset",
            "tiny",
            "--port",
            "0",
            "--inject-error-rate",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HARNESS__RUN_DIR": str(tmp_path / "run")},
        check=False,
    )
    assert p.returncode == 4, p.stderr
    # Given as a flag, named by the flag; given as the variable, named by the variable.
    assert "field '--inject-error-rate'" in p.stderr and "0 <= P < 1" in p.stderr
    assert "Traceback" not in p.stderr and "serving" not in p.stdout
    env = {**os.environ, "HARNESS__RUN_DIR": str(tmp_path / "run"), "HARNESS__SERVER__INJECT_ERROR_RATE": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--preset", "tiny", "--port", "0"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert p.returncode == 4, p.stderr
    assert "field 'HARNESS__SERVER__INJECT_ERROR_RATE'" in p.stderr, p.stderr
