"""The cache stack behind :class:`harness.cache.api.ResponseCache`: Bloom → L1 → L2 → L3.

``begin`` normalizes the request into a key and, unless the request bypasses the cache, joins an
in-flight identical request (single-flight) or becomes its leader and looks the key up:

1. Bloom guard: a key never written skips L1 and L2 (no Redis round trip for cache-penetrating
   keys); L3 is still asked (``bloom_l3_on_first_sight``) because a paraphrase always has a new key.
2. L1 (in-process), then L2 (Redis, fail-open), then L3 (semantic). A hit is promoted to the
   faster tiers with the *original* expiry (a promotion never extends an entry's life).
3. A miss returns a leader ticket; the server generates and calls ``finish``. ``finish`` writes L1
   and the Bloom filter at once and L2 + L3 in the background (write-back), then releases the
   followers, which are answered from the leader's completion (reported as ``HIT-L1``, with
   ``context["merged"] = True``).

Redis failures, timeouts and an open breaker count in ``cache_errors_total{tier="l2"}`` and the
request simply carries on, as do L3 failures. Tenants are part of every key, Redis key and L3
index, so no tier can answer one tenant with another's completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from harness.cache import codec
from harness.cache.api import CachedCompletion, CacheTicket
from harness.cache.bloom import BloomGuard
from harness.cache.keys import KeyBuilder, NormalizedRequest
from harness.cache.l1 import L1Cache, L1Entry
from harness.cache.l2 import L2Unavailable, RedisTier, redact
from harness.cache.l3 import L3Entry, SemanticCache, Vector
from harness.cache.metrics import TIERS, CacheMetrics
from harness.cache.policy import TIER_POLICIES, TierPolicy
from harness.cache.redis_server import EmbeddedRedis
from harness.cache.settings import CacheSettings
from harness.common.errors import HarnessError, InputError, UnavailableError
from harness.common.headers import DEFAULT_TENANT, CacheStatus
from harness.common.openai import Endpoint

log = logging.getLogger(__name__)

CACHEABLE_FINISH = frozenset({"stop", "length"})
FLUSH_TIERS = ("l1", "l2", "l3", "bloom")
_HIT_COUNTS_MAX = 100_000
_MEMOS_MAX = 1024


@dataclass(slots=True)
class _Memo:
    body: Mapping[str, Any]
    endpoint: str
    tenant: str
    revision: str | None
    req: NormalizedRequest
    local: tuple[bool, dict[str, Any]] | None
    """(Bloom says maybe, lookup context) of an L1 miss already counted; None: nothing looked up."""


class CacheStack:
    """The three-tier response cache. Build it with :func:`harness.cache.factory.create_cache`."""

    def __init__(
        self,
        settings: CacheSettings,
        registry: CollectorRegistry,
        *,
        redis_url: str | None,
        embedded: EmbeddedRedis | None = None,
        semantic: SemanticCache | None = None,
    ) -> None:
        self.settings = settings
        self.keys = KeyBuilder(settings)
        self.bloom = (
            BloomGuard(settings.bloom_capacity, settings.bloom_fp_rate) if settings.bloom_enabled else None
        )
        self.metrics = CacheMetrics(registry)
        self.l1 = L1Cache(
            settings.l1_max_entries,
            settings.l1_max_bytes,
            settings.l1_ttl_s,
            on_evict=self.metrics.evictions.labels("l1").inc,
        )
        self.embedded = embedded
        self.l2 = RedisTier(settings, redis_url) if settings.l2_enabled and redis_url else None
        self.l3 = semantic
        self.policy: TierPolicy = TIER_POLICIES.get(settings.tier_policy)(settings)
        self.model_revision: str | None = None
        """Overrides ``settings.model_revision`` in keys (the server sets it from the engine)."""
        self._inflight: dict[str, asyncio.Future[CachedCompletion | None]] = {}
        self._pending: set[asyncio.Task[Any]] = set()
        self._hit_counts: OrderedDict[str, int] = OrderedDict()
        self._status_counts: dict[str, int] = {}
        self.merges = 0
        self.corrupt = 0
        self._l2_evictions_seen: int | None = None
        self._l3_evictions_seen = 0
        self._refresher: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closed = False
        self._memos: dict[int, _Memo] = {}
        """``begin_nowait``'s work for the ``begin`` call that follows it, by ``id(body)`` (the memo
        holds the body, so the id cannot be reused while it is there)."""
        self.metrics.bind_gauges(self._fill_rate, self._entries, self._bloom_fp)

    # ------------------------------------------------------------------ protocol

    async def begin(
        self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str, *, no_cache: bool = False
    ) -> CacheTicket:
        t0 = time.perf_counter()
        self._ensure_background()
        tenant = tenant or DEFAULT_TENANT
        memo = self._take_memo(endpoint, body, tenant) if self._memos else None
        local: tuple[bool, dict[str, Any]] | None = None
        if memo is not None:
            req, local = memo
        else:
            try:
                req = self.keys.normalize(endpoint, body, tenant, model_revision=self.model_revision)
            except HarnessError as exc:
                # The cache never rejects a request: the server validates and answers errors itself.
                return self._ticket("BYPASS", "", tenant, t0, context={"reason": f"unkeyable: {exc}"})
        if no_cache or (req.sampled and not self.settings.cache_sampled):
            return self._bypass(req, tenant, t0, no_cache)
        deadline = time.monotonic() + self.settings.singleflight_timeout_s
        while True:
            fut = self._inflight.get(req.key)
            if fut is None:
                break
            self.merges += 1
            self.metrics.singleflight_merges.inc()
            remaining = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(0.0, remaining)):
                    completion = await asyncio.shield(fut)
            except TimeoutError:
                # The leader never reported (a server bug or a lost client): stop waiting on it.
                if self._inflight.get(req.key) is fut:
                    del self._inflight[req.key]
                break
            if completion is not None:
                return self._ticket(
                    "HIT-L1", req.key, tenant, t0, completion=completion, context={"merged": True, "req": req}
                )
            # The leader failed: loop, and one of the followers becomes the next leader.
            local = None  # a Bloom/L1 outcome from before the wait is stale
        leader_fut: asyncio.Future[CachedCompletion | None] = asyncio.get_running_loop().create_future()
        self._inflight[req.key] = leader_fut
        try:
            status, completion, ctx = await self._lookup(req, local)
        except BaseException:
            self._release(req.key, leader_fut, None)
            raise
        if completion is not None:
            self._release(req.key, leader_fut, completion)
            return self._ticket(status, req.key, tenant, t0, completion=completion, context=ctx)
        ctx["future"] = leader_fut
        return self._ticket("MISS", req.key, tenant, t0, is_leader=True, context=ctx)

    def begin_nowait(
        self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str, *, no_cache: bool = False
    ) -> CacheTicket | None:
        """:meth:`begin` for the answers that need no I/O: a BYPASS or an L1 hit, with the same
        statuses and counters ``begin`` would give. ``None`` means "now call ``begin``" (with the same
        arguments), which then reuses this call's key and Bloom/L1 outcome instead of counting them
        twice. Lets the server skip a task and a disconnect watcher on an L1 hit.
        """
        t0 = time.perf_counter()
        tenant = tenant or DEFAULT_TENANT
        try:
            req = self.keys.normalize(endpoint, body, tenant, model_revision=self.model_revision)
        except HarnessError:
            return None  # ``begin`` answers it (BYPASS, with the reason)
        if no_cache or (req.sampled and not self.settings.cache_sampled):
            return self._bypass(req, tenant, t0, no_cache)
        if req.key in self._inflight:
            self._put_memo(_Memo(body, endpoint, tenant, self.model_revision, req, None))
            return None  # a leader is at work: ``begin`` waits for it
        self._ensure_background()
        ctx: dict[str, Any] = {"req": req}
        maybe, entry = self._lookup_local(req, ctx)
        if entry is not None:
            return self._ticket("HIT-L1", req.key, tenant, t0, completion=entry.completion, context=ctx)
        self._put_memo(_Memo(body, endpoint, tenant, self.model_revision, req, (maybe, ctx)))
        return None

    def _bypass(self, req: NormalizedRequest, tenant: str, t0: float, no_cache: bool) -> CacheTicket:
        reason = "no-cache" if no_cache else "sampled"
        return self._ticket("BYPASS", req.key, tenant, t0, context={"reason": reason})

    def _put_memo(self, memo: _Memo) -> None:
        self._memos[id(memo.body)] = memo
        if len(self._memos) > _MEMOS_MAX:  # a caller that never followed up with ``begin``
            del self._memos[next(iter(self._memos))]

    def _take_memo(
        self, endpoint: str, body: Mapping[str, Any], tenant: str
    ) -> tuple[NormalizedRequest, tuple[bool, dict[str, Any]] | None] | None:
        m = self._memos.pop(id(body), None)
        if (
            m is not None
            and m.body is body
            and m.endpoint == endpoint
            and m.tenant == tenant
            and m.revision == self.model_revision
        ):
            return m.req, m.local
        return None

    async def finish(self, ticket: CacheTicket, completion: CachedCompletion | None) -> None:
        if ticket.status != "MISS":
            return
        req: NormalizedRequest | None = ticket.context.get("req")
        fut = ticket.context.pop("future", None)
        ok = (
            req is not None
            and completion is not None
            and completion.finish_reason in CACHEABLE_FINISH
            and not self._closed
        )
        if ok:
            assert req is not None and completion is not None
            self._store(req, completion, ticket.context.get("vec"), background=True)
        if fut is not None:
            self._release(ticket.key, fut, completion if ok else None)

    async def put(
        self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str, completion: CachedCompletion
    ) -> str:
        req = self.keys.normalize(
            endpoint, body, tenant or DEFAULT_TENANT, model_revision=self.model_revision
        )
        await self._store(req, completion, None, background=False)
        return req.key

    async def flush(self, tier: str | None = None) -> dict[str, int]:
        tiers = FLUSH_TIERS if tier in (None, "all") else (tier,)
        out: dict[str, int] = {}
        for t in tiers:
            if t == "l1":
                out["l1"] = self.l1.clear()
            elif t == "l2":
                if self.l2 is None:
                    out["l2"] = 0
                    continue
                try:
                    out["l2"] = await self.l2.flush()
                except L2Unavailable as exc:
                    self.metrics.error("l2")
                    raise _unavailable(exc) from None
            elif t == "l3":
                out["l3"] = self.l3.clear() if self.l3 is not None else 0
            elif t == "bloom":
                out["bloom"] = self.bloom.clear() if self.bloom is not None else 0
            else:
                raise InputError(
                    f"unknown cache tier {t!r}; expected one of {', '.join(FLUSH_TIERS)}", field="tier"
                )
        return out

    def stats(self) -> dict[str, Any]:
        c = self.metrics.counts
        tiers: dict[str, Any] = {}
        for t in TIERS:
            hits, misses = c[t]["hits"], c[t]["misses"]
            win = self.metrics.drift[t]
            tiers[t] = {
                "enabled": self._tier_enabled(t),
                "hits": hits,
                "misses": misses,
                "errors": c[t]["errors"],
                "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
                "entries": int(self._entries(t)),
                "fill_rate": self._fill_rate(t),
                "evictions": self._evictions(t),
                "lookup_ms_p50": win.percentile(50) * 1000,
                "lookup_ms_p99": win.percentile(99) * 1000,
                "thermal_drift": win.drift(),
            }
        tiers["l1"].update(bytes=self.l1.bytes_used, capacity_bytes=self.l1.max_bytes, ttl_s=self.l1.ttl_s)
        if self.l2 is not None:
            tiers["l2"].update(
                url=redact(self.l2.url),
                cluster=self.l2.cluster,
                embedded_pid=self.embedded.pid
                if self.embedded is not None and self.embedded.alive()
                else None,
                breaker=self.l2.breaker.state,
                breaker_opens=self.l2.breaker.opens,
                breaker_skips=self.l2.skipped,
                retries=self.l2.retries,
                corrupt=self.corrupt,
                info=dict(self.l2.info),
            )
        if self.l3 is not None:
            tiers["l3"].update(
                threshold=self.settings.l3_threshold,
                tenants={t: {"entries": i.live, "index": i.kind} for t, i in self.l3.tenants.items()},
                refused=dict(self.l3.refused),
                consistency=dict(self.l3.consistency),
                embed_ms_mean=1000 * self.l3.embed_s_total / max(1, self.l3.lookups),
                search_ms_mean=1000 * self.l3.search_s_total / max(1, self.l3.lookups),
            )
        total = sum(self._status_counts.values())
        hits = sum(v for k, v in self._status_counts.items() if k.startswith("HIT"))
        return {
            "schema_version": self.settings.schema_version,
            "requests": dict(self._status_counts),
            "hit_rate": hits / total if total else 0.0,
            "tiers": tiers,
            "bloom": self.bloom.stats() if self.bloom is not None else None,
            "singleflight": {"merges": self.merges, "in_flight": len(self._inflight)},
            "pending_writebacks": len(self._pending),
            "ttl_s": {
                "hot": self.settings.ttl_hot_s,
                "warm": self.settings.ttl_warm_s,
                "cold": self.settings.ttl_cold_s,
            },
            "policy": self.settings.tier_policy,
        }

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._refresher is not None:
            # The loop also checks ``_closed``: redis.asyncio can swallow a task cancellation that
            # lands inside a command (seen with redis-py 8.1 on Python 3.11), so cancel() alone
            # may not end it.
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._refresher), timeout=2.0)
        left = await self.drain(timeout_s=5.0)
        if left:
            log.warning("%d cache write-back(s) still pending at close; dropped", left)
        for key, fut in list(self._inflight.items()):
            self._release(key, fut, None)
        if self.settings.persist:
            await asyncio.get_running_loop().run_in_executor(None, self.save_state)
        if self.l2 is not None:
            await self.l2.close()
        if self.l3 is not None:
            self.l3.close()
        if self.embedded is not None:
            self.embedded.stop()

    # ------------------------------------------------------------------ extras (not in the protocol)

    async def drain(self, timeout_s: float | None = 60.0) -> int:
        """Wait until the background writes (L2/L3 write-backs, promotions, deletes of corrupt
        values) have finished, including any started while waiting; returns how many are still
        pending when ``timeout_s`` runs out (0: everything landed). ``None`` waits without limit.

        This is how callers (tests, ``POST /cache/drain``, shutdown) know that a completion handed
        to :meth:`finish` is in L2 and L3, instead of sleeping and hoping.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while pending := [t for t in self._pending if not t.done()]:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return len(pending)
            await asyncio.wait(pending, timeout=remaining)
        return 0

    async def refresh(self) -> None:
        """One pass of the background housekeeping, which :meth:`begin` starts every
        ``stats_refresh_s``: Redis INFO for the L2 gauges, L2/L3 eviction counters, L1/L3 expiry
        sweeps. Callable directly, so a caller that wants fresh figures need not wait for the timer.
        """
        if self.l2 is not None:
            # Failures are counted where requests fail; the gauges keep their last values.
            with contextlib.suppress(L2Unavailable):
                await self.l2.refresh_info()
            ev = int(self.l2.info.get("evicted_keys", 0))
            if self._l2_evictions_seen is not None and ev > self._l2_evictions_seen:
                self.metrics.evictions.labels("l2").inc(ev - self._l2_evictions_seen)
            self._l2_evictions_seen = ev
        self.l1.purge_expired()
        if self.l3 is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.l3.expire)
            ev3 = self.l3.evictions()
            if ev3 > self._l3_evictions_seen:
                self.metrics.evictions.labels("l3").inc(ev3 - self._l3_evictions_seen)
            self._l3_evictions_seen = ev3

    def state_dir(self) -> Path:
        return self.settings.resolved_state_dir()

    def save_state(self) -> None:
        """Save the Bloom filter and the L3 indexes; a failure is logged, never raised (shutdown)."""
        d = self.state_dir()
        try:
            if self.bloom is not None:
                self.bloom.save(d / "bloom.bin")
            if self.l3 is not None:
                self.l3.save(d / "l3")
        except Exception:
            log.exception("cache state not saved to %s", d)

    def load_state(self) -> None:
        d = self.state_dir()
        if self.bloom is not None and (d / "bloom.bin").is_file():
            try:
                self.bloom.load(d / "bloom.bin")
            except HarnessError as exc:
                log.warning("Bloom state not loaded: %s", exc)
        if self.l3 is not None:
            self.l3.load(d / "l3")

    # ------------------------------------------------------------------ internals

    def _ticket(
        self,
        status: CacheStatus,
        key: str,
        tenant: str,
        t0: float,
        *,
        completion: CachedCompletion | None = None,
        is_leader: bool = False,
        context: dict[str, Any] | None = None,
    ) -> CacheTicket:
        self._status_counts[status] = self._status_counts.get(status, 0) + 1
        self.metrics.request(status)
        return CacheTicket(
            status=status,
            key=key,
            tenant=tenant,
            completion=completion,
            is_leader=is_leader,
            lookup_ms=(time.perf_counter() - t0) * 1000,
            context=context or {},
        )

    def _release(
        self, key: str, fut: asyncio.Future[CachedCompletion | None], value: CachedCompletion | None
    ) -> None:
        if self._inflight.get(key) is fut:
            del self._inflight[key]
        if not fut.done():
            fut.set_result(value)

    def _lookup_local(self, req: NormalizedRequest, ctx: dict[str, Any]) -> tuple[bool, L1Entry | None]:
        """Bloom guard, then L1: (may the key exist, the L1 entry on a hit). Counts both."""
        maybe = True
        if self.bloom is not None:
            maybe = self.bloom.check_item(req.bloom_item)
            (self.metrics.bloom_passes if maybe else self.metrics.bloom_intercepts).inc()
            ctx["bloom"] = maybe
        if not maybe:
            return False, None
        if not self.settings.l1_enabled:
            return True, None
        t = time.perf_counter()
        entry = self.l1.get(req.key)
        self.metrics.observe("l1", time.perf_counter() - t)
        if entry is not None:
            self.metrics.hit("l1")
            self._count_hit(req.key)
            return True, entry
        self.metrics.miss("l1")
        return True, None

    async def _lookup(
        self, req: NormalizedRequest, local: tuple[bool, dict[str, Any]] | None = None
    ) -> tuple[CacheStatus, CachedCompletion | None, dict[str, Any]]:
        if local is not None:
            maybe, ctx = local  # from ``begin_nowait``: an L1 miss, already counted
        else:
            ctx = {"req": req}
            maybe, entry = self._lookup_local(req, ctx)
            if entry is not None:
                return "HIT-L1", entry.completion, ctx
        if maybe and self.l2 is not None:
            stored = await self._l2_get(req.key)
            if stored is not None:
                self._count_hit(req.key)
                self._l1_put(req.key, stored.completion, stored.value_tier, stored.expires_at)
                return "HIT-L2", stored.completion, ctx
        if self.l3 is not None and (maybe or self.settings.bloom_l3_on_first_sight) and req.text:
            hit, vec = await self._l3_lookup(req)
            ctx["vec"] = vec
            if hit is not None:
                self._count_hit(req.key)
                e = hit.entry
                ctx.update(l3_score=hit.score, l3_source_key=e.key)
                # Promote under this request's own key, keeping the source's expiry.
                self._l1_put(req.key, e.completion, e.value_tier, e.expires_at)
                if self.bloom is not None:
                    self.bloom.add_item(req.bloom_item)
                if self.l2 is not None:
                    value = codec.StoredValue(req.key, e.completion, e.value_tier, time.time(), e.expires_at)
                    self._spawn(self._l2_set(req.key, value))
                return "HIT-L3", e.completion, ctx
        return "MISS", None, ctx

    async def _l2_get(self, key: str) -> codec.StoredValue | None:
        assert self.l2 is not None
        t = time.perf_counter()
        try:
            raw = await self.l2.get(key)
        except L2Unavailable as exc:
            self.metrics.error("l2")
            log.debug("L2 get failed (served without L2): %s", exc)
            return None
        finally:
            self.metrics.observe("l2", time.perf_counter() - t)
        if raw is None:
            self.metrics.miss("l2")
            return None
        try:
            stored = codec.decode(raw, key, self.settings.schema_version)
        except codec.CorruptValue as exc:
            self.corrupt += 1
            self.metrics.corrupt.labels("l2").inc()
            self.metrics.miss("l2")
            log.warning("corrupt L2 value for %s deleted: %s", key, exc)
            self._spawn(self._l2_delete(key))
            return None
        if stored.expires_at <= time.time():
            self.metrics.miss("l2")
            return None
        self.metrics.hit("l2")
        return stored

    async def _l2_delete(self, key: str) -> None:
        assert self.l2 is not None
        try:
            await self.l2.delete(key)
        except L2Unavailable:
            self.metrics.error("l2")

    async def _l2_set(self, key: str, value: codec.StoredValue) -> None:
        assert self.l2 is not None
        ttl = value.expires_at - time.time()
        if ttl <= 0:
            return
        try:
            raw = codec.encode(value, self.settings.schema_version)
        except ValueError as exc:
            self.metrics.error("l2")
            log.warning("not writing %s to L2: %s", key, exc)
            return
        try:
            await self.l2.set(key, raw, ttl)
        except L2Unavailable as exc:
            self.metrics.error("l2")
            log.debug("L2 set failed: %s", exc)

    async def _l3_lookup(self, req: NormalizedRequest) -> tuple[Any, Vector | None]:
        assert self.l3 is not None
        if len(req.text) > self.settings.l3_max_chars:
            return None, None
        t = time.perf_counter()
        try:
            hit, vec = await self.l3.lookup(req)
        except Exception as exc:  # a broken L3 must not fail the request
            self.metrics.error("l3")
            log.warning("L3 lookup failed (served without L3): %s", exc)
            return None, None
        finally:
            self.metrics.observe("l3", time.perf_counter() - t)
        if hit is None:
            self.metrics.miss("l3")
        else:
            self.metrics.hit("l3")
        return hit, vec

    async def _l3_add(self, req: NormalizedRequest, entry: L3Entry, vec: Vector | None) -> None:
        assert self.l3 is not None
        try:
            await self.l3.add(req, entry, vec)
        except Exception as exc:  # a broken L3 must not fail the request
            self.metrics.error("l3")
            log.warning("L3 add failed: %s", exc)

    def _store(
        self, req: NormalizedRequest, completion: CachedCompletion, vec: Vector | None, *, background: bool
    ) -> Any:
        """Write L1 + Bloom now and L2 + L3 in the background (or awaited, when not ``background``)."""
        hits = self._hit_counts.get(req.key, 0)
        tier = self.policy.tier(req.key, completion, hits)
        now = time.time()
        expires = now + self.settings.ttl_for(tier)
        self.metrics.writebacks.labels(tier).inc()
        self._l1_put(req.key, completion, tier, expires)
        if self.bloom is not None:
            self.bloom.add_item(req.bloom_item)
        jobs: list[Any] = []
        if self.l2 is not None:
            jobs.append(self._l2_set(req.key, codec.StoredValue(req.key, completion, tier, now, expires)))
        if self.l3 is not None and req.text and len(req.text) <= self.settings.l3_max_chars:
            entry = L3Entry(
                req.key, req.params_hash, req.numbers, req.negations, completion, expires, tier, req.text
            )
            jobs.append(self._l3_add(req, entry, vec))
        if background:
            for job in jobs:
                self._spawn(job)
            return None
        return asyncio.gather(*jobs)

    def _l1_put(self, key: str, completion: CachedCompletion, tier: str, expires_at: float) -> None:
        if self.settings.l1_enabled:
            self.l1.put(key, completion, codec.completion_nbytes(completion), tier, expires_at)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _count_hit(self, key: str) -> None:
        self._hit_counts[key] = self._hit_counts.get(key, 0) + 1
        self._hit_counts.move_to_end(key)
        if len(self._hit_counts) > _HIT_COUNTS_MAX:
            self._hit_counts.popitem(last=False)

    def _tier_enabled(self, tier: str) -> bool:
        return {"l1": self.settings.l1_enabled, "l2": self.l2 is not None, "l3": self.l3 is not None}[tier]

    def _entries(self, tier: str) -> float:
        if tier == "l1":
            return float(len(self.l1))
        if tier == "l2":
            return float(self.l2.info.get("keys", 0)) if self.l2 is not None else 0.0
        return float(self.l3.entries()) if self.l3 is not None else 0.0

    def _fill_rate(self, tier: str) -> float:
        if tier == "l1":
            return self.l1.bytes_used / self.l1.max_bytes
        if tier == "l2":
            if self.l2 is None:
                return 0.0
            cap = self.l2.info.get("maxmemory") or self.settings.redis_maxmemory
            return float(self.l2.info.get("used_memory", 0)) / float(cap)
        if self.l3 is None:
            return 0.0
        return self.l3.entries() / (self.settings.l3_max_entries * max(1, len(self.l3.tenants)))

    def _evictions(self, tier: str) -> int:
        if tier == "l1":
            return self.l1.evictions
        if tier == "l2":
            return int(self.l2.info.get("evicted_keys", 0)) if self.l2 is not None else 0
        return self.l3.evictions() if self.l3 is not None else 0

    def _bloom_fp(self) -> float:
        return self.bloom.measured_fp_rate() if self.bloom is not None else 0.0

    def _ensure_background(self) -> None:
        if self._refresher is None and not self._closed:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        """:meth:`refresh` every ``stats_refresh_s`` until :meth:`close`."""
        while not self._closed:
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.settings.stats_refresh_s)


def _unavailable(exc: Exception) -> HarnessError:
    return UnavailableError(f"Redis (L2) is unavailable: {exc}")
