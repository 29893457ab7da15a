"""Cache simulators over a reference sequence: Belady's MIN (the hit-rate ceiling) and online policies.

Every simulator takes the dense key ids of a :class:`~harness.analysis.references.RefTrace`, a
capacity in the trace's unit (entries or KV blocks) and optionally an initial cache content (a
warm start: the preload of a warmup plan), and counts hits. They run in O(n log n) or O(n):

* **MIN** (Belady 1966): on a miss with a full cache, evict the entry whose next use is farthest in
  the future. Next uses come from one stable sort (:func:`next_use`), the choice from a max-heap
  with lazy deletion. A referenced key that is never used again is not admitted (evicting it at once
  is what MIN would do at the next miss anyway), so the count is the optimum of any replacement
  policy that knows the future, and so the ceiling of any real policy at that capacity.
* **LRU**: an ordered dict (move-to-end on a hit, pop the oldest on overflow). Our L1, Redis'
  ``allkeys-lru`` and the engine's prefix cache all evict this way.
* **LFU**: in-cache frequency with least-recent tie-break, via a min-heap with lazy deletion.
* **LRU-protect**: LRU whose warm start is protected until its first hit.
* **S3-FIFO** (``s3fifo``, Yang et al. SOSP'23): a small probationary FIFO, a main FIFO with
  CLOCK-like second chances and a ghost FIFO of recently evicted keys; one-off keys pass through
  the small queue without displacing the main one. ``s3fifo-seeded`` starts the preload at the
  plan's priority. Amortized O(1) per reference.
* **W-TinyLFU** (``tinylfu``, Einziger et al. 2017): an LRU window, a segmented-LRU main cache and
  an admission filter: a newcomer displaces the main cache's victim only if it was referenced
  more often (counts halved every ten capacities of references). O(1) per reference, amortized.

S3-FIFO and W-TinyLFU are the scan-resistant, implementable candidates for the engine's prefix
cache; every online policy's hits are at most MIN's from the same warm start (a property test).
The simulators treat KV blocks as independent keys: a real prefix cache also loses a block whose
parent was evicted (lookups walk the chain from the root), which only lowers the online numbers.

The initial content is ordered for LRU (first element is evicted first) and LFU (ties evicted in
order); MIN ignores the order. :func:`optimal_preload` is the warm start that is best for MIN: the
``capacity`` keys with the earliest first use (an exchange argument: swapping a preloaded key for
one used earlier never loses a hit), so MIN from it is the ceiling of *any* warmup plus *any*
replacement policy at that capacity.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from pydantic import Field

from harness.analysis.references import IntArray, RefTrace
from harness.common.errors import InputError
from harness.common.model import StrictModel
from harness.common.registry import Registry
from harness.target.engine.kv_cache import FREQ_CAP, S3FifoEviction  # one S3-FIFO: the engine's constants

NEVER = np.iinfo(np.int64).max
"""Next-use position of a reference whose key is never used again."""


def next_use(keys: IntArray) -> IntArray:
    """For each position, the position of the next reference to the same key (:data:`NEVER` if none).

    One stable sort by key keeps positions of a key in order; each position's successor in that
    order is its next use.
    """
    n = int(keys.size)
    out = np.full(n, NEVER, dtype=np.int64)
    if n < 2:
        return out
    order = np.argsort(keys, kind="stable")
    same = keys[order[:-1]] == keys[order[1:]]
    out[order[:-1][same]] = order[1:][same]
    return out


def first_use(keys: IntArray) -> dict[int, int]:
    """Key id → position of its first reference."""
    uniq, idx = np.unique(keys, return_index=True)
    return dict(zip(uniq.tolist(), idx.tolist(), strict=True))


def optimal_preload(keys: IntArray, capacity: int) -> list[int]:
    """The ``capacity`` keys with the earliest first use: MIN's best warm start (see module doc)."""
    uniq, idx = np.unique(keys, return_index=True)
    order = np.argsort(idx, kind="stable")[:capacity]
    return [int(k) for k in uniq[order]]


