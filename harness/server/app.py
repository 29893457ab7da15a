"""The FastAPI application: OpenAI endpoints, health, metrics and the response-cache admin API.

:func:`create_app` wires one :class:`~harness.engine.api.AsyncEngine` (and optionally one
:class:`~harness.cache.api.ResponseCache`) behind the OpenAI HTTP API. A request goes through:

1. body read with a size cap (413), JSON parse and strict validation (400 naming the field);
2. :func:`~harness.server.protocol.prepare`: tokenize, check the context length (400), build
   :class:`SamplingParams` and the cache body;
3. the cache's ``begin`` (tenant from ``X-Tenant-ID``, ``Cache-Control: no-cache`` bypasses); a hit
   is replayed, split into the engine's tokens so streaming clients see the same chunk cadence;
4. on a miss the engine's first event is awaited *before* the response starts, so a full queue is a
   real 429 (with ``Retry-After``) and not a broken 200 stream;
5. tokens are streamed as SSE or collected into one JSON response; a completed miss is handed to
   ``finish(ticket, completion)``, anything else to ``finish(ticket, None)``.

A client that goes away aborts its engine request (its KV blocks go back to the pool): while the
response has not started a watcher on the ASGI receive channel notices the disconnect; once streaming,
Starlette cancels the body iterator and its ``finally`` aborts the engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import orjson
from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from harness import __version__
from harness.cache.api import FLUSH_ALL, FLUSH_TIERS, CachedCompletion, CacheTicket, ResponseCache
from harness.common import headers as H
from harness.common.errors import HarnessError
from harness.common.openai import (
    COMPLETED_FINISH_REASONS,
    SSE_DONE,
    ChatCompletionRequest,
    CompletionRequest,
    Endpoint,
    sse_event,
)
from harness.engine.api import (
    AsyncEngine,
    EngineError,
    EngineFull,
    InvalidPrompt,
    PromptTooLong,
    RequestMetrics,
    SamplingParams,
    TokenEvent,
)
from harness.server.errors import APIError, bad_request, from_validation_error, retry_after_header
from harness.server.metrics import EngineCollector, ServerMetrics
from harness.server.protocol import (
    CompletionsFormat,
    Prepared,
    TokenLog,
    check_context,
    formatter,
    prepare,
    split_tokens,
    tokenize_prepared,
    usage_dict,
)
from harness.server.settings import ServerSettings

log = logging.getLogger("harness.server")

T = TypeVar("T")

_FLUSH_CHOICES = (*FLUSH_TIERS, FLUSH_ALL)


def new_id() -> str:
    """32 random hex digits, like ``uuid4().hex`` without its ``os.urandom`` system call.

    Request, response and engine ids must be unique, not unpredictable.
    """
    return f"{random.getrandbits(128):032x}"


class ClientGone(Exception):
    """The client disconnected before the response started."""


class GuardedStream(StreamingResponse):
    """A streaming response whose cleanup runs however the response ends.

    The body generator's own ``finally`` covers completion and cancellation mid-stream, but a
    generator that never started (the client left before the first chunk was pulled) never runs
    its ``finally``. ``on_close`` (idempotent) runs here in every case, shielded from cancellation.
    """

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], headers: dict[str, str]
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


@dataclass(slots=True)
class RequestContext:
    """Per-request facts read from the headers, plus timing."""

    request_id: str
    engine_id: str
    stage: str | None
    trace_id: str | None
    warmup_id: str | None
    tenant: str
    no_cache: bool
    t0: float
    endpoint: str
    cache_status: str = "BYPASS"
    cache_key: str | None = None
    status: int = 200
    first_text_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        h = {H.REQUEST_ID: self.request_id, H.CACHE_STATUS: self.cache_status}
        if self.cache_key:
            h[H.CACHE_KEY] = self.cache_key
        return h


@dataclass(slots=True)
class Outcome:
    """What came out of one generation, engine or cache."""

    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    metrics: RequestMetrics | None = None
    tokens: int = 0
    logprob_sum: float = 0.0
    logprob_n: int = 0
    entropy_sum: float = 0.0
    entropy_n: int = 0
    log: TokenLog | None = None
    offset: int = 0

    def add(self, ev: TokenEvent) -> TokenLog | None:
        """Account one engine event; returns this token's logprob entry when logprobs are on."""
        if ev.token_id is not None:
            self.tokens += 1
        if ev.logprob is not None:
            self.logprob_sum += ev.logprob
            self.logprob_n += 1
        if ev.entropy is not None:
            self.entropy_sum += ev.entropy
            self.entropy_n += 1
        step: TokenLog | None = None
        if self.log is not None and ev.token_id is not None and ev.logprob is not None:
            step = TokenLog([ev.text], [ev.logprob], [self.offset])
            self.log.tokens.append(ev.text)
            self.log.logprobs.append(ev.logprob)
            self.log.offsets.append(self.offset)
        if ev.text:
            self.text.append(ev.text)
            self.offset += len(ev.text)
        if ev.finished:
            self.finish_reason = ev.finish_reason
            self.metrics = ev.metrics
        return step


