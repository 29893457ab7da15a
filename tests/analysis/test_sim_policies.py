"""The scan-resistant simulators (S3-FIFO, W-TinyLFU) on sequences worked out by hand, and every
online simulator against MIN's ceiling."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.sim import (
    SIMULATORS,
    simulate_lru,
    simulate_min,
    simulate_s3fifo,
    simulate_s3fifo_seeded,
    simulate_tinylfu,
)

ONLINE = [name for name in SIMULATORS.names() if name != "min"]


def keys(seq: str) -> np.ndarray:
    """'ABCA' → [0, 1, 2, 0]."""
    return np.array([ord(c) - ord("A") for c in seq], dtype=np.int64)


def hit_positions(sim: object, seq: str, capacity: int, initial: list[int] | None = None) -> list[int]:
    c = SIMULATORS.get(str(sim))(keys(seq), capacity, initial or [], True)
    assert c.hit_refs is not None
    return np.flatnonzero(c.hit_refs).tolist()


def test_s3fifo_keeps_a_reused_key_through_a_scan() -> None:
    """Capacity 3 (small queue 1). A is hit on probation, so when the small queue overflows at D it
    moves to the main queue; B, C, D, E, F, G then cycle through the small queue (each evicted
    unhit, to the ghost) and A is still there at the end. LRU loses A at D."""
    seq = "AABCDEFGA"
    assert hit_positions("s3fifo", seq, 3) == [1, 8]
    assert hit_positions("lru", seq, 3) == [1]


def test_s3fifo_ghost_hit_goes_to_the_main_queue() -> None:
    """Capacity 2 (small queue 1): A is evicted unhit at C (to the ghost); its miss at 3 sends it to
    the main queue, where the later newcomers (D) do not reach it: hits at 4 and 6."""
    assert hit_positions("s3fifo", "ABCAADA", 2) == [4, 6]


def test_s3fifo_warm_start_survives_one_off_keys() -> None:
    """A preloaded key sits in the main queue; one-off keys only churn the small queue. LRU from the
    same preload has evicted X by the time it is used."""
    x = ord("X") - ord("A")
    assert hit_positions("s3fifo", "BCDX", 2, [x]) == [3]
    assert simulate_lru(keys("BCDX"), 2, [x]).hits == 0


def test_s3fifo_seeded_gives_the_better_half_more_passes() -> None:
    """Capacity 3 (small queue 1) from the preload [P, Q]: P is the less valuable half (frequency
    1), Q the better (frequency 3). A and B are hit on probation, and each move to the main queue
    forces main evictions: at B's miss P spends its point, Q one of its three, and A (fresh in main
    at 0) goes; at C's miss P goes. Q is there for its use: hits at A, B and Q. Unseeded (both at
    0), P goes at B's miss and Q at C's."""
    p, q = ord("P") - ord("A"), ord("Q") - ord("A")
    seq = keys("AABBCDEQ")
    assert simulate_s3fifo_seeded(seq, 3, [p, q]).hits == 3
    assert simulate_s3fifo(seq, 3, [p, q]).hits == 2


def test_tinylfu_admits_only_keys_seen_more_often_than_the_victim() -> None:
    """Capacity 3: window 1, main 2 (protected 1). A (count 2) and B fill the main cache; C, D and E
    (count 1 each) leave the window but are refused (A, the victim, counts 2), so A hits at the
    end. LRU loses it."""
    seq = "AABCDEA"
    assert hit_positions("tinylfu", seq, 3) == [1, 6]
    assert simulate_lru(keys(seq), 3).hits == 1
    # A newcomer seen twice beats a victim seen once: C, pushed out of the window after its second
    # miss (count 2), displaces A (count 1) and hits at the end.
    assert simulate_tinylfu(keys("ABDCXCYC"), 3).hits == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 7), min_size=1, max_size=60),
    st.integers(1, 6),
    st.lists(st.integers(0, 9), unique=True, max_size=6),
)
def test_no_online_policy_beats_min_from_the_same_warm_start(
    seq: list[int], capacity: int, initial: list[int]
) -> None:
    arr = np.asarray(seq, dtype=np.int64)
    ceiling = simulate_min(arr, capacity, initial).hits
    for name in ONLINE:
        c = SIMULATORS.get(name)(arr, capacity, initial, True)
        assert c.hits <= ceiling, name
        assert c.hit_refs is not None and int(c.hit_refs.sum()) == c.hits, name


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=40))
def test_every_policy_reaches_the_cold_ceiling_when_everything_fits(seq: list[int]) -> None:
    arr = np.asarray(seq, dtype=np.int64)
    for name in SIMULATORS.names():
        assert SIMULATORS.get(name)(arr, len(set(seq)), (), False).hits == len(seq) - len(set(seq)), name
