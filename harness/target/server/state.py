"""What every request handler of ``harness serve`` shares: the app's state, a request's context, the
outcome of one generation, and turning an outcome into a cache entry.

:class:`ServerState` is created once per app by :func:`harness.target.server.app.create_app` and
passed to the route modules (:mod:`~harness.target.server.openai_routes`,
:mod:`~harness.target.server.admin_routes`) and to :mod:`~harness.target.server.preload`, which
import this module and never the app: no module of the server imports the module that imports it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.requests import Request

from harness.common import headers as H
from harness.common.openai import ChatCompletionRequest, CompletionRequest
from harness.target.cache.api import CachedCompletion, ResponseCache
from harness.target.engine.api import AsyncEngine, RequestMetrics, TokenEvent
from harness.target.engine.kv_cache import FREQ_CAP
from harness.target.server.auth import AuthPolicy
from harness.target.server.chat_output import ChatOutput, ChatSyntax
from harness.target.server.faults import FAULT_KINDS, INJECTIONS, FaultInjector, FaultPlan
from harness.target.server.formats import PIECE_ENDS, TokenLog, piece_ends
from harness.target.server.metrics import EngineCollector, ServerMetrics
from harness.target.server.prepare import Prepared, prepare
from harness.target.server.settings import ServerSettings

log = logging.getLogger("harness.target.server")


_REQUEST_ID, _CACHE_CONTROL, _STAGE, _TRACE_ID, _WARMUP_ID, _WARMUP_PRIORITY = _CONTEXT_HEADERS = tuple(
    name.lower().encode("latin-1")
    for name in (H.REQUEST_ID, "cache-control", H.STAGE, H.TRACE_ID, H.WARMUP_ID, H.WARMUP_PRIORITY)
)
"""The headers a request's context reads, as ASGI spells them (lower-case bytes)."""


def _priority(value: str | None) -> int:
    """``X-Warmup-Priority`` as the engine takes it: an integer in ``0..FREQ_CAP``; a malformed or
    out-of-range value counts as none (a hint, never a reason to refuse a request)."""
    if value is None or not value.strip().isdigit():
        return 0
    n = int(value)
    return n if n <= FREQ_CAP else 0


def new_id() -> str:
    """32 random hex digits, like ``uuid4().hex`` without its ``os.urandom`` system call.

    Request, response and engine ids must be unique, not unpredictable.
    """
    return f"{random.getrandbits(128):032x}"


@dataclass(slots=True)
class RequestContext:
    """Per-request facts read from the headers, plus timing."""

    request_id: str
    engine_id: str
    stage: str | None
    trace_id: str | None
    warmup_id: str | None
    no_cache: bool
    t0: float
    endpoint: str
    priority: int = 0
    """``X-Warmup-Priority`` (0 to :data:`~harness.target.engine.kv_cache.FREQ_CAP`; anything else: 0): the
    prefix-cache priority the request asks for."""
    cache_status: str = "BYPASS"
    cache_key: str | None = None
    status: int = 200
    first_text_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    tenant: str = H.DEFAULT_TENANT
    """Set from the credentials by the handler (:meth:`AuthPolicy.tenant`), never read here from a
    header: a refusal must be answerable before anything trusts the caller."""
    fault: str | None = None
    """The fault an injection gave this request (:mod:`harness.target.server.faults`), else ``None``."""

    def headers(self) -> dict[str, str]:
        h = {H.REQUEST_ID: self.request_id, H.CACHE_STATUS: self.cache_status}
        if self.cache_key:
            h[H.CACHE_KEY] = self.cache_key
        if self.fault is not None:
            h[H.FAULT] = self.fault
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
    reasoning_tokens: int | None = None
    """Tokens generated while thinking, for a template that marks thinking (:mod:`.chat_output`)."""

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
            step = self.log.add(ev, self.offset)
        if ev.text:
            self.text.append(ev.text)
            self.offset += len(ev.text)
        if ev.finished:
            self.finish_reason = ev.finish_reason
            self.metrics = ev.metrics
        return step


