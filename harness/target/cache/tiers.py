"""The cache tiers behind one interface, registered in lookup order: L1, L2, L3.

:class:`~harness.target.cache.stack.CacheStack` knows tiers only through :class:`CacheTier`: it walks
:data:`CACHE_TIERS` to look a request up (fastest first), promotes a hit into every faster tier,
writes a new completion into all of them, and asks each for its figures, housekeeping, flush and
persistence. What is special about a tier stays in its class here:

* **L1** (:class:`L1Tier`, in-process LRU) is *local*: its lookup needs no I/O, so ``begin_nowait``
  can answer from it; writes are immediate.
* **L2** (:class:`L2Tier`, Redis) decodes and verifies stored values (a corrupt one is a miss and is
  deleted in the background); writes go through the codec and are write-back (background).
* **L3** (:class:`L3Tier`, semantic) is not keyed by the exact key: the Bloom guard cannot rule it
  out unless ``bloom_l3_on_first_sight`` is off, and only texts up to ``l3_max_chars`` take part.

A tier raises :class:`TierUnavailable` when it fails; the stack counts it in
``cache_errors_total{tier}`` and carries on without that tier (fail-open). Hits, misses and lookup
latency are counted by the stack, the same way for every tier.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.common.headers import CacheStatus
from harness.common.registry import Registry
from harness.target.cache import codec
from harness.target.cache.api import CachedCompletion, TierName
from harness.target.cache.keys import NormalizedRequest
from harness.target.cache.l1 import L1Cache
from harness.target.cache.l2 import L2Unavailable, RedisTier, redact
from harness.target.cache.l3 import L3Entry, SemanticCache
from harness.target.cache.metrics import CacheMetrics
from harness.target.cache.redis_server import EmbeddedRedis
from harness.target.cache.settings import CacheSettings

log = logging.getLogger("harness.target.cache.stack")


class TierUnavailable(Exception):
    """A tier operation failed; the request goes on without the tier."""


@dataclass(slots=True)
class TierHit:
    """What a tier found for a request."""

    completion: CachedCompletion
    value_tier: str
    expires_at: float
    """Absolute (``time.time``) expiry of the source entry; promotions keep it."""
    context: dict[str, Any] = field(default_factory=dict)
    """Facts for the ticket's context (the L3 score and source key)."""


class CacheTier:
    """One tier. Subclasses set the class attributes and override what they support."""

    name: TierName
    hit_status: CacheStatus
    local: bool = False
    """Lookups need no I/O (:meth:`get_nowait` answers them)."""
    guarded: bool = True
    """A key the Bloom guard has never seen cannot be here, so the lookup is skipped."""
    exact: bool = True
    """Keyed by the exact key; a hit in a tier that is not (L3) brings a key new to the guard."""

    def accepts(self, req: NormalizedRequest) -> bool:
        """Whether this request takes part in the tier at all (not counted as a miss otherwise)."""
        return True

    def get_nowait(self, req: NormalizedRequest) -> TierHit | None:
        """The lookup of a ``local`` tier."""
        raise NotImplementedError(f"{self.name} is not a local tier")

    async def get(self, req: NormalizedRequest, ctx: dict[str, Any]) -> TierHit | None:
        """Look ``req`` up; ``ctx`` is the ticket's context (a tier may leave facts for its write)."""
        return self.get_nowait(req)

    def write(
        self, req: NormalizedRequest, value: codec.StoredValue, ctx: dict[str, Any]
    ) -> Coroutine[Any, Any, None] | None:
        """Store ``value`` under ``req``: done at once (``None``), or the coroutine that does it
        (the stack runs it in the background, or awaits it for ``put``). Failures are counted
        here and never raised: a write-back has no request left to fail."""
        raise NotImplementedError

    async def clear(self) -> int:
        """Drop every entry; returns how many (raises :class:`TierUnavailable`)."""
        raise NotImplementedError

    async def housekeep(self) -> int:
        """Periodic work (expiry sweeps, server figures); returns evictions not yet counted."""
        return 0

    def entries(self) -> float:
        return 0.0

    def fill_rate(self) -> float:
        """Bytes (or entries) used / capacity."""
        return 0.0

    def evictions(self) -> int:
        return 0

    def stats(self) -> dict[str, Any]:
        """Tier-specific fields for ``GET /cache/stats``."""
        return {}

    def save_state(self, directory: Path) -> None:
        """Persist what survives a restart (nothing, unless the tier says otherwise)."""

    def load_state(self, directory: Path) -> None:
        """Load what :meth:`save_state` wrote."""

    async def close(self) -> None:
        """Release connections and threads."""


@dataclass(slots=True)
class TierParts:
    """What the tier factories build from: settings, metrics and the components the cache factory
    made (the Redis URL and embedded server, the semantic cache with its model)."""

    settings: CacheSettings
    metrics: CacheMetrics
    l1: L1Cache
    redis_url: str | None
    embedded: EmbeddedRedis | None
    semantic: SemanticCache | None
    spawn: Callable[[Coroutine[Any, Any, None]], None]
    """Runs a coroutine in the background, tracked by the stack's ``drain``."""


