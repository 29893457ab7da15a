"""L1: an in-process LRU with a fixed TTL, capped by entries and bytes, thread-safe.

The expiry is fixed when an entry is written and never refreshed by a hit, so a hot entry still
expires (the bug of caches that slide the TTL on every read). Entries promoted from L2/L3 carry the
original entry's absolute expiry, so a promoted copy never outlives its source.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from harness.target.cache.api import CachedCompletion


@dataclass(slots=True)
class L1Entry:
    completion: CachedCompletion
    expires_at: float
    """Wall-clock (``time.time``) expiry."""
    nbytes: int
    value_tier: str


class L1Cache:
    """LRU + TTL. ``clock`` is injectable so that benchmarks can use a cheaper timer and tests a
    manual one (expiry without racing real time)."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
        on_evict: Callable[[int], None] | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._on_evict = on_evict
        self._data: OrderedDict[str, L1Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes_used = 0
        self.evictions = 0
        """Entries dropped for room (LRU); expiries are counted separately."""
        self.expirations = 0

    def get(self, key: str) -> L1Entry | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            if entry.expires_at <= self._clock():
                self._remove(key)
                self.expirations += 1
                return None
            self._data.move_to_end(key)
            return entry

    def put(
        self,
        key: str,
        completion: CachedCompletion,
        nbytes: int,
        value_tier: str,
        expires_at: float | None = None,
    ) -> bool:
        """Store ``completion``; expiry = min(now + ttl, ``expires_at``). False if it cannot fit."""
        if nbytes > self.max_bytes:
            return False
        now = self._clock()
        exp = now + self.ttl_s if expires_at is None else min(now + self.ttl_s, expires_at)
        if exp <= now:
            return False
        evicted = 0
        with self._lock:
            if key in self._data:
                self._remove(key)
            self._data[key] = L1Entry(completion, exp, nbytes, value_tier)
            self.bytes_used += nbytes
            while len(self._data) > self.max_entries or self.bytes_used > self.max_bytes:
                old_key = next(iter(self._data))
                self._remove(old_key)
                self.evictions += 1
                evicted += 1
        if evicted and self._on_evict is not None:
            self._on_evict(evicted)
        return True

    def _remove(self, key: str) -> None:
        entry = self._data.pop(key)
        self.bytes_used -= entry.nbytes

    def delete(self, key: str) -> None:
        with self._lock:
            if key in self._data:
                self._remove(key)

    def clear(self) -> int:
        with self._lock:
            n = len(self._data)
            self._data.clear()
            self.bytes_used = 0
            return n

    def purge_expired(self) -> int:
        now = self._clock()
        with self._lock:
            dead = [k for k, e in self._data.items() if e.expires_at <= now]
            for k in dead:
                self._remove(k)
            self.expirations += len(dead)
            return len(dead)

    def __len__(self) -> int:
        return len(self._data)