class ServerState:
    """Everything the handlers share; one per app."""

    def __init__(
        self,
        engine: AsyncEngine,
        settings: ServerSettings,
        cache: ResponseCache | None,
        registry: CollectorRegistry,
        auth: AuthPolicy | None = None,
        *,
        fault_plan: FaultPlan | None = None,
    ) -> None:
        self.engine = engine
        self.auth = auth or AuthPolicy()
        """Who may call what; its :meth:`~AuthPolicy.tenant` is where every request's tenant comes from."""
        self.settings = settings
        self.cache = cache
        self.registry = registry
        self.metrics = ServerMetrics(registry, settings.max_stage_labels)
        registry.register(EngineCollector(engine.stats))
        self.fault_plan = fault_plan or FaultPlan.from_settings(settings)
        """The fault injections this server runs with (``/health``, the start-up warning)."""
        active = self.fault_plan.active
        for kind in INJECTIONS:
            self.metrics.fault_active.labels(kind).set(1 if kind in active else 0)
        for fault in FAULT_KINDS:
            self.metrics.injected_faults.labels(fault)  # shown as 0 from the first scrape
        self.faults = (
            FaultInjector(self.fault_plan, self.metrics.injected_faults)
            if self.fault_plan.per_request
            else None
        )
        """Draws each generation request's fault; ``None`` (one check per request) when none is on."""
        self.model_name = settings.served_model_name or engine.model_name
        self.created = int(time.time())
        self.ready = False
        self.cache_closed = False
        self.preload_sem = asyncio.Semaphore(settings.preload_concurrency)
        self._device: str | None = None
        tok = engine.tokenizer
        try:  # one rendered turn shows whether the generation prompt opens <think> itself
            sample = tok.apply_chat_template([{"role": "user", "content": "x"}])
        except Exception:  # a template that refuses it fails on real requests too, with their own error
            sample = ""
        self.chat_syntax = ChatSyntax.of(tok.chat_template, sample)
        """What the model's chat template says it writes besides answers (tool calls, thinking)."""
        self.identity: dict[str, Any] = {}
        """What ``GET /v1/models`` tells about the weights (preset, weights hash …; set by the app)."""
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

    def prepare(self, req: CompletionRequest | ChatCompletionRequest, *, tokenize: bool = True) -> Prepared:
        """:func:`~harness.target.server.prepare.prepare` with this server's tokenizer, model and limits."""
        return prepare(
            req,
            tokenizer=self.engine.tokenizer,
            model_name=self.model_name,
            max_model_len=self.engine.max_model_len,
            default_max_tokens=self.settings.default_max_tokens,
            tokenize=tokenize,
        )

    def chat_output(self, prep: Prepared) -> ChatOutput | None:
        """The parser of one chat answer (thinking, tool calls); ``None`` when there is nothing to
        parse (the model's template marks neither, or it marks only tool calls and none are offered)."""
        syn = self.chat_syntax
        if not syn.thinking and not (prep.parse_tools and syn.tools is not None):
            return None
        return ChatOutput(syn, parse_tools=prep.parse_tools)

    def context(self, request: Request, endpoint: str) -> RequestContext:
        t0 = time.perf_counter()
        # One pass over the raw ASGI headers (lower-case bytes), the first of each name kept as
        # Starlette's ``Headers.get`` would: a ``get`` per name scans the whole list each time.
        hdr: dict[bytes, str] = {}
        for name, value in request.scope["headers"]:
            if name in _CONTEXT_HEADERS and name not in hdr:
                hdr[name] = value.decode("latin-1")
        cache_control = hdr.get(_CACHE_CONTROL, "").lower()
        return RequestContext(
            request_id=hdr.get(_REQUEST_ID) or new_id(),
            engine_id=new_id(),
            stage=hdr.get(_STAGE),
            trace_id=hdr.get(_TRACE_ID),
            warmup_id=hdr.get(_WARMUP_ID),
            priority=_priority(hdr.get(_WARMUP_PRIORITY)),
            no_cache="no-cache" in cache_control or "no-store" in cache_control,
            t0=t0,
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


def cached_completion(st: ServerState, prep: Prepared, out: Outcome) -> CachedCompletion:
    """The cache entry for a completed generation (live request or preload).

    ``prompt_fp`` lets a later hit on the same prompt report ``prompt_tokens`` without tokenizing.
    """
    return CachedCompletion(
        text="".join(out.text),
        finish_reason=out.finish_reason or "stop",
        model=st.model_name,
        prompt_tokens=len(prep.prompt_ids),
        completion_tokens=out.metrics.output_tokens if out.metrics else out.tokens,
        created=int(time.time()),
        mean_logprob=out.logprob_sum / out.logprob_n if out.logprob_n else None,
        mean_entropy=out.entropy_sum / out.entropy_n if out.entropy_n else None,
        meta={
            "engine_model": st.engine.model_name,
            "prompt_fp": prep.prompt_fp,
            PIECE_ENDS: piece_ends(out.text),
            **({"reasoning_tokens": out.reasoning_tokens} if out.reasoning_tokens is not None else {}),
        },
    )
