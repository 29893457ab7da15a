"""The replay user against our own server (``harness serve --preset tiny``, CPU): real engine, real usage."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from harness.gates.measurement import MetricContext
from harness.gates.metrics import METRICS
from harness.gates.runs import load_result_set
from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from harness.load.server_metrics import SERVER_METRICS_FILE, read_server_metrics
from harness.target.server.launch import running_server
from tests.load.helpers import make_corpus

pytestmark = pytest.mark.slow


SHARED = "You are a careful assistant. Answer briefly and exactly, in plain words. " * 3
"""A shared prefix longer than a few KV blocks: the prefix cache serves it to every request but the first."""


def test_replay_against_harness_serve_tiny(tmp_path: Path) -> None:
    chat = make_corpus(tmp_path / "chat.jsonl", 6, prefix=SHARED)
    with running_server(["--preset", "tiny"], log_dir=tmp_path / "server") as server:
        spec = LoadSpec(host=server.url, corpus=chat, rate=2, duration=3, results_dir=tmp_path / "r",
                        max_tokens_cap=8, start_delay=0.5, stage="cold")  # fmt: skip
        assert run_locust(spec, timeout_s=300) == 0
        spec = LoadSpec(host=server.url, corpus=chat, rate=2, duration=2, results_dir=tmp_path / "c",
                        max_tokens_cap=8, start_delay=0.5, api="completions")  # fmt: skip
        assert run_locust(spec, timeout_s=300) == 0
    for run, n in (("r", 6), ("c", 4)):
        s = read_summary(tmp_path / run)
        assert s.requests == n and s.errors == 0, [r.error for r in read_records(tmp_path / run)]
        # Our server sends usage on every chunk (continuous_usage_stats): exact counts, no warning
        # about them (a client-bound warning says how busy the machine was, not what was counted).
        assert s.token_counting == {"usage": n}, s.token_counting
        assert not any("approximate" in w or "token" in w for w in s.warnings), s.warnings
        for r in read_records(tmp_path / run):
            assert r.status == 200 and r.cache == "BYPASS"
            assert r.ttft_ms is not None and r.e2e_ms is not None and r.e2e_ms >= r.ttft_ms
            assert r.completion_tokens is not None and 1 <= r.completion_tokens <= 8
            assert len(r.itl_ms) == r.completion_tokens - 1
            assert r.prompt_tokens and r.prefill_kv_bytes and r.prefill_kv_bytes > 0
            assert r.peak_measured is False  # the CPU estimate
            assert r.prefill_kv_measured is True  # the block manager's count, from usage.harness
            assert r.mean_entropy is not None and r.mean_entropy > 0  # usage.harness.mean_entropy
    assert read_summary(tmp_path / "r").metrics["prefill_kv_bytes"].n == 6
    # Where it was measured, what it measured, with what load (the gates' fingerprint).
    s = read_summary(tmp_path / "r")
    assert s.environment is not None and s.environment.hardware.cpu_count
    assert s.environment.software.torch is not None
    assert s.target.identity is not None
    (card,) = s.target.identity["models"]
    assert card["id"] == "tiny" and "created" not in card
    assert card["harness"]["preset"] == "tiny" and card["harness"]["device"] == "cpu"
    assert card["harness"]["response_cache"] is False and len(card["harness"]["weights"]) == 16
    assert s.recipe is not None and s.recipe.rate == 2 and s.recipe.max_tokens_cap == 8
    assert s.recipe.corpus_sha256 == s.corpus.sha256 if s.corpus else False
    assert read_summary(tmp_path / "c").recipe.api == "completions"  # type: ignore[union-attr]
    check_server_metrics(tmp_path / "r", "cold")


def check_server_metrics(run: Path, stage: str) -> None:
    """The target's own telemetry of a run: scraped through it into server_metrics.jsonl, its counters'
    deltas in summary.json equal to what the requests' usage says, and gateable."""
    samples = list(read_server_metrics(run / SERVER_METRICS_FILE))
    assert len(samples) >= 2 and all(x.kind == "harness" and x.error is None for x in samples), samples
    assert samples[0].t_s < 0 <= samples[-1].t_s  # the baseline before the epoch, the last after the run
    hits = [x.prefix_hits for x in samples]
    assert all(h is not None for h in hits) and hits == sorted(hits)  # type: ignore[type-var]
    assert samples[-1].raw["harness_engine_prefix_cache_hit_tokens_total"] == hits[-1]
    # Per label set, what harness analysis anomaly reads: the requests by endpoint, status and stage.
    served = {tuple(sorted(v.labels.items())): v.value for v in samples[-1].series
              if v.name == "harness_server_requests_total"}  # fmt: skip
    assert sum(v for k, v in served.items() if ("stage", stage) in k) >= len(list(read_records(run)))
    sm = read_summary(run).server_metrics
    assert sm is not None and sm.kind == "harness" and sm.failed == 0 and sm.error is None
    (phase,) = sm.phases
    assert phase.name == stage and phase.prefix_hits == sm.total.prefix_hits
    records = list(read_records(run))
    # Nothing else reached the engine between the first scrape and the last: the server's counters
    # moved by exactly what the responses' usage reported (the engine counts what it reports).
    assert phase.prefix_queries == sum(r.prompt_tokens or 0 for r in records)
    assert phase.prefix_hits == sum(r.cached_tokens or 0 for r in records) > 0  # repeated prefixes hit
    assert phase.prefix_hit_rate == pytest.approx(phase.prefix_hits / phase.prefix_queries)
    assert phase.kv_usage_max is not None and 0 <= phase.kv_usage_max <= 1
    m = METRICS.get("server_prefix_hit_rate").compute(load_result_set(run).frame, MetricContext())
    assert m.value == pytest.approx(phase.prefix_hit_rate) and m.n == phase.prefix_queries and not m.problems


