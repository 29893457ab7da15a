"""Bloom guard against cache penetration: a key never written skips the L1/L2 lookups.

The filter holds every key the cache has written. A request whose key is *definitely* absent
cannot be in L1 or L2, so it goes straight to the model (its completion is written back
asynchronously); only keys the filter *may* hold pay for a Redis round trip.

Keys are already SHA-256 digests, so the filter's item is an int slice of the digest (its first
64 bits, signed) and the filter uses rbloom's built-in hash path: Python's ``hash`` of an *int* is
not salted (only str/bytes are), and rbloom calls it without a Python-level call, so a check costs
~0.05 µs instead of ~0.25 µs with a Python hash function such as ``operator.index``. rbloom
refuses to save a filter that uses the built-in hash, so the guard keeps the items it added (8 bytes
each, an ``array``) and saves *those* (sorted, unique, fixed little-endian layout; never pickle);
loading re-adds them. The file therefore does not depend on the hash function or the platform, and
files from several processes merge by adding all their items.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from array import array
from pathlib import Path

import numpy as np
from rbloom import Bloom

from harness.common.errors import InputError
from harness.common.io import atomic_write

_PROBES = 20_000
_MAGIC = b"HCBLOOM2"
_HEADER = struct.Struct("<8sQdQ")  # magic, capacity, fp rate, item count; then int64 items (LE)


def key_item(key: str) -> int:
    """The filter item of a cache key: the first 16 of its 32 hex digits as a signed 64-bit integer.

    Equal to ``NormalizedRequest.bloom_item``, which the stack uses so the request path never
    re-parses the key.
    """
    digest = key.rsplit(":", 1)[-1]
    if len(digest) == 32:
        try:
            return int.from_bytes(bytes.fromhex(digest[:16]), "big", signed=True)
        except ValueError:
            pass
    # Not one of our digests (a caller-made key): hash it so it still maps stably.
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big", signed=True)


def _probe_item(i: int) -> int:
    return int.from_bytes(hashlib.sha256(b"probe:%d" % i).digest()[:8], "big", signed=True)


@functools.cache
def _probes() -> tuple[int, ...]:
    """The fixed probe items, hashed once per process (a /metrics scrape re-measures the rate)."""
    return tuple(_probe_item(i) for i in range(_PROBES))


class BloomGuard:
    """A stable-hash Bloom filter with intercept/pass counters and a measured false-positive rate."""

    def __init__(self, capacity: int, fp_rate: float) -> None:
        self.capacity = capacity
        self.fp_rate = fp_rate
        # No hash function: rbloom's built-in path (see the module docstring).
        self.bloom = Bloom(capacity, fp_rate)
        self._items = array("q")
        """Every item added (duplicates included until compacted): what :meth:`save` writes."""
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
        self._items.append(item)
        if len(self._items) > 4 * self.capacity:
            self._items = _unique(self._items)  # rewritten keys repeat; keep the log bounded

    def __contains__(self, key: str) -> bool:
        return key_item(key) in self.bloom

    def add(self, key: str) -> None:
        self.add_item(key_item(key))

    def clear(self) -> int:
        n = self.approx_items
        self.bloom.clear()
        self._items = array("q")
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
        bloom = self.bloom
        rate = sum(1 for item in _probes() if item in bloom) / _PROBES
        self._fp_cache = (n, rate)
        return rate

    def save(self, path: Path) -> None:
        """Write the geometry and the sorted unique items (the same set gives the same bytes)."""
        self._items = _unique(self._items)
        header = _HEADER.pack(_MAGIC, self.capacity, self.fp_rate, len(self._items))
        with atomic_write(path, "wb", encoding=None) as fh:
            fh.write(header)
            fh.write(np.asarray(self._items, dtype="<i8").tobytes())

    def load(self, path: Path) -> None:
        """Add the saved items to this filter (so state from several processes merges)."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot load Bloom filter: {exc}", file=path) from None
        if len(raw) < _HEADER.size or raw[:8] != _MAGIC:
            raise InputError("not a Bloom filter state file (or one of an older format)", file=path)
        _, capacity, fp_rate, n = _HEADER.unpack_from(raw)
        if len(raw) != _HEADER.size + 8 * n:
            raise InputError(f"Bloom filter file is truncated ({len(raw)} bytes for {n} items)", file=path)
        if capacity != self.capacity or fp_rate != self.fp_rate:
            raise InputError(
                "Bloom filter was saved with another capacity / false-positive rate",
                file=path,
                hint="delete it or restore the previous bloom_capacity and bloom_fp_rate",
            )
        items = np.frombuffer(raw, dtype="<i8", offset=_HEADER.size).tolist()
        self.bloom.update(items)
        self._items.extend(items)
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


def _unique(items: array[int]) -> array[int]:
    out = array("q")
    out.frombytes(np.unique(np.frombuffer(items, dtype=np.int64)).tobytes())
    return out
