"""Dedup exactness against brute force, on real MiniLM embeddings and on planted random vectors."""

from __future__ import annotations

import numpy as np
import pytest

from harness.corpus.dedup import dedup, pairs_exact, pairs_faiss, surviving_pairs

PARAPHRASES = [
    ("How do I reset my password?", "What are the steps to reset my password?"),
    ("Book a hotel room in Paris for next weekend.", "Reserve a hotel in Paris for the coming weekend."),
    ("My package has not arrived yet.", "My parcel still hasn't been delivered."),
    ("What is the weather like in Tokyo today?", "How is the weather in Tokyo today?"),
    ("Cancel my subscription, please.", "Please cancel my subscription."),
    ("I lost my credit card, block it now.", "My credit card is lost, please block it immediately."),
]
UNRELATED = [
    "The mitochondria is the powerhouse of the cell.",
    "Order two vegetarian pizzas for dinner.",
    "Which mobile plan has the best coverage downtown?",
    "Explain the rules of cricket to a beginner.",
    "The train to Lyon leaves at nine.",
    "Recommend a novel about the sea.",
]


def brute_force_keep(x: np.ndarray, t: float) -> list[int]:
    """Independent reference: the full similarity matrix and a plain Python greedy loop."""
    sims = x.astype(np.float64) @ x.astype(np.float64).T
    kept = np.zeros(len(x), dtype=bool)
    for j in range(len(x)):
        kept[j] = not (sims[kept, j] >= t).any()
    return np.flatnonzero(kept).tolist()


def brute_pairs(x: np.ndarray, t: float) -> set[tuple[int, int]]:
    sims = x.astype(np.float64) @ x.astype(np.float64).T
    i, j = np.nonzero(np.triu(sims >= t, k=1))
    return set(zip(i.tolist(), j.tolist(), strict=True))


@pytest.mark.slow
def test_minilm_paraphrases_match_brute_force(embedder) -> None:
    texts = [a for a, _ in PARAPHRASES] + UNRELATED + [b for _, b in PARAPHRASES]
    x = embedder.encode(texts)
    res = dedup(x, 0.82, method="exact")
    expected = brute_force_keep(x, 0.82)
    assert res.keep.tolist() == expected
    # Sanity on the model itself: most paraphrase pairs are above 0.82, unrelated sentences far below.
    n = len(PARAPHRASES)
    para = [float(x[i] @ x[len(texts) - n + i]) for i in range(n)]
    assert sum(p >= 0.82 for p in para) >= n - 2
    unrelated = x[n : n + len(UNRELATED)]
    off = unrelated @ unrelated.T
    assert off[np.triu_indices(len(UNRELATED), 1)].max() < 0.6
    # Every dropped item is a second half paraphrase whose representative is its first half.
    for d, rep in res.dropped.items():
        assert d >= len(texts) - n and rep == d - (len(texts) - n)
    assert surviving_pairs(x, res.keep, 0.82) == 0


def planted(n: int, d: int, dups: int, seed: int, topics: int = 0) -> np.ndarray:
    """Random unit vectors (isotropic, or around ``topics`` directions like embeddings) + planted pairs."""
    rng = np.random.default_rng(seed)
    if topics:
        centers = rng.standard_normal((topics, d)).astype(np.float32)
        centers /= np.linalg.norm(centers, axis=1, keepdims=True)
        x = centers[rng.integers(0, topics, n)] + rng.standard_normal((n, d)).astype(
            np.float32
        ) * 1.2 / np.sqrt(d)
    else:
        x = rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    src = rng.integers(0, n, dups)
    dst = rng.choice(n, dups, replace=False)
    for s, t in zip(src, dst, strict=True):
        if s == t:
            continue
        c = rng.uniform(0.83, 0.99)
        z = rng.standard_normal(d).astype(np.float32)
        z -= (z @ x[s]) * x[s]
        z /= np.linalg.norm(z)
        x[t] = c * x[s] + np.sqrt(1 - c * c) * z
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("method", "topics", "params"),
    [
        ("exact", 0, {}),
        ("exact", 100, {}),
        # Embedding-like data with the default partition: every pair found (as in the benchmark).
        ("faiss", 100, {}),
        # Isotropic vectors are the worst case for any partition: probe half the lists.
        ("faiss", 0, {"nlist": 32, "nprobe": 16}),
    ],
)
def test_planted_duplicates_match_brute_force(method: str, topics: int, params: dict[str, int]) -> None:
    x = planted(4000, 64, 300, seed=5, topics=topics)
    truth = brute_pairs(x, 0.82)
    assert len(truth) >= 250  # the planted pairs (and chains of them) are really there
    found = pairs_exact(x, 0.82) if method == "exact" else pairs_faiss(x, 0.82, **params)
    assert set(zip(found[0].tolist(), found[1].tolist(), strict=True)) == truth
    res = dedup(x, 0.82, method=method, **params)
    assert res.keep.tolist() == brute_force_keep(x, 0.82)
    assert surviving_pairs(x, res.keep, 0.82) == 0


def test_keep_order_is_first_come() -> None:
    v = np.array([[1.0, 0.0], [0.9, np.sqrt(1 - 0.81)], [0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    res = dedup(v, 0.82, method="exact")
    assert res.keep.tolist() == [0, 2]
    assert res.dropped == {1: 0, 3: 0}
