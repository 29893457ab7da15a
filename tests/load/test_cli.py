"""``harness load summarize``: the table comes from the records, with the one percentile definition."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.load.results import RecordWriter, TargetInfo, read_summary, summarize, write_summary


def rows(n: int) -> list[dict[str, object]]:
    return [
        {"id": f"r{i}", "stage": "replay", "intended_s": i * 0.1, "sent_s": i * 0.1, "lateness_ms": 0.1,
         "ttft_ms": float(i + 1), "itl_ms": [1.0, 2.0], "e2e_ms": 10.0 + i, "status": 200, "cache": "HIT-L1",
         "completion_tokens": 3, "token_counting": "usage"}
        for i in range(n)
    ]  # fmt: skip


def test_summarize_prints_the_table_and_rewrites_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = RecordWriter(tmp_path / "records.jsonl")
    w.write_many(rows(100))
    w.close()
    with pytest.raises(SystemExit) as ex:
        main(["load", "summarize", str(tmp_path), "--write"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert "ttft_ms" in out and "requests 100, errors 0" in out
    s = read_summary(tmp_path)
    assert s.metrics["ttft_ms"].p95 == 95.0  # nearest rank of 1..100
    assert s.hit_rate["HIT-L1"] == 1.0 and s.token_counting == {"usage": 100}
    # An existing summary keeps its metadata; metrics are recomputed from the records.
    old = summarize([], started_at="2026-01-01T00:00:00Z", duration_s=9.0, target=TargetInfo(url="http://t"))
    write_summary(tmp_path, old)
    with pytest.raises(SystemExit):
        main(["load", "summarize", str(tmp_path), "--write", "--json"])
    s = read_summary(tmp_path)
    assert s.target.url == "http://t" and s.requests == 100 and s.duration_s == 9.0


def test_summarize_a_missing_directory_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["load", "summarize", str(tmp_path / "nope")])
    assert ex.value.code == 3
