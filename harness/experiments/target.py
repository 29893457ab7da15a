"""The target of a paired run: a ``harness serve`` we start, or any OpenAI-compatible server at a URL.

What ``harness run`` needs from a target beyond the load itself is its cache levels: flushing them
before the cold phase, and asking whether they are warm before the warm phase. Those are admin
endpoints only some servers have, so every one is optional: an endpoint that answers 404 is *not
exposed* by this target (a server without ``--cache``, vLLM outside its dev mode, TGI, llama.cpp),
and the run says which levels it skipped rather than failing.

* :data:`FLUSH_LEVELS` (a :class:`~harness.common.registry.Registry`): the response cache with its
  Bloom guard (``POST /cache/flush?tier=all``) and the engine's KV prefix cache
  (``POST /reset_prefix_cache``, vLLM's endpoint);
* :meth:`Target.probe`: send prepared requests of the run (the load stage's bytes,
  :func:`harness.load.arrivals.prepare_requests`) and read what each reports about caching, through
  the load stage's own client (:mod:`harness.load.client`: its headers, SSE read, TTFT rule and
  usage), over ``httpx`` (this process never runs gevent);
* :meth:`Target.preload`: the load stage's ``POST /cache/preload`` call, over ``httpx``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from harness.common import headers as H
from harness.common.auth import Credentials
from harness.common.errors import UnavailableError
from harness.common.openai import RESET_PREFIX_CACHE_PATH
from harness.common.registry import Registry
from harness.load.arrivals import RequestSpec
from harness.load.client import (
    MAX_ERROR_BODY,
    PRELOAD_PATH,
    PRELOAD_TIMEOUT_S,
    PreloadCall,
    StreamBody,
    http_error,
    read_response,
    read_sse,
    stream_headers,
)
from harness.load.results import request_ok
from harness.server.launch import ServerProcess

ADMIN_TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 300.0
PROBE_STAGE = "warm-check"
"""``X-Traffic-Stage`` of probe requests, so server metrics keep them apart from the phases."""


class NotExposed(Exception):
    """The target answered 404: it does not have this endpoint."""


@dataclass
class Target:
    """Where the load goes, and the admin calls a paired run makes to it."""

    url: str
    model: str | None = None
    server: ServerProcess | None = None
    """The ``harness serve`` child this run started (``None`` for ``--url``)."""
    credentials: Credentials = field(default_factory=Credentials)
    """Key, admin token, extra headers and TLS policy for every call to the target."""

    def admin(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        timeout_s: float = ADMIN_TIMEOUT_S,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Call an admin endpoint (or ``/v1/models``); its JSON (``{}`` for an empty body). Raises
        :class:`NotExposed` on 404 and :class:`UnavailableError` when the target cannot be reached,
        refuses the credentials or fails. Messages never show a secret. ``headers`` replaces the
        credentials' headers (a prepared call brings its own)."""
        creds = self.credentials
        full = self.url.rstrip("/") + path
        if headers is None:
            headers = creds.request_headers() if path.startswith("/v1/") else creds.admin_headers()
            if content is not None:
                headers["Content-Type"] = "application/x-ndjson"
        try:
            resp = httpx.request(
                method, full, content=content, headers=headers, timeout=timeout_s, verify=creds.httpx_verify()
            )
        except httpx.HTTPError as exc:
            raise UnavailableError(creds.redact(f"cannot reach {full}: {exc}")) from None
        if resp.status_code == 404:
            raise NotExposed(f"{method} {path} answered 404")
        if resp.status_code >= 400:
            hint = None
            if resp.status_code in (401, 403):
                hint = "give --api-key" if path.startswith("/v1/") else "give --admin-token"
            raise UnavailableError(
                creds.redact(f"{method} {full} answered {resp.status_code}: {resp.text[:300]}"), hint=hint
            )
        try:
            return resp.json() if resp.content else {}
        except ValueError:
            return {"raw": resp.text[:300]}

    def preload(self, path: Path) -> Any:
        """``POST /cache/preload`` with the file (the load stage's call); the target's answer.
        :class:`NotExposed` when the target has no response cache."""
        call = PreloadCall.of(path, self.credentials)
        return self.admin(
            "POST", PRELOAD_PATH, content=call.body, timeout_s=PRELOAD_TIMEOUT_S, headers=call.headers
        )

    def probe(
        self, requests: Sequence[RequestSpec], *, no_cache: bool = False, concurrency: int = 4
    ) -> list[ProbeResult]:
        """Send each request (streamed, as the load stage would) and report its cache signals.

        ``no_cache`` adds ``Cache-Control: no-cache``: a response cache in front of the engine then
        passes the request through (``BYPASS``), so ``cached_tokens`` shows the engine's own prefix
        cache rather than a response-cache hit (which reports every prompt token as cached).
        ``concurrency`` requests are in flight at a time (threads: httpx's client is thread-safe).
        """
        creds = self.credentials
        extra = creds.request_headers()
        with (
            httpx.Client(base_url=self.url, timeout=PROBE_TIMEOUT_S, verify=creds.httpx_verify()) as client,
            ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="probe") as pool,
        ):
            return list(
                pool.map(
                    lambda spec: _probe_one(client, spec, creds, no_cache=no_cache, extra=extra), requests
                )
            )


