"""Build the cache stack the server uses: ``create_cache(settings, registry) -> ResponseCache``.

Blocking on purpose (call it before the event loop serves traffic): it starts the embedded Redis
and its supervisor (unless ``REDIS_URL`` names an external one), loads the embedding model when L3
is on, and loads the saved Bloom filter and L3 indexes from the state directory.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from harness.common.settings import load_settings
from harness.target.cache.api import ResponseCache
from harness.target.cache.redis_server import EmbeddedRedis
from harness.target.cache.settings import CacheSettings, with_tier_file
from harness.target.cache.stack import CacheStack

log = logging.getLogger(__name__)


def create_cache(
    settings: CacheSettings | None = None, registry: CollectorRegistry | None = None
) -> ResponseCache:
    """A ready :class:`~harness.target.cache.stack.CacheStack` (typed as the protocol the server relies on).

    ``registry`` receives the cache metrics; ``None`` makes a private registry (so several caches
    in one process, e.g. in tests, never collide on metric names).
    """
    return build_stack(settings, registry)


def build_stack(
    settings: CacheSettings | None = None, registry: CollectorRegistry | None = None
) -> CacheStack:
    """Like :func:`create_cache`, typed as the concrete stack (tests, benchmarks, the CLI)."""
    s = settings if settings is not None else load_settings(CacheSettings)
    s = with_tier_file(s)  # a tier file brings its policy and TTLs
    reg = registry if registry is not None else CollectorRegistry()
    embedded: EmbeddedRedis | None = None
    url = s.redis_url
    if s.l2_enabled and not url:
        embedded = EmbeddedRedis(
            s.resolved_run_dir(),
            s.redis_maxmemory,
            persistence=s.redis_persistence,
            restart=s.redis_restart,
            backoff_s=s.redis_restart_backoff_s,
            max_backoff_s=s.redis_restart_backoff_max_s,
        )
        embedded.start()
        url = embedded.url
    semantic = None
    try:
        if s.l3_enabled:
            from harness.target.cache.l3 import SemanticCache

            semantic = SemanticCache(s)
            if s.l3_warm_on_start:
                semantic.warm()
        stack = CacheStack(s, reg, redis_url=url, embedded=embedded, semantic=semantic)
        if s.persist:
            stack.load_state()
    except BaseException:
        if semantic is not None:
            semantic.close()  # its embedding thread pool
        if embedded is not None:
            embedded.stop()
        raise
    log.info("cache ready: L2 %s", "embedded " + embedded.socket_path if embedded else url)
    return stack
