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
    assert [s["name"] for s in report["steps"]] == ["start server", "stream requests", "stop server"]
    for phase in ("sequential", "concurrent"):
        rows = report["requests"][phase]
        assert [r["label"] for r in rows] == [r.label for r in DEFAULT_REQUESTS]
        for row, req in zip(rows, DEFAULT_REQUESTS, strict=True):
            assert row["status"] == 200
            assert 0 < row["ttft_ms"] <= row["e2e_ms"]
            assert 1 <= row["completion_tokens"] <= req.body["max_tokens"]
            assert row["chunks"] <= row["completion_tokens"]
            assert row["server"]["prefill_ms"] > 0
