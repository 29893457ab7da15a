"""The operator routes: ``GET /health``, ``GET /metrics``, ``POST /echo``, ``POST /reset_prefix_cache``
(the engine's KV prefix cache, vLLM's endpoint) and the response-cache admin API (``GET /cache/stats``,
``POST /cache/flush``, ``POST /cache/drain``, ``POST /cache/preload``).

``POST /echo`` answers its JSON body back: what a request costs this server before any model or
cache work (credentials, body read, JSON in and out), the floor ``bench/cache.py`` holds a cache hit
to. It takes the OpenAI routes' credentials and body limit, so it opens nothing they do not.

Every route here but ``/health``, ``/metrics`` and ``/echo`` is an admin route: it passes
:meth:`~harness.target.server.auth.AuthPolicy.require_admin` first (401 without the admin token when one is
set, 403 ``admin_disabled`` on a keyed server without one, open in loopback development), so nobody
else can flush, reset or plant answers. ``/metrics`` needs a credential only with ``--protect-metrics``.

The cache routes answer 404 ``cache_disabled`` when the server runs without ``--cache``; a cache
that cannot reach Redis makes a flush a 503 ``cache_unavailable`` (the CLI reports it), never a 500.
"""

from __future__ import annotations

import orjson
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from harness.common.errors import HarnessError
from harness.common.openai import RESET_PREFIX_CACHE_PATH
from harness.target.cache.api import FLUSH_ALL, FLUSH_TIERS, ResponseCache
from harness.target.server.asgi import ClientGone, parse_json, read_body
from harness.target.server.errors import APIError, bad_request
from harness.target.server.preload import preload
from harness.target.server.state import ServerState, log

FLUSH_CHOICES = (*FLUSH_TIERS, FLUSH_ALL)
MAX_DRAIN_S = 3600.0


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def add_admin_routes(app: FastAPI, st: ServerState) -> None:
    """Register health, metrics and the cache admin endpoints on ``app``."""

    @app.get("/health")
    async def health() -> Response:
        s = st.engine.stats()
        status = "engine failed" if s.failure else ("ok" if st.ready else "starting")
        body = {
            "status": status,
            "model": st.model_name,
            "device": s.device,
            "running": s.running,
            "waiting": s.waiting,
            "kv_blocks_used": s.kv_blocks_used,
            "kv_blocks_total": s.kv_blocks_total,
            "cache": st.cache is not None,
            # Always there, so "nothing injected" is said, not inferred from an absent field.
            "fault_injection": st.fault_plan.describe(),
        }
        if s.failure:
            body["failure"] = s.failure
        return _json(body, 200 if status == "ok" else 503)

    async def echo(request: Request) -> Response:
        try:
            st.auth.tenant(request.headers)
            body = parse_json(await read_body(request, st.settings.max_body_bytes))
        except APIError as exc:
            return exc.response()
        except ClientGone:
            return Response(status_code=499)
        return _json(body)

    # A plain Starlette route, dispatched like the OpenAI routes it is the floor of.
    app.add_route("/echo", echo, methods=["POST"])

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        try:
            st.auth.require_metrics(request.headers)
        except APIError as exc:
            return exc.response()
        return Response(generate_latest(st.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post(RESET_PREFIX_CACHE_PATH)
    async def reset_prefix_cache(request: Request) -> Response:
        """Empty the engine's KV prefix cache (vLLM's endpoint of the same name, so one client call
        serves both servers). Works with or without ``--cache``; the response cache is
        ``/cache/flush``'s."""
        try:
            st.auth.require_admin(request.headers)
        except APIError as exc:
            return exc.response()
        freed = await st.engine.reset_prefix_cache()
        log.info("prefix cache reset: %d cached KV blocks freed", freed)
        return _json({"reset": True, "blocks_freed": freed})

    def need_cache() -> ResponseCache:
        if st.cache is None:
            raise APIError(
                404, "the response cache is not enabled (start with --cache)", code="cache_disabled"
            )
        return st.cache

    @app.get("/cache/stats")
    async def cache_stats(request: Request) -> Response:
        try:
            st.auth.require_admin(request.headers)
            return _json(need_cache().stats())
        except APIError as exc:
            return exc.response()

    @app.post("/cache/flush")
    async def cache_flush(request: Request) -> Response:
        try:
            st.auth.require_admin(request.headers)
            c = need_cache()
            tier = request.query_params.get("tier", FLUSH_ALL).lower()
            if tier not in FLUSH_CHOICES:
                raise bad_request(
                    f"unknown tier '{tier}'; expected one of {', '.join(FLUSH_CHOICES)}", param="tier"
                )
            dropped = await c.flush(None if tier == FLUSH_ALL else tier)
            return _json({"tier": tier, "dropped": dropped})
        except APIError as exc:
            return exc.response()
        except HarnessError as exc:  # Redis (L2) is down: a 503 the CLI reports, not a 500 traceback
            return APIError(503, str(exc), type="server_error", code="cache_unavailable").response()

    @app.post("/cache/drain")
    async def cache_drain(request: Request) -> Response:
        """Wait until the write-backs of finished requests have landed (``{"pending": 0}``)."""
        try:
            st.auth.require_admin(request.headers)
            c = need_cache()
            raw = request.query_params.get("timeout_s", "60")
            try:
                timeout_s = float(raw)
            except ValueError:
                timeout_s = -1.0
            if not 0 <= timeout_s <= MAX_DRAIN_S:  # also refuses nan
                raise bad_request(
                    f"timeout_s must be 0–{MAX_DRAIN_S:g} seconds, got '{raw}'", param="timeout_s"
                )
            return _json({"pending": await c.drain(timeout_s)})
        except APIError as exc:
            return exc.response()

    @app.post("/cache/preload")
    async def cache_preload(request: Request) -> Response:
        """Store given completions or generate them: storing caller-given text for any tenant is an
        admin action, so the admin (or loopback development) names the tenants, by header or per line."""
        try:
            tenant = st.auth.admin_tenant(request.headers)
            c = need_cache()
            raw = await read_body(request, st.settings.max_preload_bytes)
            return _json(await preload(st, c, raw, tenant))
        except APIError as exc:
            return exc.response()
        except ClientGone:  # left mid-upload: nothing to answer, and not a server error
            return Response(status_code=499)
