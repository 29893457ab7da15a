"""Value-tier policies: how long a completion is worth keeping (hot / warm / cold → TTL).

A policy sees the completion and how often its key has been hit, and names a tier; the stack maps
tiers to TTLs (``ttl_hot_s`` ≥ ``ttl_warm_s`` ≥ ``ttl_cold_s``). Hits never extend a live entry's
expiry: a key's hit count only matters the next time the key is (re)written. Policies are looked
up by name in :data:`TIER_POLICIES`, so the analysis stage can register its own (for example one
that reads a key → tier table it has learned) and select it with ``HARNESS__CACHE__TIER_POLICY``.

A **tier policy file** (:class:`TierFile`, JSON; ``harness analysis tiers`` writes one) is how a
learned table reaches the cache: ``HARNESS__CACHE__TIER_FILE`` (``harness serve --tiers FILE``)
makes the factory select the ``table`` policy, which reads the file's entries, and use the file's
tier → TTL map (:func:`harness.target.cache.settings.with_tier_file`). Entries name a completion by its
prompt fingerprint (the ``prompt_fp`` the server stores in every completion's ``meta``: the same
prompt gives the same fingerprint whatever the model revision, tenant or ``max_tokens``) or by its
exact cache key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from harness.common.io import read_json
from harness.common.model import StrictModel
from harness.common.registry import Registry
from harness.target.cache.api import CachedCompletion, Tier


class TierPolicy(Protocol):
    def tier(self, key: str, completion: CachedCompletion, hits: int) -> Tier: ...


class TierPolicySettings(Protocol):
    """The settings a policy reads; :class:`~harness.target.cache.settings.CacheSettings` has them.

    A protocol rather than ``CacheSettings`` itself: the settings check ``tier_policy`` against
    :data:`TIER_POLICIES` when they are read, so they import this module, and this module must not
    import them back.
    """

    @property
    def hot_hits(self) -> int: ...

    @property
    def tier_file(self) -> Path | None: ...


TIER_POLICIES: Registry[Callable[[TierPolicySettings], TierPolicy]] = Registry("cache tier policy")


@TIER_POLICIES.register("heuristic")
class HeuristicPolicy:
    """The default: popular, confident or expensive completions are hot; uncertain ones cold.

    * hit ``hot_hits`` times before → hot (proven demand);
    * mean entropy known: < 0.5 nats → hot (the model was sure, the answer is stable),
      > 2.5 nats → cold (close to a coin flip, a regeneration may well differ);
    * otherwise long completions (≥ 256 tokens, expensive to regenerate) → hot, a completion cut
      at ``max_tokens`` (finish ``length``) → cold, the rest warm.
    """

    def __init__(self, settings: TierPolicySettings) -> None:
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
    """Tiers from an explicit table (fed by the analysis stage); unlisted completions via the heuristic.

    The table maps exact cache keys, and prompt fingerprints (``completion.meta["prompt_fp"]``), to
    tiers; a key entry wins over a fingerprint entry. With ``settings.tier_file`` set it is filled
    from that :class:`TierFile` at construction, and the file's ``default_tier`` (when given)
    replaces the heuristic for completions the file does not list.
    """

    def __init__(self, settings: TierPolicySettings, table: Mapping[str, Tier] | None = None) -> None:
        self.table: dict[str, Tier] = dict(table or {})
        self.by_prompt: dict[str, Tier] = {}
        self.default: Tier | None = None
        self.fallback = HeuristicPolicy(settings)
        if settings.tier_file is not None:
            self.load(load_tier_file(settings.tier_file))

    def update(self, table: Mapping[str, Tier]) -> None:
        self.table.update(table)

    def load(self, tiers: TierFile) -> None:
        """Add a tier file's entries (later entries for the same key or fingerprint win)."""
        for e in tiers.entries:
            if e.key is not None:
                self.table[e.key] = e.tier
            if e.prompt_fp is not None:
                self.by_prompt[e.prompt_fp] = e.tier
        self.default = tiers.default_tier

    def tier(self, key: str, completion: CachedCompletion, hits: int) -> Tier:
        listed = self.table.get(key)
        if listed is not None:
            return listed
        if self.by_prompt:
            fp = completion.meta.get("prompt_fp")
            if isinstance(fp, str) and fp in self.by_prompt:
                return self.by_prompt[fp]
        return self.default or self.fallback.tier(key, completion, hits)


@TIER_POLICIES.register("fixed-warm")
class FixedWarmPolicy:
    """Every entry warm: one TTL for all (the baseline to compare policies against)."""

    def __init__(self, settings: TierPolicySettings) -> None:
        pass

    def tier(self, key: str, completion: CachedCompletion, hits: int) -> Tier:
        return "warm"


# --------------------------------------------------------------------------- the tier policy file


class TierTTLs(StrictModel):
    """Seconds an entry of each value tier lives in L2 and L3 (hot ≥ warm ≥ cold)."""

    hot: float = Field(gt=0.0)
    warm: float = Field(gt=0.0)
    cold: float = Field(gt=0.0)

    @model_validator(mode="after")
    def _order(self) -> TierTTLs:
        if not (self.hot >= self.warm >= self.cold):
            raise ValueError("TTLs must satisfy hot >= warm >= cold")
        return self


class TierEntry(StrictModel):
    """One completion's tier, named by prompt fingerprint and/or exact cache key."""

    tier: Tier
    prompt_fp: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    """``harness.target.server.prepare.prompt_fingerprint`` of the prompt (32 hex digits)."""
    key: str | None = None
    """An exact cache key ``<tenant>:<32 hex>`` (as in the ``x-cache-key`` response header)."""
    query: str | None = None
    """The query text, for people reading the file; the cache ignores it."""
    zone: int | None = None
    """The hot zone (embedding cluster) the analysis put the query in; the cache ignores it."""

    @model_validator(mode="after")
    def _named(self) -> TierEntry:
        if self.prompt_fp is None and self.key is None:
            raise ValueError("an entry needs 'prompt_fp' or 'key'")
        return self


class TierFile(StrictModel):
    """A tier → TTL policy and the completions it classifies (``HARNESS__CACHE__TIER_FILE``)."""

    version: Literal[1] = 1
    ttl_s: TierTTLs
    default_tier: Tier | None = None
    """Tier of completions no entry lists; ``None``: the ``heuristic`` policy decides."""
    entries: list[TierEntry] = Field(default_factory=list)
    provenance: dict[str, Any] = Field(default_factory=dict)
    """What the producer wants to record (thresholds, zones, inputs); the cache ignores it."""


def load_tier_file(path: str | Path) -> TierFile:
    """Read and validate a :class:`TierFile`; errors are :class:`InputError` naming file and field."""
    return read_json(path, TierFile, expected="a tier policy file")
