"""The OpenAI routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``.

A request goes through:

0. the credentials (401 / 403 before the body is read, see :mod:`harness.target.server.auth`);
1. body read with a size cap (413), JSON parse and strict validation (400 naming the field);
   on a server with a per-request fault injection (:mod:`harness.target.server.faults`), the request's
   draw: an injected error answers 500 here, an injected miss is carried to steps 3 and 4;
2. :func:`~harness.target.server.prepare.prepare`: tokenize, check the context length (400), build
   :class:`SamplingParams` and the cache body;
3. the cache's ``begin_nowait`` / ``begin`` (tenant from the API key, or from ``X-Tenant-ID`` on a
   server without keys: :meth:`~harness.target.server.auth.AuthPolicy.tenant`; ``Cache-Control: no-cache``
   bypasses); a hit is replayed, split into the engine's tokens so streaming clients see
   the same chunk cadence;
4. on a miss the engine's first event is awaited *before* the response starts, so a full queue is a
   real 429 (with ``Retry-After``) and not a broken 200 stream;
5. tokens are streamed as SSE or collected into one JSON response; a completed miss is handed to
   ``finish(ticket, completion)``, anything else to ``finish(ticket, None)``.

A client that goes away aborts its engine request (its KV blocks go back to the pool): while the
response has not started a watcher on the ASGI receive channel notices the disconnect; once streaming,
Starlette cancels the body iterator and its ``finally`` aborts the engine request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from harness import __version__
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
from harness.target.cache.api import CachedCompletion, CacheTicket
from harness.target.engine.api import (
    EngineError,
    EngineFull,
    InvalidPrompt,
    PromptTooLong,
    TokenEvent,
)
from harness.target.server.asgi import ClientGone, GuardedStream, parse_json, read_body, until_disconnect
from harness.target.server.chat_output import ChatOutput, OutputDelta
from harness.target.server.errors import APIError, bad_request, from_validation_error, retry_after_header
from harness.target.server.formats import (
    ChatFormat,
    CompletionsFormat,
    TokenLog,
    formatter,
    replay_pieces,
    replay_progress,
    usage_dict,
)
from harness.target.server.prepare import Prepared, check_context, tokenize_prepared
from harness.target.server.state import Outcome, ServerState, cached_completion, log, new_id


def add_openai_routes(app: FastAPI, st: ServerState) -> None:
    """Register the OpenAI endpoints on ``app``."""

    async def completions(request: Request) -> Response:
        return await Handler(st, request, "completions").run()

    async def chat_completions(request: Request) -> Response:
        return await Handler(st, request, "chat.completions").run()

    # Plain Starlette routes: the handlers take the raw Request, so FastAPI's dependency solving
    # (tens of µs per request) would buy nothing on the hottest path. Exception handlers still apply.
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            st.auth.tenant(request.headers)
        except APIError as exc:
            st.metrics.rejections.labels(exc.reason).inc()
            return exc.response()
        card = {
            "id": st.model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "harness",
            "max_model_len": st.engine.max_model_len,
            # What a baseline compares to know it measures the same target (docs/gates.md).
            "harness": {
                **st.identity,
                "device": st.device,
                "response_cache": st.cache is not None,
                "version": __version__,
                # Whether the model can call tools and think (a request with tools is served either way).
                "chat": st.chat_syntax.describe(),
            },
        }
        return Response(orjson.dumps({"object": "list", "data": [card]}), media_type="application/json")


@dataclass(slots=True)
class _StreamState:
    """An engine stream being sent to a client."""

    gen: AsyncIterator[TokenEvent]
    out: Outcome
    finished: bool = False


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


class Handler:
    """Serves one OpenAI request; split into steps so each failure maps to one status."""

    def __init__(self, st: ServerState, request: Request, endpoint: Endpoint) -> None:
        self.st = st
        self.request = request
        self.endpoint = endpoint
        self.ctx = st.context(request, endpoint)
        self.ticket: CacheTicket | None = None
        self.fmt: CompletionsFormat | None = None
        self.output: ChatOutput | None = None
        """The chat answer's parser (thinking, tool calls); ``None``: every token is content."""
        self._closed = False
        """Set by the (idempotent) cleanup of a streaming response."""

    async def run(self) -> Response:
        st, ctx = self.st, self.ctx
        st.metrics.in_flight.inc()
        handed_off = False  # a streaming body takes over the cleanup
        try:
            # First: nothing (body, cache, engine) is touched for a caller who is refused.
            ctx.tenant = st.auth.tenant(self.request.headers)
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
            miss = False  # an injected cache miss: neither the response nor the prefix cache is used
            if st.faults is not None:  # a server without injection pays this one check
                fault = st.faults.draw()
                if fault is not None:
                    ctx.fault = fault
                    if fault == "error":
                        raise st.faults.error()
                    miss = True
            # With a cache, tokenize only when needed: a hit on the same prompt does not need it.
            prep = st.prepare(req, tokenize=st.cache is None or ctx.no_cache or miss)
            self.fmt = formatter(
                self.endpoint,
                new_id(),
                int(time.time()),
                st.model_name,
                prep.include_usage,
                continuous_usage=prep.continuous_usage,
            )
            if self.endpoint == "chat.completions":
                self.output = st.chat_output(prep)
            await self._begin_cache(prep, force_miss=miss)
            if self.ticket is not None and self.ticket.completion is not None:
                resp = self._serve_hit(prep, self.ticket.completion)
            else:
                tokenize_prepared(prep, st.engine.tokenizer, st.engine.max_model_len)
                resp = await self._serve_engine(prep, use_prefix_cache=not miss)
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

    async def _begin_cache(self, prep: Prepared, *, force_miss: bool = False) -> None:
        """Ask the cache; ``force_miss`` (an injected miss) makes it answer ``MISS`` without looking
        and store nothing when the ticket is finished (a bypass still wins: it never looks either)."""
        cache = self.st.cache
        if cache is None:
            return
        no_cache = self.ctx.no_cache or not prep.cacheable
        body, tenant = prep.cache_body, self.ctx.tenant
        try:
            # An L1 hit, a bypass or a forced miss is decided without I/O: no task, no disconnect watcher.
            ticket = cache.begin_nowait(self.endpoint, body, tenant, no_cache=no_cache, force_miss=force_miss)
            if ticket is None:
                ticket = await until_disconnect(
                    self.request,
                    cache.begin(self.endpoint, body, tenant, no_cache=no_cache, force_miss=force_miss),
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
                reasoning_tokens=self._hit_reasoning(hit, len(pieces)),
                prompt_tokens=n_prompt,
                completion_tokens=hit.completion_tokens,
                cached_tokens=n_prompt,
                metrics=None,
                cache_status=ctx.cache_status,
                ttft_ms=ttft_ms,
                tpot_ms=tpot,
                e2e_ms=e2e_ms,
                device=device,
                mean_entropy=hit.mean_entropy,
            )

        def account(ttft_s: float) -> None:
            e2e_s = time.perf_counter() - ctx.t0
            m_ttft.observe(ttft_s)
            m_e2e.observe(e2e_s)
            m_prompt.inc(n_prompt)
            m_output.inc(hit.completion_tokens)

        # The cached text in the pieces the engine streamed it in; the chat parser reads the pieces as
        # it would the tokens (a hit answers with the same thinking and tool calls). A whole answer
        # without a parser needs no pieces: that hit never touches the tokenizer.
        output = self.output
        pieces = (
            replay_pieces(st.engine.tokenizer, hit.text, hit.completion_tokens, hit.meta)
            if prep.stream or output is not None
            else [hit.text]
        )
        if not prep.stream:
            ttft = time.perf_counter() - ctx.t0
            text = (echo or "") + hit.text
            parsed = self._parse_all(pieces)
            reason = self._finish_reason(hit.finish_reason)
            u = usage(ttft * 1000, ttft * 1000)
            body = (
                fmt.response(text, reason, None, u)
                if output is None
                else self._chat_fmt().response(text, reason, None, u, parsed=parsed, calls=output.calls)
            )
            account(ttft)
            st.count(ctx, 200)
            st.log_request(
                ctx, Outcome(text=[hit.text], finish_reason=hit.finish_reason, tokens=hit.completion_tokens)
            )
            return Response(orjson.dumps(body), media_type="application/json", headers=ctx.headers())

        progress = replay_progress(len(pieces), hit.completion_tokens)

        async def replay() -> AsyncIterator[bytes]:
            ttft: float | None = None
            try:
                for c in fmt.start_chunks(echo, (n_prompt, 0)):
                    yield sse_event(c)
                for piece, done in zip(pieces, progress, strict=True):
                    if ttft is None:
                        ttft = time.perf_counter() - ctx.t0
                    if output is None:
                        yield sse_event(fmt.delta(piece, None, (n_prompt, done)))
                    elif d := output.feed(piece):
                        yield sse_event(self._chat_fmt().parts(d, None, (n_prompt, done)))
                if output is not None and (tail := output.finish()):
                    yield sse_event(self._chat_fmt().parts(tail, None, (n_prompt, hit.completion_tokens)))
                reason = self._finish_reason(hit.finish_reason)
                yield sse_event(fmt.finish(reason, (n_prompt, hit.completion_tokens)))
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

    def _chat_fmt(self) -> ChatFormat:
        assert isinstance(self.fmt, ChatFormat)
        return self.fmt

    def _finish_reason(self, reason: str) -> str:
        """``tool_calls`` for a generation that stopped after calling tools (OpenAI's finish reason);
        the engine's (and the cache's) reason otherwise."""
        return "tool_calls" if reason == "stop" and self.output is not None and self.output.calls else reason

    def _parse_all(self, pieces: list[str]) -> OutputDelta | None:
        """A whole answer through the chat parser, piece by piece (a token's text each: the parser
        counts thinking tokens as it goes); ``None`` without one."""
        output = self.output
        if output is None:
            return None
        parsed = OutputDelta()
        for piece in pieces:
            parsed.add(output.feed(piece))
        parsed.add(output.finish())
        return parsed

    def _reasoning_tokens(self) -> int | None:
        """Thinking tokens of this answer, for a model whose template marks thinking (else ``None``:
        not reported, as vLLM reports none without a reasoning parser)."""
        out = self.output
        return out.reasoning_tokens if out is not None and self.st.chat_syntax.thinking else None

    def _hit_reasoning(self, hit: CachedCompletion, pieces: int) -> int | None:
        """A hit's thinking tokens: the entry's own count (stored when it was generated), else the
        share of the replayed pieces that were thinking, of its completion tokens."""
        n = self._reasoning_tokens()
        if n is None:
            return None
        stored = hit.meta.get("reasoning_tokens")
        if isinstance(stored, int):
            return stored
        return round(hit.completion_tokens * n / pieces) if pieces else 0

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

    async def _serve_engine(self, prep: Prepared, *, use_prefix_cache: bool = True) -> Response:
        st, ctx = self.st, self.ctx
        params = prep.params
        caching = self.ticket is not None and self.ticket.status == "MISS"
        if caching and not params.logprobs:
            # The cache's value policy reads mean entropy; it costs one log-softmax per step (an
            # injected miss pays it too, although nothing is stored: it costs what a real miss costs).
            params = dataclasses.replace(params, logprobs=True)
        gen: AsyncIterator[TokenEvent] | None = None
        try:
            # The engine refuses (EngineFull, PromptTooLong) either here or at the first event.
            gen = st.engine.generate(
                ctx.engine_id, prep.prompt_ids, params, use_prefix_cache=use_prefix_cache,
                priority=ctx.priority,
            )  # fmt: skip
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
        except EngineError as exc:  # the engine process died while generating: say so, by name
            raise APIError(
                503, f"the engine failed: {exc}", type="server_error", reason="engine_error"
            ) from None
        if out.finish_reason not in COMPLETED_FINISH_REASONS:  # ``run`` settles the cache ticket
            raise APIError(
                500,
                f"generation ended with '{out.finish_reason}'",
                type="server_error",
                reason="engine_error",
            )
        parsed = self._parse_all(out.text)
        out.reasoning_tokens = self._reasoning_tokens()
        await self._finish_cache(cached_completion(st, prep, out))
        self._account(out)
        text = "".join(out.text)
        if prep.echo:
            text = prep.prompt_text + text
        assert self.fmt is not None
        reason = self._finish_reason(out.finish_reason or "stop")
        usage = self._usage(prep, out)
        body = (
            self.fmt.response(text, reason, out.log, usage)
            if self.output is None
            else self._chat_fmt().response(
                text, reason, out.log, usage, parsed=parsed, calls=self.output.calls
            )
        )
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
            reasoning_tokens=self._reasoning_tokens(),
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
        n_prompt = len(prep.prompt_ids)
        output = self.output
        try:
            for c in fmt.start_chunks(prep.prompt_text if prep.echo else None, (n_prompt, 0)):
                yield sse_event(c)
            try:
                async for ev in _chain([first], state.gen):
                    step = out.add(ev)
                    if ev.text and ctx.first_text_at is None:
                        ctx.first_text_at = time.perf_counter()
                    if output is None:
                        if ev.text or step is not None:
                            yield sse_event(fmt.delta(ev.text, step, (n_prompt, out.tokens)))
                    else:
                        # A token whose text the parser holds back (a marker's first characters) is
                        # counted by the next chunk's usage: a chunk may carry several tokens.
                        d = output.feed(ev.text) if ev.text or ev.token_id is not None else OutputDelta()
                        if d or step is not None:
                            yield sse_event(self._chat_fmt().parts(d, step, (n_prompt, out.tokens)))
                    if ev.finished:
                        state.finished = True
            except EngineError as exc:  # the engine process died mid-stream: say so, by name
                state.finished = True  # nothing to abort, and not a client that left
                yield sse_event(APIError(503, f"the engine failed: {exc}", type="server_error").body())
                yield SSE_DONE
                return
            if out.finish_reason in COMPLETED_FINISH_REASONS:
                if output is not None and (tail := output.finish()):
                    yield sse_event(self._chat_fmt().parts(tail, None, (n_prompt, out.tokens)))
                out.reasoning_tokens = self._reasoning_tokens()
                reason = self._finish_reason(out.finish_reason or "stop")
                yield sse_event(fmt.finish(reason, (n_prompt, out.tokens)))
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
        await self._finish_cache(cached_completion(st, prep, state.out) if done else None)
        st.metrics.in_flight.dec()
        st.log_request(self.ctx, state.out)
