"""Settings of the traces stage (env prefix ``HARNESS__TRACES__``); command-line options override them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from harness.common.settings import stage_config

DEFAULT_CACHE_HIT = (
    "cache.hit",
    "cache_hit",
    "gen_ai.usage.cache_read.input_tokens>0",
    "http.response.header.x-cache~hit",
)
"""Tags that mark a hop as served from a cache: truthy ``cache.hit`` / ``cache_hit``, GenAI prompt
caching, an ``x-cache: HIT…`` response header."""


class TracesSettings(BaseSettings):
    """Every default of the traces stage, declared once: :class:`~harness.traces.coldpaths.ColdPathConfig`
    and the ``harness traces`` options (and their help texts) take theirs from here."""

    model_config = stage_config("traces")

    threshold_ms: float = 500.0
    """A first hop slower than this (and with no cache hit) makes a cold path."""
    protocols: str = "http,grpc"
    """Comma-separated protocols a first hop may speak: http, grpc, genai, other, or any."""
    hops: Literal["first", "all"] = "first"
    """``first``: the first cross-service server span under each entry; ``all``: every one."""
    cache_scope: Literal["hop", "subtree"] = "subtree"
    """Where the cache-hit predicate looks: the hop span only, or the hop and everything below it."""
    cache_hit: str = ",".join(DEFAULT_CACHE_HIT)
    """Comma-separated predicates: ``key`` (truthy), ``key=value``, ``key~substring``, ``key>number``."""
    k: int = Field(default=12, ge=1)
    """Scenario classes (k-means clusters) to build."""
    seed: int = 0
    """k-means seed."""
    max_buffered_spans: int = Field(default=50_000, ge=1)
    """Spans held while grouping streamed span documents into traces (bounds memory)."""
    query_timeout_s: float = 10.0
    query_page_s: float = 3600.0
    """Time-window page size for Jaeger query searches."""
    query_limit: int = 100


def default(name: str) -> Any:
    """The declared default of setting ``name`` (not the environment's value): for APIs and help
    texts that must agree with the settings without reading the environment."""
    return TracesSettings.model_fields[name].default
