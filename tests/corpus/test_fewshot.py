"""Few-shot pool: top-N by confidence, stratified allocation with a floor, every domain covered."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from harness.common.errors import InputError
from harness.corpus.fewshot import allocate, build_pool, read_log, top_by_confidence

from .conftest import FIXTURES

LOG = FIXTURES / "fewshot_log.jsonl"


def _raw() -> list[dict]:
    return [json.loads(line) for line in LOG.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_top_n_by_confidence_matches_the_raw_file() -> None:
    raw = _raw()
    expected = [r["id"] for r in sorted(raw, key=lambda r: (-r["confidence"], r["id"]))[:100]]
    assert [e.id for e in top_by_confidence(read_log(LOG), 100)] == expected


@pytest.mark.parametrize("total", [3, 5, 12, 40])
def test_allocation_floor_covers_every_stratum(total: int) -> None:
    weights = {"big": 0.9, "mid": 0.07, "small": 0.02, "tiny": 0.01}
    alloc = allocate(weights, total, floor=1)
    assert set(alloc) == set(weights)
    assert all(v >= 1 for v in alloc.values())
    assert sum(alloc.values()) == max(total, len(weights))
    if total >= 12:
        assert alloc["big"] == max(alloc.values())


def test_allocation_is_proportional_beyond_the_floor() -> None:
    alloc = allocate({"a": 0.5, "b": 0.3, "c": 0.2}, 103, floor=1)
    assert alloc == {"a": 1 + 50, "b": 1 + 30, "c": 1 + 20}


@pytest.mark.slow
def test_pool_shot_set_covers_every_domain(embedder) -> None:
    raw = sorted(_raw(), key=lambda r: (-r["confidence"], r["id"]))[:100]
    domains = {r["domain"] for r in raw}
    assert len(domains) == 5
    pool = build_pool(read_log(LOG), embedder, top_n=100, k=None, shot_set_size=8, floor=1, seed=0)
    covered = Counter(pool.strata[i] for i in pool.shots)
    assert set(covered) == domains
    assert sum(covered.values()) == 8
    assert 2 <= pool.k <= 10 and pool.silhouette is not None
    assert pool.purity is not None and 0.0 < pool.purity <= 1.0


def test_bad_log_lines_name_file_line_and_field(tmp_path) -> None:
    p = tmp_path / "log.jsonl"
    p.write_text('{"id": "a", "text": "hi", "confidence": 0.5}\n{"id": "b", "text": "x", "confidence": 7}\n')
    with pytest.raises(InputError) as info:
        read_log(p)
    assert info.value.line == 2 and info.value.field == "confidence"
