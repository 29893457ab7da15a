"""The request table and the arrival plan: matching, shares, rates, segments."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from harness.common.errors import ConfigError
from harness.corpus.model import read_corpus
from harness.load.arrivals import (
    RateArrivals,
    Segment,
    bypass_offset,
    bypasses,
    from_corpus_offsets,
    from_schedule,
    is_sampled,
    preload_line,
    prepare_requests,
    share,
)
from harness.traces.model import ScheduleEntry
from tests.load.helpers import make_corpus


@pytest.fixture
def records(tmp_path: Path) -> list:
    return list(read_corpus(make_corpus(tmp_path / "c.jsonl", 12, offsets_s=[i * 0.5 for i in range(12)])))


def test_bodies_keep_every_field_and_ask_for_per_chunk_usage(records: list) -> None:
    reqs = prepare_requests(records, model="m", max_tokens_cap=4)
    body = orjson.loads(reqs[0].body)
    assert reqs[0].path == "/v1/chat/completions"
    assert body["stop"] == ["\n\n"] and body["temperature"] == 0.0 and body["max_tokens"] == 4
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    lp = prepare_requests(records, api="completions", token_counting="logprobs")
    body = orjson.loads(lp[0].body)
    assert lp[0].path == "/v1/completions" and body["logprobs"] == 1 and body["prompt"] == "question 0"
    assert "continuous_usage_stats" not in body["stream_options"]


def test_schedule_entries_match_by_trace_then_scenario_then_cycle(records: list) -> None:
    reqs = prepare_requests(records)
    entries = [
        ScheduleEntry(offset_s=0.0, source_trace_id=f"{5:032x}"),  # record r4
        ScheduleEntry(offset_s=1.0, scenario="s2"),  # first of scenario s2: r2
        ScheduleEntry(offset_s=2.0, scenario="s2"),  # next: r5
        ScheduleEntry(offset_s=3.0),  # plain cycle: r0
        ScheduleEntry(offset_s=4.0, scenario="unknown"),  # no such scenario: the cycle goes on, r1
    ]
    arr = from_schedule(entries, reqs, speedup=2.0)
    assert [reqs[a.request].id for a in arr] == ["r4", "r2", "r5", "r0", "r1"]
    assert [a.intended_s for a in arr] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert arr[0].trace_id == f"{5:032x}"
    assert len(from_schedule(entries, reqs, duration_s=2.5)) == 3
    with pytest.raises(ConfigError):
        from_schedule(entries, reqs, speedup=0)


def test_shares_partition_the_plan_deterministically_by_affinity(records: list) -> None:
    reqs = prepare_requests(records)
    arr = from_corpus_offsets(records, reqs)
    assert arr is not None and len(arr) == 12
    parts = [share(arr, reqs, k, 3) for k in range(3)]
    assert sorted(a.seq for p in parts for a in p) == list(range(12))
    for p in parts:  # one prefix group never spans two workers
        groups = {reqs[a.request].affinity for a in p}
        assert all(
            g not in {reqs[a.request].affinity for q in parts if q is not p for a in q} for g in groups
        )
    assert share(arr, reqs, 1, 3) == parts[1]


def drain(src: RateArrivals, limit: int = 10_000) -> list:
    out = []
    while (t := src.peek()) is not None and t != float("inf") and len(out) < limit:
        out.append(src.pop())
    return out


def test_constant_rate_workers_interleave_into_the_single_process_sequence() -> None:
    single = RateArrivals(5)
    single.set_segments([Segment(0.0, 1.0, 10.0, "a"), Segment(1.0, 2.0, 20.0, "b")])
    one = drain(single)
    assert len(one) == 30 and [a.stage for a in one].count("b") == 20
    parts = []
    for k in range(3):
        src = RateArrivals(5, slot=k, n=3)
        src.set_segments([Segment(0.0, 1.0, 10.0, "a"), Segment(1.0, 2.0, 20.0, "b")])
        parts += drain(src)
    merged = sorted(parts, key=lambda a: (a.intended_s, a.seq))
    assert [round(a.intended_s, 9) for a in merged] == [round(a.intended_s, 9) for a in one]
    assert len({a.seq for a in merged}) == 30  # unique across workers


def test_segments_pause_and_are_replaced() -> None:
    src = RateArrivals(3)
    src.set_segments([Segment(0.0, 1.0, 4.0)], final=False)
    assert len(drain(src)) == 4
    assert src.peek() == float("inf")  # paused: more may come
    src.set_segments([Segment(5.0, 6.0, 2.0, "hold")], final=True)
    rest = drain(src)
    assert [a.intended_s for a in rest] == [5.0, 5.5] and src.peek() is None


def test_poisson_rate_is_about_right() -> None:
    src = RateArrivals(1, process="poisson", seed=3)
    src.set_segments([Segment(0.0, 100.0, 50.0)])
    n = len(drain(src))
    assert 4500 < n < 5500


def test_preload_lines_are_the_replayed_bodies_without_streaming(records: list) -> None:
    for api in ("auto", "completions"):
        reqs = prepare_requests(records, api=api, model="m", max_tokens_cap=4)
        for rec, req in zip(records, reqs, strict=True):
            line = preload_line(rec, api=api, model="m", max_tokens_cap=4)
            sent = orjson.loads(req.body)
            for k in ("stream", "stream_options"):
                sent.pop(k)
            # What the cache keys on is the same; the tenant goes as X-Tenant-ID live, as a field here.
            assert {k: v for k, v in line.items() if k != "tenant"} == sent
            assert line.get("tenant") == (None if rec.tenant == "default" else rec.tenant)


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.75, 0.9])
def test_bypass_choice_is_deterministic_and_holds_its_share_in_every_window(fraction: float) -> None:
    offset = bypass_offset(7)
    assert offset == bypass_offset(7) != bypass_offset(8) and 0.0 <= offset < 1.0
    picks = [bypasses(seq, fraction, offset) for seq in range(5000)]
    assert picks == [bypasses(seq, fraction, offset) for seq in range(5000)]
    prefix = [0]
    for p in picks:
        prefix.append(prefix[-1] + p)
    # Any run of n consecutive arrivals (a stage, a worker's slice of time) holds fraction·n to
    # within a few (golden-ratio Weyl sequence); coin flips would stray by √(n·f·(1−f)) ≈ 11 at 500.
    worst = max(
        abs(prefix[start + n] - prefix[start] - fraction * n)
        for n in (10, 37, 100, 500, 2000)
        for start in range(0, 5000 - n, 7)
    )
    assert worst <= 3.0, worst
    # Not periodic in the corpus length: with 4 records, each record is bypassed at about the share.
    for rec in range(4):
        mine = picks[rec::4]
        assert abs(sum(mine) / len(mine) - fraction) < 0.01


def test_bypass_edges() -> None:
    assert not any(bypasses(s, 0.0, 0.3) for s in range(1000))
    assert all(bypasses(s, 1.0, 0.3) for s in range(1000))


def test_sampled_requests_are_recognised() -> None:
    assert is_sampled({"prompt": "x"})  # OpenAI's default temperature is 1
    assert is_sampled({"prompt": "x", "temperature": None})
    assert is_sampled({"prompt": "x", "temperature": 0.7})
    assert not is_sampled({"prompt": "x", "temperature": 0.7, "seed": 1})
    assert not is_sampled({"prompt": "x", "temperature": 0})
