"""Prefix-cache eviction policies in the BlockManager: S3-FIFO keeps a reused prefix through a scan
of one-off prompts where LRU loses it, honours a warmup's priority, and no policy breaks lookups."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.common.errors import ConfigError
from harness.target.engine.kv_cache import EVICTION_POLICIES, BlockManager

BS = 4
HOT = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # two full (cached) blocks and one token


def run(bm: BlockManager, seq_id: str, tokens: list[int], priority: int = 0) -> int:
    """One request: allocate, write the prompt's K/V, finish; returns its cached tokens."""
    cached = bm.allocate(seq_id, tokens, priority)
    bm.record_written(seq_id, tokens, len(tokens))
    bm.free(seq_id)
    return cached


def scan(bm: BlockManager, n: int, tag: int = 0) -> None:
    """``n`` one-off prompts of the hot prompt's size, sharing nothing (scans with other tags too)."""
    for i in range(n):
        base = 1000 * (tag + 1) + 10 * i
        assert run(bm, f"scan-{i}", [base + j for j in range(len(HOT))]) == 0


@pytest.mark.parametrize(("eviction", "kept"), [("lru", False), ("s3fifo", True)])
def test_a_reused_prefix_survives_a_scan_of_one_off_prompts(eviction: str, kept: bool) -> None:
    """8 blocks; the hot prompt is used twice (its two blocks hit once), then ten one-off prompts
    of three blocks each pass. LRU evicts the hot blocks as soon as the free list runs out; S3-FIFO
    moves them to its main queue when they reach the end of the small one (they were hit there)
    and evicts the one-off blocks (never hit) from the small queue instead."""
    bm = BlockManager(8, BS, eviction=eviction)
    assert run(bm, "hot-1", HOT) == 0
    assert run(bm, "hot-2", HOT) == 2 * BS
    scan(bm, 10)
    assert run(bm, "hot-3", HOT) == (2 * BS if kept else 0)


@pytest.mark.parametrize(("priority", "kept"), [(0, False), (1, True)])
def test_a_warmup_priority_keeps_a_preloaded_prefix_resident(priority: int, kept: bool) -> None:
    """A prompt preloaded once (no hit yet) is a one-off to S3-FIFO unless its sequence carries a
    priority: then its blocks are registered in the main queue with that many second chances."""
    bm = BlockManager(8, BS, eviction="s3fifo")
    assert run(bm, "warm", HOT, priority) == 0
    scan(bm, 10)
    assert run(bm, "first-use", HOT) == (2 * BS if kept else 0)


def test_a_block_evicted_unhit_and_needed_again_goes_to_main() -> None:
    """The hot prompt is evicted unhit (its hashes go to the ghost queue); recomputed soon after,
    its blocks register in main, so the next scan does not evict them."""
    bm = BlockManager(8, BS, eviction="s3fifo")
    run(bm, "hot-1", HOT)
    scan(bm, 4)
    assert run(bm, "hot-2", HOT) == 0  # evicted from the small queue, remembered in the ghost
    scan(bm, 10, tag=1)
    assert run(bm, "hot-3", HOT) == 2 * BS


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="lru"):
        BlockManager(8, BS, eviction="nope")


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(EVICTION_POLICIES.names()),
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(1, 3 * BS)), min_size=1, max_size=40
    ),
)
def test_no_policy_breaks_lookups(eviction: str, prompts: list[tuple[int, int, int]]) -> None:
    """Random prompts over a few shared prefixes (so parents get evicted while children stay
    cached): every hit is a block-aligned prefix of the prompt that was written before with the
    same tokens (``validate`` checks the shared blocks' tokens and holders), and with two requests
    in flight the pool never runs out."""
    bm = BlockManager(10, BS, eviction=eviction)
    held: dict[str, list[int]] = {}
    for i, (a, b, tail) in enumerate(prompts):
        tokens = [a] * BS + [10 + b] * BS + [20 + i] * tail
        seq = f"s{i}"
        cached = bm.allocate(seq, tokens)
        assert cached % BS == 0 and cached < len(tokens)
        bm.record_written(seq, tokens, len(tokens))
        held[seq] = tokens
        bm.validate(held.items())
        if len(held) == 2:  # finish the older one
            old = next(iter(held))
            bm.free(old)
            del held[old]
    for seq in list(held):
        bm.free(seq)
    assert bm.num_free == bm.num_blocks


def test_the_engine_setting_chooses_the_policy() -> None:
    """``prefix_eviction`` reaches the engine's block manager (and ``lru`` stays the default)."""
    from harness.target.engine.factory import create_core
    from harness.target.engine.kv_cache import LruEviction, S3FifoEviction

    from .conftest import tiny_settings

    default, _ = create_core(tiny_settings(num_kv_blocks=16, block_size=4))
    assert isinstance(default.blocks._evictable, LruEviction)
    chosen, _ = create_core(tiny_settings(num_kv_blocks=16, block_size=4, prefix_eviction="s3fifo"))
    assert isinstance(chosen.blocks._evictable, S3FifoEviction)
