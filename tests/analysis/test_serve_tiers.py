"""Tier file from ``harness analysis tiers`` → ``harness serve --cache --tiers``: requests take its tiers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness.analysis.tiers import build_tiers, embed_queries, queries_from_rows
from harness.common.io import write_json, write_jsonl
from harness.common.prometheus import parse_exposition
from harness.target.cache.policy import TierTTLs
from tests.server.conftest import ServerProc, harness_server

HOT_Q = "How do I reset my password?"
COLD_Q = "Tell me something surprising about penguins"


def _writebacks(server: ServerProc) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {dict(s.labels)["value_tier"]: s.value for s in parse_exposition(text, ["cache_writebacks_total"])}


def _wait_writeback(server: ServerProc, tier: str, n: float, deadline_s: float = 120.0) -> None:
    """The write-back runs after the response is sent: wait for its counter, with a deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if _writebacks(server).get(tier, 0.0) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {tier} write-back within {deadline_s} s: {_writebacks(server)}")


def _ask(server: ServerProc, q: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": q}], "max_tokens": 4, "temperature": 0}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


@pytest.mark.slow
def test_served_requests_follow_the_tier_file(tmp_path: Path) -> None:
    rows = tmp_path / "queries.jsonl"
    write_jsonl(
        rows,
        [
            {"query": HOT_Q, "count": 80, "mean_entropy": 0.5},  # dense and confident: hot
            {"query": COLD_Q, "count": 1, "mean_entropy": 3.5},  # rare and unsure: cold
        ],
    )
    qs = queries_from_rows(rows)
    tier_file, _ = build_tiers(qs, embed_queries(qs), ttl=TierTTLs(hot=777, warm=77, cold=7))
    assert {e.query: e.tier for e in tier_file.entries} == {HOT_Q: "hot", COLD_Q: "cold"}
    path = tmp_path / "tiers.json"
    write_json(path, tier_file.model_dump(mode="json"))
    # L3 off: this test is about value tiers, and MiniLM would only slow the server's start.
    env = {"HARNESS__CACHE__L3_ENABLED": "false"}
    with harness_server(tmp_path / "srv", "--cache", "--tiers", str(path), env=env) as server:
        stats = httpx.get(server.url + "/cache/stats", timeout=30).json()
        assert stats["policy"] == "table" and stats["ttl_s"] == {"hot": 777, "warm": 77, "cold": 7}
        # The tiny random model is unsure of everything: the heuristic would call both cold.
        assert _ask(server, HOT_Q).headers["x-cache"] == "MISS"
        _wait_writeback(server, "hot", 1)
        assert _ask(server, COLD_Q).headers["x-cache"] == "MISS"
        _wait_writeback(server, "cold", 1)
        assert _writebacks(server).get("hot") == 1
        assert _ask(server, HOT_Q).headers["x-cache"].startswith("HIT")


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_bad_tier_file_fails_before_the_model_loads(tmp_path: Path) -> None:
    bad = tmp_path / "tiers.json"
    bad.write_text('{"version": 1, "ttl_s": {"hot": 1, "warm": 2, "cold": 3}}')
    r = _serve("--cache", "--tiers", str(bad))
    assert r.returncode == 3, r.stderr
    assert "tiers.json: field 'ttl_s'" in r.stderr and "Traceback" not in r.stderr
    r = _serve("--no-cache", "--tiers", str(bad))
    assert r.returncode == 4 and "--no-cache" in r.stderr
