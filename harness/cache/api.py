"""The cache stack's contract with the server.

The server never touches tiers directly: it asks :meth:`ResponseCache.begin` what to do with a
request, streams either the cached completion or the engine's, and reports the outcome with
:meth:`ResponseCache.finish`. Single-flight lives behind ``begin``: of several concurrent identical
misses one ticket leads (``is_leader``) and the others wait inside ``begin`` for its result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from harness.common.headers import CacheStatus
from harness.common.openai import Endpoint

Tier = Literal["hot", "warm", "cold"]


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
    """What ``harness serve`` calls; implemented by :mod:`harness.cache.stack`."""

    async def begin(
        self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str, *, no_cache: bool = False
    ) -> CacheTicket: ...

    async def finish(self, ticket: CacheTicket, completion: CachedCompletion | None) -> None: ...

    async def put(
        self, endpoint: Endpoint, body: Mapping[str, Any], tenant: str, completion: CachedCompletion
    ) -> str:
        """Store a completion directly (preload); returns its key."""
        ...

    async def flush(self, tier: str | None = None) -> dict[str, int]:
        """Drop entries of one tier (``l1``, ``l2``, ``l3``, ``bloom``) or all; returns counts dropped."""
        ...

    async def drain(self, timeout_s: float | None = 60.0) -> int:
        """Wait until background writes (write-backs after ``finish``) have landed; returns how
        many are still pending when ``timeout_s`` runs out (0: all landed)."""
        ...

    def stats(self) -> dict[str, Any]:
        """JSON-ready per-tier statistics for ``GET /cache/stats``."""
        ...

    async def close(self) -> None: ...
