"""Settings of the traces stage (env prefix ``HARNESS__TRACES__``); command-line options override them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from harness.common.settings import stage_config
from harness.traces.coldpaths import DEFAULT_CACHE_HIT


class TracesSettings(BaseSettings):
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
    k: int = 12
    seed: int = 0
    max_buffered_spans: int = Field(default=50_000, ge=1)
    """Spans held while grouping streamed span documents into traces (bounds memory)."""
    query_timeout_s: float = 10.0
    query_page_s: float = 3600.0
    """Time-window page size for Jaeger query searches."""
    query_limit: int = 100
