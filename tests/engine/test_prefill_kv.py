"""``prefill_kv_bytes`` is what the block manager allocated, and ``use_prefix_cache=False`` misses.

The engine counts the KV blocks a request takes from the pool where the block manager hands them
out (``BlockTable.taken``); these tests hold that count against the pool's own total
(``BlockManager.blocks_taken``), read before the request is added and after the step that sampled
its first token, for a cold prompt, a prompt sharing a cached prefix, a chunked prefill, a prefill
preempted half way, and a request told not to use the prefix cache. One request runs at a time, so
every block the pool handed out in that window was this request's. The over-allocation fault
injection (``inject_kv_overalloc``) raises that count by about F and gives every block back.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.target.engine.api import RequestMetrics, SamplingParams, TokenEvent
from harness.target.engine.core import EngineCore
from harness.target.engine.factory import create_core

from .conftest import tiny_settings

BS = 4
PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


@pytest.fixture
def core() -> EngineCore:
    c, _ = create_core(tiny_settings(num_kv_blocks=256, block_size=BS))
    return c


def ids(start: int, n: int) -> list[int]:
    """``n`` distinct token ids of the tiny vocabulary (no tokenizer: exact lengths)."""
    return list(range(1000 + start, 1000 + start + n))


@dataclass
class Run:
    metrics: RequestMetrics
    tokens: list[int]
    pool_blocks_at_first_token: int
    """Blocks the pool handed out from ``add_request`` to the end of the step that sampled the first token."""
    pool_blocks_total: int
    """… and to the end of the request (decode blocks included)."""
    prefill_steps: int


def run(c: EngineCore, rid: str, prompt: list[int], *, preempt_after: int | None = None, **kw: bool) -> Run:
    before = c.blocks.blocks_taken
    req = c.add_request(rid, prompt, PARAMS, **kw)
    events: list[TokenEvent] = []
    at_first: int | None = None
    steps = 0
    while c.has_work():
        evs = c.step()
        steps += at_first is None
        c.validate()
        if preempt_after is not None and steps == preempt_after:
            assert not req.prefill_done, "the prefill ended before the preemption the test wanted"
            c._preempt(req)  # what the scheduler does when the pool runs out mid-prefill
        if at_first is None and any(e.token_id is not None for e in evs):
            at_first = c.blocks.blocks_taken - before
        events += evs
    assert at_first is not None and events[-1].metrics is not None
    return Run(
        events[-1].metrics,
        [e.token_id for e in events if e.token_id is not None],
        at_first,
        c.blocks.blocks_taken - before,
        steps,
    )


def test_a_block_is_what_it_occupies_in_the_kv_tensor(core: EngineCore) -> None:
    # [layers, K/V, blocks · block_size, Hkv, Dh]: the bytes of one block's slots in every layer.
    one_block = core.kv_cache[:, :, :BS]
    assert core.block_bytes == one_block.numel() * one_block.element_size()
    assert core.block_bytes == BS * core.kv_bytes_per_token


def test_a_cold_prompt_counts_the_blocks_it_took_and_not_its_decode_blocks(core: EngineCore) -> None:
    prompt = ids(0, 5 * BS)  # block-aligned: the first decode token needs a block of its own
    r = run(core, "cold", prompt)
    assert r.metrics.prefill_kv_measured and r.metrics.cached_prompt_tokens == 0
    assert r.metrics.prefill_kv_bytes == r.pool_blocks_at_first_token * core.block_bytes
    assert r.pool_blocks_at_first_token == 5
    assert r.pool_blocks_total == 6  # the decode block came after the prefill and is not counted


def test_a_shared_prefix_costs_only_the_blocks_after_it(core: EngineCore) -> None:
    prefix = ids(0, 3 * BS)
    run(core, "first", [*prefix, *ids(100, 2)])
    r = run(core, "second", [*prefix, *ids(200, 6)])  # 18 tokens: 5 blocks, 3 of them cached
    assert r.metrics.cached_prompt_tokens == 3 * BS
    assert r.metrics.prefill_kv_measured
    assert r.metrics.prefill_kv_bytes == r.pool_blocks_at_first_token * core.block_bytes
    assert r.pool_blocks_at_first_token == 2


def test_a_chunked_prefill_counts_every_chunk() -> None:
    c, _ = create_core(tiny_settings(num_kv_blocks=256, block_size=BS, max_num_batched_tokens=16))
    r = run(c, "long", ids(0, 70))  # 70 tokens in chunks of 16: five steps, 18 blocks
    assert r.prefill_steps == 5
    assert r.metrics.prefill_kv_measured
    assert r.metrics.prefill_kv_bytes == r.pool_blocks_at_first_token * c.block_bytes
    assert r.pool_blocks_at_first_token == c.blocks.blocks_for(70)


def test_a_prefill_preempted_half_way_counts_both_attempts() -> None:
    c, _ = create_core(tiny_settings(num_kv_blocks=256, block_size=BS, max_num_batched_tokens=16))
    r = run(c, "again", ids(0, 70), preempt_after=2)
    # The first attempt took all 18 blocks; its first 32 tokens were written into 8 full blocks,
    # which the second attempt shares from the prefix cache, so it takes 10 more.
    assert r.metrics.preemptions == 1 and r.metrics.prefill_kv_measured
    assert r.metrics.prefill_kv_bytes == r.pool_blocks_at_first_token * c.block_bytes
    assert r.pool_blocks_at_first_token == 18 + 10


def test_without_the_prefix_cache_a_request_computes_everything_and_leaves_nothing(
    core: EngineCore,
) -> None:
    prompt = [*ids(0, 4 * BS), *ids(100, 3)]
    warm = run(core, "warm", prompt)
    cached = run(core, "cached", prompt)
    assert cached.metrics.cached_prompt_tokens == 4 * BS
    hits_before = core.blocks.prefix_hit_tokens
    queries_before = core.blocks.prefix_query_tokens
    cold = run(core, "cold", prompt, use_prefix_cache=False)
    assert cold.metrics.cached_prompt_tokens == 0
    assert cold.tokens == warm.tokens == cached.tokens  # computed in full, the same answer
    assert cold.metrics.prefill_kv_bytes == core.blocks.blocks_for(len(prompt)) * core.block_bytes
    assert cold.pool_blocks_at_first_token == core.blocks.blocks_for(len(prompt))
    # Looked up as a miss: the prefix counters say what the request got.
    assert core.blocks.prefix_query_tokens - queries_before == len(prompt)
    assert core.blocks.prefix_hit_tokens == hits_before
    # A fresh prompt served without the prefix cache registers none of its blocks ...
    fresh = [*ids(500, 4 * BS), *ids(600, 3)]
    run(core, "fresh-cold", fresh, use_prefix_cache=False)
    assert run(core, "fresh-after", fresh).metrics.cached_prompt_tokens == 0
    # ... and the normal request after it does, as always.
    assert run(core, "fresh-again", fresh).metrics.cached_prompt_tokens == 4 * BS


def test_an_injected_over_allocation_raises_prefill_kv_bytes_by_f_and_gives_every_block_back(
    core: EngineCore,
) -> None:
    over, _ = create_core(tiny_settings(num_kv_blocks=256, block_size=BS, inject_kv_overalloc=0.2))
    prompt = ids(0, 40 * BS + 1)  # 41 blocks: ceil(1.2 × 41) = 50
    base = run(core, "p", prompt)
    free_before, cached_before = over.blocks.num_free, over.blocks.num_cached_free
    r = run(over, "p", prompt)
    assert r.tokens == base.tokens  # the extra blocks hold nothing the model reads
    assert r.metrics.prefill_kv_measured
    assert base.metrics.prefill_kv_bytes == 41 * core.block_bytes
    assert (
        r.metrics.prefill_kv_bytes == r.pool_blocks_at_first_token * over.block_bytes == 50 * over.block_bytes
    )
    assert r.metrics.prefill_kv_bytes / base.metrics.prefill_kv_bytes == pytest.approx(1.2, abs=1 / 41)
    # Every block is free again, and only the prompt's 40 full blocks stayed cached, as without it.
    assert over.blocks.num_free == free_before == over.blocks.num_blocks
    assert over.blocks.num_cached_free - cached_before == core.blocks.num_cached_free == 40
    assert over.blocks.num_used == 0 and not over.blocks.tables
    # The same prompt again shares those 40 blocks; its last one costs ceil(1.2 × 1) = 2 blocks.
    again = run(over, "again", prompt)
    assert again.metrics.cached_prompt_tokens == 40 * BS
    assert again.metrics.prefill_kv_bytes == 2 * over.block_bytes
    assert again.tokens == base.tokens and over.blocks.num_free == over.blocks.num_blocks


def test_an_over_allocated_prefill_preempted_half_way_counts_both_attempts() -> None:
    c, _ = create_core(
        tiny_settings(num_kv_blocks=256, block_size=BS, max_num_batched_tokens=16, inject_kv_overalloc=0.2)
    )
    r = run(c, "again", ids(0, 70), preempt_after=2)
    # As without the injection (18, then 10 after 8 shared), each attempt 1.2× rounded up.
    assert r.metrics.preemptions == 1
    assert r.metrics.prefill_kv_bytes == r.pool_blocks_at_first_token * c.block_bytes
    assert r.pool_blocks_at_first_token == 22 + 12
    assert c.blocks.num_free == c.blocks.num_blocks


def test_a_request_near_the_pool_size_gets_only_the_extra_blocks_that_let_it_finish() -> None:
    """12 blocks of 4: a 40-token prompt (10 blocks) with 3 tokens to generate needs 11 blocks in
    its life, so the pool has room for 1 extra block, not ceil(0.2 × 10) = 2 (with 2 it would be
    admitted and then preempt itself at every step for want of its decode block)."""
    c, _ = create_core(tiny_settings(num_kv_blocks=12, block_size=BS, inject_kv_overalloc=0.2))
    req = c.add_request("edge", ids(0, 40), PARAMS)
    for _ in range(20):  # bounded: a livelock fails here instead of hanging
        if not c.has_work():
            break
        c.step()
        c.validate()
    assert not c.has_work() and req.finished and req.metrics.preemptions == 0
    assert len(req.output_ids) == PARAMS.max_tokens
    assert req.metrics.prefill_kv_bytes == (10 + 1) * c.block_bytes
    assert c.blocks.num_free == c.blocks.num_blocks
