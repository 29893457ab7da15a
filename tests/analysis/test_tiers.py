"""Hot-zone tiers: the threshold rule, zones from real MiniLM embeddings, entropy sources, the file."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from harness.analysis.tiers import (
    Query,
    TierThresholds,
    apply_cache_state,
    apply_entropy_file,
    build_tiers,
    classify,
    embed_queries,
    queries_from_corpus,
    queries_from_rows,
)
from harness.common.errors import InputError
from harness.common.io import write_json, write_jsonl
from harness.target.cache.policy import load_tier_file
from harness.target.server.prepare import prompt_fingerprint

from .conftest import corpus_record, record, write_corpus, write_run


@pytest.mark.parametrize(
    ("density", "entropy", "tier"),
    [
        (50, 2.1, "hot"),  # both thresholds are inclusive
        (500, 0.1, "hot"),
        (49.9, 0.1, "warm"),
        (50, 2.11, "warm"),
        (50, None, "warm"),  # unknown entropy does not count as confident
        (10, None, "cold"),
        (10, 3.0, "cold"),
    ],
)
def test_threshold_rule(density: float, entropy: float | None, tier: str) -> None:
    assert classify(density, entropy, TierThresholds()) == tier


def test_thresholds_are_configurable() -> None:
    th = TierThresholds(density_min=5, entropy_max=3.5)
    assert classify(10, 3.0, th) == "hot"
    assert classify(10, 3.0, TierThresholds()) == "cold"


def _fp(text: str) -> str:
    return prompt_fingerprint(([{"role": "user", "content": text}], True))


def test_zones_from_real_embeddings(tmp_path: Path) -> None:
    rows = [
        # a dense, confident zone: paraphrases of one question, 60 requests
        {"query": "How do I reset my password?", "count": 30, "mean_entropy": 1.0},
        {"query": "How can I reset my password", "count": 20, "mean_entropy": 1.2},
        {"query": "I forgot my password, how do I reset it?", "count": 10},
        # dense but uncertain
        {"query": "Write a short poem about the sea", "count": 40, "mean_entropy": 3.4},
        {"query": "Write a short poem about the ocean", "count": 25, "mean_entropy": 3.0},
        # confident but rare
        {"query": "What is the capital of France?", "count": 3, "mean_entropy": 0.4},
        # rare, entropy unknown
        {"query": "Explain quantum tunnelling to a child", "count": 1},
    ]
    path = tmp_path / "queries.jsonl"
    write_jsonl(path, rows)
    qs = queries_from_rows(path)
    tier_file, report = build_tiers(qs, embed_queries(qs))
    tier_of = {e.query: e.tier for e in tier_file.entries}
    assert (
        tier_of["How do I reset my password?"] == tier_of["I forgot my password, how do I reset it?"] == "hot"
    )
    assert tier_of["Write a short poem about the sea"] == "warm"
    assert tier_of["What is the capital of France?"] == "warm"
    assert tier_of["Explain quantum tunnelling to a child"] == "cold"
    hot = next(z for z in report.zones if z.tier == "hot")
    assert hot.density >= 60 and hot.queries == 3
    # Entropy of a zone: the count-weighted mean of what is known (the third query has none).
    assert hot.entropy == pytest.approx((30 * 1.0 + 20 * 1.2) / 50)
    assert hot.entropy_known == pytest.approx(50 / 60)
    # Entries are named the way the server fingerprints a one-message chat.
    fps = {e.query: e.prompt_fp for e in tier_file.entries}
    assert fps["How do I reset my password?"] == _fp("How do I reset my password?")
    assert report.tiers == {"hot": 3, "warm": 3, "cold": 1}
    out = tmp_path / "tiers.json"
    write_json(out, tier_file.model_dump(mode="json"))
    assert load_tier_file(out) == tier_file


def test_entropy_from_runs_entropy_file_and_cache_state(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", [corpus_record(f"q{i}") for i in range(4)])
    # The load stage records the server's usage.harness.mean_entropy on each record (None: not reported).
    run = tmp_path / "run"
    entropies = [1.0, None, 2.0, None]
    write_run(run, [record(i, id=f"q{i % 2}", mean_entropy=e) for i, e in enumerate(entropies)])
    qs = {q.ids[0]: q for q in queries_from_corpus(corpus, [run])}
    assert set(qs) == {"q0", "q1"}  # only what the runs replayed, counted
    assert (
        qs["q0"].count == 2
        and qs["q0"].entropy == pytest.approx(1.5)
        and qs["q0"].entropy_source == "records"
    )
    assert qs["q1"].entropy is None
    # An explicit entropy file wins; the cache state fills what is still unknown.
    ent = tmp_path / "entropy.jsonl"
    write_jsonl(ent, [{"id": "q0", "mean_entropy": 0.7}])
    assert apply_entropy_file(list(qs.values()), ent) == 1
    state = tmp_path / "state"
    meta = {
        "schema": 1,
        "tenant": "default",
        "entries": [
            {"completion": {"mean_entropy": 2.9, "created": 1, "meta": {"prompt_fp": qs["q1"].prompt_fp}}},
            {"completion": {"mean_entropy": 0.1, "created": 1, "meta": {"prompt_fp": qs["q0"].prompt_fp}}},
        ],
    }
    write_json(state / "l3" / "default" / "meta.json", meta)
    assert apply_cache_state(list(qs.values()), state) == 1
    assert qs["q0"].entropy == 0.7 and qs["q0"].entropy_source == "entropy-file"
    assert qs["q1"].entropy == 2.9 and qs["q1"].entropy_source == "cache-state"
    with pytest.raises(InputError, match="no saved cache state"):
        apply_cache_state(list(qs.values()), tmp_path / "nowhere")


def test_bad_rows_name_file_line_and_field(tmp_path: Path) -> None:
    p = tmp_path / "q.jsonl"
    p.write_text('{"query": "ok"}\n{"query": "x", "count": 0}\n')
    with pytest.raises(InputError) as exc:
        queries_from_rows(p)
    assert exc.value.line == 2 and exc.value.field == "count"
    with pytest.raises(InputError, match="no queries"):
        build_tiers([], embed_queries([Query(text="x", prompt_fp="0" * 32)])[:0])


def test_run_records_are_read_through_the_load_stages_model(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", [corpus_record("q0")])
    run = tmp_path / "run"
    write_run(run, [record(0, id="q0", mean_entropy=1.0)])
    rows = [orjson.loads(x) for x in (run / "records.jsonl").read_bytes().splitlines()]
    rows[0]["mean_entropy"] = "high"  # not a number: the record's line and field are named
    write_jsonl(run / "records.jsonl", rows)
    with pytest.raises(InputError) as err:
        queries_from_corpus(corpus, [run])
    assert err.value.line == 1 and err.value.field == "mean_entropy"
