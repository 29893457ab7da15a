"""The FastAPI application of ``harness serve``: its lifecycle, error handlers and routes.

:func:`create_app` wires one :class:`~harness.target.engine.api.AsyncEngine` (and optionally one
:class:`~harness.target.cache.api.ResponseCache`) behind the OpenAI HTTP API. The server is split by what
changes together, and no module imports the one that imports it:

* ``app`` (this module): startup (engine start, chat-template and first-forward warm-up), shutdown
  (engine, then cache), the error handlers, and which routes exist;
* :mod:`~harness.target.server.state`: what the handlers share (:class:`ServerState`), a request's context,
  the outcome of a generation and the cache entry made from it;
* :mod:`~harness.target.server.openai_routes`: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``;
* :mod:`~harness.target.server.admin_routes`: ``/health``, ``/metrics`` and the ``/cache/*`` admin API;
* :mod:`~harness.target.server.preload`: ``POST /cache/preload``'s validation and generation;
* :mod:`~harness.target.server.asgi`: body reading, disconnect watching and the guarded stream;
* :mod:`~harness.target.server.prepare`: OpenAI request → engine parameters and the cache body;
* :mod:`~harness.target.server.formats`: the response and chunk shapes, ``usage``;
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from harness import __version__
from harness.target.cache.api import ResponseCache
from harness.target.engine.api import AsyncEngine, SamplingParams
from harness.target.server.admin_routes import add_admin_routes
from harness.target.server.auth import AuthPolicy
from harness.target.server.errors import APIError
from harness.target.server.faults import FaultPlan
from harness.target.server.openai_routes import add_openai_routes
from harness.target.server.settings import ServerSettings
from harness.target.server.state import ServerState, log


def create_app(
    engine: AsyncEngine,
    *,
    settings: ServerSettings | None = None,
    cache: ResponseCache | None = None,
    registry: CollectorRegistry | None = None,
    manage_lifecycle: bool = True,
    identity: dict[str, Any] | None = None,
    auth: AuthPolicy | None = None,
    faults: FaultPlan | None = None,
) -> FastAPI:
    """The ASGI app. With ``manage_lifecycle`` the app starts the engine on startup and shuts the
    engine down and closes the cache on shutdown. ``identity`` (preset, weights hash …, see
    :func:`harness.target.server.cli.model_identity`) goes into ``GET /v1/models``' ``harness`` block.
    ``auth`` is who may call what (default: read from ``settings``, see :mod:`harness.target.server.auth`).
    ``faults`` are the fault injections (default: the server settings', without a slowdown, which is
    the engine's; see :mod:`harness.target.server.faults`)."""
    settings = settings or ServerSettings()
    registry = registry if registry is not None else CollectorRegistry()
    st = ServerState(
        engine, settings, cache, registry, auth or AuthPolicy.from_settings(settings), fault_plan=faults
    )
    st.identity = dict(identity or {})

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await engine.start()
        # The first chat template render compiles its jinja template (hundreds of ms): do it now, not
        # inside the first request's TTFT.
        tok = engine.tokenizer
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "warm-up"}]))
        if manage_lifecycle and settings.warmup:
            # One short generation pays the first forward pass's one-off costs (allocator, kernels)
            # before a client's TTFT would.
            params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
            async for _event in engine.generate("warmup-" + uuid.uuid4().hex, ids, params):
                pass
        st.ready = True
        try:
            yield
        finally:
            st.ready = False
            if manage_lifecycle:
                await engine.shutdown()
                if cache is not None:
                    await cache.close()
                    st.cache_closed = True

    app = FastAPI(
        title="harness serve",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.harness = st

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        err = APIError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return err.response(exc.headers)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return APIError(500, f"internal server error: {type(exc).__name__}", type="server_error").response()

    add_openai_routes(app, st)
    add_admin_routes(app, st)
    return app
