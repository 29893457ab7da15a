"""L2: Redis (embedded, external or Cluster) behind timeouts, a retry budget and a circuit breaker.

Every operation runs on the event loop through ``redis.asyncio`` under one deadline
(``l2_op_timeout_s``) covering the call and its retries, so a dead, hung (SIGSTOP) or slow Redis
costs a request at most that budget; socket and connect timeouts bound each attempt as well.

The one exception is the request path's GET on a local unix socket (the embedded Redis, or a
``unix://`` URL) with ``l2_blocking_get``: it is a plain blocking call on one dedicated redis-py
connection, made directly from the event loop. A local GET answers in tens of µs, less than
``redis.asyncio``'s own per-call machinery, so the asyncio client made an L2 hit ~2× a blocking GET.
The price is that a hung Redis blocks the loop, so every blocking attempt is capped by a tight
socket timeout (``l2_blocking_timeout_s``, at most a third of ``l2_op_timeout_s``: connect,
handshake and the GET each get one), the whole call by ``l2_op_timeout_s``, and the breaker opens
after ``breaker_failures`` such failures, after which L2 costs nothing until the next probe.
After ``breaker_failures`` consecutive failures the breaker opens and L2 is skipped outright for
``breaker_reset_s``; then one probe is let through (half-open) and its outcome closes or re-opens
it. Retries (on connection errors only) draw from a token bucket refilled by a fraction of the
calls, so a broken Redis is never hit by a retry storm. Keys are ``<prefix>:v<schema>:<tenant>:<hash>``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from redis import exceptions as rexc

from harness.target.cache.settings import CacheSettings

T = TypeVar("T")


class L2Unavailable(Exception):
    """An L2 operation failed, timed out or was skipped by the open breaker."""


class CircuitBreaker:
    """closed → (N consecutive failures) → open → (reset_s) → half-open: one probe → closed/open."""

    def __init__(self, failures: int, reset_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = failures
        self.reset_s = reset_s
        self.clock = clock
        """Monotonic seconds; replaceable (tests move a manual clock past ``reset_s``)."""
        self.failures = 0
        self.opened_at: float | None = None
        self._probing = False
        self.opens = 0

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.reset_s else "open"

    def allow(self) -> bool:
        if self.opened_at is None:
            return True
        if self.clock() - self.opened_at < self.reset_s or self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self._probing = False

    def failure(self) -> None:
        self.failures += 1
        if self._probing or self.failures >= self.threshold:
            if self.opened_at is None or self._probing:
                self.opens += 1
            self.opened_at = self.clock()
            self._probing = False


class RetryBudget:
    """Token bucket: each call deposits ``ratio`` tokens (capped), each retry spends one."""

    def __init__(self, ratio: float, cap: float = 10.0) -> None:
        self.ratio = ratio
        self.cap = cap
        self.tokens = cap if ratio > 0 else 0.0

    def deposit(self) -> None:
        self.tokens = min(self.cap, self.tokens + self.ratio)

    def withdraw(self) -> bool:
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def redact(url: str) -> str:
    """``url`` without its password, for logs and stats."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def is_cluster_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme.endswith("+cluster") or "cluster=1" in parts.query or "cluster=true" in parts.query


