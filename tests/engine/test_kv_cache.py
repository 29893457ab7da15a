"""BlockManager on its own: chained prefix hashes, reference counts, eviction, validation.

Every test runs under every eviction policy (:data:`~harness.target.engine.kv_cache.EVICTION_POLICIES`).
"""

from __future__ import annotations

import pytest

from harness.common.errors import CheckFailed
from harness.target.engine.kv_cache import EVICTION_POLICIES, BlockManager

BS = 4


@pytest.fixture(params=EVICTION_POLICIES.names())
def eviction(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def fill(bm: BlockManager, seq_id: str, tokens: list[int]) -> int:
    """Allocate like the engine does and record the prompt's K/V as written; returns cached tokens."""
    cached = bm.allocate(seq_id, tokens)
    bm.record_written(seq_id, tokens, len(tokens))
    return cached


def test_hit_needs_the_whole_prefix_not_just_the_block(eviction: str) -> None:
    bm = BlockManager(16, BS, eviction=eviction)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    fill(bm, "a", a)
    # Same second block (5..8) after a different first block: no hit at all.
    assert fill(bm, "b", [0, 0, 0, 0, 5, 6, 7, 8, 9]) == 0
    # Same first block only: one block.
    assert fill(bm, "c", [1, 2, 3, 4, 0, 0, 0, 0, 9]) == BS
    # Both blocks: two; and never the whole prompt (8 tokens = 2 full blocks → last token recomputed).
    assert fill(bm, "d", [1, 2, 3, 4, 5, 6, 7, 8, 42]) == 2 * BS
    assert bm.allocate("e", [1, 2, 3, 4, 5, 6, 7, 8]) == BS
    seqs = {
        "a": a,
        "b": [0, 0, 0, 0, 5, 6, 7, 8, 9],
        "c": [1, 2, 3, 4, 0, 0, 0, 0, 9],
        "d": [1, 2, 3, 4, 5, 6, 7, 8, 42],
    }
    bm.record_written("e", [1, 2, 3, 4, 5, 6, 7, 8], 8)
    seqs["e"] = [1, 2, 3, 4, 5, 6, 7, 8]
    bm.validate(seqs.items())
    assert bm.blocks[bm.tables["a"].blocks[0].block_id].ref_count == 4  # a, c, d, e


def test_shared_blocks_survive_until_last_holder_frees_and_stay_cached(eviction: str) -> None:
    bm = BlockManager(8, BS, eviction=eviction)
    p = [1, 2, 3, 4, 5]
    fill(bm, "a", p)
    fill(bm, "b", p)
    shared = bm.tables["a"].blocks[0]
    assert shared is bm.tables["b"].blocks[0] and shared.ref_count == 2
    bm.free("a")
    assert shared.ref_count == 1 and bm.num_used == 2  # b's two blocks
    bm.free("b")
    assert bm.num_used == 0 and bm.num_cached_free == 1  # the full block stays cached
    assert fill(bm, "c", p) == BS


def test_the_oldest_unhit_cached_block_is_evicted_first(eviction: str) -> None:
    bm = BlockManager(4, BS, eviction=eviction)
    # Three one-block prefixes, freed in the order x, y, z (x least recently used).
    for name, tok in (("x", 10), ("y", 20), ("z", 30)):
        fill(bm, name, [tok] * BS)  # exactly one (full, hence hashed) block
    for name in ("x", "y", "z"):
        bm.free(name)
    assert bm.num_cached_free == 3 and bm.num_free == 4
    # Two fresh blocks needed: the never-hashed free block first, then the LRU cached one (x).
    fill(bm, "n", [7] * (2 * BS - 1))
    assert fill(bm, "y2", [20] * BS + [1]) == BS  # y still cached
    bm.free("y2")
    bm.free("n")
    assert fill(bm, "x2", [10] * BS + [1]) == 0  # x was evicted


def test_can_admit_counts_cached_hits_as_no_longer_free(eviction: str) -> None:
    bm = BlockManager(3, BS, eviction=eviction)
    p = [5] * BS + [6]
    fill(bm, "a", p)
    bm.free("a")
    # 3 free (one of them the cached prefix). A 2-block prompt with that prefix needs 1 new block.
    assert bm.can_admit(p, reserve=1)
    assert not bm.can_admit([1] * (3 * BS + 1))  # 4 blocks never fit


def test_validate_catches_ref_count_mismatch(eviction: str) -> None:
    bm = BlockManager(8, BS, eviction=eviction)
    fill(bm, "a", [1, 2, 3, 4, 5])
    bm.validate([("a", [1, 2, 3, 4, 5])])
    bm.tables["a"].blocks[0].ref_count = 2
    with pytest.raises(CheckFailed, match="ref_count"):
        bm.validate([("a", [1, 2, 3, 4, 5])])


def test_validate_catches_tokens_past_length_in_cache(eviction: str) -> None:
    bm = BlockManager(8, BS, eviction=eviction)
    fill(bm, "a", [1, 2, 3, 4, 5])
    with pytest.raises(CheckFailed, match="only 4 tokens"):
        bm.validate([("a", [1, 2, 3, 4])])


def test_reset_prefix_cache_forgets_cached_and_held_blocks(eviction: str) -> None:
    """After a reset no prompt hits a block cached before it, also not one a running sequence holds."""
    bm = BlockManager(16, BS, eviction=eviction)
    p = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    fill(bm, "done", p)
    bm.free("done")  # two full blocks parked in the LRU
    fill(bm, "running", [11, 12, 13, 14, 15])  # one full block held by a live sequence
    assert bm.num_cached_free == 2
    assert bm.reset_prefix_cache() == 2
    assert bm.num_cached_free == 0 and bm.num_used == 2  # "running" keeps its own blocks
    assert fill(bm, "again", p) == 0
    assert fill(bm, "twin", [11, 12, 13, 14, 15]) == 0
    bm.validate({"running": [11, 12, 13, 14, 15], "again": p, "twin": [11, 12, 13, 14, 15]}.items())
    # The held block lost its hash, so it returns to the free list, not the cache, when released.
    bm.free("running")
    assert bm.num_cached_free == 0
    # Blocks written after the reset are cached as usual.
    bm.free("again")
    assert fill(bm, "third", p) == 2 * BS


def test_blocks_are_counted_where_they_are_taken(eviction: str) -> None:
    bm = BlockManager(16, BS, eviction=eviction)
    a = list(range(1, 11))  # 10 tokens: 3 blocks, 2 of them full
    fill(bm, "a", a)
    assert bm.tables["a"].taken == bm.blocks_taken == 3
    assert fill(bm, "b", [*a[:8], 99, 98, 97]) == 2 * BS  # shares 2 blocks, takes 1
    assert bm.tables["b"].taken == 1 and bm.blocks_taken == 4
    bm.ensure_capacity("b", 13)  # a 4th block for decode
    assert bm.tables["b"].taken == 2 and bm.blocks_taken == 5


def test_a_sequence_without_the_prefix_cache_neither_shares_nor_registers(eviction: str) -> None:
    bm = BlockManager(16, BS, eviction=eviction)
    a = list(range(1, 11))
    fill(bm, "a", a)
    assert bm.can_admit(a, reserve=16 - 3 - 1) and not bm.can_admit(a, 16 - 3 - 1, use_prefix_cache=False)
    assert bm.allocate("b", a, use_prefix_cache=False) == 0
    bm.record_written("b", a, len(a))
    assert bm.tables["b"].taken == 3
    bm.validate([("a", a), ("b", a)])
    fresh = list(range(50, 60))
    assert bm.allocate("c", fresh, use_prefix_cache=False) == 0
    bm.record_written("c", fresh, len(fresh))
    bm.free("c")
    assert bm.allocate("d", fresh) == 0  # "c" registered nothing
    assert bm.prefix_hit_tokens == 0 and bm.prefix_query_tokens == 4 * len(a)


def test_over_allocated_blocks_are_taken_never_cached_and_all_given_back(eviction: str) -> None:
    """The over-allocation fault injection: ``ceil(F × n)`` more blocks really leave the pool (and
    evict cached ones under pressure), but they hold nothing, enter no prefix table and are all free
    again once the sequence is."""
    bm = BlockManager(16, BS, eviction=eviction, overalloc=0.5)
    a = list(range(1, 18))  # 17 tokens: 5 blocks, 4 of them full
    fill(bm, "a", a)
    t = bm.tables["a"]
    assert (len(t.blocks), len(t.extra)) == (5, 3)  # ceil(0.5 × 5) extra
    assert t.taken == bm.blocks_taken == bm.num_used == 8
    assert all(not b.tokens and b.block_hash is None and b.ref_count == 1 for b in t.extra)
    bm.validate([("a", a)])
    bm.free("a")
    assert bm.num_free == 16 and bm.num_cached_free == 4  # the 4 full prompt blocks, no extra
    # Again: 4 blocks shared, 1 taken for the last token and ceil(0.5 × 1) extra.
    assert fill(bm, "a2", a) == 4 * BS and bm.tables["a2"].taken == 2
    bm.free("a2")
    # 10 new blocks + 5 extra out of 12 never-hashed free ones: 3 cached blocks are evicted.
    big = list(range(100, 140))
    assert bm.can_admit(big) and not bm.can_admit([*big, 1])  # 11 + 6 > 16
    fill(bm, "big", big)
    assert bm.num_free == 1 and bm.num_cached_free == 1 and len(bm.match_prefix(a)) <= 1
    bm.validate([("big", big)])
    bm.free("big")
    assert bm.num_free == 16 and bm.num_cached_free == 1 + 10  # big's 10 full blocks, no extra


def test_the_over_allocation_is_a_ceiling_of_exact_decimals_and_can_be_capped() -> None:
    def extra(f: float, needed: int, limit: int | None = None) -> int:
        return BlockManager(4, BS, overalloc=f).extra_blocks(needed, limit)

    assert extra(0.0, 10) == 0 and extra(0.2, 0) == 0
    assert 0.28 * 25 > 7 and extra(0.28, 25) == 7  # not 8: the float product is 7.000000000000001
    assert extra(0.2, 5) == 1 and extra(0.2, 6) == 2 and extra(0.2, 40) == 8
    assert extra(0.2, 40, limit=3) == 3 and extra(0.2, 40, limit=-1) == 0
    with pytest.raises(ValueError, match="overalloc"):
        BlockManager(4, BS, overalloc=float("nan"))


def test_validate_catches_an_over_allocated_block_that_was_written(eviction: str) -> None:
    bm = BlockManager(8, BS, eviction=eviction, overalloc=1.0)
    fill(bm, "a", [1, 2, 3, 4, 5])
    bm.validate([("a", [1, 2, 3, 4, 5])])
    bm.tables["a"].extra[0].tokens.append(7)
    with pytest.raises(CheckFailed, match="over-allocated"):
        bm.validate([("a", [1, 2, 3, 4, 5])])
