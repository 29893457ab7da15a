"""The warmup effect's pure parts: the time split, the prefix-only preload, the plan's two preloads and
their simulated hit rates, and the realized gains (paired by request) computed from pass records."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.analysis.effect import (
    measure_effect,
    pair_records,
    plan_effect,
    prefix_only,
    split_records,
)
from harness.common.errors import ConfigError, InputError
from harness.common.stats import percentile
from harness.corpus.graph import graph_records
from harness.corpus.model import CorpusRecord
from harness.corpus.tokens import load_tokenizer
from harness.traces.api import read_traces
from harness.traces.graph import replay_graphs

from .conftest import corpus_record, record

ROOT = Path(__file__).resolve().parents[2]

BLOCK = 4


def _words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def _rec(i: int, t: float, blocks: list[int], **kw: Any) -> CorpusRecord:
    """A completions record at ``t`` whose prompt opens with one word per token of its blocks."""
    tok = load_tokenizer(None, 0)
    prefix = " ".join(_words(BLOCK, f"b{b}x") for b in blocks)
    prompt = (prefix + " " if prefix else "") + _words(6, f"own{i}y")
    n_prefix = tok.count(prefix) if prefix else 0
    return corpus_record(
        f"r{i}", messages=None, prompt=prompt, arrival_offset_s=t, prefix_block_ids=blocks,
        prefix_tokens=n_prefix, **kw,
    )  # fmt: skip


def test_split_cuts_at_a_share_of_the_time_span_and_rebases_the_window() -> None:
    recs = [_rec(i, float(t), []) for i, t in enumerate([0, 10, 20, 30, 40, 100])]
    s = split_records(list(reversed(recs)), 0.5, "c.jsonl")
    assert [r.id for r in s.history] == ["r0", "r1", "r2", "r3", "r4"]
    assert [r.id for r in s.window] == ["r5"] and s.window[0].arrival_offset_s == 0.0
    assert s.cut_s == 50.0
    with pytest.raises(InputError, match="leaves 0 history"):  # one instant: nothing before any cut
        split_records([_rec(0, 5.0, []), _rec(1, 5.0, [])], 0.5, "c.jsonl")
    with pytest.raises(InputError, match="not in"):
        split_records(recs, 1.0, "c.jsonl")
    untimed = corpus_record("u")
    with pytest.raises(InputError, match="arrival_offset_s") as err:
        pair_records([untimed], recs, ("h.jsonl", "w.jsonl"))
    assert err.value.file == "h.jsonl" and err.value.line == 1
    both = pair_records(recs[:2], recs[3:], ("h", "w"))
    assert [r.arrival_offset_s for r in both.window] == [0.0, 10.0, 70.0] and math.isnan(both.cut_s)


def test_an_agent_session_corpus_is_refused_naming_its_call_field() -> None:
    """A graph corpus (harness corpus graph) has an arrival on each session's first call only, and its
    calls share prefixes through their messages, not block ids: refused for that, not sent to build
    the corpus from a trace (which it was)."""
    (adk,) = replay_graphs(
        read_traces(ROOT / "fixtures" / "traces" / "genai" / "kagent_adk_go_1turn_otlp.json")
    )
    with pytest.raises(InputError, match="agent session") as err:
        split_records(graph_records([adk]), 0.5, "graph.jsonl")
    assert (err.value.file, err.value.line, err.value.field) == ("graph.jsonl", 1, "call")


def test_prefix_only_is_the_shared_prefix_alone_and_one_token() -> None:
    tok = load_tokenizer(None, 0)
    r = _rec(1, 0.0, [7, 8])
    pre = prefix_only(r, tok)
    assert pre is not None
    assert r.prompt is not None and pre.prompt is not None
    assert r.prompt.startswith(pre.prompt) and "own1y" not in pre.prompt
    assert tok.count(pre.prompt) == r.prefix_tokens and pre.max_tokens == 1 and pre.id == "preload-r1"
    one = prefix_only(r, tok, blocks=1)
    assert one is not None and one.prefix_block_ids == [7] and one.prompt is not None
    assert pre.prompt.startswith(one.prompt) and len(one.prompt) < len(pre.prompt)
    assert prefix_only(r, tok, blocks=0) is None
    assert prefix_only(_rec(2, 0.0, []), tok) is None
    assert prefix_only(corpus_record("chat", prefix_block_ids=[1], prefix_tokens=4), tok) is None


def test_plan_preloads_the_history_s_hot_blocks_and_the_oracle_the_window_s() -> None:
    # History: block chain [1, 2] is hot (five uses), [3] used once; the window reuses [1, 2] and
    # brings a chain [5] used twice that the history never saw.
    history = [_rec(i, float(i), [1, 2]) for i in range(5)] + [_rec(5, 5.0, [3])]
    window = [_rec(10, 0.0, [1, 2]), _rec(11, 1.0, [5]), _rec(12, 2.0, [5]), _rec(13, 3.0, [])]
    split = pair_records(history, window, ("h", "w"))
    plan = plan_effect(split, capacity=2)
    assert [r.id for r in plan.planned] == ["preload-r0"]  # the first request bringing [1, 2]
    assert plan.planned_blocks == 2
    # With room for 2 blocks, Belady's preload holds the window's most useful ones: [1, 2] or [5].
    assert plan.oracle and all(r.id.startswith("preload-r1") for r in plan.oracle)
    p = plan.prediction
    assert p.refs == 4
    assert p.cold == pytest.approx(1 / 4)  # only the second [5] hits a cold LRU
    assert p.planned == pytest.approx(3 / 4)  # [1, 2] preloaded, then [5] again
    assert p.oracle >= p.planned
    with pytest.raises(InputError, match="share no KV blocks"):
        plan_effect(pair_records([_rec(0, 0.0, [])], window, ("h", "w")), capacity=2)


def test_gains_are_paired_by_request_per_window_head() -> None:
    window = [_rec(i, float(i), [1]) for i in range(100)]
    rng = np.random.default_rng(3)
    cold_ttft = rng.uniform(100, 300, size=100)
    # Planned: the first half 2× faster, the rest unchanged; oracle 4× faster everywhere.
    planned_ttft = np.where(np.arange(100) < 50, cold_ttft / 2, cold_ttft)
    oracle_ttft = cold_ttft / 4

    def run(ttft: np.ndarray, cached: int) -> list[Any]:
        return [
            record(i, id=f"r{i}", ttft_ms=float(v), cached_tokens=cached, prompt_tokens=20)
            for i, v in enumerate(ttft)
        ]

    prefix = window[0].prefix_tokens
    passes = {
        "cold": run(cold_ttft, 0),
        "planned": run(planned_ttft, prefix),
        "oracle": run(oracle_ttft, 999),
    }
    heads = measure_effect(passes, window, confidence=0.95, seed=0)
    assert [h.head for h in heads] == [0.1, 0.25, 1.0]
    first = heads[0]
    assert first.passes["cold"].requests == 10  # arrivals 0..9 of a 99 s window: ≤ 9.9 s
    want = 1 - percentile(planned_ttft[:10], 95) / percentile(cold_ttft[:10], 95)
    g = first.gain_p95["planned"]
    assert g.value == pytest.approx(want) == pytest.approx(0.5)
    assert g.lo is not None and g.hi is not None and g.lo <= g.value <= g.hi
    assert first.gain_p95["oracle"].value == pytest.approx(0.75)
    whole = heads[-1]
    assert whole.passes["planned"].requests == 100
    # Over the whole window the slow half dominates the P95: the gain shrinks towards 0.
    assert whole.gain_p95["planned"].value == pytest.approx(
        1 - percentile(planned_ttft, 95) / percentile(cold_ttft, 95)
    )
    assert whole.gain_p95["planned"].value < 0.25
    # Block hits: cached tokens up to the shared prefix, over the prefix tokens carried.
    assert whole.passes["cold"].block_hit_rate == 0.0
    assert whole.passes["planned"].block_hit_rate == 1.0
    assert whole.passes["oracle"].block_hit_rate == 1.0  # capped at the prefix: 999 cached counts as all
    assert whole.passes["cold"].ttft_p95.n == 100


def test_one_off_blocks_take_room_in_the_prediction_as_in_a_prefix_cache() -> None:
    # A window whose first prompt brings 6 one-off blocks after its shared [1]: a 4-block LRU loses
    # the preloaded [2] to them before the second request asks for it; S3-FIFO seeded keeps it.
    history = [_rec(i, float(i), [2]) for i in range(3)] + [_rec(3, 3.0, [1])]
    first, second = _rec(10, 0.0, [1]), _rec(11, 1.0, [2])
    size = first.prefix_tokens  # tokens of one block
    window = [
        first.model_copy(update={"prompt_tokens": 7 * size}),  # 1 shared + 6 one-off blocks
        second.model_copy(update={"prompt_tokens": size}),
    ]
    split = pair_records(history, window, ("h", "w"))
    lru = plan_effect(split, capacity=4).prediction
    assert lru.refs == 2 and lru.one_off_refs == 6
    assert lru.planned == pytest.approx(0.5)  # [1] hits (preloaded), [2] was pushed out
    kept = plan_effect(split, capacity=4, policy="s3fifo-seeded").prediction
    assert kept.planned == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="unknown cache simulator 'nope'"):
        plan_effect(split, capacity=4, policy="nope")


def test_a_preload_stops_at_its_deepest_chosen_block_so_it_fits_the_capacity() -> None:
    # The first request bringing the hot [1, 2] also carries a cold [3]: with room for 2 blocks the
    # preload is [1, 2] only (the plan chose those), not the whole chain.
    history = [_rec(0, 0.0, [1, 2, 3])] + [_rec(i, float(i), [1, 2]) for i in range(1, 5)]
    window = [_rec(10, 0.0, [1, 2])]
    plan = plan_effect(pair_records(history, window, ("h", "w")), capacity=2)
    assert [r.prefix_block_ids for r in plan.planned] == [[1, 2]]
    assert plan.planned[0].id == "preload-r0" and plan.planned_blocks == 2
    assert plan.prediction.planned == pytest.approx(1.0)


def test_a_prefix_is_cut_with_the_tokenizer_the_corpus_was_built_with(tmp_path: Path) -> None:
    from harness.analysis.effect_run import corpus_tokenizer
    from harness.corpus.tokens import default_tokenizer_path

    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "corpus.jsonl").write_text("")
    assert corpus_tokenizer(corpus) is None  # no manifest
    (corpus / "manifest.json").write_text(json.dumps({"tokenizer": str(default_tokenizer_path())}))
    want = str(default_tokenizer_path())
    assert corpus_tokenizer(corpus) == corpus_tokenizer(corpus / "corpus.jsonl") == want
    (corpus / "manifest.json").write_text(json.dumps({"tokenizer": str(tmp_path / "gone.json")}))
    assert corpus_tokenizer(corpus) is None  # a tokenizer no longer there is not guessed at