CACHE_TIERS: Registry[Callable[[TierParts], CacheTier | None]] = Registry("cache tier")
"""Tier factories by name, in lookup order; a factory returns ``None`` when its tier is off."""


class L1Tier(CacheTier):
    """The in-process LRU (:class:`~harness.target.cache.l1.L1Cache`)."""

    name = "l1"
    hit_status = "HIT-L1"
    local = True

    def __init__(self, parts: TierParts) -> None:
        self.cache = parts.l1

    def get_nowait(self, req: NormalizedRequest) -> TierHit | None:
        e = self.cache.get(req.key)
        return None if e is None else TierHit(e.completion, e.value_tier, e.expires_at)

    def write(
        self, req: NormalizedRequest, value: codec.StoredValue, ctx: dict[str, Any]
    ) -> Coroutine[Any, Any, None] | None:
        c = value.completion
        self.cache.put(req.key, c, codec.completion_nbytes(c), value.value_tier, value.expires_at)
        return None

    async def clear(self) -> int:
        return self.cache.clear()

    async def housekeep(self) -> int:
        self.cache.purge_expired()
        return 0  # L1 counts its evictions as they happen (``on_evict``)

    def entries(self) -> float:
        return float(len(self.cache))

    def fill_rate(self) -> float:
        return self.cache.bytes_used / self.cache.max_bytes

    def evictions(self) -> int:
        return self.cache.evictions

    def stats(self) -> dict[str, Any]:
        return {
            "bytes": self.cache.bytes_used,
            "capacity_bytes": self.cache.max_bytes,
            "ttl_s": self.cache.ttl_s,
        }


@CACHE_TIERS.register("l1")
def _l1_tier(parts: TierParts) -> CacheTier | None:
    return L1Tier(parts) if parts.settings.l1_enabled else None


class L2Tier(CacheTier):
    """Redis (:class:`~harness.target.cache.l2.RedisTier`): values are encoded, checksummed and verified."""

    name = "l2"
    hit_status = "HIT-L2"

    def __init__(self, parts: TierParts, redis: RedisTier) -> None:
        self.redis = redis
        self.settings = parts.settings
        self.metrics = parts.metrics
        self.embedded = parts.embedded
        self.spawn = parts.spawn
        self.corrupt = 0
        self._evictions_seen: int | None = None

    async def get(self, req: NormalizedRequest, ctx: dict[str, Any]) -> TierHit | None:
        try:
            raw = await self.redis.get(req.key)
        except L2Unavailable as exc:
            raise TierUnavailable(str(exc)) from exc
        if raw is None:
            return None
        try:
            stored = codec.decode(raw, req.key, self.settings.schema_version)
        except codec.CorruptValue as exc:
            self.corrupt += 1
            self.metrics.corrupt.labels(self.name).inc()
            log.warning("corrupt L2 value for %s deleted: %s", req.key, exc)
            self.spawn(self._delete(req.key))
            return None
        if stored.expires_at <= time.time():
            return None
        return TierHit(stored.completion, stored.value_tier, stored.expires_at)

    async def _delete(self, key: str) -> None:
        try:
            await self.redis.delete(key)
        except L2Unavailable:
            self.metrics.error(self.name)

    def write(
        self, req: NormalizedRequest, value: codec.StoredValue, ctx: dict[str, Any]
    ) -> Coroutine[Any, Any, None] | None:
        return self._set(req.key, value)

    async def _set(self, key: str, value: codec.StoredValue) -> None:
        ttl = value.expires_at - time.time()
        if ttl <= 0:
            return
        try:
            raw = codec.encode(value, self.settings.schema_version)
        except ValueError as exc:
            self.metrics.error(self.name)
            log.warning("not writing %s to L2: %s", key, exc)
            return
        try:
            await self.redis.set(key, raw, ttl)
        except L2Unavailable as exc:
            self.metrics.error(self.name)
            log.debug("L2 set failed: %s", exc)

    async def clear(self) -> int:
        try:
            return await self.redis.flush()
        except L2Unavailable as exc:
            raise TierUnavailable(f"Redis (L2) is unavailable: {exc}") from exc

    async def housekeep(self) -> int:
        # Failures are counted where requests fail; the gauges keep their last values.
        try:
            await self.redis.refresh_info()
        except L2Unavailable:
            return 0
        ev = int(self.redis.info.get("evicted_keys", 0))
        # The first figure is the baseline: evictions before this process started are not ours.
        new = (
            ev - self._evictions_seen if self._evictions_seen is not None and ev > self._evictions_seen else 0
        )
        self._evictions_seen = ev
        return new

    def entries(self) -> float:
        return float(self.redis.info.get("keys", 0))

    def fill_rate(self) -> float:
        cap = self.redis.info.get("maxmemory") or self.settings.redis_maxmemory
        return float(self.redis.info.get("used_memory", 0)) / float(cap)

    def evictions(self) -> int:
        return int(self.redis.info.get("evicted_keys", 0))

    def stats(self) -> dict[str, Any]:
        r = self.redis
        embedded = self.embedded
        return {
            "url": redact(r.url),
            "cluster": r.cluster,
            "embedded_pid": embedded.pid if embedded is not None and embedded.alive() else None,
            "embedded_restarts": embedded.restarts if embedded is not None else 0,
            "breaker": r.breaker.state,
            "breaker_opens": r.breaker.opens,
            "breaker_skips": r.skipped,
            "retries": r.retries,
            "corrupt": self.corrupt,
            "info": dict(r.info),
        }

    async def close(self) -> None:
        await self.redis.close()


