"""Paged KV-cache bookkeeping: a block pool with reference counts, prefix caching and validation.

The KV tensors themselves live in the engine (``[layers, 2, blocks · block_size, kv_heads,
head_dim]``); this module only decides which block each sequence's tokens go to.

Prefix caching: a block that is full gets a hash chained from its parent's hash and its own token
ids (``hash((parent_hash, tokens))``), so equal hashes mean equal whole prefixes. A new sequence
looks its full prompt blocks up in that table and shares the hits (reference count + 1). When the
last holder frees a hashed block it stays in the table, parked among the evictable blocks;
allocation takes never-hashed free blocks first, then evicts a parked block chosen by the
eviction policy (:data:`EVICTION_POLICIES`, engine setting ``prefix_eviction``):

* ``lru`` (default): the least recently parked block.
* ``s3fifo``: S3-FIFO (Yang et al., SOSP'23; :func:`harness.analysis.sim.simulate_s3fifo` is its
  simulator). A newly cached block starts in a small probationary FIFO (a tenth of the parked
  blocks); one that was hit while there moves to the main FIFO when it reaches the end, one that
  was not is evicted and its hash remembered in a ghost FIFO (as many hashes as the pool has
  blocks), so a block recomputed soon after goes straight to main. Main gives each block as many
  second chances as it has hits (at most :data:`FREQ_CAP`). A scan of
  one-off prompts so churns the small queue and leaves a reused prefix in main, where LRU evicts
  it. A sequence allocated with a ``priority`` (a warmup's preload) registers its blocks in main
  with that many chances, so the hot set a plan predicts survives the traffic after it.

Evicting a parent whose children are still cached never breaks lookups: lookups walk the chain
from the root and stop at the first miss, the parent is recomputed with the same chained hash, and
its cached children are reachable again. Both policies tend to evict leaves first, without a
cascade: :meth:`BlockManager.free` parks a sequence's blocks leaf first, and a child is only ever
hit together with its parent, so a parent has at least its children's hits.

Every block handed out is counted where it is taken from the pool, per sequence
(:attr:`BlockTable.taken`) and in total (:attr:`BlockManager.blocks_taken`): the engine's
``prefill_kv_bytes`` is that count, not a formula on token counts. A sequence allocated with
``use_prefix_cache=False`` neither shares cached blocks nor registers its own (a fault injection
that makes one request miss without changing what the next one finds).

Over-allocation (engine setting ``inject_kv_overalloc`` F, ``harness serve --inject-kv-overalloc``,
a fault injection): every :meth:`BlockManager.allocate` takes ``ceil(F × n)`` blocks more than the
``n`` its prompt needs, as an allocator that wastes KV bytes per token would. The extra blocks are
really taken from the pool (counted in ``taken``, so ``prefill_kv_bytes`` rises by about F, and
they can evict cached blocks) but kept apart from the block table (:attr:`BlockTable.extra`): no
token is ever written to one and none is registered in the prefix cache; they go back to the free
list when the sequence is freed.

:meth:`BlockManager.validate` checks the layout invariants (no sequence has written past its own
length, a block is shared only by sequences with an identical prefix, reference counts match the
block tables) and raises :class:`~harness.common.errors.CheckFailed` naming the first violation.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from harness.common.errors import CheckFailed
from harness.common.registry import Registry

ROOT_HASH = 0x5EED


@dataclass(slots=True)
class KVBlock:
    """One block of ``block_size`` token slots."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    """Set once the block is full and registered in the prefix table."""
    tokens: list[int] = field(default_factory=list)
    """Token ids whose K/V have been written here, in slot order (the validator's ground truth)."""


class BlockTable:
    """A sequence's view of the pool: its blocks in order and how many tokens they hold."""

    __slots__ = ("blocks", "cacheable", "extra", "num_tokens", "priority", "seq_id", "taken")

    def __init__(self, seq_id: str, priority: int = 0, cacheable: bool = True) -> None:
        self.seq_id = seq_id
        self.blocks: list[KVBlock] = []
        self.num_tokens = 0
        """Tokens whose K/V are in the cache (cached prefix + computed)."""
        self.priority = priority
        """Passed to the eviction policy for the blocks this sequence registers (0: none)."""
        self.cacheable = cacheable
        """Whether this sequence's full blocks are registered in the prefix cache."""
        self.taken = 0
        """Blocks taken from the pool for this sequence (shared prefix-cache hits not included)."""
        self.extra: list[KVBlock] = []
        """Blocks the injected over-allocation took for it: held (reference count 1) and counted in
        ``taken``, but never written, hashed or part of the slot layout (not in ``blocks``)."""


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    return hash((parent, tuple(tokens)))


# --------------------------------------------------------------------------- eviction policies


class EvictionPolicy(ABC):
    """Which parked block (cached, hashed, reference count 0) a new allocation evicts.

    The block manager tells the policy when a block gets its hash (:meth:`registered`), is hit by a
    prefix lookup (:meth:`hit`), is parked by its last holder (:meth:`park`) or taken back by a
    hit (:meth:`unpark`); :meth:`victim` removes and returns the block to evict. Iteration yields
    the parked blocks; ``len`` counts them.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    def registered(self, block_id: int, block_hash: int, priority: int) -> None:  # noqa: B027
        """A block got its hash (it holds a full prefix block now); ``priority``: its sequence's."""

    def hit(self, block_id: int) -> None:  # noqa: B027
        """A prefix lookup shared this block (parked or held)."""

    @abstractmethod
    def park(self, block_id: int) -> None:
        """The block's last holder freed it: it may be evicted from now on."""

    @abstractmethod
    def unpark(self, block_id: int) -> None:
        """A parked block is held again (a prefix hit)."""

    @abstractmethod
    def victim(self) -> int:
        """Remove and return the parked block to evict (the caller checked there is one)."""

    @abstractmethod
    def clear(self) -> list[int]:
        """Forget every block and hash; return the parked blocks (the prefix cache is reset)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[int]: ...


EVICTION_POLICIES: Registry[type[EvictionPolicy]] = Registry("prefix-cache eviction policy")


@EVICTION_POLICIES.register("lru")
class LruEviction(EvictionPolicy):
    """The least recently parked block goes first."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._parked: OrderedDict[int, None] = OrderedDict()  # least recently parked first

    def park(self, block_id: int) -> None:
        self._parked[block_id] = None

    def unpark(self, block_id: int) -> None:
        self._parked.pop(block_id, None)

    def victim(self) -> int:
        return self._parked.popitem(last=False)[0]

    def clear(self) -> list[int]:
        out = list(self._parked)
        self._parked.clear()
        return out

    def __len__(self) -> int:
        return len(self._parked)

    def __iter__(self) -> Iterator[int]:
        return iter(self._parked)


FREQ_CAP = 3
"""S3-FIFO's hit count saturates here (two bits in the paper): the most second chances a block (or
a simulated key, :func:`harness.analysis.sim.simulate_s3fifo`) gets in the main queue without a new
hit, which bounds how long a once-hot prefix outlives its popularity."""


@EVICTION_POLICIES.register("s3fifo")
class S3FifoEviction(EvictionPolicy):
    """S3-FIFO over the parked blocks (module doc). O(1) per operation, amortized: a pass over main
    that spares a block takes one of its hits, and hits are bounded by :data:`FREQ_CAP`."""

    SMALL_SHARE = 0.1
    """Share of the parked blocks the small queue may hold before it is evicted from."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._small: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._main: OrderedDict[int, None] = OrderedDict()
        self._ghost: OrderedDict[int, None] = OrderedDict()  # hashes evicted from small unhit
        self._freq: dict[int, int] = {}  # registered block → hits (0..FREQ_CAP)
        self._hash: dict[int, int] = {}
        self._in_main: set[int] = set()

    def registered(self, block_id: int, block_hash: int, priority: int) -> None:
        self._hash[block_id] = block_hash
        self._freq[block_id] = min(max(priority, 0), FREQ_CAP)
        if block_hash in self._ghost:  # evicted unhit not long ago and needed again: a reuse
            del self._ghost[block_hash]
            self._in_main.add(block_id)
        elif priority > 0:  # a warmup's preload: trusted like a block that proved itself
            self._in_main.add(block_id)

    def hit(self, block_id: int) -> None:
        f = self._freq.get(block_id)
        if f is not None and f < FREQ_CAP:
            self._freq[block_id] = f + 1

    def park(self, block_id: int) -> None:
        (self._main if block_id in self._in_main else self._small)[block_id] = None

    def unpark(self, block_id: int) -> None:
        self._small.pop(block_id, None)
        self._main.pop(block_id, None)

    def victim(self) -> int:
        while True:
            small_over = len(self._small) >= self.SMALL_SHARE * (len(self._small) + len(self._main))
            if self._small and (small_over or not self._main):
                bid, _ = self._small.popitem(last=False)
                if self._freq.get(bid, 0) > 0:  # hit on probation: to main, starting afresh
                    self._freq[bid] = 0
                    self._in_main.add(bid)
                    self._main[bid] = None
                    continue
                h = self._hash.get(bid)
                if h is not None:
                    self._ghost[h] = None
                    if len(self._ghost) > self.num_blocks:
                        self._ghost.popitem(last=False)
                return self._forget(bid)
            bid, _ = self._main.popitem(last=False)
            f = self._freq.get(bid, 0)
            if f > 0:
                self._freq[bid] = f - 1
                self._main[bid] = None
                continue
            return self._forget(bid)

    def _forget(self, block_id: int) -> int:
        self._freq.pop(block_id, None)
        self._hash.pop(block_id, None)
        self._in_main.discard(block_id)
        return block_id

    def clear(self) -> list[int]:
        out = [*self._small, *self._main]
        for d in (self._small, self._main, self._ghost):
            d.clear()
        self._freq.clear()
        self._hash.clear()
        self._in_main.clear()
        return out

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def __iter__(self) -> Iterator[int]:
        yield from self._small
        yield from self._main


class BlockManager:
    """Allocates KV blocks to sequences; keeps the prefix-cache table and its eviction order.

    ``eviction`` names the policy in :data:`EVICTION_POLICIES` (an unknown name raises
    :class:`~harness.common.errors.ConfigError` listing the known ones). ``overalloc`` F > 0 is the
    over-allocation fault injection (module doc): every allocation takes ``ceil(F × n)`` extra blocks.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        eviction: str = "lru",
        overalloc: float = 0.0,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("need at least one KV block")
        if not overalloc >= 0.0:  # written so that NaN fails too
            raise ValueError(f"overalloc must be >= 0, got {overalloc}")
        self.overalloc = overalloc
        """Injected over-allocation F (0: none)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # never-hashed, pop() from the end
        self._evictable: EvictionPolicy = EVICTION_POLICIES.get(eviction)(num_blocks)  # hashed, ref 0
        self.eviction = eviction
        self._by_hash: dict[int, int] = {}
        self.tables: dict[str, BlockTable] = {}
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self.blocks_taken = 0
        """Blocks handed out from the pool so far, to any sequence (a total, never reset)."""

    # ---- capacity -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free plus evictable cached)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_free(self) -> int:
        return len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def extra_blocks(self, needed: int, limit: int | None = None) -> int:
        """Blocks the injected over-allocation adds to an allocation of ``needed`` blocks:
        ``ceil(F × needed)``, so ``ceil((1 + F) × needed)`` in all; at most ``limit`` when given.

        The product is rounded to 9 decimals before the ceiling: ``0.28 × 25`` must be 7 extra
        blocks, not 8 because the float product is 7.000000000000001.
        """
        if self.overalloc <= 0.0 or needed <= 0:
            return 0
        extra = math.ceil(round(self.overalloc * needed, 9))
        return extra if limit is None else max(0, min(extra, limit))

    # ---- allocation -----------------------------------------------------------------------------
    def _take(self, table: BlockTable) -> KVBlock:
        """A free (or evicted) block for ``table``'s sequence, counted as taken by it."""
        if self._free:
            blk = self.blocks[self._free.pop()]
        elif self._evictable:
            bid = self._evictable.victim()
            blk = self.blocks[bid]
            if blk.block_hash is not None and self._by_hash.get(blk.block_hash) == bid:
                del self._by_hash[blk.block_hash]
            blk.block_hash = None
        else:
            raise RuntimeError("KV pool exhausted (the scheduler should have checked can_admit / can_append)")
        blk.tokens = []
        blk.ref_count = 1
        table.taken += 1
        self.blocks_taken += 1
        return blk

    def _ref(self, blk: KVBlock) -> None:
        if blk.ref_count == 0:
            self._evictable.unpark(blk.block_id)
        blk.ref_count += 1

    def _unref(self, blk: KVBlock) -> None:
        blk.ref_count -= 1
        if blk.ref_count == 0:
            if blk.block_hash is not None and self._by_hash.get(blk.block_hash) == blk.block_id:
                self._evictable.park(blk.block_id)
            else:
                blk.block_hash = None
                blk.tokens = []
                self._free.append(blk.block_id)

    def match_prefix(self, token_ids: Sequence[int]) -> list[KVBlock]:
        """Cached blocks holding the longest block-aligned prefix of ``token_ids``.

        At least one token is always left uncached, because the last prompt token must be run to
        get the logits for the first output token.
        """
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[KVBlock] = []
        parent = ROOT_HASH
        for i in range((len(token_ids) - 1) // bs):
            h = chain_hash(parent, token_ids[i * bs : (i + 1) * bs])
            bid = self._by_hash.get(h)
            if bid is None:
                break
            hits.append(self.blocks[bid])
            parent = h
        return hits

    def can_admit(
        self,
        token_ids: Sequence[int],
        reserve: int = 0,
        *,
        use_prefix_cache: bool = True,
        max_extra: int | None = None,
    ) -> bool:
        """Whether a sequence with this prompt can get its blocks now, keeping ``reserve`` free
        (the over-allocation's extra blocks included, ``max_extra`` as in :meth:`allocate`)."""
        hits = self.match_prefix(token_ids) if use_prefix_cache else []
        # Hits parked in the LRU stop being free once shared.
        reused_free = sum(1 for b in hits if b.ref_count == 0)
        need = self.blocks_for(len(token_ids)) - len(hits)
        need += self.extra_blocks(need, max_extra)
        return self.num_free - reused_free - need >= reserve

    def allocate(
        self,
        seq_id: str,
        token_ids: Sequence[int],
        priority: int = 0,
        *,
        use_prefix_cache: bool = True,
        max_extra: int | None = None,
    ) -> int:
        """Give a new sequence blocks for its whole prompt; returns the cached prefix length.

        ``priority`` > 0 marks a warmup's preload: the blocks the sequence registers enter the
        eviction policy with it (``s3fifo``: straight to the main queue with that many second
        chances; ``lru`` ignores it). ``use_prefix_cache=False``: no cached block is shared (0 is
        returned) and none of the sequence's blocks is registered later; its prompt still counts
        as looked up (``prefix_query_tokens``), with no hit. With over-allocation on, the extra
        blocks (:meth:`extra_blocks`, at most ``max_extra``) are taken too, into
        :attr:`BlockTable.extra`.
        """
        if seq_id in self.tables:
            raise RuntimeError(f"sequence {seq_id} already has blocks")
        table = BlockTable(seq_id, priority, cacheable=use_prefix_cache)
        hits = self.match_prefix(token_ids) if use_prefix_cache else []
        for blk in hits:
            self._evictable.hit(blk.block_id)
            self._ref(blk)
        table.blocks = list(hits)
        cached = len(hits) * self.block_size
        table.num_tokens = cached
        need = self.blocks_for(len(token_ids)) - len(hits)
        for _ in range(need):
            table.blocks.append(self._take(table))
        # Taken after the prompt's own blocks, so the prompt's layout is the one it would have
        # without the injection; kept out of ``blocks``, so nothing is written to them or hashed.
        for _ in range(self.extra_blocks(need, max_extra)):
            table.extra.append(self._take(table))
        self.tables[seq_id] = table
        self.prefix_query_tokens += len(token_ids)
        self.prefix_hit_tokens += cached
        return cached

    def can_append(self, seq_id: str, n: int = 1) -> bool:
        t = self.tables[seq_id]
        return self.blocks_for(t.num_tokens + n) - len(t.blocks) <= self.num_free

    def ensure_capacity(self, seq_id: str, total_tokens: int) -> None:
        """Grow the sequence's table to hold ``total_tokens`` (caller checked :meth:`can_append`)."""
        t = self.tables[seq_id]
        while len(t.blocks) < self.blocks_for(total_tokens):
            t.blocks.append(self._take(t))

    def slots_for(self, seq_id: str, start: int, n: int) -> list[int]:
        """Cache slots of token positions ``start .. start+n-1``."""
        t = self.tables[seq_id]
        bs = self.block_size
        return [t.blocks[p // bs].block_id * bs + p % bs for p in range(start, start + n)]

    def record_written(self, seq_id: str, all_tokens: Sequence[int], new_total: int) -> None:
        """Note that K/V for positions ``num_tokens .. new_total-1`` are now written.

        Fills the blocks' token lists (validator ground truth) and registers blocks that became
        full in the prefix table.
        """
        t = self.tables[seq_id]
        bs = self.block_size
        start = t.num_tokens
        for p in range(start, new_total):
            t.blocks[p // bs].tokens.append(all_tokens[p])
        t.num_tokens = new_total
        if not (self.enable_prefix_caching and t.cacheable):
            return
        first_full, last_full = start // bs, new_total // bs
        parent = t.blocks[first_full - 1].block_hash if first_full > 0 else ROOT_HASH
        for i in range(first_full, last_full):
            blk = t.blocks[i]
            if parent is None:
                break  # an unhashed ancestor (its twin was registered first): no chain to extend
            if blk.block_hash is None:
                h = chain_hash(parent, blk.tokens)
                if h not in self._by_hash:
                    self._by_hash[h] = blk.block_id
                    blk.block_hash = h
                    self._evictable.registered(blk.block_id, h, t.priority)
                else:
                    # Another block already caches this prefix; keep ours private, but let the
                    # chain continue from the shared hash so later blocks still get registered.
                    parent = h
                    continue
            parent = blk.block_hash

    def free(self, seq_id: str) -> None:
        """Return a finished, aborted or preempted sequence's blocks (cached ones stay cached)."""
        t = self.tables.pop(seq_id, None)
        if t is None:
            return
        # Over-allocated blocks hold nothing and have no hash: straight back to the free list.
        for blk in t.extra:
            self._unref(blk)
        # Free back to front so that a prefix's leaf blocks are evicted before its root blocks.
        for blk in reversed(t.blocks):
            self._unref(blk)

    def reset_prefix_cache(self) -> int:
        """Empty the prefix cache: afterwards no prompt hits a block cached before; returns the
        number of cached, unreferenced blocks freed.

        Blocks that running sequences still hold keep their K/V (the sequences need them) but lose
        their hashes, so they are private from now on and go back to the free list when released.
        A running sequence whose blocks lost their hashes registers no further blocks (its chain
        has an unhashed ancestor, see :meth:`record_written`); blocks written after the reset by new
        sequences are cached as usual. The hit counters are not reset (they are totals).
        """
        freed = 0
        for bid in self._evictable.clear():
            blk = self.blocks[bid]
            blk.block_hash = None
            blk.tokens = []
            self._free.append(bid)
            freed += 1
        for blk in self.blocks:
            if blk.ref_count > 0:
                blk.block_hash = None
        self._by_hash.clear()
        return freed

    # ---- validation -----------------------------------------------------------------------------
    def validate(self, sequences: Iterable[tuple[str, Sequence[int]]]) -> None:
        """Check the layout against each sequence's true token ids ``(seq_id, tokens)``.

        Raises :class:`CheckFailed` when a sequence has written past its own length, a block is
        shared by sequences whose prefixes differ, an over-allocated block holds tokens, a hash or
        another holder, or reference counts and free lists disagree.
        """
        bs = self.block_size
        holders: dict[int, list[tuple[str, int]]] = {}
        truth: dict[str, Sequence[int]] = {}
        for seq_id, tokens in sequences:
            truth[seq_id] = tokens
            t = self.tables.get(seq_id)
            if t is None:
                raise CheckFailed(f"sequence {seq_id} has no block table", field="kv_cache")
            if t.num_tokens > len(tokens):
                raise CheckFailed(
                    f"sequence {seq_id} has {t.num_tokens} tokens in the cache but only {len(tokens)} tokens",
                    field="kv_cache",
                )
            if self.blocks_for(t.num_tokens) > len(t.blocks):
                raise CheckFailed(
                    f"sequence {seq_id} holds fewer blocks than its tokens need", field="kv_cache"
                )
            for i, blk in enumerate(t.blocks):
                holders.setdefault(blk.block_id, []).append((seq_id, i))
                own = max(0, min(bs, t.num_tokens - i * bs))
                if len(blk.tokens) > bs:
                    raise CheckFailed(
                        f"block {blk.block_id} holds {len(blk.tokens)} tokens, more than the block size {bs}",
                        field="kv_cache",
                    )
                if blk.ref_count == 1 and len(blk.tokens) > own:
                    raise CheckFailed(
                        f"sequence {seq_id} wrote past its own length: block {blk.block_id} (index {i}) "
                        f"holds {len(blk.tokens)} tokens, the sequence owns {own} of them",
                        field="kv_cache",
                    )
                if list(blk.tokens[:own]) != list(tokens[i * bs : i * bs + own]):
                    raise CheckFailed(
                        f"sequence {seq_id}: block {blk.block_id} (index {i}) holds other tokens than "
                        "the sequence's own",
                        field="kv_cache",
                    )
            for blk in t.extra:
                # Position -1 (no slot of the sequence): a block also held elsewhere fails the
                # shared-block checks below, as no over-allocated block is ever shared.
                holders.setdefault(blk.block_id, []).append((seq_id, -1))
                if blk.tokens or blk.block_hash is not None:
                    raise CheckFailed(
                        f"sequence {seq_id}: over-allocated block {blk.block_id} holds tokens or a "
                        "prefix-cache hash",
                        field="kv_cache",
                    )
        for bid, users in holders.items():
            blk = self.blocks[bid]
            if blk.ref_count != len(users):
                raise CheckFailed(
                    f"block {bid} has ref_count {blk.ref_count} but {len(users)} holders", field="kv_cache"
                )
            if len(users) > 1:
                if len(blk.tokens) != bs:
                    raise CheckFailed(f"block {bid} is shared but not full", field="kv_cache")
                idx = {i for _, i in users}
                if len(idx) != 1:
                    raise CheckFailed(
                        f"block {bid} is shared at different positions {sorted(idx)}", field="kv_cache"
                    )
                i = idx.pop()
                prefixes = {tuple(truth[s][: (i + 1) * bs]) for s, _ in users}
                if len(prefixes) != 1:
                    raise CheckFailed(
                        f"block {bid} is shared by sequences with different prefixes: "
                        f"{sorted(s for s, _ in users)}",
                        field="kv_cache",
                    )
        for seq_id in self.tables:
            if seq_id not in truth:
                raise CheckFailed(f"block table for unknown sequence {seq_id}", field="kv_cache")
        free_ids = set(self._free) | set(self._evictable)
        for blk in self.blocks:
            if (blk.block_id in free_ids) == (blk.ref_count > 0):
                raise CheckFailed(
                    f"block {blk.block_id} has ref_count {blk.ref_count} but is "
                    f"{'' if blk.block_id in free_ids else 'not '}on a free list",
                    field="kv_cache",
                )