def history_preload(keys: IntArray, seen: IntArray, capacity: int) -> list[int]:
    """The ``capacity`` keys of ``seen`` with the earliest first use in ``keys``: MIN's best warm
    start among keys a history has seen (the history ceiling's preload; see module doc)."""
    uniq, idx = np.unique(keys, return_index=True)
    allowed = np.isin(uniq, seen)
    uniq, idx = uniq[allowed], idx[allowed]
    order = np.argsort(idx, kind="stable")[:capacity]
    return [int(k) for k in uniq[order]]


@dataclass(slots=True)
class Counts:
    hits: int
    refs: int
    hit_refs: IntArray | None = None
    """Per-reference hit flags (0/1), when asked for."""


class Simulator(Protocol):
    """``(keys, capacity, initial, flags) → Counts``; a protocol (not a ``Callable`` alias) so that
    registered simulators keep their defaults for callers."""

    def __call__(
        self, keys: IntArray, capacity: int, initial: Sequence[int] = (), flags: bool = False
    ) -> Counts: ...


SIMULATORS: Registry[Simulator] = Registry("cache simulator")


def _flags(n: int, want: bool) -> IntArray | None:
    return np.zeros(n, dtype=np.int64) if want else None


@SIMULATORS.register("min")
def simulate_min(keys: IntArray, capacity: int, initial: Sequence[int] = (), flags: bool = False) -> Counts:
    """Belady's MIN: hits of the optimal offline replacement (with no admission of dead keys)."""
    nxt = next_use(keys).tolist()
    kl = keys.tolist()
    hit_flags = _flags(len(kl), flags)
    first = first_use(keys) if initial else {}
    cache: dict[int, int] = {}  # key → its next use (the heap may hold stale copies)
    heap: list[tuple[int, int]] = []  # (−next use, key): the farthest next use on top
    push, pop = heapq.heappush, heapq.heappop
    for k in list(initial)[-capacity:]:
        f = first.get(k, NEVER)
        cache[k] = f
        push(heap, (-f, k))
    hits = 0
    for i, k in enumerate(kl):
        nu = nxt[i]
        if k in cache:
            hits += 1
            if hit_flags is not None:
                hit_flags[i] = 1
            if nu == NEVER:
                del cache[k]  # dead from here on: its slot is free
            else:
                cache[k] = nu
                push(heap, (-nu, k))
            continue
        if nu == NEVER:
            continue  # never used again: admitting it cannot produce a hit
        if len(cache) < capacity:
            cache[k] = nu
            push(heap, (-nu, k))
            continue
        while True:  # drop stale heap tops
            neg, v = heap[0]
            if cache.get(v) == -neg:
                break
            pop(heap)
        if -heap[0][0] > nu:
            _, v = pop(heap)
            del cache[v]
            cache[k] = nu
            push(heap, (-nu, k))
    return Counts(hits, len(kl), hit_flags)


@SIMULATORS.register("lru")
def simulate_lru(keys: IntArray, capacity: int, initial: Sequence[int] = (), flags: bool = False) -> Counts:
    """Least recently used; ``initial`` runs from least to most recently used."""
    cache: OrderedDict[int, None] = OrderedDict((k, None) for k in list(initial)[-capacity:])
    kl = keys.tolist()
    hit_flags = _flags(len(kl), flags)
    hits = 0
    move, popitem = cache.move_to_end, cache.popitem
    for i, k in enumerate(kl):
        if k in cache:
            hits += 1
            move(k)
            if hit_flags is not None:
                hit_flags[i] = 1
        else:
            cache[k] = None
            if len(cache) > capacity:
                popitem(last=False)
    return Counts(hits, len(kl), hit_flags)


