"""A warmup's preload survives a scan where an ordinary request does not: ``X-Warmup-Priority`` reaches
the engine's prefix cache through HTTP and ``s3fifo`` honours it. A real ``harness serve`` with a
64-block KV pool; each check is one request's ``cached_tokens``."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common import headers as H
from harness.corpus.model import CorpusRecord
from harness.load.arrivals import prepare_requests
from harness.load.target import TargetClient
from harness.target.server.state import _priority
from tests.analysis.conftest import corpus_record
from tests.server.conftest import harness_server

pytestmark = pytest.mark.slow


def _rec(rid: str, words: list[str]) -> CorpusRecord:
    return corpus_record(
        rid, messages=None, prompt=" ".join(words), max_tokens=1, sampling={"temperature": 0.0}
    )


def _cached_after_scan(log_dir: Path, eviction: str) -> dict[str, int | None]:
    """Preload one prefix with the warmup priority and one without, scan, ask for both again."""
    env = {"HARNESS__ENGINE__PREFIX_EVICTION": eviction, "HARNESS__ENGINE__NUM_KV_BLOCKS": "64"}
    with harness_server(log_dir, env=env) as srv:
        client = TargetClient(srv.url)
        # Two 10-block prefixes: one preloaded with the warmup priority, one as an ordinary request.
        kept = _rec("kept", ["alpha"] * 160)
        plain = _rec("plain", ["bravo"] * 160)
        client.probe(prepare_requests([kept]), no_cache=True, priority=H.PRELOAD_PRIORITY)
        client.probe(prepare_requests([plain]), no_cache=True)
        # A scan of one-off prompts, 1.5 pools' worth of blocks.
        scan = [_rec(f"s{i}", [f"tok{i}x{j}" for j in range(40)]) for i in range(40)]
        client.probe(prepare_requests(scan), no_cache=True, concurrency=1)
        again = [_rec("kept2", ["alpha"] * 160 + ["end"]), _rec("plain2", ["bravo"] * 160 + ["end"])]
        got = client.probe(prepare_requests(again), no_cache=True, concurrency=1)
        return {"kept": got[0].cached_tokens, "plain": got[1].cached_tokens}


def test_s3fifo_keeps_a_prioritized_preload_through_a_scan_and_an_ordinary_prefix_not(tmp_path: Path) -> None:
    # (LRU ignores the priority: tests/engine/test_kv_eviction.py, on the block manager.)
    assert _cached_after_scan(tmp_path, "s3fifo") == {"kept": 160, "plain": 0}


@pytest.mark.parametrize(
    ("value", "want"), [(None, 0), ("1", 1), ("3", 3), ("0", 0), ("4", 0), ("-1", 0), ("x", 0), (" 2 ", 2)]
)
def test_the_priority_header_is_a_hint_clamped_to_the_engine_s_range(value: str | None, want: int) -> None:
    assert _priority(value) == want