@CACHE_TIERS.register("l2")
def _l2_tier(parts: TierParts) -> CacheTier | None:
    if not parts.settings.l2_enabled or not parts.redis_url:
        return None
    return L2Tier(parts, RedisTier(parts.settings, parts.redis_url))


class L3Tier(CacheTier):
    """The semantic cache (:class:`~harness.target.cache.l3.SemanticCache`): near-duplicate prompts."""

    name = "l3"
    hit_status = "HIT-L3"
    exact = False

    def __init__(self, parts: TierParts, semantic: SemanticCache) -> None:
        self.semantic = semantic
        self.settings = parts.settings
        self.metrics = parts.metrics
        # A paraphrase always has a new key, so by default the Bloom guard does not rule L3 out.
        self.guarded = not parts.settings.bloom_l3_on_first_sight
        self._evictions_seen = 0

    def accepts(self, req: NormalizedRequest) -> bool:
        # MiniLM reads only ~256 word pieces: two long texts that differ later would look the same.
        return bool(req.text) and len(req.text) <= self.settings.l3_max_chars

    async def get(self, req: NormalizedRequest, ctx: dict[str, Any]) -> TierHit | None:
        try:
            hit, vec = await self.semantic.lookup(req)
        except Exception as exc:  # a broken L3 must not fail the request
            log.warning("L3 lookup failed (served without L3): %s", exc)
            raise TierUnavailable(f"L3 lookup failed: {exc}") from exc
        ctx["vec"] = vec  # the write after a miss reuses this embedding
        if hit is None:
            return None
        e = hit.entry
        return TierHit(
            e.completion, e.value_tier, e.expires_at, {"l3_score": hit.score, "l3_source_key": e.key}
        )

    def write(
        self, req: NormalizedRequest, value: codec.StoredValue, ctx: dict[str, Any]
    ) -> Coroutine[Any, Any, None] | None:
        if not self.accepts(req):
            return None
        entry = L3Entry(
            req.key,
            req.params_hash,
            req.numbers,
            req.negations,
            value.completion,
            value.expires_at,
            value.value_tier,
            req.text,
        )
        return self._add(req, entry, ctx.get("vec"))

    async def _add(self, req: NormalizedRequest, entry: L3Entry, vec: Any) -> None:
        try:
            await self.semantic.add(req, entry, vec)
        except Exception as exc:  # a broken L3 must not fail the request
            self.metrics.error(self.name)
            log.warning("L3 add failed: %s", exc)

    async def clear(self) -> int:
        return self.semantic.clear()

    async def housekeep(self) -> int:
        await asyncio.get_running_loop().run_in_executor(None, self.semantic.expire)
        ev = self.semantic.evictions()
        new = max(0, ev - self._evictions_seen)
        self._evictions_seen = ev
        return new

    def entries(self) -> float:
        return float(self.semantic.entries())

    def fill_rate(self) -> float:
        return self.semantic.entries() / (self.settings.l3_max_entries * max(1, len(self.semantic.tenants)))

    def evictions(self) -> int:
        return self.semantic.evictions()

    def stats(self) -> dict[str, Any]:
        s = self.semantic
        return {
            "threshold": self.settings.l3_threshold,
            "tenants": {t: {"entries": i.live, "index": i.kind} for t, i in s.tenants.items()},
            "refused": dict(s.refused),
            "consistency": dict(s.consistency),
            "embed_ms_mean": 1000 * s.embed_s_total / max(1, s.lookups),
            "search_ms_mean": 1000 * s.search_s_total / max(1, s.lookups),
        }

    def save_state(self, directory: Path) -> None:
        self.semantic.save(directory / "l3")

    def load_state(self, directory: Path) -> None:
        self.semantic.load(directory / "l3")

    async def close(self) -> None:
        self.semantic.close()


@CACHE_TIERS.register("l3")
def _l3_tier(parts: TierParts) -> CacheTier | None:
    return L3Tier(parts, parts.semantic) if parts.semantic is not None else None