@SIMULATORS.register("lru-protect")
def simulate_lru_protect(
    keys: IntArray, capacity: int, initial: Sequence[int] = (), flags: bool = False
) -> Counts:
    """LRU whose warm start is protected until its first hit (``initial``: least valuable first).

    A miss evicts the least recently used unprotected entry; only when every entry is a protected,
    never-hit preload does the least valuable of them go.
    """
    start = list(initial)[-capacity:]
    protected: OrderedDict[int, None] = OrderedDict((k, None) for k in start)
    cache: OrderedDict[int, None] = OrderedDict()
    kl = keys.tolist()
    hit_flags = _flags(len(kl), flags)
    hits = 0
    for i, k in enumerate(kl):
        if k in protected:
            del protected[k]  # its first hit: an ordinary entry from now on
            cache[k] = None
        elif k in cache:
            cache.move_to_end(k)
        else:
            cache[k] = None
            if len(cache) + len(protected) > capacity:
                (cache if len(cache) > 1 else protected).popitem(last=False)
            continue
        hits += 1
        if hit_flags is not None:
            hit_flags[i] = 1
    return Counts(hits, len(kl), hit_flags)


@SIMULATORS.register("lfu")
def simulate_lfu(keys: IntArray, capacity: int, initial: Sequence[int] = (), flags: bool = False) -> Counts:
    """Least frequently used (counts since admission), least recent first among equals.

    Preloaded keys start at count 0, so one real use outranks any unused preload.
    """
    kl = keys.tolist()
    hit_flags = _flags(len(kl), flags)
    freq: dict[int, tuple[int, int]] = {}  # key → (count, last tick)
    heap: list[tuple[int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    tick = 0
    for k in list(initial)[-capacity:]:
        tick += 1
        freq[k] = (0, tick)
        push(heap, (0, tick, k))
    hits = 0
    for i, k in enumerate(kl):
        tick += 1
        cur = freq.get(k)
        if cur is not None:
            hits += 1
            if hit_flags is not None:
                hit_flags[i] = 1
            entry = (cur[0] + 1, tick)
        else:
            if len(freq) >= capacity:
                while True:
                    c, t, v = pop(heap)
                    if freq.get(v) == (c, t):
                        del freq[v]
                        break
            entry = (1, tick)
        freq[k] = entry
        push(heap, (entry[0], entry[1], k))
        if len(heap) > 4 * capacity + 64:  # keep lazy deletion from growing the heap unboundedly
            heap = [(c, t, v) for v, (c, t) in freq.items()]
            heapq.heapify(heap)
    return Counts(hits, len(kl), hit_flags)


# --------------------------------------------------------------------------- scan-resistant policies


@SIMULATORS.register("s3fifo")
def simulate_s3fifo(
    keys: IntArray, capacity: int, initial: Sequence[int] = (), flags: bool = False
) -> Counts:
    """S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO and a ghost FIFO.

    A new key enters the small queue (a tenth of the capacity). When the small queue is over its
    share its oldest entry leaves: to the main queue if it was hit while there, else out, its key
    remembered in the ghost queue (as many keys as the capacity, no data). A miss on a ghost key
    goes straight to the main queue. The main queue evicts its oldest entry unless the entry's
    frequency (hits, saturating at :data:`FREQ_CAP`) is above 0, in which case it goes back to the
    front with its frequency less one (CLOCK-like second chances). One-off keys so pass through
    the small queue without touching the main one: the scan resistance LRU lacks.

    A warm start goes into the main queue (the plan is trusted like a key that proved itself),
    least valuable first (evicted first), each at frequency 0: the preload survives one pass of
    the main queue, and a pass with a hit earns it more. See :func:`simulate_s3fifo_seeded`.
    """
    return _s3fifo(keys, capacity, initial, flags, seed=0)


@SIMULATORS.register("s3fifo-seeded")
def simulate_s3fifo_seeded(
    keys: IntArray, capacity: int, initial: Sequence[int] = (), flags: bool = False
) -> Counts:
    """S3-FIFO whose warm start starts at the plan's priority: the preload's more valuable half at
    frequency :data:`FREQ_CAP`, the rest at 1 (``initial`` runs least valuable first), so the
    predicted hot set survives that many passes of the main queue without a hit."""
    return _s3fifo(keys, capacity, initial, flags, seed=-1)


def _s3fifo(
    keys: IntArray,
    capacity: int,
    initial: Sequence[int],
    flags: bool,
    *,
    seed: int,
    small: float = S3FifoEviction.SMALL_SHARE,
) -> Counts:
    small_cap = max(1, int(capacity * small))
    kl = keys.tolist()
    hit_flags = _flags(len(kl), flags)
    freq: dict[int, int] = {}  # cached key → frequency (0..FREQ_CAP)
    fifo_s: deque[int] = deque()  # appendleft = newest, pop() = oldest
    main: deque[int] = deque()
    ghost: OrderedDict[int, None] = OrderedDict()
    start = list(dict.fromkeys(initial))[-capacity:]
    for i, k in enumerate(start):
        main.appendleft(k)
        freq[k] = seed if seed >= 0 else (FREQ_CAP if 2 * i >= len(start) else 1)
    hits = 0
    for i, k in enumerate(kl):
        f = freq.get(k)
        if f is not None:
            hits += 1
            if hit_flags is not None:
                hit_flags[i] = 1
            if f < FREQ_CAP:
                freq[k] = f + 1
            continue
        # Make room. Each pass frees a slot, moves a small-queue entry to the main queue or takes a
        # frequency point from a main entry; points come only from hits, so this is amortized O(1).
        while len(freq) >= capacity:
            if fifo_s and (len(fifo_s) >= small_cap or not main):
                v = fifo_s.pop()
                if freq[v] > 0:  # proved itself while on probation; starts afresh in main
                    freq[v] = 0
                    main.appendleft(v)
                else:
                    del freq[v]
                    ghost[v] = None
                    if len(ghost) > capacity:
                        ghost.popitem(last=False)
            else:
                v = main.pop()
                fv = freq[v]
                if fv > 0:
                    freq[v] = fv - 1
                    main.appendleft(v)
                else:
                    del freq[v]
        freq[k] = 0
        if k in ghost:
            del ghost[k]
            main.appendleft(k)
        else:
            fifo_s.appendleft(k)
    return Counts(hits, len(kl), hit_flags)


@SIMULATORS.register("tinylfu")
def simulate_tinylfu(
    keys: IntArray, capacity: int, initial: Sequence[int] = (), flags: bool = False
) -> Counts:
    """W-TinyLFU (Einziger et al. 2017): an LRU window, a segmented-LRU main cache and an admission
    filter on reference counts.

    Every reference counts its key (counts of all keys, seen or cached, halved every ten
    capacities' worth of references so that old popularity fades). A new key enters the window (1 %
    of the capacity); the key the window pushes out is admitted to the main cache only if its count
    is higher than that of the main cache's victim (the least recent entry of the probation
    segment), so a stream of one-off keys never displaces a key that was used twice. A hit in
    probation promotes to the protected segment (80 % of the main cache), whose overflow goes
    back to probation. The counts are exact (a dict); the published design's count-min sketch
    only saves memory.

    A warm start fills the main cache, its more valuable part protected; each preloaded key
    starts at count 1 (as if seen once), so a key seen twice in the window displaces it, one-off
    keys never do.
    """
    return _tinylfu(keys, capacity, initial, flags, seed=1)


def _tinylfu(
    keys: IntArray, capacity: int, initial: Sequence[int], flags: bool, *, seed: int, window: float = 0.01
) -> Counts:
    win_cap = max(1, int(capacity * window))
    main_cap = capacity - win_cap
    prot_cap = (main_cap * 4) // 5
    age_every = 10 * capacity
    kl = keys.tolist()
    hit_flags = _flags(len(kl), flags)
    counts: dict[int, int] = {}
    lru_w: OrderedDict[int, None] = OrderedDict()
    probation: OrderedDict[int, None] = OrderedDict()
    protected: OrderedDict[int, None] = OrderedDict()
    start = list(dict.fromkeys(initial))[-capacity:]
    if main_cap == 0:
        lru_w.update((k, None) for k in start)
    else:
        start = start[-main_cap:]
        cut = max(0, len(start) - prot_cap)
        probation.update((k, None) for k in start[:cut])
        protected.update((k, None) for k in start[cut:])
    for k in start:
        counts[k] = seed
    hits = 0
    seen = 0
    for i, k in enumerate(kl):
        counts[k] = counts.get(k, 0) + 1
        seen += 1
        if seen >= age_every:  # O(keys counted) every 10·capacity references: amortized O(1)
            seen = 0
            counts = {v: c >> 1 for v, c in counts.items() if c > 1}
        if k in lru_w:
            lru_w.move_to_end(k)
        elif k in protected:
            protected.move_to_end(k)
        elif k in probation:
            del probation[k]
            protected[k] = None
            if len(protected) > prot_cap:
                v, _ = protected.popitem(last=False)
                probation[v] = None
        else:
            lru_w[k] = None
            if len(lru_w) > win_cap:
                cand, _ = lru_w.popitem(last=False)
                if len(probation) + len(protected) < main_cap:
                    probation[cand] = None
                elif main_cap:
                    seg = probation if probation else protected
                    victim = next(iter(seg))
                    if counts.get(cand, 0) > counts.get(victim, 0):
                        del seg[victim]
                        probation[cand] = None
            continue
        hits += 1
        if hit_flags is not None:
            hit_flags[i] = 1
    return Counts(hits, len(kl), hit_flags)


class PolicyResult(StrictModel):
    """One simulation: a policy at a capacity over a trace, cold or warm-started."""

    policy: str
    capacity: int
    warm: str | None = None
    """What the cache started with: ``None`` (empty), ``optimal`` (MIN's best preload), ``history``
    (MIN's best preload among keys a history has seen) or ``plan``."""
    refs: int
    hits: int
    hit_rate: float
    requests: int
    seconds: float
    requests_per_s: float = Field(description="Simulated requests per second of wall time.")


def simulate(
    trace: RefTrace,
    capacity: int,
    policy: str = "min",
    *,
    initial: Sequence[int] = (),
    warm: str | None = None,
) -> PolicyResult:
    """Run one simulator over ``trace`` and time it."""
    if capacity < 1:
        raise InputError(f"capacity must be at least 1, got {capacity}", field="capacity")
    sim = SIMULATORS.get(policy)
    t0 = time.perf_counter()
    c = sim(trace.keys, capacity, initial, False)
    dt = time.perf_counter() - t0
    return PolicyResult(
        policy=policy,
        capacity=capacity,
        warm=warm,
        refs=c.refs,
        hits=c.hits,
        hit_rate=c.hits / c.refs if c.refs else 0.0,
        requests=trace.n_requests,
        seconds=dt,
        requests_per_s=trace.n_requests / dt if dt > 0 else float("inf"),
    )


class HitRateReport(StrictModel):
    """``harness analysis hitrate --json``: MIN beside LRU and LFU at each capacity."""

    source: str
    unit: str
    requests: int
    refs: int
    distinct: int
    """Distinct keys: at a capacity this large every policy reaches the cold ceiling."""
    cold_ceiling: float
    """Hit rate of an infinite cache starting empty: 1 − distinct / refs."""
    results: list[PolicyResult]


def hitrate_report(
    trace: RefTrace, capacities: Sequence[int], policies: Sequence[str] = ("min", "lru", "lfu")
) -> HitRateReport:
    """Every policy at every capacity (cold start)."""
    distinct = trace.distinct
    results = [simulate(trace, c, p) for c in capacities for p in policies]
    return HitRateReport(
        source=trace.source,
        unit=trace.unit,
        requests=trace.n_requests,
        refs=trace.n_refs,
        distinct=distinct,
        cold_ceiling=1.0 - distinct / trace.n_refs if trace.n_refs else 0.0,
        results=results,
    )
