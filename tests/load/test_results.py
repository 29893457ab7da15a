"""The results model: records validate strictly, summaries are computed from records."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from harness.common.errors import InputError
from harness.common.io import write_json, write_jsonl
from harness.load.results import RequestRecord, read_records
from harness.load.run_summary import METRIC_FIELDS, TargetInfo, read_summary, summarize


def record(i: int, **kw: object) -> RequestRecord:
    base: dict[str, object] = {
        "id": f"r{i}",
        "stage": "replay",
        "intended_s": i * 0.1,
        "sent_s": i * 0.1 + 0.0005,
        "lateness_ms": 0.5,
        "ttft_ms": 50.0 + i,
        "itl_ms": [10.0, 0.0, 0.0],
        "tpot_ms": 10.0 / 3,
        "e2e_ms": 90.0,
        "completion_tokens": 4,
        "cached_tokens": 0,
        "cache": "MISS",
        "status": 200,
    }
    base.update(kw)
    return RequestRecord.parse(base)


def test_summary_metrics_come_from_the_records() -> None:
    recs = [record(i) for i in range(20)] + [record(20, status=0, error="connection refused", ttft_ms=None)]
    s = summarize(recs, started_at="2026-12-01T00:00:00Z", duration_s=2.1, target=TargetInfo(url="http://x"))
    assert s.requests == 21 and s.errors == 1
    assert set(s.metrics) == set(METRIC_FIELDS)
    assert s.metrics["ttft_ms"].n == 20 and s.metrics["ttft_ms"].p95 == 68.0  # 50..69: the 19th
    assert s.metrics["itl_ms"].n == 63  # every gap of every request, pooled
    assert s.metrics["prefill_kv_bytes"].n == 0 and s.metrics["prefill_kv_bytes"].p95 is None
    assert s.hit_rate["MISS"] == 1.0 and s.hit_rate["any"] == 0.0 and s.hit_rate["prefix"] == 0.0
    # A failed request is a miss, never a hit, whatever its header said (the gates count the same).
    hits = [record(i, cache="HIT-L1") for i in range(3)] + [record(3, status=500, error="x", cache="HIT-L1")]
    h = summarize(hits, started_at="2026-12-01T00:00:00Z", duration_s=1.0, target=TargetInfo(url="http://x"))
    assert h.hit_rate["any"] == 0.75 and h.hit_rate["HIT-L1"] == 0.75
    assert s.achieved_rate == pytest.approx(10.0)
    assert not s.client_bound


def test_only_a_starved_client_cpu_marks_a_run_client_bound() -> None:
    s = summarize([record(0)], started_at="x", duration_s=1.0, target=TargetInfo(url="u"), client_cpu_pct=97)
    assert s.client_bound and s.warnings == ["client-bound: client CPU 97 % > 90 %"]
    s = summarize([record(0)], started_at="x", duration_s=1.0, target=TargetInfo(url="u"), client_cpu_pct=60)
    assert not s.client_bound and not s.warnings


def test_lateness_spent_waiting_for_a_free_user_is_saturation_not_a_bound_client() -> None:
    """40 ms late, 39.5 of them waiting for a busy user: the target did not keep up."""
    recs = [record(i, lateness_ms=40.0, queue_wait_ms=39.5) for i in range(8)] + [
        record(8, queue_wait_ms=0.0)
    ]
    s = summarize(recs, started_at="x", duration_s=1.0, target=TargetInfo(url="u"), client_cpu_pct=4)
    assert not s.client_bound
    assert s.warnings == [
        "saturated: 8 of 9 requests waited for a free user (p99 wait 39.5 ms): the target did not keep "
        "up; the *_from_intended latencies include the wait"
    ]
    assert s.metrics["lateness_ms"].p99 == 40.0  # the lateness is kept as it was
    assert s.metrics["client_lateness_ms"].p99 == 0.5 and s.metrics["client_lateness_ms"].n == 9
    assert [r.client_lateness_ms for r in recs[-2:]] == [0.5, 0.5]


def test_the_clients_own_lateness_warns_of_jitter_without_marking_the_run() -> None:
    recs = [record(i, lateness_ms=40.0, queue_wait_ms=0.0) for i in range(10)]
    s = summarize(recs, started_at="x", duration_s=1.0, target=TargetInfo(url="u"))
    assert not s.client_bound and len(s.warnings) == 1
    assert s.warnings[0].startswith("client jitter: p99 of the client's own lateness 40.0 ms > 5 ms")
    assert "widened" in s.warnings[0]
    # Records from before queue_wait_ms existed: all of their lateness counts as the client's own.
    old = [record(i, lateness_ms=7.0) for i in range(10)]
    assert old[0].queue_wait_ms is None and old[0].client_lateness_ms == 7.0
    s = summarize(old, started_at="x", duration_s=1.0, target=TargetInfo(url="u"))
    assert not s.client_bound and s.warnings[0].startswith("client jitter:")


def test_round_trip_and_bad_lines_name_file_line_field(tmp_path: Path) -> None:
    recs = [record(i) for i in range(3)]
    write_jsonl(tmp_path / "records.jsonl", [r.to_dict() for r in recs])
    s = summarize(recs, started_at="x", duration_s=1.0, target=TargetInfo(url="u"))
    write_json(tmp_path / "summary.json", s.model_dump(mode="json"))
    assert list(read_records(tmp_path)) == recs
    assert read_summary(tmp_path) == s
    bad = tmp_path / "bad"
    bad.mkdir()
    rows = [r.to_dict() for r in recs]
    rows[1]["lateness_ms"] = -1
    (bad / "records.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    with pytest.raises(InputError) as err:
        list(read_records(bad))
    assert err.value.line == 2 and err.value.field == "lateness_ms"
    (bad / "summary.json").write_text('{"requests": 1}')
    with pytest.raises(InputError) as err:
        read_summary(bad)
    assert err.value.file is not None and err.value.file.endswith("summary.json")


def test_bypass_and_mean_entropy_default_for_older_records_and_other_targets() -> None:
    # Records written before the fields existed (and by targets that report no entropy) still read.
    old = {k: v for k, v in record(0).to_dict().items() if k not in ("bypass", "mean_entropy")}
    r = RequestRecord.parse(old)
    assert r.bypass is False and r.mean_entropy is None
    assert record(1, bypass=True, mean_entropy=2.5).mean_entropy == 2.5


def test_the_one_reader_keeps_a_nan_literal_as_a_broken_sample_and_reads_an_empty_file(
    tmp_path: Path,
) -> None:
    """One NaN rule for every reader of records.jsonl (the gates and the load stage alike): the literal
    Python's json writes is read as NaN, so the gates can refuse the metric it is in; a line that is
    not JSON at all still stops the read, naming the line."""
    import json
    import math

    from harness.gates.runs import load_result_set

    rows = [record(i).to_dict() for i in range(3)]
    rows[1]["tpot_ms"] = math.nan
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = list(read_records(tmp_path))
    assert len(got) == 3 and math.isnan(got[1].tpot_ms or 0.0) and got[0].tpot_ms == rows[0]["tpot_ms"]
    frame = load_result_set(tmp_path).frame  # the gates read through the same reader
    assert frame.bad("tpot_ms").tolist() == [False, True, False]
    (tmp_path / "records.jsonl").write_text(json.dumps(rows[0]) + "\n{nope\n")
    with pytest.raises(InputError) as err:
        list(read_records(tmp_path))
    assert err.value.line == 2
    (tmp_path / "records.jsonl").write_bytes(b"")
    assert list(read_records(tmp_path)) == []


def test_the_summary_hit_rate_and_the_gates_count_alike(tmp_path: Path) -> None:
    """One definition of a hit: summary.json's hit_rate and the gates' hit_rate_* / warm_rate count the
    same records the same way (a header-less response is in no denominator of the response cache; a
    target that reports no cached_tokens is in none of the prefix cache)."""
    from harness.gates.measurement import MetricContext
    from harness.gates.metrics import METRICS
    from harness.gates.runs import load_result_set
    from tests.analysis.conftest import write_run

    rows = [  # (x-cache, cached_tokens)
        ("HIT-L1", None), ("HIT-L2", 0), ("HIT-L3", 12), ("MISS", 0), ("MISS", 40),
        ("BYPASS", None), (None, 8), (None, 0), (None, None), ("MISS", None),
    ]  # fmt: skip
    recs = [record(i, cache=c, cached_tokens=t) for i, (c, t) in enumerate(rows)]
    s = summarize(recs, started_at="x", duration_s=1.0, target=TargetInfo(url="u"))
    # Told: 7 with a header, 3 of them HIT-*; reported cached_tokens: 6, 3 of them > 0.
    assert s.hit_rate["any"] == pytest.approx(3 / 7) and s.hit_rate["HIT-L2"] == pytest.approx(1 / 7)
    assert s.hit_rate["MISS"] == pytest.approx(3 / 7) and s.hit_rate["prefix"] == pytest.approx(3 / 6)
    frame = load_result_set(write_run(tmp_path / "run", recs)).frame
    for metric, want in (("hit_rate_any", (3, 7)), ("hit_rate_l2", (1, 7)), ("hit_rate_prefix", (3, 6))):
        counts = METRICS.get(metric).counts
        assert counts is not None and counts(frame) == want, metric
        assert METRICS.get(metric).compute(frame, MetricContext()).value == pytest.approx(want[0] / want[1])
    # Warm: a response-cache or a prefix-cache hit, among rows reporting either (9 of the 10).
    warm = METRICS.get("warm_rate").counts
    assert warm is not None and warm(frame) == (5, 9)
