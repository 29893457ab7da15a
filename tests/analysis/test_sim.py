"""Cache simulators against sequences worked out by hand, and MIN against exhaustive search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.references import RefTrace
from harness.analysis.sim import (
    NEVER,
    history_preload,
    hitrate_report,
    next_use,
    optimal_preload,
    simulate,
    simulate_lfu,
    simulate_lru,
    simulate_lru_protect,
    simulate_min,
)


def keys(seq: str) -> np.ndarray:
    """'ABCA' → [0, 1, 2, 0]."""
    return np.array([ord(c) - ord("A") for c in seq], dtype=np.int64)


def test_next_use_by_hand() -> None:
    nu = next_use(keys("ABACBA"))
    assert nu.tolist() == [2, 4, 5, NEVER, NEVER, NEVER]


def test_belady_textbook_sequence() -> None:
    """7 0 1 2 0 3 0 4 2 3 0 3 2 with 3 slots, by hand. Dead keys (7, 1, 4: never used again) are
    not admitted, so 0, 2 and 3 stay from their first use on: misses at 0, 1, 2, 3, 5, 7 and hits
    at 4, 6, 8, 9, 10, 11, 12 (7 hits). Demand-paging OPT, which must admit 4 and so evicts 0 at
    position 7, gets 6: a ceiling that admits everything is not the ceiling.
    """
    seq = np.array([7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2], dtype=np.int64)
    c = simulate_min(seq, 3, (), True)
    assert c.hits == 7
    assert c.hit_refs is not None
    assert np.flatnonzero(c.hit_refs).tolist() == [4, 6, 8, 9, 10, 11, 12]


def test_belady_capacity_one_and_all_distinct() -> None:
    assert simulate_min(keys("AAAA"), 1).hits == 3
    assert simulate_min(keys("ABAB"), 1).hits == 1  # keep A for its reuse at 2, then B at 3 is a miss
    assert simulate_min(keys("ABCD"), 2).hits == 0


def test_lru_by_hand() -> None:
    # capacity 2: A B A C B A → A miss, B miss, A hit, C miss (evict B), B miss (evict A), A miss.
    c = simulate_lru(keys("ABACBA"), 2, (), True)
    assert c.hits == 1 and c.hit_refs is not None and c.hit_refs.tolist() == [0, 0, 1, 0, 0, 0]
    # MIN on the same sequence: A B A(hit) C (evict C itself? next uses: A@5, B@4, C never → not admitted)
    # B hit, A hit.
    assert simulate_min(keys("ABACBA"), 2).hits == 3


def test_lfu_by_hand() -> None:
    # capacity 2: A A B C A → A miss, A hit (A:2), B miss (B:1), C miss evicts B (fewest uses), A hit.
    c = simulate_lfu(keys("AABCA"), 2, (), True)
    assert c.hits == 2 and c.hit_refs is not None and c.hit_refs.tolist() == [0, 1, 0, 0, 1]
    # LRU would have evicted A at C (A B are used at 1, 2): A's last hit is lost.
    assert simulate_lru(keys("AABCA"), 2).hits == 1


def test_warm_start_by_hand() -> None:
    seq = keys("CABCD")
    # Optimal preload at capacity 2: the two keys used first (C, A).
    assert optimal_preload(seq, 2) == [2, 0]
    assert (
        simulate_min(seq, 2, [2, 0]).hits == 3
    )  # C, A hit; B misses; C hits again (B is dead: not admitted)
    # LRU from [B, C] (B least recent): C hit, A miss evicts B, B miss evicts C, C miss …
    assert simulate_lru(seq, 2, [1, 2]).hits == 1
    # Preloaded keys count 0 in LFU: one real use outranks them.
    assert simulate_lfu(keys("AB"), 1, [1]).hits == 0


def test_history_preload_and_lru_protect_by_hand() -> None:
    seq = keys("CABCD")
    # Only A, B and D were seen: the best two of them are those used first, A and B.
    assert history_preload(seq, np.array([0, 1, 3]), 2) == [0, 1]
    assert simulate_min(seq, 2, [0, 1]).hits == 2  # C is new to the history: a miss either way
    # Preload A, capacity 2. LRU: Y flushes A, then X and Y hit, A misses. Protected: X and Y
    # fight over the one unprotected slot (no hit), and A is still there for its use.
    lru = simulate_lru(keys("XYXYA"), 2, [0], True)
    prot = simulate_lru_protect(keys("XYXYA"), 2, [0], True)
    assert lru.hit_refs is not None and lru.hit_refs.tolist() == [0, 0, 1, 1, 0]
    assert prot.hits == 1 and prot.hit_refs is not None and prot.hit_refs.tolist() == [0, 0, 0, 0, 1]
    # With every slot protected and unused, the least valuable preload goes first.
    assert simulate_lru_protect(keys("XCB"), 2, [1, 2]).hits == 1


def _brute_force(seq: list[int], capacity: int, initial: frozenset[int] = frozenset()) -> int:
    """Best hit count over every admission and eviction choice (exponential: tiny inputs only)."""
    best = 0

    def walk(i: int, cache: frozenset[int], hits: int) -> None:
        nonlocal best
        if hits + (len(seq) - i) <= best:
            return
        if i == len(seq):
            best = max(best, hits)
            return
        k = seq[i]
        if k in cache:
            walk(i + 1, cache, hits + 1)
            return
        walk(i + 1, cache, hits)  # not admitted
        if len(cache) < capacity:
            walk(i + 1, cache | {k}, hits)
        else:
            for v in cache:
                walk(i + 1, (cache - {v}) | {k}, hits)

    walk(0, initial, 0)
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=10), st.integers(1, 3))
def test_min_equals_exhaustive_search(seq: list[int], capacity: int) -> None:
    arr = np.asarray(seq, dtype=np.int64)
    assert simulate_min(arr, capacity).hits == _brute_force(seq, capacity)
    # The optimal preload with MIN beats every other warm start.
    warm = simulate_min(arr, capacity, optimal_preload(arr, capacity)).hits
    best_warm = max(
        _brute_force(seq, capacity, frozenset(s)) for s in itertools.combinations(range(5), capacity)
    )
    assert warm == best_warm


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=9), st.integers(1, 3), st.sets(st.integers(0, 4)))
def test_history_preload_is_the_best_allowed_warm_start(
    seq: list[int], capacity: int, seen: set[int]
) -> None:
    arr = np.asarray(seq, dtype=np.int64)
    warm = simulate_min(arr, capacity, history_preload(arr, np.array(sorted(seen), dtype=np.int64), capacity))
    best = max(
        _brute_force(seq, capacity, frozenset(s))
        for n in range(min(capacity, len(seen)) + 1)
        for s in itertools.combinations(sorted(seen), n)
    )
    assert warm.hits == best


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.integers(1, 5))
def test_min_is_a_ceiling(seq: list[int], capacity: int) -> None:
    arr = np.asarray(seq, dtype=np.int64)
    m = simulate_min(arr, capacity).hits
    assert simulate_lru(arr, capacity).hits <= m
    assert simulate_lfu(arr, capacity).hits <= m
    assert (
        simulate_lru_protect(arr, capacity, list(range(capacity))).hits
        <= simulate_min(arr, capacity, list(range(capacity))).hits
    )
    assert m <= len(seq) - len(set(seq))  # compulsory misses


def _trace(seq: str) -> RefTrace:
    k = keys(seq)
    return RefTrace(
        unit="entries",
        keys=k,
        req=np.arange(k.size, dtype=np.int64),
        arrival_s=np.arange(k.size, dtype=np.float64),
        labels=list(range(26)),
        source="hand",
    )


def test_report_and_bad_capacity() -> None:
    rep = hitrate_report(_trace("ABACBA"), [2])
    by = {r.policy: r for r in rep.results}
    assert (by["min"].hits, by["lru"].hits) == (3, 1)
    assert rep.distinct == 3 and rep.cold_ceiling == pytest.approx(0.5)
    assert all(r.requests_per_s > 0 for r in rep.results)
    from harness.common.errors import InputError

    with pytest.raises(InputError, match="capacity"):
        simulate(_trace("AB"), 0)
