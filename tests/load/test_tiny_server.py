"""The replay user against our own server (``harness serve --preset tiny``, CPU): real engine, real usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.load.results import read_records, read_summary
from harness.load.runner import LoadSpec, run_locust
from harness.server.launch import running_server
from tests.load.helpers import make_corpus

pytestmark = pytest.mark.slow


def test_replay_against_harness_serve_tiny(tmp_path: Path) -> None:
    chat = make_corpus(tmp_path / "chat.jsonl", 6)
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
        # Until the server sends per-chunk usage, the final usage is spread (and the summary says so).
        assert set(s.token_counting) <= {"usage", "final-usage"} and sum(s.token_counting.values()) == n
        for r in read_records(tmp_path / run):
            assert r.status == 200 and r.cache == "BYPASS"
            assert r.ttft_ms is not None and r.e2e_ms is not None and r.e2e_ms >= r.ttft_ms
            assert r.completion_tokens is not None and 1 <= r.completion_tokens <= 8
            assert len(r.itl_ms) == r.completion_tokens - 1
            assert r.prompt_tokens and r.prefill_kv_bytes and r.prefill_kv_bytes > 0
            assert r.peak_measured is False  # the CPU estimate
    assert read_summary(tmp_path / "r").metrics["prefill_kv_bytes"].n == 6