@dataclass(slots=True)
class _StreamState:
    """An engine stream being sent to a client."""

    gen: AsyncIterator[TokenEvent]
    out: Outcome
    finished: bool = False


class ServerState:
    """Everything the handlers share; one per app."""

    def __init__(
        self,
        engine: AsyncEngine,
        settings: ServerSettings,
        cache: ResponseCache | None,
        registry: CollectorRegistry,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.cache = cache
        self.registry = registry
        self.metrics = ServerMetrics(registry, settings.max_stage_labels)
        registry.register(EngineCollector(engine.stats))
        self.model_name = settings.served_model_name or engine.model_name
        self.created = int(time.time())
        self.ready = False
        self.cache_closed = False
        self.preload_sem = asyncio.Semaphore(settings.preload_concurrency)
        self._device: str | None = None
        self._request_counters: dict[tuple[str, int, str | None], Any] = {}
        self._hit_metrics: dict[str, tuple[Any, Any, Any, Any]] = {}

    @property
    def device(self) -> str:
        """The engine's device, read once (it never changes; ``engine.stats()`` is not free)."""
        if self._device is None:
            self._device = self.engine.stats().device
        return self._device

    def hit_metrics(self, endpoint: str) -> tuple[Any, Any, Any, Any]:
        """The labelled children a cache hit updates, resolved once per endpoint (``labels()`` costs µs)."""
        m = self._hit_metrics.get(endpoint)
        if m is None:
            mt = self.metrics
            m = (
                mt.ttft.labels(endpoint, "cache"),
                mt.e2e.labels(endpoint, "cache"),
                mt.prompt_tokens.labels("cache"),
                mt.output_tokens.labels("cache"),
            )
            self._hit_metrics[endpoint] = m
        return m

    def context(self, request: Request, endpoint: str) -> RequestContext:
        hdr = request.headers
        rid = hdr.get(H.REQUEST_ID) or new_id()
        cache_control = hdr.get("cache-control", "").lower()
        return RequestContext(
            request_id=rid,
            engine_id=new_id(),
            stage=hdr.get(H.STAGE),
            trace_id=hdr.get(H.TRACE_ID),
            warmup_id=hdr.get(H.WARMUP_ID),
            tenant=hdr.get(H.TENANT) or H.DEFAULT_TENANT,
            no_cache="no-cache" in cache_control or "no-store" in cache_control,
            t0=time.perf_counter(),
            endpoint=endpoint,
        )

    def count(self, ctx: RequestContext, status: int) -> None:
        ctx.status = status
        label = (ctx.endpoint, status, ctx.stage)
        child = self._request_counters.get(label)
        if child is None:
            stage = self.metrics.stage_label(ctx.stage)
            child = self.metrics.requests.labels(ctx.endpoint, str(status), stage)
            if stage == ctx.stage or ctx.stage is None:
                # Bounded like the labels themselves: only stages that got their own label are kept.
                self._request_counters[label] = child
        child.inc()

    def log_request(self, ctx: RequestContext, out: Outcome | None) -> None:
        if not self.settings.log_requests:
            return
        log.info(
            "request id=%s endpoint=%s status=%s stage=%s trace=%s warmup=%s tenant=%s cache=%s "
            "tokens=%s finish=%s e2e_ms=%.1f",
            ctx.request_id,
            ctx.endpoint,
            ctx.status,
            ctx.stage,
            ctx.trace_id,
            ctx.warmup_id,
            ctx.tenant,
            ctx.cache_status,
            out.tokens if out else 0,
            out.finish_reason if out else None,
            (time.perf_counter() - ctx.t0) * 1000,
        )


# --------------------------------------------------------------------------------------------------
# helpers


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(
            413,
            f"request body is {declared} bytes; the limit is {limit}",
            code="request_too_large",
            reason="body_too_large",
        )
    # The ASGI receive channel directly: Starlette's ``request.stream()`` generator costs tens of µs.
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise APIError(
                413,
                f"request body exceeds the limit of {limit} bytes",
                code="request_too_large",
                reason="body_too_large",
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, aw: Awaitable[T]) -> T:
    """Await ``aw`` unless the client disconnects first (then it is cancelled and ClientGone raised)."""
    task = asyncio.ensure_future(aw)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise ClientGone


async def _chain(first: Iterable[TokenEvent], rest: AsyncIterator[TokenEvent]) -> AsyncIterator[TokenEvent]:
    for ev in first:
        yield ev
        if ev.finished:
            return
    async for ev in rest:
        yield ev
        if ev.finished:
            return


async def _close(gen: AsyncIterator[TokenEvent] | None) -> None:
    """Close an engine stream (which aborts its request if unfinished); errors are irrelevant here."""
    aclose = getattr(gen, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


def _cached_completion(st: ServerState, prep: Prepared, out: Outcome) -> CachedCompletion:
    # ``prompt_fp`` lets a later hit on the same prompt report ``prompt_tokens`` without tokenizing.
    return CachedCompletion(
        text="".join(out.text),
        finish_reason=out.finish_reason or "stop",
        model=st.model_name,
        prompt_tokens=len(prep.prompt_ids),
        completion_tokens=out.metrics.output_tokens if out.metrics else out.tokens,
        created=int(time.time()),
        mean_logprob=out.logprob_sum / out.logprob_n if out.logprob_n else None,
        mean_entropy=out.entropy_sum / out.entropy_n if out.entropy_n else None,
        meta={"engine_model": st.engine.model_name, "prompt_fp": prep.prompt_fp},
    )


# --------------------------------------------------------------------------------------------------
# the OpenAI handlers


class Handler:
    """Serves one OpenAI request; split into steps so each failure maps to one status."""

    def __init__(self, st: ServerState, request: Request, endpoint: Endpoint) -> None:
        self.st = st
        self.request = request
        self.endpoint = endpoint
        self.ctx = st.context(request, endpoint)
        self.ticket: CacheTicket | None = None
        self.fmt: CompletionsFormat | None = None
        self._closed = False
        """Set by the (idempotent) cleanup of a streaming response."""

    async def run(self) -> Response:
        st, ctx = self.st, self.ctx
        st.metrics.in_flight.inc()
        handed_off = False  # a streaming body takes over the cleanup
        try:
            raw = await read_body(self.request, st.settings.max_body_bytes)
            req = self._validate(parse_json(raw))
            if req.request_id and not self.request.headers.get(H.REQUEST_ID):
                ctx.request_id = req.request_id
            if st.settings.strict_model_name and req.model not in (None, st.model_name):
                raise APIError(
                    404,
                    f"The model '{req.model}' does not exist; this server serves '{st.model_name}'",
                    param="model",
                    code="model_not_found",
                    reason="unknown_model",
                )
            prep = prepare(
                req,
                tokenizer=st.engine.tokenizer,
                model_name=st.model_name,
                max_model_len=st.engine.max_model_len,
                default_max_tokens=st.settings.default_max_tokens,
                # With a cache, tokenize only when needed: a hit on the same prompt does not need it.
                tokenize=st.cache is None or ctx.no_cache,
            )
            self.fmt = formatter(self.endpoint, new_id(), int(time.time()), st.model_name, prep.include_usage)
            await self._begin_cache(prep)
            if self.ticket is not None and self.ticket.completion is not None:
                resp = self._serve_hit(prep, self.ticket.completion)
            else:
                tokenize_prepared(prep, st.engine.tokenizer, st.engine.max_model_len)
                resp = await self._serve_engine(prep)
            handed_off = isinstance(resp, StreamingResponse)
            return resp
        except APIError as exc:
            st.metrics.rejections.labels(exc.reason).inc()
            await self._finish_cache(None)
            st.count(ctx, exc.status)
            st.log_request(ctx, None)
            return exc.response(ctx.headers())
        except ClientGone:
            st.metrics.disconnects.inc()
            await self._finish_cache(None)
            st.count(ctx, 499)
            st.log_request(ctx, None)
            return Response(status_code=499)
        except Exception:
            # A bug: release a MISS ticket (single-flight followers wait on it), then let the app's
            # handler answer 500 and log the traceback.
            await self._finish_cache(None)
            st.count(ctx, 500)
            raise
        finally:
            if not handed_off:
                st.metrics.in_flight.dec()

    def _validate(self, obj: Any) -> CompletionRequest | ChatCompletionRequest:
        if not isinstance(obj, dict):
            raise bad_request("request body must be a JSON object", code="invalid_json")
        cls = ChatCompletionRequest if self.endpoint == "chat.completions" else CompletionRequest
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            raise from_validation_error(exc) from None

    async def _begin_cache(self, prep: Prepared) -> None:
        cache = self.st.cache
        if cache is None:
            return
        no_cache = self.ctx.no_cache or not prep.cacheable
        try:
            # An L1 hit or a bypass is decided without I/O: no task, no disconnect watcher.
            ticket = cache.begin_nowait(self.endpoint, prep.cache_body, self.ctx.tenant, no_cache=no_cache)
            if ticket is None:
                ticket = await until_disconnect(
                    self.request,
                    cache.begin(self.endpoint, prep.cache_body, self.ctx.tenant, no_cache=no_cache),
                )
            self.ticket = ticket
        except ClientGone:
            raise
        except HarnessError as exc:  # a body the cache cannot key: served uncached
            log.warning("response cache refused the request (%s); serving from the engine", exc)
            self.ticket = None
            return
        except Exception:
            # Fail open: a broken cache must never cost the request; the cache counts its own errors.
            log.exception("response cache begin() failed; serving from the engine")
            self.ticket = None
            return
        self.ctx.cache_status = self.ticket.status
        self.ctx.cache_key = self.ticket.key

    async def _finish_cache(self, completion: CachedCompletion | None) -> None:
        ticket, self.ticket = self.ticket, None  # exactly once
        if ticket is None or ticket.status != "MISS" or self.st.cache is None:
            return
        try:
            await self.st.cache.finish(ticket, completion)
        except Exception:
            log.exception("response cache finish() failed")

    # ---------------------------------------------------------------- cache hit

    def _serve_hit(self, prep: Prepared, hit: CachedCompletion) -> Response:
        st, ctx, fmt = self.st, self.ctx, self.fmt
        assert fmt is not None
        echo = prep.prompt_text if prep.echo else None
        n_prompt = self._hit_prompt_tokens(prep, hit)
        device = st.device
        m_ttft, m_e2e, m_prompt, m_output = st.hit_metrics(self.endpoint)

        def usage(ttft_ms: float, e2e_ms: float) -> dict[str, Any]:
            tpot = (e2e_ms - ttft_ms) / (hit.completion_tokens - 1) if hit.completion_tokens > 1 else 0.0
            return usage_dict(
                prompt_tokens=n_prompt,
                completion_tokens=hit.completion_tokens,
                cached_tokens=n_prompt,
                metrics=None,
                cache_status=ctx.cache_status,
                ttft_ms=ttft_ms,
                tpot_ms=tpot,
                e2e_ms=e2e_ms,
                device=device,
            )

        def account(ttft_s: float) -> None:
            e2e_s = time.perf_counter() - ctx.t0
            m_ttft.observe(ttft_s)
            m_e2e.observe(e2e_s)
            m_prompt.inc(n_prompt)
            m_output.inc(hit.completion_tokens)

        if not prep.stream:
            ttft = time.perf_counter() - ctx.t0
            text = (echo or "") + hit.text
            body = fmt.response(text, hit.finish_reason, None, usage(ttft * 1000, ttft * 1000))
            account(ttft)
            st.count(ctx, 200)
            st.log_request(
                ctx, Outcome(text=[hit.text], finish_reason=hit.finish_reason, tokens=hit.completion_tokens)
            )
            return Response(orjson.dumps(body), media_type="application/json", headers=ctx.headers())

        pieces = split_tokens(st.engine.tokenizer, hit.text)

        async def replay() -> AsyncIterator[bytes]:
            ttft: float | None = None
            try:
                for c in fmt.start_chunks(echo):
                    yield sse_event(c)
                for piece in pieces:
                    if ttft is None:
                        ttft = time.perf_counter() - ctx.t0
                    yield sse_event(fmt.delta(piece, None))
                yield sse_event(fmt.finish(hit.finish_reason))
                ttft = ttft if ttft is not None else time.perf_counter() - ctx.t0
                if prep.include_usage:
                    e2e = time.perf_counter() - ctx.t0
                    yield sse_event(fmt.usage_chunk(usage(ttft * 1000, e2e * 1000)))
                yield SSE_DONE
                account(ttft)
            finally:
                await close()

        async def close() -> None:
            if self._closed:
                return
            self._closed = True
            st.metrics.in_flight.dec()
            st.log_request(
                ctx, Outcome(text=pieces, finish_reason=hit.finish_reason, tokens=hit.completion_tokens)
            )

        st.count(ctx, 200)
        return GuardedStream(replay(), close, self._stream_headers())

    def _hit_prompt_tokens(self, prep: Prepared, hit: CachedCompletion) -> int:
        """The hit's ``prompt_tokens``: the entry's own count when it was made from this very prompt
        (same fingerprint), else this request's prompt tokenized now (an L3 or preloaded entry, or a
        prompt that differs from the cached one only in normalized whitespace)."""
        st = self.st
        if not prep.tokenized and hit.meta.get("prompt_fp") == prep.prompt_fp:
            param = "prompt" if prep.endpoint == "completions" else "messages"
            check_context(hit.prompt_tokens, prep.params.max_tokens, st.engine.max_model_len, param)
            return hit.prompt_tokens
        tokenize_prepared(prep, st.engine.tokenizer, st.engine.max_model_len)
        return len(prep.prompt_ids)

    def _stream_headers(self) -> dict[str, str]:
        return {**self.ctx.headers(), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

    # ---------------------------------------------------------------- engine

    async def _serve_engine(self, prep: Prepared) -> Response:
        st, ctx = self.st, self.ctx
        params = prep.params
        caching = self.ticket is not None and self.ticket.status == "MISS"
        if caching and not params.logprobs:
            # The cache's value policy reads mean entropy; it costs one log-softmax per step.
            params = dataclasses.replace(params, logprobs=True)
        gen: AsyncIterator[TokenEvent] | None = None
        try:
            # The engine refuses (EngineFull, PromptTooLong) either here or at the first event.
            gen = st.engine.generate(ctx.engine_id, prep.prompt_ids, params)
            first = await until_disconnect(self.request, gen.__anext__())
        except EngineFull as exc:
            await _close(gen)
            raise APIError(
                429,
                f"the server is busy (waiting queue full): {exc}",
                type="rate_limit_error",
                code="queue_full",
                reason="queue_full",
                headers=retry_after_header(exc.retry_after_s),
            ) from None
        except PromptTooLong as exc:
            await _close(gen)
            raise APIError(
                400,
                str(exc),
                param="max_tokens",
                code="context_length_exceeded",
                reason="too_long",
            ) from None
        except InvalidPrompt as exc:
            await _close(gen)
            raise bad_request(str(exc), param="prompt") from None
        except EngineError as exc:
            await _close(gen)
            raise APIError(
                503, f"the engine refused the request: {exc}", type="server_error", reason="engine_error"
            ) from None
        except StopAsyncIteration:
            raise APIError(
                500, "the engine ended the request without output", type="server_error", reason="engine_error"
            ) from None
        except ClientGone:
            if gen is not None:
                await self._abort(gen)
            raise
        out = Outcome(log=TokenLog() if prep.want_logprobs else None)
        if prep.stream:
            st.count(ctx, 200)
            state = _StreamState(gen, out)
            return GuardedStream(
                self._stream(prep, state, first),
                lambda: self._stream_closed(prep, state),
                self._stream_headers(),
            )
        try:
            await until_disconnect(self.request, self._collect(gen, first, out))
        except ClientGone:
            await self._abort(gen)
            raise
        if out.finish_reason not in COMPLETED_FINISH_REASONS:  # ``run`` settles the cache ticket
            raise APIError(
                500,
                f"generation ended with '{out.finish_reason}'",
                type="server_error",
                reason="engine_error",
            )
        await self._finish_cache(_cached_completion(st, prep, out))
        self._account(out)
        text = "".join(out.text)
        if prep.echo:
            text = prep.prompt_text + text
        assert self.fmt is not None
        body = self.fmt.response(text, out.finish_reason or "stop", out.log, self._usage(prep, out))
        st.count(ctx, 200)
        st.log_request(ctx, out)
        return Response(orjson.dumps(body), media_type="application/json", headers=ctx.headers())

    async def _collect(self, gen: AsyncIterator[TokenEvent], first: TokenEvent, out: Outcome) -> None:
        async for ev in _chain([first], gen):
            out.add(ev)
            if ev.text and self.ctx.first_text_at is None:
                self.ctx.first_text_at = time.perf_counter()

    async def _abort(self, gen: AsyncIterator[TokenEvent]) -> None:
        with anyio.CancelScope(shield=True):
            await _close(gen)
            with contextlib.suppress(Exception):
                await self.st.engine.abort(self.ctx.engine_id)

    def _usage(self, prep: Prepared, out: Outcome) -> dict[str, Any]:
        m = out.metrics
        now = time.perf_counter()
        first = self.ctx.first_text_at or now
        return usage_dict(
            prompt_tokens=m.prompt_tokens if m and m.prompt_tokens else len(prep.prompt_ids),
            completion_tokens=m.output_tokens if m else out.tokens,
            cached_tokens=m.cached_prompt_tokens if m else 0,
            metrics=m,
            cache_status=self.ctx.cache_status,
            ttft_ms=(first - self.ctx.t0) * 1000,
            tpot_ms=0.0,
            e2e_ms=(now - self.ctx.t0) * 1000,
            device=self.st.device if m is None else m.device,
        )

    def _account(self, out: Outcome) -> None:
        mt = self.st.metrics
        now = time.perf_counter()
        ttft = (self.ctx.first_text_at or now) - self.ctx.t0
        mt.ttft.labels(self.endpoint, "engine").observe(ttft)
        mt.e2e.labels(self.endpoint, "engine").observe(now - self.ctx.t0)
        m = out.metrics
        if m is not None:
            if m.output_tokens > 1:
                mt.tpot.labels(self.endpoint).observe(m.tpot_ms / 1000)
            mt.prefill.observe(m.prefill_ms / 1000)
            mt.queued.observe(m.queued_ms / 1000)
            mt.prefill_kv_bytes.observe(m.prefill_kv_bytes)
            mt.prompt_tokens.labels("engine").inc(m.prompt_tokens)
            mt.output_tokens.labels("engine").inc(m.output_tokens)

    async def _stream(self, prep: Prepared, state: _StreamState, first: TokenEvent) -> AsyncIterator[bytes]:
        ctx, fmt, out = self.ctx, self.fmt, state.out
        assert fmt is not None
        try:
            for c in fmt.start_chunks(prep.prompt_text if prep.echo else None):
                yield sse_event(c)
            async for ev in _chain([first], state.gen):
                step = out.add(ev)
                if ev.text or step is not None:
                    if ev.text and ctx.first_text_at is None:
                        ctx.first_text_at = time.perf_counter()
                    yield sse_event(fmt.delta(ev.text, step))
                if ev.finished:
                    state.finished = True
            if out.finish_reason in COMPLETED_FINISH_REASONS:
                yield sse_event(fmt.finish(out.finish_reason or "stop"))
                if prep.include_usage:
                    yield sse_event(fmt.usage_chunk(self._usage(prep, out)))
            else:
                err = APIError(500, f"generation ended with '{out.finish_reason}'", type="server_error")
                yield sse_event(err.body())
            yield SSE_DONE
            self._account(out)
        finally:
            # Completion or cancellation (client gone) mid-stream; shielded so the awaits complete.
            with anyio.CancelScope(shield=True):
                await self._stream_closed(prep, state)

    async def _stream_closed(self, prep: Prepared, state: _StreamState) -> None:
        """Abort an unfinished engine request, settle the cache ticket, account; once."""
        if self._closed:
            return
        self._closed = True
        st = self.st
        if not state.finished:
            st.metrics.disconnects.inc()
            await self._abort(state.gen)
        done = state.finished and state.out.finish_reason in COMPLETED_FINISH_REASONS
        await self._finish_cache(_cached_completion(st, prep, state.out) if done else None)
        st.metrics.in_flight.dec()
        st.log_request(self.ctx, state.out)


# --------------------------------------------------------------------------------------------------
# the app


def create_app(
    engine: AsyncEngine,
    *,
    settings: ServerSettings | None = None,
    cache: ResponseCache | None = None,
    registry: CollectorRegistry | None = None,
    manage_lifecycle: bool = True,
) -> FastAPI:
    """The ASGI app. With ``manage_lifecycle`` the app starts the engine on startup and shuts the
    engine down and closes the cache on shutdown."""
    settings = settings or ServerSettings()
    registry = registry if registry is not None else CollectorRegistry()
    st = ServerState(engine, settings, cache, registry)

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

    async def completions(request: Request) -> Response:
        return await Handler(st, request, "completions").run()

    async def chat_completions(request: Request) -> Response:
        return await Handler(st, request, "chat.completions").run()

    # Plain Starlette routes: the handlers take the raw Request, so FastAPI's dependency solving
    # (tens of µs per request) would buy nothing on the hottest path. Exception handlers still apply.
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])

    @app.get("/v1/models")
    async def models() -> Response:
        card = {
            "id": st.model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "harness",
            "max_model_len": engine.max_model_len,
        }
        return Response(orjson.dumps({"object": "list", "data": [card]}), media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        s = engine.stats()
        body = {
            "status": "ok" if st.ready else "starting",
            "model": st.model_name,
            "device": s.device,
            "running": s.running,
            "waiting": s.waiting,
            "kv_blocks_used": s.kv_blocks_used,
            "kv_blocks_total": s.kv_blocks_total,
            "cache": cache is not None,
        }
        return Response(
            orjson.dumps(body), status_code=200 if st.ready else 503, media_type="application/json"
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # ---------------------------------------------------------------- cache admin

    def need_cache() -> ResponseCache:
        if cache is None:
            raise APIError(
                404, "the response cache is not enabled (start with --cache)", code="cache_disabled"
            )
        return cache

    @app.get("/cache/stats")
    async def cache_stats() -> Response:
        try:
            return Response(orjson.dumps(need_cache().stats()), media_type="application/json")
        except APIError as exc:
            return exc.response()

    @app.post("/cache/flush")
    async def cache_flush(request: Request) -> Response:
        try:
            c = need_cache()
            tier = request.query_params.get("tier", "all").lower()
            if tier not in _FLUSH_CHOICES:
                raise bad_request(
                    f"unknown tier '{tier}'; expected one of {', '.join(_FLUSH_CHOICES)}", param="tier"
                )
            dropped = await c.flush(None if tier == "all" else tier)
            return Response(orjson.dumps({"tier": tier, "dropped": dropped}), media_type="application/json")
        except APIError as exc:
            return exc.response()
        except HarnessError as exc:  # Redis (L2) is down: a 503 the CLI reports, not a 500 traceback
            return APIError(503, str(exc), type="server_error", code="cache_unavailable").response()

    @app.post("/cache/drain")
    async def cache_drain(request: Request) -> Response:
        try:
            c = need_cache()
            raw = request.query_params.get("timeout_s", "60")
            try:
                timeout_s = float(raw)
            except ValueError:
                timeout_s = -1.0
            if not 0 <= timeout_s <= 3600:
                raise bad_request(f"timeout_s must be 0–3600 seconds, got '{raw}'", param="timeout_s")
            pending = await c.drain(timeout_s)
            return Response(orjson.dumps({"pending": pending}), media_type="application/json")
        except APIError as exc:
            return exc.response()

    @app.post("/cache/preload")
    async def cache_preload(request: Request) -> Response:
        from harness.server.preload import preload

        try:
            c = need_cache()
            raw = await read_body(request, settings.max_preload_bytes)
            tenant = request.headers.get(H.TENANT) or H.DEFAULT_TENANT
            result = await preload(st, c, raw, tenant)
            return Response(orjson.dumps(result), media_type="application/json")
        except APIError as exc:
            return exc.response()
        except ClientGone:  # left mid-upload: nothing to answer, and not a server error
            return Response(status_code=499)

    return app
