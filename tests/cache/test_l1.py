"""L1: fixed TTL (never refreshed by hits), LRU caps by entries and bytes, thread safety."""

from __future__ import annotations

import random
import threading

from harness.target.cache.l1 import L1Cache
from tests.cache.conftest import ManualClock, completion


def test_ttl_is_fixed_from_write_not_refreshed_by_hits() -> None:
    clock = ManualClock()
    l1 = L1Cache(max_entries=10, max_bytes=10_000, ttl_s=0.4, clock=clock)
    l1.put("k", completion("v"), 100, "warm")
    for _ in range(15):  # hit it repeatedly over 0.3 s: must not extend the life
        assert l1.get("k") is not None
        clock.advance(0.02)
    clock.advance(0.1)  # 0.4 s after the write: expired, however often it was hit
    assert l1.get("k") is None
    assert l1.expirations == 1 and len(l1) == 0 and l1.bytes_used == 0


def test_promoted_entry_keeps_the_source_expiry() -> None:
    clock = ManualClock()
    l1 = L1Cache(max_entries=10, max_bytes=10_000, ttl_s=60, clock=clock)
    assert l1.put("k", completion("v"), 10, "warm", expires_at=clock() + 0.15)
    assert l1.get("k") is not None
    clock.advance(0.15)
    assert l1.get("k") is None  # the source's expiry, not L1's 60 s
    assert not l1.put("dead", completion("v"), 10, "warm", expires_at=clock() - 1)


def test_purge_expired_drops_only_expired_entries() -> None:
    clock = ManualClock()
    l1 = L1Cache(max_entries=10, max_bytes=10_000, ttl_s=10, clock=clock)
    l1.put("short", completion("v"), 10, "warm", expires_at=clock() + 1)
    l1.put("long", completion("v"), 10, "warm")
    clock.advance(1)
    assert l1.purge_expired() == 1
    assert l1.get("long") is not None and len(l1) == 1 and l1.bytes_used == 10


def test_lru_by_entries_and_bytes() -> None:
    l1 = L1Cache(max_entries=3, max_bytes=1000, ttl_s=60)
    for k in "abc":
        l1.put(k, completion(k), 100, "warm")
    assert l1.get("a") is not None  # a is now most recent
    l1.put("d", completion("d"), 100, "warm")
    assert l1.get("b") is None and l1.get("a") is not None and len(l1) == 3
    l1.put("big", completion("x"), 800, "warm")  # needs room: evicts LRU entries until bytes fit
    assert l1.bytes_used <= 1000
    assert l1.get("big") is not None
    assert l1.evictions >= 2
    assert not l1.put("huge", completion("x"), 2000, "warm")


def test_concurrent_use_keeps_invariants() -> None:
    l1 = L1Cache(max_entries=50, max_bytes=4000, ttl_s=60)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(3000):
                k = f"k{rng.randrange(200)}"
                if rng.random() < 0.5:
                    l1.put(k, completion(k), rng.randrange(10, 200), "warm")
                else:
                    e = l1.get(k)
                    assert e is None or e.completion.text == k
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(l1) <= 50
    assert l1.bytes_used == sum(e.nbytes for e in l1._data.values()) <= 4000
