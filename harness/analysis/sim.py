"""Cache simulators over a reference sequence: Belady's MIN (the hit-rate ceiling), LRU and LFU.

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

The initial content is ordered for LRU (first element is evicted first) and LFU (ties evicted in
order); MIN ignores the order. :func:`optimal_preload` is the warm start that is best for MIN: the
``capacity`` keys with the earliest first use (an exchange argument: swapping a preloaded key for
one used earlier never loses a hit), so MIN from it is the ceiling of *any* warmup plus *any*
replacement policy at that capacity.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from harness.analysis.references import IntArray, RefTrace
from harness.common.errors import InputError
from harness.common.model import StrictModel
from harness.common.registry import Registry

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


Simulator = Callable[[IntArray, int, Sequence[int], bool], Counts]
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
