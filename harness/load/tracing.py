"""Trace context on every request, and optionally one OpenTelemetry client span per request.

Every request carries W3C ``traceparent`` and Jaeger ``uber-trace-id`` headers, written by the
OpenTelemetry propagators (a composite of ``TraceContextTextMapPropagator`` and
``JaegerPropagator``), so a target instrumented with either joins its server spans to the request.
The client span is a new root per request; its link (and the ``harness.source_trace_id``
attribute) points at the production trace the request replays, which stays untouched. An agent
session's calls are children of one session span instead (one trace per session played), each
linked to the spans of the calls it waited for, with the ``gen_ai.*`` attributes of the live call.

Without ``--otlp-endpoint`` the span is a non-recording one (random ids, nothing exported: a few µs).
With it, spans go through the SDK's ``BatchSpanProcessor`` to an OTLP/HTTP exporter: ending a span
only appends it to a queue; serialization and the POST happen in the processor's worker (a greenlet
under Locust's monkey-patching) in batches of :data:`EXPORT_BATCH`, small enough that one export
does not hold the event loop for long. Import this module after Locust (gevent patches ``requests``
and ``urllib3``, which the exporter uses, only if they are imported after it).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.jaeger import JaegerPropagator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

EXPORT_BATCH = 64
TRACEPARENT = "traceparent"
UBER_TRACE_ID = "uber-trace-id"
SERVICE_NAME = "harness-load"

AttrValue = str | int | float | bool


def _source_link(trace_id: str | None) -> list[Link]:
    """A link to the source trace (hex id), when it is a valid 128-bit or 64-bit trace id."""
    if not trace_id:
        return []
    try:
        tid = int(trace_id, 16)
    except ValueError:
        return []
    if not 0 < tid < 1 << 128:
        return []
    # The schedule knows the source trace, not one of its spans: the link names the trace; its span
    # id is a fixed placeholder (a link needs one) and the attribute says what it means.
    ctx = SpanContext(trace_id=tid, span_id=1, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return [Link(ctx, {"harness.link": "source_trace"})]


class Tracing:
    """Header injection and (with an endpoint) span export for one load process."""

    def __init__(
        self, otlp_endpoint: str | None = None, *, resource: Mapping[str, AttrValue] | None = None
    ) -> None:
        self.propagator = CompositePropagator([TraceContextTextMapPropagator(), JaegerPropagator()])
        self.endpoint = otlp_endpoint
        self._provider: Any = None
        self._tracer: trace.Tracer | None = None
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            attrs: dict[str, AttrValue] = {"service.name": SERVICE_NAME, **(resource or {})}
            provider = TracerProvider(resource=Resource.create(attrs))
            provider.add_span_processor(
                BatchSpanProcessor(
                    OTLPSpanExporter(endpoint=otlp_endpoint, timeout=10),
                    max_export_batch_size=EXPORT_BATCH,
                    schedule_delay_millis=1000,
                )
            )
            self._provider = provider
            self._tracer = provider.get_tracer("harness.load")
        # Once now, nothing exported: the propagators' first call imports and builds what they need,
        # which would otherwise make the run's first request milliseconds late.
        warm = NonRecordingSpan(SpanContext(trace_id=1, span_id=1, is_remote=False))
        self.propagator.inject({}, context=trace.set_span_in_context(warm))

    @property
    def recording(self) -> bool:
        """Whether spans are exported (``--otlp-endpoint``); else only the trace context is sent."""
        return self._tracer is not None

    @staticmethod
    def inject_new_context(headers: dict[str, str]) -> None:
        """Write a new root context (random ids, sampled) as ``traceparent`` and ``uber-trace-id``:
        what :meth:`start` writes for a non-recording span, without building one (the propagators
        cost the replay user more than the rest of a request's headers; the equality is tested)."""
        trace_id = random.getrandbits(128) or 1
        span_id = random.getrandbits(64) or 1
        headers[TRACEPARENT] = f"00-{trace_id:032x}-{span_id:016x}-01"
        # Jaeger's format as its OpenTelemetry propagator writes it: no parent, flags sampled|debug.
        headers[UBER_TRACE_ID] = f"{trace_id:032x}:{span_id:016x}:0000000000000000:03"

    def start(
        self,
        name: str,
        headers: dict[str, str],
        *,
        attributes: Mapping[str, AttrValue],
        source_trace_id: str | None,
        start_ns: int,
        parent: trace.Span | None = None,
        after: Sequence[trace.Span] = (),
    ) -> trace.Span:
        """Begin the request's client span and write its context into ``headers``. ``parent``: the
        span it is a child of (an agent session's), else a new root; ``after``: the spans of the calls
        it waited for, linked (a call of a graph follows from them)."""
        span: trace.Span
        if self._tracer is not None:
            links = _source_link(source_trace_id) + [
                Link(s.get_span_context(), {"harness.link": "after"}) for s in after
            ]
            span = self._tracer.start_span(
                name,
                context=trace.set_span_in_context(parent) if parent is not None else None,
                kind=SpanKind.CLIENT,
                attributes=dict(attributes),
                links=links,
                start_time=start_ns,
            )
        else:
            span = self._unrecorded(parent)
        self.propagator.inject(headers, context=trace.set_span_in_context(span))
        return span

    def session(self, name: str, *, attributes: Mapping[str, AttrValue], start_ns: int) -> trace.Span:
        """The span of an agent session, parent of its calls' spans: one trace per session played,
        so the target's server spans of its calls join one trace too (exported with an endpoint)."""
        if self._tracer is None:
            return self._unrecorded(None)
        return self._tracer.start_span(
            name, context=None, kind=SpanKind.INTERNAL, attributes=dict(attributes), start_time=start_ns
        )

    @staticmethod
    def _unrecorded(parent: trace.Span | None) -> trace.Span:
        """A span that is only a context: the parent's trace (or a new one) and a new span id."""
        tid = parent.get_span_context().trace_id if parent is not None else random.getrandbits(128) or 1
        ctx = SpanContext(
            trace_id=tid,
            span_id=random.getrandbits(64) or 1,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        return NonRecordingSpan(ctx)

    @staticmethod
    def end(span: trace.Span, *, attributes: Mapping[str, AttrValue], error: str | None, end_ns: int) -> None:
        if not span.is_recording():
            return
        span.set_attributes(dict(attributes))
        if error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.end(end_time=end_ns)

    def shutdown(self) -> None:
        """Export what is queued and stop the exporter (end of the run)."""
        if self._provider is not None:
            self._provider.force_flush(10_000)
            self._provider.shutdown()
            self._provider = None
            self._tracer = None
