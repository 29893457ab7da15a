"""``POST /reset_prefix_cache`` (vLLM's endpoint name) empties the engine's KV prefix cache.

A repeated prompt reports prefix-cache hits (``usage.prompt_tokens_details.cached_tokens > 0``);
after the reset the same prompt reports none, and ``harness cache flush --tier kv`` / ``--tier all``
go through the same endpoint. Real ``harness serve --preset tiny`` subprocess.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import orjson
import pytest

from harness.common.openai import RESET_PREFIX_CACHE_PATH, CompletionResponse
from tests.server.conftest import ServerProc, harness_server

pytestmark = pytest.mark.slow

# Long enough for several full KV blocks (16 tokens each) of the tiny preset.
PROMPT = " ".join(f"word{i} of a prompt that repeats" for i in range(20))


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ServerProc:
    env = {"HARNESS__CACHE__L3_ENABLED": "false"}
    with harness_server(tmp_path_factory.mktemp("serve-prefix-reset"), "--cache", env=env) as srv:
        yield srv


def cached_tokens(server: ServerProc) -> int:
    # no-cache: the response cache stays out of it (a hit would report every prompt token cached).
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0},
        headers={"Cache-Control": "no-cache"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-cache"] == "BYPASS"
    usage = CompletionResponse.model_validate(r.json()).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return usage.prompt_tokens_details.cached_tokens


def flush_cli(server: ServerProc, tier: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "cache", "flush", "--tier", tier, "--url", server.url],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return orjson.loads(out.stdout)


def test_reset_endpoint_empties_the_prefix_cache(server):
    cached_tokens(server)
    assert cached_tokens(server) > 0  # the same prompt again: its full blocks were cached
    r = httpx.post(server.url + RESET_PREFIX_CACHE_PATH, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["reset"] is True and r.json()["blocks_freed"] > 0
    assert cached_tokens(server) == 0
    assert cached_tokens(server) > 0  # cached again by the request after the reset


@pytest.mark.parametrize("tier", ["kv", "all"])
def test_cache_flush_cli_resets_the_prefix_cache(server, tier):
    cached_tokens(server)
    assert cached_tokens(server) > 0
    data = flush_cli(server, tier)
    assert data["kv"]["reset"] is True if tier == "all" else data["reset"] is True
    if tier == "all":
        assert set(data["dropped"]) >= {"l1", "l2", "bloom"}
        assert "skipped" not in data
    assert cached_tokens(server) == 0


def test_flush_all_without_response_cache_says_what_it_skipped(tmp_path):
    with harness_server(tmp_path / "plain") as plain:
        data = flush_cli(plain, "all")
    assert data["kv"]["reset"] is True
    assert "404" in data["skipped"]["response"]
