"""The cache stack behind :class:`harness.target.cache.api.ResponseCache`: Bloom → L1 → L2 → L3.

``begin`` normalizes the request into a key and, unless the request bypasses the cache, joins an
in-flight identical request (single-flight) or becomes its leader and looks the key up:

1. Bloom guard: a key never written skips L1 and L2 (no Redis round trip for cache-penetrating
   keys); L3 is still asked (``bloom_l3_on_first_sight``) because a paraphrase always has a new key.
2. The tiers of :data:`harness.target.cache.tiers.CACHE_TIERS` in order: L1 (in-process), then L2 (Redis,
   fail-open), then L3 (semantic). A hit is promoted to the faster tiers with the *original*
   expiry (a promotion never extends an entry's life). The stack knows tiers only through
   :class:`~harness.target.cache.tiers.CacheTier`; what is special about one lives in its class.
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
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from harness.common.errors import HarnessError, InputError, UnavailableError
from harness.common.headers import DEFAULT_TENANT, CacheStatus
from harness.common.openai import COMPLETED_FINISH_REASONS, Endpoint
from harness.target.cache import codec
from harness.target.cache.api import FLUSH_ALL, FLUSH_TIERS, TIER_NAMES, CachedCompletion, CacheTicket
from harness.target.cache.bloom import BloomGuard
from harness.target.cache.keys import KeyBuilder, NormalizedRequest
from harness.target.cache.l1 import L1Cache
from harness.target.cache.l2 import RedisTier
from harness.target.cache.l3 import SemanticCache
from harness.target.cache.metrics import CacheMetrics
from harness.target.cache.policy import TIER_POLICIES, TierPolicy
from harness.target.cache.redis_server import EmbeddedRedis
from harness.target.cache.settings import CacheSettings
from harness.target.cache.tiers import CACHE_TIERS, CacheTier, L2Tier, TierHit, TierParts, TierUnavailable

log = logging.getLogger(__name__)
_SAMPLED_REFUSAL = (
    "a sampled request (temperature > 0, no seed) is never served from the cache, so storing it warms "
    "nothing; give it a seed or temperature 0, or set HARNESS__CACHE__CACHE_SAMPLED=true"
)

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
    """The three-tier response cache. Build it with :func:`harness.target.cache.factory.create_cache`."""

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
        self._pending: set[asyncio.Task[Any]] = set()
        parts = TierParts(settings, self.metrics, self.l1, redis_url, embedded, semantic, self._spawn)
        self.tiers: list[CacheTier] = [t for _, make in CACHE_TIERS.items() if (t := make(parts)) is not None]
        """The enabled tiers in lookup order."""
        self._by_name: dict[str, CacheTier] = {t.name: t for t in self.tiers}
        self._local = [t for t in self.tiers if t.local]
        self._remote = [t for t in self.tiers if not t.local]
        l2 = self._by_name.get("l2")
        self.l2: RedisTier | None = l2.redis if isinstance(l2, L2Tier) else None
        """The Redis client of L2 (tests and benchmarks inspect it)."""
        self.l3 = semantic
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the stack serves on, known from the first ``begin``/``put`` (for restarts)."""
        if embedded is not None:
            embedded.on_restart.append(self._redis_restarted)
        self.policy: TierPolicy = TIER_POLICIES.get(settings.tier_policy)(settings)
        self.model_revision: str | None = None
        """Overrides ``settings.model_revision`` in keys (the server sets it from the engine)."""
        self._inflight: dict[str, asyncio.Future[CachedCompletion | None]] = {}
        self._hit_counts: OrderedDict[str, int] = OrderedDict()
        self._status_counts: dict[str, int] = {}
        self.merges = 0
        self._refresher: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closed = False
        self._memos: dict[int, _Memo] = {}
        """``begin_nowait``'s work for the ``begin`` call that follows it, by ``id(body)`` (the memo
        holds the body, so the id cannot be reused while it is there)."""
        self.metrics.bind_gauges(self._fill_rate, self._entries, self._bloom_fp)

    # ------------------------------------------------------------------ protocol

    async def begin(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        tenant: str,
        *,
        no_cache: bool = False,
        force_miss: bool = False,
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
        if force_miss:
            return self._forced_miss(req, tenant, t0)
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
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        tenant: str,
        *,
        no_cache: bool = False,
        force_miss: bool = False,
    ) -> CacheTicket | None:
        """:meth:`begin` for the answers that need no I/O: a BYPASS or an L1 hit, with the same
        statuses and counters ``begin`` would give (the local tiers: L1). ``None`` means "now call
        ``begin``" (with the same arguments), which then reuses this call's key and Bloom/L1 outcome
        instead of counting them twice. Lets the server skip a task and a disconnect watcher on an
        L1 hit.
        """
        t0 = time.perf_counter()
        tenant = tenant or DEFAULT_TENANT
        try:
            req = self.keys.normalize(endpoint, body, tenant, model_revision=self.model_revision)
        except HarnessError:
            return None  # ``begin`` answers it (BYPASS, with the reason)
        if no_cache or (req.sampled and not self.settings.cache_sampled):
            return self._bypass(req, tenant, t0, no_cache)
        if force_miss:
            return self._forced_miss(req, tenant, t0)
        if req.key in self._inflight:
            self._put_memo(_Memo(body, endpoint, tenant, self.model_revision, req, None))
            return None  # a leader is at work: ``begin`` waits for it
        self._ensure_background()
        ctx: dict[str, Any] = {"req": req}
        maybe, tier, hit = self._lookup_local(req, ctx)
        if tier is not None and hit is not None:
            status, completion = self._on_hit(req, tier, hit, ctx)
            return self._ticket(status, req.key, tenant, t0, completion=completion, context=ctx)
        self._put_memo(_Memo(body, endpoint, tenant, self.model_revision, req, (maybe, ctx)))
        return None

    def _bypass(self, req: NormalizedRequest, tenant: str, t0: float, no_cache: bool) -> CacheTicket:
        reason = "no-cache" if no_cache else "sampled"
        return self._ticket("BYPASS", req.key, tenant, t0, context={"reason": reason})

    def _forced_miss(self, req: NormalizedRequest, tenant: str, t0: float) -> CacheTicket:
        """An injected miss: counted as a MISS, nothing looked up. Not a single-flight leader (an
        identical request meanwhile looks up and leads on its own), and nothing to store: its
        context has no ``req`` for :meth:`finish` to store under."""
        return self._ticket("MISS", req.key, tenant, t0, context={"forced_miss": True})

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
        if ticket.status != "MISS" or "forced_miss" in ticket.context:
            return
        req: NormalizedRequest | None = ticket.context.get("req")
        fut = ticket.context.pop("future", None)
        ok = (
            req is not None
            and completion is not None
            and completion.finish_reason in COMPLETED_FINISH_REASONS
            and not self._closed
        )
        if ok:
            assert req is not None and completion is not None
            self._store(req, completion, ticket.context, background=True)
        if fut is not None:
            self._release(ticket.key, fut, completion if ok else None)

    def never_served(self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str) -> str | None:
        try:
            req = self.keys.normalize(
                endpoint, body, tenant or DEFAULT_TENANT, model_revision=self.model_revision
            )
        except HarnessError as exc:
            return f"no cache key can be made for it: {exc}"
        return _SAMPLED_REFUSAL if req.sampled and not self.settings.cache_sampled else None

    async def put(
        self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str, completion: CachedCompletion
    ) -> str:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        req = self.keys.normalize(
            endpoint, body, tenant or DEFAULT_TENANT, model_revision=self.model_revision
        )
        if req.sampled and not self.settings.cache_sampled:
            raise InputError(_SAMPLED_REFUSAL, field="temperature")
        await self._store(req, completion, {}, background=False)
        return req.key

    async def flush(self, tier: str | None = None) -> dict[str, int]:
        names = FLUSH_TIERS if tier in (None, FLUSH_ALL) else (tier,)
        out: dict[str, int] = {}
        for name in names:
            if name == "bloom":
                out[name] = self.bloom.clear() if self.bloom is not None else 0
                continue
            if name not in TIER_NAMES:
                raise InputError(
                    f"unknown cache tier {name!r}; expected one of {', '.join(FLUSH_TIERS)}", field="tier"
                )
            t = self._by_name.get(name)
            try:
                out[name] = await t.clear() if t is not None else 0
            except TierUnavailable as exc:
                self.metrics.error(name)
                raise UnavailableError(str(exc)) from None
        return out

    def stats(self) -> dict[str, Any]:
        c = self.metrics.counts
        tiers: dict[str, Any] = {}
        for name in TIER_NAMES:
            t = self._by_name.get(name)
            hits, misses = c[name]["hits"], c[name]["misses"]
            win = self.metrics.drift[name]
            tiers[name] = {
                "enabled": t is not None,
                "hits": hits,
                "misses": misses,
                "errors": c[name]["errors"],
                "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
                "entries": int(t.entries()) if t is not None else 0,
                "fill_rate": t.fill_rate() if t is not None else 0.0,
                "evictions": t.evictions() if t is not None else 0,
                "lookup_ms_p50": win.percentile(50) * 1000,
                "lookup_ms_p99": win.percentile(99) * 1000,
                "thermal_drift": win.drift(),
                **(t.stats() if t is not None else {}),
            }
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
        for t in self.tiers:
            await t.close()
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
        ``stats_refresh_s``: each tier's :meth:`~harness.target.cache.tiers.CacheTier.housekeep` (Redis
        INFO for the L2 gauges, L1/L3 expiry sweeps) and the evictions it reports. Callable
        directly, so a caller that wants fresh figures need not wait for the timer.
        """
        for t in self.tiers:
            evicted = await t.housekeep()
            if evicted:
                self.metrics.evictions.labels(t.name).inc(evicted)

    def tier(self, name: str) -> CacheTier | None:
        """The enabled tier called ``name`` (``l1``, ``l2``, ``l3``), else ``None``."""
        return self._by_name.get(name)

    @property
    def corrupt(self) -> int:
        """L2 values that failed decoding or verification (and were deleted)."""
        l2 = self._by_name.get("l2")
        return l2.corrupt if isinstance(l2, L2Tier) else 0

    def state_dir(self) -> Path:
        return self.settings.resolved_state_dir()

    def save_state(self) -> None:
        """Save the Bloom filter and the tiers' state (L3 indexes); a failure is logged, never
        raised (shutdown)."""
        d = self.state_dir()
        try:
            if self.bloom is not None:
                self.bloom.save(d / "bloom.bin")
            for t in self.tiers:
                t.save_state(d)
        except Exception:
            log.exception("cache state not saved to %s", d)

    def load_state(self) -> None:
        d = self.state_dir()
        if self.bloom is not None and (d / "bloom.bin").is_file():
            try:
                self.bloom.load(d / "bloom.bin")
            except HarnessError as exc:
                log.warning("Bloom state not loaded: %s", exc)
        for t in self.tiers:
            t.load_state(d)

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

    def _lookup_local(
        self, req: NormalizedRequest, ctx: dict[str, Any]
    ) -> tuple[bool, CacheTier | None, TierHit | None]:
        """Bloom guard, then the local tiers (L1): (may the key exist, the tier and hit if one hit).
        Counts every lookup."""
        maybe = True
        if self.bloom is not None:
            maybe = self.bloom.check_item(req.bloom_item)
            (self.metrics.bloom_passes if maybe else self.metrics.bloom_intercepts).inc()
            ctx["bloom"] = maybe
        for tier in self._local:
            if (tier.guarded and not maybe) or not tier.accepts(req):
                continue
            t = time.perf_counter()
            hit = tier.get_nowait(req)
            self.metrics.observe(tier.name, time.perf_counter() - t)
            if hit is not None:
                self.metrics.hit(tier.name)
                return maybe, tier, hit
            self.metrics.miss(tier.name)
        return maybe, None, None

    async def _lookup(
        self, req: NormalizedRequest, local: tuple[bool, dict[str, Any]] | None = None
    ) -> tuple[CacheStatus, CachedCompletion | None, dict[str, Any]]:
        if local is not None:
            maybe, ctx = local  # from ``begin_nowait``: the local tiers missed, already counted
        else:
            ctx = {"req": req}
            maybe, tier, hit = self._lookup_local(req, ctx)
            if tier is not None and hit is not None:
                return (*self._on_hit(req, tier, hit, ctx), ctx)
        for tier in self._remote:
            if (tier.guarded and not maybe) or not tier.accepts(req):
                continue
            t = time.perf_counter()
            try:
                found = await tier.get(req, ctx)
            except TierUnavailable as exc:  # fail open: served without this tier
                self.metrics.error(tier.name)
                log.debug("%s lookup failed (served without it): %s", tier.name, exc)
                continue
            finally:
                self.metrics.observe(tier.name, time.perf_counter() - t)
            if found is not None:
                self.metrics.hit(tier.name)
                return (*self._on_hit(req, tier, found, ctx), ctx)
            self.metrics.miss(tier.name)
        return "MISS", None, ctx

    def _on_hit(
        self, req: NormalizedRequest, tier: CacheTier, hit: TierHit, ctx: dict[str, Any]
    ) -> tuple[CacheStatus, CachedCompletion]:
        """Count the hit and promote it into the faster tiers under this request's key, keeping the
        source's expiry (a promotion never extends an entry's life)."""
        self._count_hit(req.key)
        ctx.update(hit.context)
        value = codec.StoredValue(req.key, hit.completion, hit.value_tier, time.time(), hit.expires_at)
        for faster in self.tiers:
            if faster is tier:
                break
            job = faster.write(req, value, ctx)
            if job is not None:
                self._spawn(job)
        if not tier.exact and self.bloom is not None:
            self.bloom.add_item(req.bloom_item)  # a near-duplicate's key is new to the guard
        return tier.hit_status, hit.completion

    def _store(
        self, req: NormalizedRequest, completion: CachedCompletion, ctx: dict[str, Any], *, background: bool
    ) -> Any:
        """Write every tier: the local ones (L1) and the Bloom filter now, the others (L2, L3) in
        the background, or awaited when not ``background`` (``put``)."""
        hits = self._hit_counts.get(req.key, 0)
        tier = self.policy.tier(req.key, completion, hits)
        now = time.time()
        value = codec.StoredValue(req.key, completion, tier, now, now + self.settings.ttl_for(tier))
        self.metrics.writebacks.labels(tier).inc()
        jobs = [job for t in self.tiers if (job := t.write(req, value, ctx)) is not None]
        if self.bloom is not None:
            self.bloom.add_item(req.bloom_item)
        if background:
            for job in jobs:
                self._spawn(job)
            return None
        return asyncio.gather(*jobs)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _count_hit(self, key: str) -> None:
        self._hit_counts[key] = self._hit_counts.get(key, 0) + 1
        self._hit_counts.move_to_end(key)
        if len(self._hit_counts) > _HIT_COUNTS_MAX:
            self._hit_counts.popitem(last=False)

    def _entries(self, name: str) -> float:
        t = self._by_name.get(name)
        return t.entries() if t is not None else 0.0

    def _fill_rate(self, name: str) -> float:
        t = self._by_name.get(name)
        return t.fill_rate() if t is not None else 0.0

    def _bloom_fp(self) -> float:
        return self.bloom.measured_fp_rate() if self.bloom is not None else 0.0

    def _redis_restarted(self) -> None:
        """The embedded Redis came back (called from its supervisor thread): count it, and have
        the loop drop L2's dead connections and close its breaker, so L2 serves again at once."""
        self.metrics.redis_restarts.inc()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._reconnect_l2)

    def _reconnect_l2(self) -> None:
        if self.l2 is not None and not self._closed:
            job = self.l2.reconnect()
            if job is not None:
                self._spawn(job)

    def _ensure_background(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self._refresher is None and not self._closed:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        """:meth:`refresh` every ``stats_refresh_s`` until :meth:`close`."""
        while not self._closed:
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.settings.stats_refresh_s)