class RedisTier:
    """Async Redis access for the cache values; raises :class:`L2Unavailable` on any failure."""

    def __init__(self, settings: CacheSettings, url: str) -> None:
        self.settings = settings
        self.url = url
        self.cluster = is_cluster_url(url)
        self.prefix = f"{settings.redis_key_prefix}:v{settings.schema_version}:"
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_reset_s)
        self.budget = RetryBudget(settings.retry_budget_ratio)
        self.retries = 0
        self.skipped = 0
        """Operations the open breaker refused without touching Redis."""
        self._client: Any = None
        self._initialized = False
        self._init_task: asyncio.Task[None] | None = None
        self.blocking = settings.l2_blocking_get and not self.cluster and urlsplit(url).scheme == "unix"
        """GETs use :meth:`_get_blocking` (one blocking connection on a local unix socket)."""
        self.blocking_timeout_s = min(settings.l2_blocking_timeout_s, settings.l2_op_timeout_s / 3)
        self._conn: Any = None
        self.info: dict[str, Any] = {}
        """Last INFO snapshot (refreshed in the background; never read on the request path)."""

    def _make_client(self) -> Any:
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        s = self.settings
        common: dict[str, Any] = {
            "socket_timeout": s.redis_socket_timeout_s,
            "socket_connect_timeout": s.redis_connect_timeout_s,
        }
        if self.cluster:
            from redis.asyncio.cluster import RedisCluster

            # The cluster client keeps its own retries: they follow MOVED/ASK redirections and
            # topology changes. Our deadline still bounds every operation.
            parts = urlsplit(self.url)
            scheme = "rediss" if parts.scheme.startswith("rediss") else "redis"
            plain = urlunsplit(parts._replace(scheme=scheme, query=""))
            return RedisCluster.from_url(plain, **common)
        import redis.asyncio as aredis

        # Retries are ours (bounded by the budget and the deadline), not redis-py's.
        return aredis.Redis.from_url(self.url, retry=Retry(NoBackoff(), 0), **common)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._make_client()
        return self._client

    async def _initialize(self) -> None:
        """Initialize the cluster client once, before any concurrent use.

        redis-py's async cluster client races (AttributeError on a half-open connection) when many
        first commands overlap, and discovering the slots can take longer than one operation's
        budget. So one shielded task (bounded by ``max(2 s, budget)``) does it, and each request
        waits for it only within its own deadline.
        """
        if self._init_task is None or (self._init_task.done() and self._init_task.exception() is not None):

            async def init() -> None:
                async with asyncio.timeout(max(2.0, self.settings.l2_op_timeout_s)):
                    await self.client.initialize()
                self._initialized = True

            self._init_task = asyncio.get_running_loop().create_task(init())
        await asyncio.shield(self._init_task)

    def _admit(self) -> None:
        """Raise :class:`L2Unavailable` without touching Redis while the breaker is open."""
        if not self.breaker.allow():
            self.skipped += 1
            raise L2Unavailable("circuit breaker open")

    def rkey(self, key: str) -> str:
        return self.prefix + key

    async def _run(self, op: Callable[[], Awaitable[T]]) -> T:
        self._admit()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.l2_op_timeout_s
        attempt = 0
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    if self.cluster and not self._initialized:
                        await self._initialize()
                    result = await op()
            except Exception as exc:
                # (redis-py's cluster client can also raise AttributeError and the like on a race).
                if self._may_retry(exc, attempt, fits=loop.time() < deadline):
                    attempt += 1
                    continue
                raise L2Unavailable(f"{type(exc).__name__}: {exc}") from exc
            self.breaker.success()
            self.budget.deposit()
            return result

    def _may_retry(self, exc: Exception, attempt: int, *, fits: bool) -> bool:
        """Whether a failed attempt may be retried, for the async and the blocking path alike.

        Only connection errors are retried (a timeout already spent the budget), within the retry
        count, only when another attempt ``fits`` the deadline, and only while the retry budget
        lasts. A refusal counts as a breaker failure; a retry is counted in ``retries``.
        """
        retryable = isinstance(exc, rexc.ConnectionError) and not isinstance(exc, rexc.TimeoutError)
        if retryable and attempt < self.settings.l2_max_retries and fits and self.budget.withdraw():
            self.retries += 1
            return True
        self.breaker.failure()
        return False

    async def get(self, key: str) -> bytes | None:
        rk = self.prefix + key
        if self.blocking:
            return self._get_blocking(rk)
        value: bytes | None = await self._run(lambda: self.client.get(rk))
        return value

    def _blocking_conn(self) -> Any:
        if self._conn is None:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            t = self.blocking_timeout_s
            pool = redis.ConnectionPool.from_url(
                self.url, socket_timeout=t, socket_connect_timeout=t, retry=Retry(NoBackoff(), 0)
            )
            # Not connected yet: ``send_command`` connects lazily, under the same timeouts.
            self._conn = pool.make_connection()
        return self._conn

    def _get_blocking(self, rk: str) -> bytes | None:
        """GET on the dedicated connection, blocking the loop for at most ``l2_op_timeout_s``.

        Each attempt is bounded by ``blocking_timeout_s`` per step (connect, handshake, reply), at
        most three steps, and a retry starts only if a whole attempt still fits in the budget.
        """
        self._admit()
        end = time.monotonic() + self.settings.l2_op_timeout_s
        attempt = 0
        while True:
            conn = self._blocking_conn()
            try:
                conn.send_command("GET", rk)
                value: bytes | None = conn.read_response()
            except Exception as exc:
                # The connection's state is unknown after any failure (a half-read reply).
                conn.disconnect()
                if self._may_retry(exc, attempt, fits=time.monotonic() + 3 * self.blocking_timeout_s <= end):
                    attempt += 1
                    continue
                raise L2Unavailable(f"{type(exc).__name__}: {exc}") from exc
            self.breaker.success()
            self.budget.deposit()
            return value

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        rk = self.rkey(key)
        ms = max(1, int(ttl_s * 1000))
        await self._run(lambda: self.client.set(rk, value, px=ms))

    async def delete(self, key: str) -> None:
        rk = self.rkey(key)
        await self._run(lambda: self.client.delete(rk))

    async def flush(self) -> int:
        """Delete every key of this schema's prefix (all tenants); returns the count."""

        async def op() -> int:
            n = 0
            batch: list[Any] = []
            async for k in self.client.scan_iter(match=self.prefix + "*", count=1000):
                batch.append(k)
                if len(batch) >= 500:
                    n += await self._delete_many(batch)
                    batch = []
            if batch:
                n += await self._delete_many(batch)
            return n

        self._admit()
        try:
            async with asyncio.timeout(max(5.0, self.settings.l2_op_timeout_s)):
                if self.cluster and not self._initialized:
                    await self._initialize()
                result = await op()
        except Exception as exc:
            self.breaker.failure()
            raise L2Unavailable(f"{type(exc).__name__}: {exc}") from exc
        self.breaker.success()
        return result

    async def _delete_many(self, keys: list[Any]) -> int:
        if self.cluster:  # keys of one DEL must share a slot in a cluster
            return sum([int(await self.client.delete(k)) for k in keys])
        return int(await self.client.delete(*keys))

    async def refresh_info(self) -> dict[str, Any]:
        """INFO memory/stats + key count, stored in :attr:`info`."""

        async def op() -> dict[str, Any]:
            if self.cluster:  # per primary; _flatten sums the nodes
                nodes = self.client.PRIMARIES
                mem = await self.client.info("memory", target_nodes=nodes)
                st = await self.client.info("stats", target_nodes=nodes)
                keys = await self.client.dbsize(target_nodes=nodes)
                if isinstance(keys, dict):
                    keys = sum(int(v) for v in keys.values())
            else:
                mem = await self.client.info("memory")
                st = await self.client.info("stats")
                keys = await self.client.dbsize()
            return {**_flatten(mem), **_flatten(st), "keys": keys}

        raw = await self._run(op)
        self.info = {
            "used_memory": int(raw.get("used_memory", 0)),
            "maxmemory": int(raw.get("maxmemory", 0)),
            "evicted_keys": int(raw.get("evicted_keys", 0)),
            "expired_keys": int(raw.get("expired_keys", 0)),
            "keys": int(raw.get("keys", 0)),
        }
        return self.info

    def reconnect(self) -> Coroutine[Any, Any, None] | None:
        """Forget every connection and close the breaker: the server behind ``url`` was restarted
        (the embedded Redis), so old connections are dead and the next operation may succeed.
        Returns the closing of the old asyncio client, for the caller to run (or ``None``)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.disconnect()
        self.breaker.success()
        if self._client is None:
            return None
        client, self._client = self._client, None
        self._initialized = False
        return _close_quietly(client)

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.disconnect()
        if self._client is not None:
            client, self._client = self._client, None
            self._initialized = False
            await _close_quietly(client)


async def _close_quietly(client: Any) -> None:
    """Close a redis.asyncio client within a second, whatever state its server is in."""
    try:
        async with asyncio.timeout(1.0):
            await client.aclose()
    except (rexc.RedisError, OSError, TimeoutError, RuntimeError):
        pass


def _flatten(info: Any) -> dict[str, Any]:
    """Cluster INFO answers per node ({node: {...}}); sum numeric fields over nodes."""
    if not isinstance(info, dict):
        return {}
    if info and all(isinstance(v, dict) for v in info.values()):
        out: dict[str, Any] = {}
        for node in info.values():
            for k, v in node.items():
                if isinstance(v, int | float):
                    out[k] = out.get(k, 0) + v
        return out
    return info
