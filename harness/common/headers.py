"""HTTP header names shared by the load generator (client) and the target (server).

Every request the harness sends is coloured with these so that server logs, traces and cache
metrics can be joined back to the load stage, trace and warmup step that caused them.
"""

from __future__ import annotations

TENANT = "X-Tenant-ID"
"""Cache partition and isolation key; absent means the default tenant."""
DEFAULT_TENANT = "default"

STAGE = "X-Harness-Stage"
"""Load stage (ladder step or replay phase) that sent the request."""
TRACE_ID = "X-Harness-Trace-Id"
"""Source trace or request id the request replays."""
WARMUP_ID = "X-Harness-Warmup-Id"
"""Warmup plan step, when the request is part of a cache warmup."""
REQUEST_ID = "X-Request-Id"

CACHE_STATUS = "x-cache"
"""Response header: HIT-L1 | HIT-L2 | HIT-L3 | MISS | BYPASS."""
CACHE_KEY = "x-cache-key"
