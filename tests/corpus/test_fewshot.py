"""Few-shot pool: confidence, top-N stratified by domain with a floor, near-duplicates skipped."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from harness.corpus.dedup import CharTfidfJudge, EmbeddingJudge
from harness.corpus.fewshot import allocate, build_pool, fill_confidence, label_confidence, top_by_confidence
from harness.corpus.logs import read_log

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


def test_label_confidence_is_the_nearest_centroid_margin() -> None:
    """Against a brute-force reading of the definition: dense TF-IDF, leave-one-out centroids."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = [u.text for u in read_log(FIXTURES / "clinc150_sample.json")][:200]
    labels = [u.intent or "" for u in read_log(FIXTURES / "clinc150_sample.json")][:200]
    got = label_confidence(texts, labels)
    x = TfidfVectorizer(analyzer="char", ngram_range=(2, 3)).fit_transform(texts).toarray()
    for i in range(0, 200, 17):
        cos = {}
        for lab in set(labels):
            members = [j for j in range(200) if labels[j] == lab and j != i]
            if not members:
                cos[lab] = 0.0
                continue
            c = x[members].mean(axis=0)
            cos[lab] = float(x[i] @ c / np.linalg.norm(c))
        own = cos.pop(labels[i])
        assert got[i] == pytest.approx(np.clip(0.5 + (own - max(cos.values())) / 2, 0, 1), abs=1e-6)


def test_fill_confidence_keeps_a_logs_own() -> None:
    own = read_log(LOG)
    assert [u.confidence for u in fill_confidence(own)] == [u.confidence for u in own]
    filled = fill_confidence(read_log(FIXTURES / "crosswoz_sample.json.zip"))
    assert all(u.confidence is not None and 0 <= u.confidence <= 1 for u in filled)


@pytest.mark.slow
def test_pool_is_stratified_confident_and_deduplicated(embedder) -> None:
    logs = fill_confidence(
        read_log(FIXTURES / "clinc150_sample.json") + read_log(FIXTURES / "crosswoz_sample.json.zip")
    )
    zh_ref = [u.text for u in logs if u.lang == "zh"]
    judges = {"en": EmbeddingJudge(embedder), "zh": CharTfidfJudge(zh_ref)}
    pool = build_pool(logs, judges.__getitem__, top_n=100, threshold=0.82, shot_set_size=15, floor=1, seed=0)
    assert len(pool.entries) == 100 and pool.strata_from == "labels"
    sizes = Counter(u.domain for u in logs)
    want = allocate({d: float(n) for d, n in sizes.items()}, 100, 1)
    assert Counter(pool.strata) == Counter(want)  # every domain gets its share
    # Within a stratum the pool holds its most confident lines, skipping only near-duplicates.
    for stratum in want:
        mine = [u for u, s in zip(pool.entries, pool.strata, strict=True) if s == stratum]
        ranked = top_by_confidence([u for u in logs if u.domain == stratum], len(logs))
        assert ranked.index(mine[-1]) < len(mine) + pool.rejected
        assert [ranked.index(u) for u in mine] == sorted(ranked.index(u) for u in mine)
    covered = Counter(pool.strata[i] for i in pool.shots)
    assert set(covered) == set(want) and sum(covered.values()) == 15
    en = [u.text for u in pool.entries if u.lang == "en"]
    x = embedder.encode(en)
    sims = x @ x.T
    np.fill_diagonal(sims, 0)
    assert sims.max() < 0.82


def test_a_log_without_domains_is_stratified_by_clusters() -> None:
    """Unlabelled lines: KMeans on the judge's vectors (here the Chinese TF-IDF guard) gives the strata."""
    from dataclasses import replace

    lines = [
        replace(u, domain=None, intent=None, confidence=0.9)
        for u in read_log(FIXTURES / "crosswoz_sample.json.zip")
    ]
    judge = CharTfidfJudge([u.text for u in lines])
    pool = build_pool(lines, lambda lang: judge, top_n=30, threshold=0.82, shot_set_size=6, seed=0)
    assert pool.strata_from == "kmeans" and pool.k is not None and 2 <= pool.k <= 10
    assert pool.silhouette is not None
    assert len(pool.entries) == 30 and all(s.startswith("zh-cluster-") for s in pool.strata)
    assert len(set(pool.strata)) == pool.k  # every cluster is represented (floor 1)
    x = judge.vectors([u.text for u in pool.entries])
    sims = (x @ x.T).toarray()
    np.fill_diagonal(sims, 0)
    assert sims.max() < 0.82
