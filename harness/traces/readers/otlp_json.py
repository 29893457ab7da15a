"""OTLP/JSON traces: ``{"resourceSpans": [...]}`` documents, their JSON Lines form (one
ExportTraceServiceRequest per line) and Jaeger api_v3 responses ``{"result": {"resourceSpans": ...}}``.

Handles nanosecond times as strings or numbers, attribute value unions (arrays and kvlists are kept
as JSON text), integer or named span kinds, upper-case hex IDs and base64 IDs as protobuf JSON
mapping emits them, and the old ``instrumentationLibrarySpans`` name. Spans are grouped into traces
across resource/scope blocks and lines by :class:`~harness.traces.tree.SpanAssembler`. Links become
FOLLOWS_FROM references; they never make a parent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from harness.common.errors import InputError
from harness.common.formats import Reader
from harness.traces._base import (
    TRACE_READERS,
    OnSkip,
    error_from_tags,
    normalize_otlp_id,
    reject,
    span_error,
)
from harness.traces.model import RefType, Span, SpanKind, SpanRef, TagValue, Trace
from harness.traces.readers._json import is_json_lines, iter_items, iter_json_lines, to_int, top_level_keys
from harness.traces.tree import SpanAssembler

EXPECTED = "OTLP/JSON {resourceSpans: [...]} or a Jaeger api_v3 {result: {resourceSpans: [...]}}"
KIND_BY_NUMBER = {
    0: SpanKind.UNSPECIFIED,
    1: SpanKind.INTERNAL,
    2: SpanKind.SERVER,
    3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER,
    5: SpanKind.CONSUMER,
}


def sniff(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    return text.startswith((b"{", b"[")) and (b'"resourceSpans"' in head or b'"resource_spans"' in head)


def any_value(value: object) -> TagValue:
    """The Python value of an OTLP ``AnyValue`` union."""
    if not isinstance(value, dict) or not value:
        return "" if value is None else value if isinstance(value, str | int | float | bool) else str(value)
    key, inner = next(iter(value.items()))
    if key == "stringValue":
        return str(inner)
    if key == "boolValue":
        return inner if isinstance(inner, bool) else str(inner).lower() == "true"
    if key == "intValue":
        try:
            return int(inner)
        except (TypeError, ValueError):
            return str(inner)
    if key == "doubleValue":
        try:
            return float(inner)
        except (TypeError, ValueError):
            return str(inner)
    if key == "arrayValue":
        items = inner.get("values", []) if isinstance(inner, dict) else []
        return orjson.dumps([any_value(v) for v in items]).decode()
    if key == "kvlistValue":
        items = inner.get("values", []) if isinstance(inner, dict) else []
        return orjson.dumps({str(kv.get("key")): any_value(kv.get("value")) for kv in items}).decode()
    return str(inner)


def attrs(raw: object) -> dict[str, TagValue]:
    out: dict[str, TagValue] = {}
    if isinstance(raw, list):
        for kv in raw:
            if isinstance(kv, dict) and "key" in kv:
                out[str(kv["key"])] = any_value(kv.get("value"))
    return out


def kind_of(raw: object) -> SpanKind:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return KIND_BY_NUMBER.get(raw, SpanKind.UNSPECIFIED)
    text = str(raw or "").upper().removeprefix("SPAN_KIND_").lower()
    try:
        return SpanKind(text)
    except ValueError:
        return SpanKind.UNSPECIFIED


def _status_error(status: object) -> bool:
    if not isinstance(status, dict):
        return False
    code = status.get("code")
    return code == 2 or str(code).upper() in ("STATUS_CODE_ERROR", "ERROR", "2")


def convert_span(obj: Any, resource: dict[str, TagValue], scope: str | None, warns: list[str]) -> Span:
    if not isinstance(obj, dict):
        raise ValueError("expected a span object")
    for key in ("traceId", "spanId"):
        if obj.get(key) in (None, ""):
            raise ValueError(f"{key}: missing")
    tid = normalize_otlp_id(obj["traceId"], 32)
    sid = normalize_otlp_id(obj["spanId"], 16)
    raw_parent = obj.get("parentSpanId")
    parent = normalize_otlp_id(raw_parent, 16) if raw_parent not in (None, "") else None
    start_ns = to_int(obj.get("startTimeUnixNano", 0), "startTimeUnixNano")
    end_ns = to_int(obj.get("endTimeUnixNano", start_ns), "endTimeUnixNano")
    duration = (end_ns - start_ns) // 1000
    if duration < 0:
        warns.append(f"span {sid}: ends before it starts; duration set to 0")
        duration = 0
    tags = attrs(obj.get("attributes"))
    if scope:
        tags.setdefault("otel.scope.name", scope)
    refs: list[SpanRef] = []
    if parent is not None:
        refs.append(SpanRef(RefType.CHILD_OF, tid, parent))
    for link in obj.get("links") or []:
        if isinstance(link, dict) and link.get("spanId"):
            ltid = normalize_otlp_id(link.get("traceId") or tid, 32)
            refs.append(SpanRef(RefType.FOLLOWS_FROM, ltid, normalize_otlp_id(link["spanId"], 16)))
    return Span(
        trace_id=tid,
        span_id=sid,
        parent_span_id=parent,
        service=str(resource.get("service.name") or "unknown_service"),
        operation=str(obj.get("name") or ""),
        start_us=start_ns // 1000,
        duration_us=duration,
        kind=kind_of(obj.get("kind")),
        references=tuple(refs),
        tags=tags,
        resource=resource,
        error=_status_error(obj.get("status")) or error_from_tags(tags),
    )


def _raw_spans(rs: dict[str, Any]) -> Iterator[tuple[str, Any, dict[str, TagValue], str | None]]:
    """(JSON path below the resourceSpans entry, raw span, resource attributes, scope name) per span."""
    resource = attrs((rs.get("resource") or {}).get("attributes"))
    blocks = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or rs.get("scope_spans") or []
    for b, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        scope_obj = block.get("scope") or block.get("instrumentationLibrary") or {}
        scope = scope_obj.get("name") if isinstance(scope_obj, dict) else None
        for s, raw in enumerate(block.get("spans") or []):
            yield f"scopeSpans[{b}].spans[{s}]", raw, resource, scope


def _resource_spans_of(obj: Any) -> list[Any] | None:
    """The ``resourceSpans`` list of an OTLP document or api_v3 ``{result: …}`` response, else ``None``."""
    if isinstance(obj, dict) and isinstance(obj.get("result"), dict):
        obj = obj["result"]
    if not isinstance(obj, dict):
        return None
    blocks = obj.get("resourceSpans", obj.get("resource_spans"))
    return blocks if isinstance(blocks, list) else None


def document_spans(obj: Any) -> Iterator[tuple[Span, list[str]]]:
    """(span, its conversion warnings) for each span of one OTLP / api_v3 document already in memory
    (query responses); ``ValueError`` for a document or span of the wrong shape."""
    blocks = _resource_spans_of(obj)
    if blocks is None:
        raise ValueError("expected " + EXPECTED)
    for rs in blocks:
        if not isinstance(rs, dict):
            continue
        for _, raw, resource, scope in _raw_spans(rs):
            warns: list[str] = []
            span = convert_span(raw, resource, scope, warns)
            yield span, warns


def read(path: Path, skip: bool, on_skip: OnSkip, max_buffered_spans: int | None = None) -> Iterator[Trace]:
    assembler = SpanAssembler(str(path), max_buffered_spans)

    def fail(msg: str, line: int | None, where: str) -> None:
        reject(span_error(msg, path, line, where, "an OTLP span"), skip, on_skip)

    def resource_spans(rs: Any, line: int | None, where: str) -> Iterator[Trace]:
        if not isinstance(rs, dict):
            fail("expected a resourceSpans object", line, where)
            return
        for at, raw, resource, scope in _raw_spans(rs):
            warns: list[str] = []
            try:
                span = convert_span(raw, resource, scope, warns)
            except ValueError as exc:
                fail(str(exc), line, f"{where}.{at}")
                continue
            yield from assembler.add(span, warns)

    def document(obj: Any, line: int | None) -> Iterator[Trace]:
        blocks = _resource_spans_of(obj)
        if blocks is None:
            err = InputError("JSON of the wrong shape, expected " + EXPECTED, file=path, line=line)
            reject(err, skip, on_skip)
            return
        for i, rs in enumerate(blocks):
            yield from resource_spans(rs, line, f"resourceSpans[{i}]")

    if is_json_lines(path):
        for n, obj in iter_json_lines(path, skip, on_skip, EXPECTED):
            yield from document(obj, n)
    else:
        shape, key = top_level_keys(path, {"resourceSpans", "resource_spans", "result"})
        if shape != "object" or key is None:
            raise InputError("JSON of the wrong shape, expected " + EXPECTED, file=path, line=1)
        prefix = "result.resourceSpans.item" if key == "result" else f"{key}.item"
        for i, rs in iter_items(path, prefix):
            yield from resource_spans(rs, None, f"resourceSpans[{i}]")
    yield from assembler.flush()


TRACE_READERS.register("otlp-json")(
    Reader(
        "otlp-json",
        "OTLP/JSON traces, their JSON Lines form, Jaeger api_v3 responses",
        sniff,
        read,
        30,
    )
)
