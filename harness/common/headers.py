"""HTTP header names shared by the load generator (client) and the target (server).

Every request the harness sends is coloured with these so that server logs, traces and cache
metrics can be joined back to the load stage, trace and warmup step that caused them.
"""

from __future__ import annotations

from typing import Literal, get_args

TENANT = "X-Tenant-ID"
"""Cache partition and isolation key; absent means the default tenant."""
DEFAULT_TENANT = "default"

STAGE = "X-Traffic-Stage"
"""Load stage (ladder step or replay phase: ``cold``, ``warm``, ``stage-2`` …) that sent the request."""
TRACE_ID = "X-Trace-ID"
"""Source trace or request id the request replays, when the record came from a trace."""
WARMUP_ID = "X-Warmup-ID"
"""One id per load run (warmup or replay), so a server can group a run's requests."""
WARMUP_PRIORITY = "X-Warmup-Priority"
"""A warmup's preload asks the target to keep what it computes: ``1`` … ``3`` (our engine registers the
request's prefix blocks with that priority, which ``s3fifo`` eviction honours; absent or ``0``: an
ordinary request). ``X-Warmup-ID`` is not that signal: every load run sends one."""
PRELOAD_PRIORITY = 1
"""The priority the harness's preloads ask for (``X-Warmup-Priority``, and every line of ``POST
/cache/preload``): one second chance in S3-FIFO's main queue, as if each block had been hit once."""
PREHEAT = "x-env"
"""``x-env: preheat`` marks warmup traffic for mesh routing (Istio) apart from user traffic."""
REQUEST_ID = "X-Request-Id"
SESSION_ID = "X-Session-ID"
"""The conversation a request is a turn of (session corpora): a router may keep a session on one
replica, a server may key its prefix cache by it."""

CACHE_STATUS = "x-cache"
"""Response header carrying a :data:`CacheStatus`."""
CacheStatus = Literal["HIT-L1", "HIT-L2", "HIT-L3", "MISS", "BYPASS"]
"""Which response-cache tier answered (``HIT-*``), or that the engine did (``MISS``, ``BYPASS``)."""
CACHE_STATUSES: tuple[CacheStatus, ...] = get_args(CacheStatus)
CACHE_KEY = "x-cache-key"
FAULT = "x-harness-fault"
"""Response header of a request that a fault injection of ``harness serve`` hit (``error``,
``cache-miss``); absent on every other response, and on every response of a server without injection."""
