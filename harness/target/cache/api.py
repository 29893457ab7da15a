"""The cache stack's contract with the server.

The server never touches tiers directly: it asks :meth:`ResponseCache.begin` what to do with a
request, streams either the cached completion or the engine's, and reports the outcome with
:meth:`ResponseCache.finish`. Single-flight lives behind ``begin``: of several concurrent identical
misses one ticket leads (``is_leader``) and the others wait inside ``begin`` for its result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from harness.common.headers import CacheStatus
from harness.common.openai import Endpoint

Tier = Literal["hot", "warm", "cold"]
"""A completion's value tier: how long it is worth keeping (``ttl_hot_s`` ≥ ``ttl_warm_s`` ≥ …)."""

TierName = Literal["l1", "l2", "l3"]
TIER_NAMES: tuple[TierName, ...] = get_args(TierName)
"""The cache tiers in lookup order (fastest first); :data:`harness.target.cache.tiers.CACHE_TIERS`
implements them under these names."""
FLUSH_TIERS: tuple[str, ...] = (*TIER_NAMES, "bloom")
"""What :meth:`ResponseCache.flush` can drop, one at a time; ``all`` (or ``None``) drops every one."""
FLUSH_ALL = "all"


@dataclass(slots=True)
class CachedCompletion:
    """A finished completion as stored in every tier (serialized as JSON, never pickle)."""

    text: str
    finish_reason: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    created: int
    """Unix time the completion was generated."""
    mean_logprob: float | None = None
    mean_entropy: float | None = None
    """Mean per-token entropy of the output distribution; low entropy = confident = worth keeping."""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class CacheTicket:
    """The cache's answer for one request.

    ``completion`` is set on a hit (``status`` HIT-*). On MISS the caller must generate and then
    call :meth:`ResponseCache.finish` exactly once, with the completion or ``None`` when it did not
    complete (error, client gone); BYPASS tickets need no ``finish``.
    """

    status: CacheStatus
    key: str
    tenant: str
    completion: CachedCompletion | None = None
    is_leader: bool = False
    lookup_ms: float = 0.0
    context: dict[str, Any] = field(default_factory=dict)
    """Private state of the cache implementation (normalized request, embedding, …)."""


class ResponseCache(Protocol):
    """What ``harness serve`` calls; implemented by :mod:`harness.target.cache.stack`."""

    async def begin(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        tenant: str,
        *,
        no_cache: bool = False,
        force_miss: bool = False,
    ) -> CacheTicket:
        """What to do with a request. ``no_cache``: BYPASS (not looked up, not stored).
        ``force_miss`` (the server's ``--inject-cache-miss-rate``): a ``MISS`` ticket without any
        lookup (no tier, no Bloom filter, no single-flight), counted as a miss, whose
        :meth:`finish` stores nothing, so the next identical request finds what it would have
        found without this one; ``no_cache`` wins over it."""
        ...

    def begin_nowait(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        tenant: str,
        *,
        no_cache: bool = False,
        force_miss: bool = False,
    ) -> CacheTicket | None:
        """The answers :meth:`begin` can give without I/O (a BYPASS, a forced miss, an in-process
        hit), or ``None``: then call :meth:`begin` with the same arguments. An implementation
        without such a fast path always returns ``None``. The server tries it first, so an
        in-process hit needs no task and no disconnect watcher."""
        ...

    async def finish(self, ticket: CacheTicket, completion: CachedCompletion | None) -> None: ...

    def never_served(self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str) -> str | None:
        """Why a live request with this body would never be answered from the cache (it would be a
        ``BYPASS``), or ``None`` when it can be. Preload asks before it spends a generation."""
        ...

    async def put(
        self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str, completion: CachedCompletion
    ) -> str:
        """Store a completion directly (preload); returns its key. A body that :meth:`never_served`
        refuses is an :class:`~harness.common.errors.InputError`: storing it would warm nothing."""
        ...

    async def flush(self, tier: str | None = None) -> dict[str, int]:
        """Drop the entries of one of :data:`FLUSH_TIERS`, or of all (``None`` or ``"all"``);
        returns the counts dropped per tier."""
        ...

    async def drain(self, timeout_s: float | None = 60.0) -> int:
        """Wait until background writes (write-backs after ``finish``) have landed; returns how
        many are still pending when ``timeout_s`` runs out (0: all landed)."""
        ...

    def stats(self) -> dict[str, Any]:
        """JSON-ready per-tier statistics for ``GET /cache/stats``."""
        ...

    async def close(self) -> None: ...
