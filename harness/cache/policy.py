"""Value-tier policies: how long a completion is worth keeping (hot / warm / cold → TTL).

A policy sees the completion and how often its key has been hit, and names a tier; the stack maps
tiers to TTLs (``ttl_hot_s`` ≥ ``ttl_warm_s`` ≥ ``ttl_cold_s``). Hits never extend a live entry's
expiry: a key's hit count only matters the next time the key is (re)written. Policies are looked
up by name in :data:`TIER_POLICIES`, so the analysis stage can register its own (for example one
that reads a key → tier table it has learned) and select it with ``HARNESS__CACHE__TIER_POLICY``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from harness.cache.api import CachedCompletion, Tier
from harness.cache.settings import CacheSettings
from harness.common.registry import Registry


class TierPolicy(Protocol):
    def tier(self, key: str, completion: CachedCompletion, hits: int) -> Tier: ...


TIER_POLICIES: Registry[Callable[[CacheSettings], TierPolicy]] = Registry("cache tier policy")


@TIER_POLICIES.register("heuristic")
class HeuristicPolicy:
    """The default: popular, confident or expensive completions are hot; uncertain ones cold.

    * hit ``hot_hits`` times before → hot (proven demand);
    * mean entropy known: < 0.5 nats → hot (the model was sure, the answer is stable),
      > 2.5 nats → cold (close to a coin flip, a regeneration may well differ);
    * otherwise long completions (≥ 256 tokens, expensive to regenerate) → hot, a completion cut
      at ``max_tokens`` (finish ``length``) → cold, the rest warm.
    """

    def __init__(self, settings: CacheSettings) -> None:
        self.hot_hits = settings.hot_hits

    def tier(self, key: str, completion: CachedCompletion, hits: int) -> Tier:
        if hits >= self.hot_hits:
            return "hot"
        if completion.mean_entropy is not None:
            if completion.mean_entropy < 0.5:
                return "hot"
            if completion.mean_entropy > 2.5:
                return "cold"
        if completion.completion_tokens >= 256:
            return "hot"
        if completion.finish_reason == "length":
            return "cold"
        return "warm"


@TIER_POLICIES.register("table")
class TablePolicy:
    """Tiers from an explicit key → tier table (fed by the analysis stage); others via the heuristic."""

    def __init__(self, settings: CacheSettings, table: Mapping[str, Tier] | None = None) -> None:
        self.table: dict[str, Tier] = dict(table or {})
        self.fallback = HeuristicPolicy(settings)

    def update(self, table: Mapping[str, Tier]) -> None:
        self.table.update(table)

    def tier(self, key: str, completion: CachedCompletion, hits: int) -> Tier:
        return self.table.get(key) or self.fallback.tier(key, completion, hits)


@TIER_POLICIES.register("fixed-warm")
class FixedWarmPolicy:
    """Every entry warm: one TTL for all (the baseline to compare policies against)."""

    def __init__(self, settings: CacheSettings) -> None:
        pass

    def tier(self, key: str, completion: CachedCompletion, hits: int) -> Tier:
        return "warm"
