"""The one client of a target outside Locust: every call the harness makes to it over ``httpx``.

Commands that talk to a target from their own process (``harness run`` and ``harness capacity``
through :mod:`harness.experiments`, ``harness cache …``, ``harness analysis decay-sweep`` and
``avalanche``) all use :class:`TargetClient`, which carries the target's
:class:`~harness.common.auth.Credentials`: the API key on the OpenAI routes, the admin token on the
admin routes, the extra headers on everything, the TLS policy. It lives in the load stage, beside
:mod:`harness.load.client` (the headers, SSE read, TTFT rule and usage of the Locust replay user,
which its probes reuse), so that every stage above may import it; it knows nothing of ``harness
serve`` (the pairing of a client with the server process a command started is
:class:`harness.experiments.target.Target`).

What it calls:

* the OpenAI routes: :meth:`TargetClient.models` (``GET /v1/models``), :meth:`~TargetClient.first_model`,
  :meth:`~TargetClient.complete` (one non-streamed request), :meth:`~TargetClient.probe` (prepared
  requests streamed as the load stage sends them, with their cache signals);
* the operational routes: :meth:`~TargetClient.health` (``GET /health``),
  :meth:`~TargetClient.metrics` (``GET /metrics`` as text);
* the admin routes of ``harness serve`` (and vLLM's ``/reset_prefix_cache``):
  :meth:`~TargetClient.cache_stats`, :meth:`~TargetClient.cache_flush`,
  :meth:`~TargetClient.cache_drain`, :meth:`~TargetClient.cache_preload`,
  :meth:`~TargetClient.reset_prefix_cache`.

Every call but :meth:`~TargetClient.probe` raises on an answer it cannot use, and no message shows
a secret (a server that echoes a header is not trusted to be careful: :meth:`Credentials.redact`):

* 404: :class:`NotExposed` (an :class:`~harness.common.errors.UnavailableError`): the target does
  not have this endpoint, which for the admin routes and ``/metrics`` is an answer, not a failure
  (a server without ``--cache``, vLLM outside its dev mode);
* 401 / 403, or no answer at all: :class:`~harness.common.errors.UnavailableError` with a hint
  naming the option that is missing (``--api-key``, ``--admin-token``) or the address;
* another 4xx: :class:`~harness.common.errors.InputError` with the server's message (the preload
  file named when there is one); a 5xx, 408 or 429: :class:`~harness.common.errors.UnavailableError`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson

from harness.common import headers as H
from harness.common.auth import ADMIN_TOKEN_ENV, API_KEY_ENV, Credentials
from harness.common.errors import HarnessError, InputError, UnavailableError
from harness.common.io import check_input_file
from harness.common.openai import RESET_PREFIX_CACHE_PATH
from harness.load.arrivals import RequestSpec
from harness.load.client import (
    ERROR_TEXT,
    MAX_ERROR_BODY,
    MODELS_PATH,
    PRELOAD_PATH,
    PRELOAD_TIMEOUT_S,
    TENANT_MISMATCH,
    TENANT_MISMATCH_HINT,
    StreamBody,
    http_error,
    model_ids,
    read_response,
    read_sse,
    stream_headers,
    tenant_header,
)
from harness.load.results import request_ok

DEFAULT_TIMEOUT_S = 120.0
"""Seconds a call may take unless it says otherwise (a flush of a large L2 takes seconds)."""
PROBE_TIMEOUT_S = 300.0
"""Seconds one probe request may take, stream included."""
PROBE_STAGE = "warm-check"
"""``X-Traffic-Stage`` of probe requests, so server metrics keep them apart from the phases."""
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
"""Prometheus text. Named here, not imported from :mod:`harness.load.telemetry`: the scraper there may
use this client, and must be able to import it without a cycle."""

Route = Literal["openai", "admin", "metrics", "open"]
"""Which credentials a route takes: the API key (``/v1/*``), the admin token (``/cache/*``,
``/reset_prefix_cache``), the admin token else the API key (``/metrics``, which a server with
``--protect-metrics`` opens to either), or only the extra headers (``/health``, always open)."""

_HINTS: dict[Route, str] = {
    "openai": f"give --api-key (or ${API_KEY_ENV})",
    "admin": f"give --admin-token (or ${ADMIN_TOKEN_ENV})",
    "metrics": "give --admin-token or --api-key (the target protects /metrics)",
    "open": "give the header the target wants with --header NAME:VALUE",
}


class NotExposed(UnavailableError):
    """The target answered 404: it does not have this endpoint (exit 5 where nobody expected that)."""


@dataclass(frozen=True)
class ProbeResult:
    """What one probe request reported about caching."""

    id: str
    status: int
    """The HTTP status (0: no answer)."""
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


@dataclass(frozen=True)
class TargetClient:
    """A target's base URL and the credentials every call to it carries.

    Args:
        url: the base URL (``http://127.0.0.1:8000``; a path prefix such as ``http://gw/llm`` is
            kept: every route follows it). A trailing ``/`` is dropped.
        credentials: API key, admin token, extra headers and TLS policy.
        timeout_s: seconds a call may take unless the method is given its own ``timeout_s``.

    A client holds no connection: each call opens its own (:meth:`probe` one for its batch), so
    it may be shared between threads and needs no closing.
    """

    url: str
    credentials: Credentials = field(default_factory=Credentials)
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", self.url.rstrip("/"))

    # ---- the OpenAI routes -----------------------------------------------------------------------

    def models(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``GET /v1/models``: the target's model list, as it answered.

        Raises:
            NotExposed: the target has no model list (404).
            UnavailableError: unreachable, the API key refused (401/403, hint ``give --api-key``),
                or a server error.
        """
        return _json(self._call("GET", MODELS_PATH, "openai", timeout_s=timeout_s))

    def first_model(self, *, timeout_s: float | None = None) -> str | None:
        """The first model id of ``GET /v1/models``: what a request names when no ``--model`` was
        given. ``None`` when the target has no model list (404) or lists none.

        Raises:
            UnavailableError: as :meth:`models` (unreachable, refused, a server error).
        """
        try:
            ids = model_ids(self.models(timeout_s=timeout_s))
        except NotExposed:
            return None
        return ids[0] if ids else None

    def complete(
        self,
        path: str,
        body: Mapping[str, Any] | bytes,
        *,
        tenant: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """``POST`` one non-streamed request (``path``: ``/v1/chat/completions`` or
        ``/v1/completions``); the target's JSON answer. ``tenant`` goes as ``X-Tenant-ID`` unless it
        is the default one (:func:`harness.load.client.tenant_header`).

        Raises:
            NotExposed: the target has no such endpoint (404; a model it does not serve is 404 too).
            InputError: the target refused the request (400, 422 …), with its message.
            UnavailableError: unreachable, the key refused (401/403) or a server error.
        """
        content = body if isinstance(body, bytes) else orjson.dumps(dict(body))
        headers = {"Content-Type": "application/json", **tenant_header(tenant)}
        resp = self._call("POST", path, "openai", content=content, headers=headers, timeout_s=timeout_s)
        return _json(resp)

    def probe(
        self,
        requests: Sequence[RequestSpec],
        *,
        no_cache: bool = False,
        concurrency: int = 4,
        stage: str = PROBE_STAGE,
        priority: int = 0,
    ) -> list[ProbeResult]:
        """Send each prepared request streamed, as the load stage would
        (:func:`harness.load.arrivals.prepare_requests`' bytes, :func:`harness.load.client.stream_headers`,
        the SSE read and TTFT rule of :mod:`harness.load.client`), and report its cache signals.

        Args:
            requests: the requests, sent in this order (``concurrency`` of them in flight).
            no_cache: add ``Cache-Control: no-cache``: a response cache in front of the engine then
                passes the request through (``BYPASS``), so ``cached_tokens`` shows the engine's own
                prefix cache rather than a response-cache hit (which reports every prompt token as
                cached).
            concurrency: requests in flight at a time (threads; httpx's client is thread-safe).
            stage: the requests' ``X-Traffic-Stage``.
            priority: sent as ``X-Warmup-Priority`` when > 0: the requests are a warmup's preload
                (:data:`harness.common.headers.PRELOAD_PRIORITY`); our server registers the prefix
                blocks they compute with it, which a scan-resistant eviction honours.

        Returns:
            One :class:`ProbeResult` per request, in order. A request that failed is a result with
            its ``error`` (redacted), never an exception.
        """
        creds = self.credentials
        extra = creds.request_headers()
        with (
            httpx.Client(base_url=self.url, timeout=PROBE_TIMEOUT_S, verify=creds.httpx_verify()) as client,
            ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="probe") as pool,
        ):
            return list(
                pool.map(
                    lambda spec: _probe_one(
                        client, spec, creds, stage=stage, no_cache=no_cache, extra=extra, priority=priority
                    ),
                    requests,
                )
            )

    # ---- operational routes ----------------------------------------------------------------------

    def health(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``GET /health``: the target's answer (``{"raw": text}`` when it is not JSON).

        Raises:
            NotExposed: no ``/health`` (404).
            UnavailableError: unreachable, or it answered an error (a 5xx: the target is not healthy).
        """
        return _json(self._call("GET", HEALTH_PATH, "open", timeout_s=timeout_s))

    def metrics(self, *, timeout_s: float | None = None) -> str:
        """``GET /metrics``: the target's Prometheus exposition, as text (sent with the admin
        token, else the API key: what a server with ``--protect-metrics`` takes).

        Raises:
            NotExposed: no ``/metrics`` (404).
            UnavailableError: unreachable, the credentials refused (401/403), or a server error.
        """
        return self._call("GET", METRICS_PATH, "metrics", timeout_s=timeout_s).text

    # ---- the admin routes of harness serve -------------------------------------------------------

    def cache_stats(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``GET /cache/stats``: per-tier counts, the Bloom guard, single-flight merges.

        Raises:
            NotExposed: the target has no response cache (404).
            UnavailableError: unreachable, the admin token refused (401/403, hint ``give
                --admin-token``), or a server error.
        """
        return _json(self._call("GET", "/cache/stats", "admin", timeout_s=timeout_s))

    def cache_flush(self, tier: str = "all", *, timeout_s: float | None = None) -> dict[str, Any]:
        """``POST /cache/flush?tier=TIER`` (``l1``, ``l2``, ``l3``, ``bloom`` or ``all``): the
        entries dropped per tier.

        Raises:
            NotExposed: the target has no response cache (404).
            InputError: the target refused the tier (400).
            UnavailableError: unreachable, the admin token refused (401/403), or a server error.
        """
        return _json(self._call("POST", f"/cache/flush?tier={tier}", "admin", timeout_s=timeout_s))

    def cache_drain(self, wait_s: float = 60.0, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``POST /cache/drain?timeout_s=WAIT``: returns once the write-backs of finished requests
        landed in L2/L3, or after ``wait_s`` seconds (``{"pending": N}``: how many had not). The call
        itself may take ``timeout_s`` (default: ``wait_s`` + 10 s).

        Raises:
            NotExposed: the target has no response cache (404).
            UnavailableError: unreachable, the admin token refused (401/403), or a server error.
        """
        limit = timeout_s if timeout_s is not None else wait_s + 10.0
        return _json(self._call("POST", f"/cache/drain?timeout_s={wait_s:g}", "admin", timeout_s=limit))

    def cache_preload(
        self, file: Path, *, tenant: str | None = None, timeout_s: float = PRELOAD_TIMEOUT_S
    ) -> dict[str, Any]:
        """``POST /cache/preload`` with ``file`` (JSONL: one OpenAI request body per line, optional
        ``completion`` and ``tenant``) as its body: the target's answer (``lines``, ``stored``,
        ``generated``, ``failed`` …). ``tenant`` is the default tenant of lines without one
        (``X-Tenant-ID``; the admin may name any). The server stores, and may generate, every line
        before it answers, hence the long default ``timeout_s``.

        Raises:
            NotExposed: the target has no response cache (404).
            InputError: ``file`` is missing, empty or binary, or the target refused it (400, 413 …):
                the error names the file.
            UnavailableError: unreachable, the admin token refused (401/403), or a server error.
        """
        body = check_input_file(file).read_bytes()
        headers = {"Content-Type": "application/x-ndjson"}
        if tenant:
            headers[H.TENANT] = tenant
        resp = self._call(
            "POST", PRELOAD_PATH, "admin", content=body, headers=headers, timeout_s=timeout_s, file=file
        )
        return _json(resp)

    def reset_prefix_cache(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``POST /reset_prefix_cache``: empty the engine's KV prefix cache (ours, and vLLM's in its
        dev mode).

        Raises:
            NotExposed: the target has no such endpoint (404).
            UnavailableError: unreachable, the admin token refused (401/403), or a server error.
        """
        return _json(self._call("POST", RESET_PREFIX_CACHE_PATH, "admin", timeout_s=timeout_s))

    # ---- the one request -------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        route: Route,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        file: Path | None = None,
    ) -> httpx.Response:
        """Send one request with the route's credentials (then ``headers``); its response when it is
        2xx, else the error for its status (see the module docstring)."""
        creds = self.credentials
        if route == "openai":
            sent = creds.request_headers()
        elif route in ("admin", "metrics"):
            sent = creds.admin_headers()
        else:
            sent = dict(creds.headers)
        sent.update(headers or {})
        full = self.url + path
        limit = timeout_s if timeout_s is not None else self.timeout_s
        try:
            resp = httpx.request(
                method, full, content=content, headers=sent, timeout=limit, verify=creds.httpx_verify()
            )
        except httpx.TimeoutException:
            raise UnavailableError(
                f"{method} {full}: no answer within {limit:g} s", hint="is the target overloaded or stuck?"
            ) from None
        except httpx.HTTPError as exc:
            raise UnavailableError(
                creds.redact(f"cannot reach {full}: {exc}"), hint="is the server running at that URL?"
            ) from None
        if resp.status_code < 400:
            return resp
        raise self._refusal(method, full, route, resp, file)

    def _refusal(
        self, method: str, full: str, route: Route, resp: httpx.Response, file: Path | None
    ) -> HarnessError:
        status = resp.status_code
        said = self.credentials.redact(_message(resp.content[:MAX_ERROR_BODY]))
        message = f"{method} {full} answered {status}: {said}"
        if status == 404:
            return NotExposed(message)
        if status in (401, 403):
            hint = TENANT_MISMATCH_HINT if TENANT_MISMATCH in said else _HINTS[route]
            return UnavailableError(message, hint=hint)
        if status < 500 and status not in (408, 429):
            return InputError(message, file=file)
        return UnavailableError(message)


def _message(body: bytes) -> str:
    """What an error body says: an OpenAI error object's ``message`` (ours, vLLM's), FastAPI's
    ``detail``, else the text itself, cut to :data:`~harness.load.client.ERROR_TEXT` characters."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:ERROR_TEXT]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            code = err.get("code")
            return (f"{err['message']} ({code})" if isinstance(code, str) else err["message"])[:ERROR_TEXT]
        if isinstance(data.get("detail"), str):
            return str(data["detail"])[:ERROR_TEXT]
    return body.decode("utf-8", "replace")[:ERROR_TEXT]


def _json(resp: httpx.Response) -> dict[str, Any]:
    """A 2xx answer's JSON object: ``{}`` for an empty body, ``{"raw": text}`` for one that is not
    JSON, ``{"answer": value}`` for JSON that is not an object."""
    if not resp.content:
        return {}
    try:
        data = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return {"raw": resp.text[:ERROR_TEXT]}
    return data if isinstance(data, dict) else {"answer": data}


def _probe_one(
    client: httpx.Client,
    spec: RequestSpec,
    creds: Credentials,
    *,
    stage: str,
    no_cache: bool,
    extra: dict[str, str],
    priority: int = 0,
) -> ProbeResult:
    hdrs = stream_headers(stage=stage, tenant=spec.tenant, extra=extra, bypass=no_cache)
    if priority > 0:
        hdrs[H.WARMUP_PRIORITY] = str(priority)
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