def wait_for_writebacks(url: str, n: int, deadline_s: float = 120.0) -> None:
    """The cache writes a completion back after the response was sent: wait for its counter."""
    end = time.monotonic() + deadline_s
    total = 0.0
    while time.monotonic() < end:
        text = httpx.get(url + "/metrics", timeout=30).text
        total = sum(float(m) for m in re.findall(r"^cache_writebacks_total\{[^}]*\} (\S+)$", text, re.M))
        if total >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{total:g} of {n} write-backs within {deadline_s} s")


def test_cache_hits_count_tokens_exactly_and_carry_the_stored_entropy(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "chat.jsonl", 4)
    with running_server(["--preset", "tiny", "--cache"], log_dir=tmp_path / "server") as server:
        for run in ("miss", "hit"):  # the second replay of the same requests is served by the cache
            spec = LoadSpec(host=server.url, corpus=corpus, rate=4, duration=1, results_dir=tmp_path / run,
                            max_tokens_cap=8, start_delay=0.5)  # fmt: skip
            assert run_locust(spec, timeout_s=300) == 0
            if run == "miss":
                wait_for_writebacks(server.url, 4)
    miss = {r.id: r for r in read_records(tmp_path / "miss")}
    hit = {r.id: r for r in read_records(tmp_path / "hit")}
    assert {r.cache for r in miss.values()} == {"MISS"}
    assert {r.cache for r in hit.values()} <= {"HIT-L1", "HIT-L2", "HIT-L3"} and len(hit) == 4
    assert read_summary(tmp_path / "hit").token_counting == {"usage": 4}
    for rid, r in hit.items():
        # The replayed stream's per-chunk usage reaches the stored completion's count exactly.
        assert r.completion_tokens == miss[rid].completion_tokens and len(r.itl_ms) == r.completion_tokens - 1
        assert r.mean_entropy == pytest.approx(miss[rid].mean_entropy)
