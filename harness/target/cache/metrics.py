"""Prometheus metrics of the cache stack, registered in the registry given to ``create_cache``.

Counters and histograms are updated on the request path; derived values (hit rate, fill rate,
entries, thermal drift, Bloom false-positive rate) are gauges read through callbacks when the
registry is scraped, so they cost nothing per request.

Thermal drift is the coefficient of variation (stddev / mean) of a tier's lookup latency over a
sliding five-minute window: a tier whose latency starts to wander (Redis swapping, a FAISS index
outgrowing the CPU cache, a noisy neighbour) shows it before its mean moves much.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from harness.common.stats import percentile
from harness.target.cache.api import TIER_NAMES

TIERS: tuple[str, ...] = TIER_NAMES
_BUCKETS = (
    1e-6,
    5e-6,
    1e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    0.05,
    0.1,
    0.25,
    1.0,
)


class DriftWindow:
    """Latency samples of the last ``window_s`` seconds (at most ``max_samples``), for stddev/mean."""

    def __init__(self, window_s: float = 300.0, max_samples: int = 20_000) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._samples.append((time.monotonic(), seconds))

    def values(self) -> list[float]:
        cutoff = time.monotonic() - self.window_s
        with self._lock:
            while self._samples and self._samples[0][0] < cutoff:
                self._samples.popleft()
            return [v for _, v in self._samples]

    def drift(self) -> float:
        vals = self.values()
        if len(vals) < 2:
            return 0.0
        mean = sum(vals) / len(vals)
        if mean <= 0:
            return 0.0
        var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
        return math.sqrt(var) / mean

    def percentile(self, q: float) -> float:
        """Nearest-rank ``q``-th percentile (0–100) of the window, in seconds; 0 when it is empty."""
        vals = self.values()
        return percentile(vals, q) if vals else 0.0


class CacheMetrics:
    """All cache metrics; per-tier counters are also kept as plain ints for ``stats()``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.hits = Counter("cache_hits", "Cache hits per tier.", ["tier"], registry=registry)
        self.misses = Counter(
            "cache_misses", "Cache lookups that missed, per tier.", ["tier"], registry=registry
        )
        self.errors = Counter(
            "cache_errors", "Failed or timed-out tier operations (fail-open).", ["tier"], registry=registry
        )
        self.evictions = Counter("cache_evictions", "Entries evicted for room.", ["tier"], registry=registry)
        self.corrupt = Counter(
            "cache_corrupt_values",
            "Stored values that failed decoding or checksum (deleted).",
            ["tier"],
            registry=registry,
        )
        self.requests = Counter("cache_requests", "Requests by cache outcome.", ["status"], registry=registry)
        self.lookup = Histogram(
            "cache_lookup_seconds", "Lookup latency per tier.", ["tier"], buckets=_BUCKETS, registry=registry
        )
        self.bloom_intercepts = Counter(
            "cache_bloom_intercepts",
            "Requests whose key the Bloom filter never saw (lookups skipped).",
            registry=registry,
        )
        self.bloom_passes = Counter(
            "cache_bloom_passes", "Requests whose key the Bloom filter may have seen.", registry=registry
        )
        self.singleflight_merges = Counter(
            "cache_singleflight_merges",
            "Requests merged into an identical in-flight request.",
            registry=registry,
        )
        self.redis_restarts = Counter(
            "cache_redis_restarts",
            "Restarts of the embedded Redis after its process died.",
            registry=registry,
        )
        self.writebacks = Counter(
            "cache_writebacks", "Completions written back, per value tier.", ["value_tier"], registry=registry
        )
        self.hit_rate = Gauge(
            "cache_hit_rate", "hits / (hits + misses) per tier.", ["tier"], registry=registry
        )
        self.fill_rate = Gauge(
            "cache_fill_rate", "Bytes used / capacity per tier.", ["tier"], registry=registry
        )
        self.entries = Gauge("cache_entries", "Entries per tier.", ["tier"], registry=registry)
        self.drift_gauge = Gauge(
            "cache_thermal_drift",
            "stddev / mean of lookup latency over 5 min, per tier.",
            ["tier"],
            registry=registry,
        )
        self.bloom_fp = Gauge("cache_bloom_fp_rate", "Measured Bloom false-positive rate.", registry=registry)
        self.counts: dict[str, dict[str, int]] = {t: {"hits": 0, "misses": 0, "errors": 0} for t in TIERS}
        self.drift = {t: DriftWindow() for t in TIERS}
        # Label lookups cost microseconds each; the request path uses these resolved children.
        self._hits = {t: self.hits.labels(t) for t in TIERS}
        self._misses = {t: self.misses.labels(t) for t in TIERS}
        self._errors = {t: self.errors.labels(t) for t in TIERS}
        self._lookup = {t: self.lookup.labels(t) for t in TIERS}
        self._requests: dict[str, Any] = {}
        for tier in TIERS:
            self.hit_rate.labels(tier).set_function(self._hit_rate_fn(tier))
            self.drift_gauge.labels(tier).set_function(self.drift[tier].drift)

    def _hit_rate_fn(self, tier: str) -> Callable[[], float]:
        def fn() -> float:
            c = self.counts[tier]
            total = c["hits"] + c["misses"]
            return c["hits"] / total if total else 0.0

        return fn

    def bind_gauges(
        self,
        fill: Callable[[str], float],
        entries: Callable[[str], float],
        bloom_fp: Callable[[], float],
    ) -> None:
        for tier in TIERS:
            self.fill_rate.labels(tier).set_function(lambda t=tier: fill(t))  # type: ignore[misc]
            self.entries.labels(tier).set_function(lambda t=tier: entries(t))  # type: ignore[misc]
        self.bloom_fp.set_function(bloom_fp)

    def hit(self, tier: str) -> None:
        self.counts[tier]["hits"] += 1
        self._hits[tier].inc()

    def miss(self, tier: str) -> None:
        self.counts[tier]["misses"] += 1
        self._misses[tier].inc()

    def error(self, tier: str) -> None:
        self.counts[tier]["errors"] += 1
        self._errors[tier].inc()

    def observe(self, tier: str, seconds: float) -> None:
        self._lookup[tier].observe(seconds)
        self.drift[tier].add(seconds)

    def request(self, status: str) -> None:
        child = self._requests.get(status)
        if child is None:
            child = self._requests[status] = self.requests.labels(status)
        child.inc()
