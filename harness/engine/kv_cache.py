"""Paged KV-cache bookkeeping: a block pool with reference counts, prefix caching and validation.

The KV tensors themselves live in the engine (``[layers, 2, blocks · block_size, kv_heads,
head_dim]``); this module only decides which block each sequence's tokens go to.

Prefix caching: a block that is full gets a hash chained from its parent's hash and its own token
ids (``hash((parent_hash, tokens))``), so equal hashes mean equal whole prefixes. A new sequence
looks its full prompt blocks up in that table and shares the hits (reference count + 1). When the
last holder frees a hashed block it stays in the table, parked in an LRU of evictable blocks;
allocation takes never-hashed free blocks first, then evicts the least recently used cached one.

:meth:`BlockManager.validate` checks the layout invariants (no sequence has written past its own
length, a block is shared only by sequences with an identical prefix, reference counts match the
block tables) and raises :class:`~harness.common.errors.CheckFailed` naming the first violation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from harness.common.errors import CheckFailed

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

    __slots__ = ("blocks", "num_tokens", "seq_id")

    def __init__(self, seq_id: str) -> None:
        self.seq_id = seq_id
        self.blocks: list[KVBlock] = []
        self.num_tokens = 0
        """Tokens whose K/V are in the cache (cached prefix + computed)."""


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    return hash((parent, tuple(tokens)))


class BlockManager:
    """Allocates KV blocks to sequences; keeps the prefix-cache table and its LRU."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("need at least one KV block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # never-hashed, pop() from the end
        self._evictable: OrderedDict[int, None] = OrderedDict()  # hashed, ref 0, LRU first
        self._by_hash: dict[int, int] = {}
        self.tables: dict[str, BlockTable] = {}
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

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

    # ---- allocation -----------------------------------------------------------------------------
    def _take(self) -> KVBlock:
        if self._free:
            blk = self.blocks[self._free.pop()]
        elif self._evictable:
            bid, _ = self._evictable.popitem(last=False)
            blk = self.blocks[bid]
            if blk.block_hash is not None and self._by_hash.get(blk.block_hash) == bid:
                del self._by_hash[blk.block_hash]
            blk.block_hash = None
        else:
            raise RuntimeError("KV pool exhausted (the scheduler should have checked can_admit / can_append)")
        blk.tokens = []
        blk.ref_count = 1
        return blk

    def _ref(self, blk: KVBlock) -> None:
        if blk.ref_count == 0:
            self._evictable.pop(blk.block_id, None)
        blk.ref_count += 1

    def _unref(self, blk: KVBlock) -> None:
        blk.ref_count -= 1
        if blk.ref_count == 0:
            if blk.block_hash is not None and self._by_hash.get(blk.block_hash) == blk.block_id:
                self._evictable[blk.block_id] = None  # most recently used at the end
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

    def can_admit(self, token_ids: Sequence[int], reserve: int = 0) -> bool:
        """Whether a sequence with this prompt can get its blocks now, keeping ``reserve`` free."""
        hits = self.match_prefix(token_ids)
        # Hits parked in the LRU stop being free once shared.
        reused_free = sum(1 for b in hits if b.ref_count == 0)
        need = self.blocks_for(len(token_ids)) - len(hits)
        return self.num_free - reused_free - need >= reserve

    def allocate(self, seq_id: str, token_ids: Sequence[int]) -> int:
        """Give a new sequence blocks for its whole prompt; returns the cached prefix length."""
        if seq_id in self.tables:
            raise RuntimeError(f"sequence {seq_id} already has blocks")
        table = BlockTable(seq_id)
        hits = self.match_prefix(token_ids)
        for blk in hits:
            self._ref(blk)
        table.blocks = list(hits)
        cached = len(hits) * self.block_size
        table.num_tokens = cached
        for _ in range(self.blocks_for(len(token_ids)) - len(hits)):
            table.blocks.append(self._take())
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
            t.blocks.append(self._take())

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
        if not self.enable_prefix_caching:
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
        while self._evictable:
            bid, _ = self._evictable.popitem(last=False)
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
        shared by sequences whose prefixes differ, or reference counts and free lists disagree.
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
