"""``make demo`` end to end: the real server is started, streamed to, stopped, and the report written."""

from __future__ import annotations

import json

import pytest

from harness.demo import DEFAULT_REQUESTS, run_demo

pytestmark = pytest.mark.slow


def test_demo_runs_and_writes_its_report(tmp_path):
    ctx = run_demo(out_dir=tmp_path)
    assert ctx.server is None  # stopped
    reports = sorted(tmp_path.glob("demo-*.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert report == json.loads((tmp_path / "latest.json").read_text())
    assert report["server"]["exit_code"] == 0
    assert [s["name"] for s in report["steps"]] == [
        "traces → cold paths → scenarios",
        "corpus build",
        "start server",
        "stream requests",
        "replay corpus: cold, then warm",
        "stop server",
    ]
    # The bundled GenAI trace has slow cross-service hops, so scenarios exist and weigh 1 in total.
    assert report["scenarios"] and abs(sum(c["weight"] for c in report["scenarios"]) - 1) < 1e-6
    assert report["corpus"]["metrics"]["records"] == 16
    summary = report["replay"]["summary"]
    assert summary["cold"]["ok"] == summary["cold"]["n"] == 16
    assert summary["warm"]["ok"] == 16
    # Seeded, deterministic requests: the cold pass generates, the warm pass is served from cache.
    assert summary["cold"]["cache"].get("MISS", 0) >= 1
    warm_hits = sum(v for k, v in summary["warm"]["cache"].items() if k.startswith("HIT"))
    assert warm_hits == 16, summary["warm"]["cache"]
    for phase in ("sequential", "concurrent"):
        rows = report["requests"][phase]
        assert [r["label"] for r in rows] == [r.label for r in DEFAULT_REQUESTS]
        for row, req in zip(rows, DEFAULT_REQUESTS, strict=True):
            assert row["status"] == 200
            assert 0 < row["ttft_ms"] <= row["e2e_ms"]
            assert 1 <= row["completion_tokens"] <= req.body["max_tokens"]
            assert row["chunks"] <= row["completion_tokens"]
            if phase == "sequential" or not str(row["cache"]).startswith("HIT"):
                assert row["server"]["prefill_ms"] > 0, row  # the engine ran the prompt
            else:
                assert row["server"]["prefill_ms"] == 0, row  # served from the cache stack
    # Greedy and seeded requests repeat exactly, so the second round of them is served from cache.
    assert any(str(r["cache"]).startswith("HIT") for r in report["requests"]["concurrent"])