@dataclass(frozen=True)
class ProbeResult:
    """What one probe request reported about caching."""

    id: str
    status: int
    cache: str | None
    """The ``x-cache`` header (``None``: the target sends none)."""
    cached_tokens: int | None
    """``usage.prompt_tokens_details.cached_tokens`` (``None``: not reported)."""
    prompt_tokens: int | None
    ttft_ms: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return request_ok(self.status, self.error)


def _probe_one(
    client: httpx.Client, spec: RequestSpec, creds: Credentials, *, no_cache: bool, extra: dict[str, str]
) -> ProbeResult:
    hdrs = stream_headers(stage=PROBE_STAGE, tenant=spec.tenant, extra=extra, bypass=no_cache)
    body = StreamBody()
    clock = time.perf_counter
    sent = clock()
    try:
        with client.stream("POST", spec.path, content=spec.body, headers=hdrs) as resp:
            cache = resp.headers.get(H.CACHE_STATUS)
            if resp.status_code != 200:
                error = http_error(resp.status_code, resp.read()[:MAX_ERROR_BODY], creds)
                return ProbeResult(spec.id, resp.status_code, cache, None, None, None, error)
            read_sse((line.encode() for line in resp.iter_lines()), body, clock)
    except httpx.HTTPError as exc:
        return ProbeResult(spec.id, 0, None, None, None, None, creds.redact(f"{type(exc).__name__}: {exc}"))
    out = read_response(body.lines, "auto")
    first = out.timing.first_token_t if out.timing is not None else None
    return ProbeResult(
        id=spec.id,
        status=200,
        cache=cache,
        cached_tokens=out.usage.cached_tokens,
        prompt_tokens=out.usage.prompt_tokens,
        ttft_ms=(first - sent) * 1000.0 if first is not None else None,
        error=creds.redact(out.error) if out.error else None,
    )


# ------------------------------------------------------------------------------------- flushing

FlushStatus = Literal["flushed", "not exposed"]


@dataclass(frozen=True)
class FlushOutcome:
    """One cache level before the cold phase: flushed (with the target's answer) or not exposed."""

    level: str
    status: FlushStatus
    detail: str
    answer: dict[str, Any] | None = None


@dataclass(frozen=True)
class FlushLevel:
    """A cache level a paired run empties before its cold phase."""

    what: str
    """What the level is, for messages."""
    call: Callable[[Target], Any]


FLUSH_LEVELS: Registry[FlushLevel] = Registry("cache level")
"""The levels emptied before the cold phase, in order."""

FLUSH_LEVELS.register("response")(
    FlushLevel(
        "response cache (L1, L2, L3) and its Bloom guard",
        lambda t: t.admin("POST", "/cache/flush?tier=all"),
    )
)
FLUSH_LEVELS.register("kv")(
    FlushLevel("engine KV prefix cache", lambda t: t.admin("POST", RESET_PREFIX_CACHE_PATH))
)


def flush_all(target: Target) -> list[FlushOutcome]:
    """Empty every cache level the target exposes; a level that answers 404 is reported, not fatal.

    Write-backs of requests that already finished are waited for first (``POST /cache/drain``), so
    none lands in a tier after it was flushed.
    """
    with contextlib.suppress(NotExposed):
        target.admin("POST", "/cache/drain?timeout_s=60")
    out: list[FlushOutcome] = []
    for name, level in FLUSH_LEVELS.items():
        try:
            answer = level.call(target)
        except NotExposed as exc:
            out.append(FlushOutcome(name, "not exposed", f"{level.what}: not exposed by the target ({exc})"))
            continue
        out.append(FlushOutcome(name, "flushed", level.what, answer if isinstance(answer, dict) else None))
    return out
