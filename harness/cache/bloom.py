"""Bloom guard against cache penetration: a key never written skips the L1/L2 lookups.

The filter holds every key the cache has written. A request whose key is *definitely* absent
cannot be in L1 or L2, so it goes straight to the model (its completion is written back
asynchronously); only keys the filter *may* hold pay for a Redis round trip. Keys are already
SHA-256 digests, so the filter's item is the digest's 128 bits as a signed integer and the hash
function is the identity (``operator.index``): stable across processes and restarts (Python's
salted ``hash`` is not), and the check stays in C. The state is saved with rbloom's own byte
format (never pickle); filters built by different processes can be OR-ed together.
"""

from __future__ import annotations

import hashlib
import math
import operator
from pathlib import Path

from rbloom import Bloom

from harness.common.errors import InputError
from harness.common.io import atomic_write

_HALF = 1 << 127
_PROBES = 20_000


def key_item(key: str) -> int:
    """The filter item of a cache key: its 32 hex digits as a signed 128-bit integer.

    Equal to ``NormalizedRequest.bloom_item``, which the stack uses so the request path never
    re-parses the key.
    """
    digest = key.rsplit(":", 1)[-1]
    try:
        return int(digest[-32:], 16) - (_HALF << 1 if digest[-32] in "89abcdef" else 0)
    except ValueError:
        # Not one of our digests (a caller-made key): hash it so it still maps stably.
        return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=16).digest(), "big") - _HALF


class BloomGuard:
    """A stable-hash Bloom filter with intercept/pass counters and a measured false-positive rate."""

    def __init__(self, capacity: int, fp_rate: float) -> None:
        self.capacity = capacity
        self.fp_rate = fp_rate
        self.bloom = Bloom(capacity, fp_rate, operator.index)
        self.intercepted = 0
        """Lookups skipped because the key was definitely never written."""
        self.passed = 0
        self._fp_cache: tuple[int, float] | None = None

    def check(self, key: str) -> bool:
        """May ``key`` have been written? Counts the outcome."""
        return self.check_item(key_item(key))

    def check_item(self, item: int) -> bool:
        """:meth:`check` for a precomputed item (``NormalizedRequest.bloom_item``)."""
        if item in self.bloom:
            self.passed += 1
            return True
        self.intercepted += 1
        return False

    def add_item(self, item: int) -> None:
        self.bloom.add(item)

    def __contains__(self, key: str) -> bool:
        return key_item(key) in self.bloom

    def add(self, key: str) -> None:
        self.bloom.add(key_item(key))

    def clear(self) -> int:
        n = self.approx_items
        self.bloom.clear()
        self._fp_cache = None
        return n

    @property
    def approx_items(self) -> int:
        return round(self.bloom.approx_items)

    def theoretical_fp_rate(self) -> float:
        """(1 - e^{-kn/m})^k for the current fill, with k the optimal number of hashes."""
        m = self.bloom.size_in_bits
        n = self.bloom.approx_items
        if n <= 0:
            return 0.0
        k = max(1, round(m / max(self.capacity, 1) * math.log(2)))
        return float((1.0 - math.exp(-k * n / m)) ** k)

    def measured_fp_rate(self) -> float:
        """Share of probe keys that were never added but test positive (20 000 fixed probes).

        Probes are SHA-256 digests of ``probe:<i>``, which no request key equals, so every
        positive is a false positive. Cached until the fill changes.
        """
        n = self.approx_items
        if self._fp_cache is not None and self._fp_cache[0] == n:
            return self._fp_cache[1]
        hits = 0
        for i in range(_PROBES):
            item = int.from_bytes(hashlib.sha256(b"probe:%d" % i).digest()[:16], "big") - _HALF
            hits += item in self.bloom
        rate = hits / _PROBES
        self._fp_cache = (n, rate)
        return rate

    def save(self, path: Path) -> None:
        with atomic_write(path, "wb", encoding=None) as fh:
            fh.write(self.bloom.save_bytes())

    def load(self, path: Path) -> None:
        """OR the saved filter into this one (so state from several processes merges)."""
        try:
            other = Bloom.load_bytes(path.read_bytes(), operator.index)
        except (ValueError, OSError) as exc:
            raise InputError(f"cannot load Bloom filter: {exc}", file=path) from None
        if other.size_in_bits != self.bloom.size_in_bits:
            raise InputError(
                "Bloom filter was saved with another capacity / false-positive rate",
                file=path,
                hint="delete it or restore the previous bloom_capacity and bloom_fp_rate",
            )
        self.bloom.update(other)
        self._fp_cache = None

    def stats(self) -> dict[str, float | int]:
        total = self.intercepted + self.passed
        return {
            "items": self.approx_items,
            "capacity": self.capacity,
            "size_bits": self.bloom.size_in_bits,
            "fill_rate": min(1.0, self.approx_items / self.capacity),
            "intercepted": self.intercepted,
            "passed": self.passed,
            "intercept_rate": self.intercepted / total if total else 0.0,
            "fp_rate_target": self.fp_rate,
            "fp_rate_theoretical": self.theoretical_fp_rate(),
            "fp_rate_measured": self.measured_fp_rate(),
        }
