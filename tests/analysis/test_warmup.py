"""Reference traces, the warmup plan, preload JSONL and the ladder plan."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from harness.analysis.references import load_refs
from harness.analysis.sim import simulate
from harness.analysis.warmup import (
    covering_requests,
    ladder_plan,
    plan_warmup,
    preload_lines,
    rank_keys,
)
from harness.common.errors import InputError
from harness.common.openai import ChatCompletionRequest, CompletionRequest
from harness.corpus.model import read_corpus
from harness.load.arrivals import prepare_requests
from harness.load.plan import Plan, plan_preload, read_plan, write_plan

from .conftest import corpus_record, record, write_corpus, write_run

SAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "corpus" / "mooncake_sample.jsonl"


def test_mooncake_sample_as_entries_and_blocks() -> None:
    blocks = load_refs(SAMPLE, "blocks")
    lines = [orjson.loads(x) for x in SAMPLE.read_bytes().splitlines()]
    assert blocks.n_requests == len(lines) == 40
    assert blocks.n_refs == sum(len(x["hash_ids"]) for x in lines)
    assert blocks.distinct == len({h for x in lines for h in x["hash_ids"]})
    entries = load_refs(SAMPLE, "entries")
    assert entries.n_refs == 40
    assert entries.distinct == len({tuple(x["hash_ids"]) for x in lines})
    assert entries.request_refs[0] == "line:1"
    # A shared leading block is a hit for a block cache, not for an entry cache.
    assert simulate(blocks, 10_000, "min").hits > 0


def test_a_trace_without_block_ids_is_refused(repo_root: Path) -> None:
    with pytest.raises(InputError, match="no prefix block ids"):
        load_refs(repo_root / "fixtures" / "traces" / "azure_code_head20.csv", "entries")


def test_records_are_keyed_by_id_and_sorted_by_send_time(tmp_path: Path) -> None:
    # Written in completion order, not send order.
    recs = [record(2, id="a", sent_s=0.3), record(0, id="b", sent_s=0.1), record(1, id="a", sent_s=0.2)]
    run = write_run(tmp_path / "run", recs)
    refs = load_refs(run, "entries")
    assert refs.request_refs == ["records:b", "records:a", "records:a"]
    assert simulate(refs, 1, "lru").hits == 1
    with pytest.raises(InputError, match="no KV block ids"):
        load_refs(run, "blocks")


def test_replay_predictor_ranks_soon_and_often_first(tmp_path: Path) -> None:
    # c used early twice, a used early once, b only late.
    recs = [
        record(0, id="c", sent_s=0.0),
        record(1, id="a", sent_s=1.0),
        record(2, id="c", sent_s=2.0),
        record(3, id="b", sent_s=100.0),
    ]
    refs = load_refs(write_run(tmp_path / "run", recs), "entries")
    ranked = [refs.labels[k] for k in rank_keys(refs, "replay", 10.0).tolist()]
    assert ranked == [("", "c"), ("", "a"), ("", "b")]
    ranked = [refs.labels[k] for k in rank_keys(refs, "recent", 10.0).tolist()]
    assert ranked[0] == ("", "b")


@pytest.mark.parametrize("in_sample", [False, True])
def test_plan_is_bounded_by_the_ceilings_and_beats_a_cold_cache(in_sample: bool) -> None:
    blocks = load_refs(SAMPLE, "blocks")
    for cap in (20, 100, 400):
        report, chosen, requests = plan_warmup(blocks, cap, window_fraction=0.5, in_sample=in_sample)
        assert report.mode == ("in_sample" if in_sample else "out_of_sample")
        assert report.history_requests == (40 if in_sample else 20) and report.window_requests == 20
        assert len(chosen) <= cap
        assert report.expected_hit_rate <= report.plan_min_hit_rate + 1e-12
        assert report.protected_hit_rate <= report.plan_min_hit_rate + 1e-12
        assert report.plan_min_hit_rate <= report.history_ceiling + 1e-12
        assert report.history_preload_hit_rate <= report.history_ceiling + 1e-12
        assert report.history_ceiling <= report.ceiling + 1e-12
        assert report.ceiling >= report.cold["min"] >= report.cold["lru"] - 1e-12
        assert report.expected_hit_rate >= report.cold["lru"]
        # Every chosen block is carried by one of the covering requests.
        carried = {k for r in requests for k in blocks.keys[blocks.req == r].tolist()}
        assert set(chosen) <= carried
        assert covering_requests(blocks, chosen) == requests
        if in_sample:  # the plan saw every key of the window
            assert report.history_ceiling == report.ceiling and report.limits.refs_unseen == 0


def test_the_backtest_plans_without_the_window(tmp_path: Path) -> None:
    # History: a and b alternate; the window (last 40 %): c and d, never seen before.
    ids = ["a", "b"] * 3 + ["c", "d"] * 2
    refs = load_refs(
        write_run(tmp_path / "run", [record(i, id=x, sent_s=float(i)) for i, x in enumerate(ids)])
    )
    report, chosen, _ = plan_warmup(refs, 2, window_fraction=0.4, predictor="frequency")
    assert report.history_requests == 6 and report.window_requests == 4
    # Nothing the history saw comes back: no plan can help, the history ceiling is a cold MIN.
    assert report.history_ceiling == report.cold["min"] == 0.5 and report.plan_min_hit_rate == 0.5
    assert report.ceiling == 1.0  # Belady preloads c and d: it knows the window
    assert report.limits.refs_unseen == 1.0 and report.limits.refs_one_off == 0.0
    assert report.limits.preload_used == 0.0
    # The written plan comes from the whole history, whose most frequent keys are a and b (3 uses
    # each; c and d 2): it is not the evaluated plan.
    assert sorted(refs.labels[k] for k in chosen) == [("", "a"), ("", "b")]
    # In sample the window is the history's head (a, b, a, b): a plan that saw it is perfect.
    upper, _, _ = plan_warmup(refs, 2, window_fraction=0.4, in_sample=True, predictor="frequency")
    assert upper.mode == "in_sample" and upper.expected_hit_rate == upper.history_ceiling == 1.0


def test_protection_keeps_the_hot_set_where_lru_loses_it(tmp_path: Path) -> None:
    # History: h is the hot prompt. Window: four one-off prompts, then h: LRU at capacity 2 has
    # flushed h before its use; protecting the preload until its first hit keeps it.
    ids = ["h", "x", "h", "y", "h", "o1", "o2", "o3", "o4", "h"]
    refs = load_refs(
        write_run(tmp_path / "run", [record(i, id=x, sent_s=float(i)) for i, x in enumerate(ids)])
    )
    report, _, _ = plan_warmup(refs, 2, window_fraction=0.5, predictor="frequency")
    assert report.expected_hit_rate == 0.0 and report.protected_hit_rate == 0.2
    assert report.history_ceiling == 0.2 and report.ratio == 0.0
    assert report.limits.refs_one_off == 0.8 and report.limits.preload_used == 0.5


def test_preload_lines_are_what_post_cache_preload_accepts(tmp_path: Path) -> None:
    blocks = load_refs(SAMPLE, "blocks")
    _, _, requests = plan_warmup(blocks, 60, window_fraction=0.5)
    # A corpus generated from the trace: record i reproduces trace line i + 1; every third has a tenant.
    corpus = write_corpus(
        tmp_path / "corpus.jsonl",
        [
            corpus_record(
                f"c{i}",
                tenant="acme" if i % 3 == 0 else "default",
                provenance={
                    "seed": 0,
                    "candidate": i,
                    "template": "t.j2",
                    "template_sha256": "0" * 64,
                    "source_line": i + 1,
                },
            )
            for i in range(40)
        ],
    )
    lines, missing = preload_lines(blocks, requests, corpus)
    assert missing == 0 and len(lines) == len(requests)
    for line, r in zip(lines, requests, strict=True):
        assert line["messages"][-1]["content"] == f"question c{r}"
        assert line.get("tenant") == ("acme" if r % 3 == 0 else None)
        body = {k: v for k, v in line.items() if k not in ("tenant", "completion")}
        assert "stream" not in body
        (ChatCompletionRequest if "messages" in body else CompletionRequest).model_validate(body)


def test_ladder_plan_is_the_load_stages_plan_and_round_trips(tmp_path: Path) -> None:
    refs = load_refs(SAMPLE, "entries")
    plan = ladder_plan(refs, stage_s=30, max_failure_rate=0.02, preload="preload.jsonl")
    assert isinstance(plan, Plan)
    qps = [s.qps for s in plan.stages]
    assert qps == sorted(qps) and len(qps) == 5 and qps[0] > 0
    assert {s.duration_s for s in plan.stages} == {30} and {s.max_failure_rate for s in plan.stages} == {0.02}
    assert plan.policy.on_failure == "retry"
    path = write_plan(tmp_path / "ladder.yaml", plan)
    doc = yaml.safe_load(path.read_text())
    assert set(doc) == {"name", "preload", "policy", "stages"}
    assert set(doc["stages"][0]) == {"name", "qps", "duration_s", "max_failure_rate"}
    assert read_plan(path) == plan  # what locustfiles/warmup.py reads
    assert plan_preload(plan, path) == tmp_path / "preload.jsonl"


def test_preload_lines_follow_the_replays_request_options(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", [corpus_record(f"c{i}") for i in range(3)])
    run = write_run(tmp_path / "run", [record(i, id=f"c{i % 3}", sent_s=float(i)) for i in range(6)])
    refs = load_refs(run, "entries")
    lines, missing = preload_lines(refs, [0, 1, 2], corpus, api="completions", model="m", max_tokens_cap=4)
    assert missing == 0
    # Exactly the body the load stage sends for the record (minus streaming): the cache key matches.
    sent = prepare_requests(list(read_corpus(corpus)), api="completions", model="m", max_tokens_cap=4)
    for line, req in zip(lines, sent, strict=True):
        body = orjson.loads(req.body)
        body.pop("stream")
        body.pop("stream_options")
        assert line == body and line["max_tokens"] == 4 and "prompt" in line


@pytest.mark.realdata
def test_mooncake_plan_in_and_out_of_sample(realdata: Path) -> None:
    trace = realdata / "mooncake" / "synthetic_trace.jsonl"
    blocks = load_refs(trace, "blocks")
    cap = blocks.head(0.1).distinct // 2
    # In sample (labelled upper bound): the replay plan reaches the ceiling at half the window.
    upper, _, _ = plan_warmup(blocks, cap, in_sample=True, predictor="replay")
    assert upper.ratio_belady >= 0.95, upper
    assert upper.expected_hit_rate > 5 * upper.cold["lru"]
    # Out of sample: planned from the first 90 %, judged on the last 10 %.
    cap = blocks.window(int(blocks.n_requests * 0.9), blocks.n_requests).distinct // 2
    report, _, _ = plan_warmup(blocks, cap)
    assert report.mode == "out_of_sample" and report.history_requests == blocks.n_requests - 399
    assert report.expected_hit_rate > report.cold["lru"]
    assert report.plan_min_hit_rate <= report.history_ceiling <= report.ceiling
    assert 0 < report.limits.preload_used < 1


def test_ceiling_dependence_by_hand() -> None:
    """MIN from the preload [X] at capacity 2 on X B C X: X's first use is a preload hit (no
    newcomer before it), its second an in-window reuse; B and C are never used again. At capacity
    1 on B C X, X's first use comes after two newcomers: out of LRU's reach (LRU scores 0)."""
    import numpy as np

    from harness.analysis.sim import simulate_lru
    from harness.analysis.warmup import ceiling_dependence

    x, b, c = 23, 1, 2
    assert ceiling_dependence(np.array([x, b, c, x], dtype=np.int64), [x], 2) == (0.5, 0.0)
    scan = np.array([b, c, x], dtype=np.int64)
    assert ceiling_dependence(scan, [x], 1) == (1.0, 1.0)
    assert simulate_lru(scan, 1, [x]).hits == 0
    assert ceiling_dependence(scan, [], 1) == (0.0, 0.0)
