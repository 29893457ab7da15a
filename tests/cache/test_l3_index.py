"""The per-tenant FAISS index on its own (random unit vectors, no embedder): exact search against
brute force, replacement of a re-written key, the entry cap, tombstone compaction, HNSW switch."""

from __future__ import annotations

import time

import numpy as np

from harness.target.cache.l3 import L3Entry, TenantIndex
from harness.target.cache.settings import CacheSettings
from tests.cache.conftest import completion

DIM = 32


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    out: np.ndarray = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def entry(key: str, ttl: float = 60.0) -> L3Entry:
    return L3Entry(key, "p", (), 0, completion(key), time.time() + ttl, "warm", key)


def settings(**kw: object) -> CacheSettings:
    return CacheSettings(redis_url=None, **kw)  # type: ignore[arg-type]


def test_flat_search_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    idx = TenantIndex(DIM, settings())
    x = unit(rng, 300)
    for i, v in enumerate(x):
        idx.add(v, entry(f"k{i}"))
    for q in unit(rng, 20):
        best = int(np.argmax(x @ q))
        score, e, pos = idx.search(q, 8)[0]
        assert e.key == f"k{best}" and pos == best
        assert abs(score - float(x[best] @ q)) < 1e-5


def test_rewrite_replaces_cap_evicts_oldest_and_tombstones_compact() -> None:
    rng = np.random.default_rng(1)
    idx = TenantIndex(DIM, settings(l3_max_entries=100))
    x = unit(rng, 150)
    for i in range(100):
        idx.add(x[i], entry(f"k{i}"))
    idx.add(x[100], entry("k5"))  # k5 again: the old k5 goes
    assert idx.live == 100 and sum(1 for e in idx.entries if e is not None and e.key == "k5") == 1
    hits = idx.search(x[5], 3)
    assert all(e.key != "k5" or pos == idx.pos["k5"] for _, e, pos in hits)
    for i in range(101, 150):  # past the cap: the oldest live entries are dropped
        idx.add(x[i], entry(f"n{i}"))
    assert idx.live == 100 and idx.evictions == 49
    assert "k0" not in idx.pos and "n149" in idx.pos
    assert len(idx.entries) <= 2 * idx.live  # compacted when half was dead
    for key, pos in idx.pos.items():
        e = idx.entries[pos]
        assert e is not None and e.key == key


def test_expiry_and_switch_to_hnsw() -> None:
    rng = np.random.default_rng(2)
    idx = TenantIndex(DIM, settings(l3_hnsw_min=50))
    x = unit(rng, 60)
    for i in range(60):
        idx.add(x[i], entry(f"k{i}", ttl=0.0 if i < 5 else 60.0))
    assert idx.kind == "hnsw"
    assert idx.expire(time.time()) == 5 and idx.live == 55
    found = idx.search(x[30], 4)
    assert found[0][1].key == "k30" and abs(found[0][0] - 1.0) < 1e-4
    rec = idx.index.reconstruct_n(0, idx.index.ntotal)
    assert np.max(np.abs(rec - idx.vectors)) < 1e-5
