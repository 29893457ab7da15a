"""Client spans exported over OTLP/HTTP to a receiver on loopback; their context is what the target saw."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from tests.load.sse_server import Behaviour, SSEServer

pytestmark = pytest.mark.slow


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Receiver

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self.server.lock:
            for rs in req.resource_spans:
                res = {a.key: a.value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    self.server.spans.extend(ss.spans)
                    self.server.resources.append(res)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()


def attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value or v.int_value or v.double_value or v.bool_value
    return out


def test_each_request_becomes_a_client_span_linked_to_its_source_trace(tmp_path: Path, corpus: Path) -> None:
    receiver = _Receiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    try:
        with SSEServer(Behaviour(tokens=3)) as srv:
            spec = LoadSpec(host=srv.url, corpus=corpus, rate=10, duration=2, results_dir=tmp_path / "r",
                            start_delay=0.5, stage="warm", otlp_endpoint=endpoint)  # fmt: skip
            assert run_locust(spec, timeout_s=180) == 0
            served = srv.requests
    finally:
        receiver.shutdown()
        receiver.server_close()
    assert read_summary(tmp_path / "r").requests == 20
    spans = receiver.spans
    assert len(spans) == 20
    assert all(r["service.name"].string_value == "harness-load" for r in receiver.resources)
    by_trace = {s.trace_id.hex(): s for s in spans}
    for x in served:
        _, trace_id, span_id, _ = x.headers["traceparent"].split("-")
        span = by_trace[trace_id]  # the target saw the span's own context
        assert span.span_id.hex() == span_id
        assert span.kind == span.SPAN_KIND_CLIENT
        a = attrs(span)
        assert a["harness.stage"] == "warm" and a["harness.scenario"].startswith("s")
        assert a["http.response.status_code"] == 200 and a["url.path"] == "/v1/chat/completions"
        rid = int(x.body["messages"][0]["content"].split()[-1])
        assert [link.trace_id.hex() for link in span.links] == [f"{rid + 1:032x}"]  # the source trace
        assert span.end_time_unix_nano > span.start_time_unix_nano


def test_the_context_written_without_a_span_is_what_the_propagators_write() -> None:
    """The replay user's fast path (no --otlp-endpoint) writes the same headers the OpenTelemetry
    propagators write for a non-recording span with the same ids; and a target can parse them."""
    import random

    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from harness.load.tracing import Tracing

    tracing = Tracing()
    for seed in range(20):
        random.seed(seed)
        fast: dict[str, str] = {}
        Tracing.inject_new_context(fast)
        random.seed(seed)
        ctx = SpanContext(
            trace_id=random.getrandbits(128) or 1, span_id=random.getrandbits(64) or 1, is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )  # fmt: skip
        slow: dict[str, str] = {}
        tracing.propagator.inject(slow, context=trace.set_span_in_context(NonRecordingSpan(ctx)))
        assert fast == slow
        parsed = trace.get_current_span(TraceContextTextMapPropagator().extract(fast)).get_span_context()
        assert (parsed.trace_id, parsed.span_id, parsed.is_valid) == (ctx.trace_id, ctx.span_id, True)
