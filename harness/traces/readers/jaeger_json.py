"""Jaeger v1 JSON in the shapes users have.

* the query API / UI download envelope ``{"data": [trace, ...]}`` (streamed item by item),
* one trace object ``{"traceID", "spans", "processes"}``,
* an array of traces,
* JSON Lines of traces (or of envelopes),
* Elasticsearch / OpenSearch span documents with an embedded ``process`` (JSON Lines, an array, or
  a search response ``{"hits": {"hits": [{"_source": span}]}}``), grouped into traces by trace id.

Tolerated: IDs of any length and case (normalized), ``references`` missing / null / dangling /
several, duplicate span IDs, tag values that disagree with their declared type, ES tag maps with
``@`` for ``.``, start times that are not epochs (kept; the trace gets ``epoch_known=False``) and
nanosecond times (values above 1e17 are divided by 1000).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.common.errors import InputError
from harness.common.formats import Reader
from harness.traces._base import (
    TRACE_READERS,
    OnSkip,
    coerce_tag,
    error_from_tags,
    normalize_id,
    reject,
    span_error,
)
from harness.traces.model import RefType, Span, SpanKind, SpanRef, TagValue, Trace
from harness.traces.readers._json import is_json_lines, iter_items, iter_json_lines, to_int, top_level_keys
from harness.traces.tree import SpanAssembler, build_trace

EXPECTED = "a Jaeger trace {traceID, spans, processes}, a {data: [...]} envelope or a span document"
NS_THRESHOLD = 10**17
KINDS = {k.value: k for k in SpanKind}
ProcessCache = dict[str, tuple[str, dict[str, TagValue]]]


def sniff(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    if not text.startswith((b"{", b"[")):
        return False
    if b'"resourceSpans"' in head or b'"resource_spans"' in head:
        return False
    return b'"spanID"' in head or b'"traceID"' in head


def tags_of(raw: object) -> dict[str, TagValue]:
    out: dict[str, TagValue] = {}
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and "key" in item:
                out[str(item["key"])] = coerce_tag(item.get("value"), item.get("type"))
    elif isinstance(raw, dict):  # Elasticsearch "tag" maps, where "." may be stored as "@"
        for key, value in raw.items():
            out[str(key).replace("@", ".")] = coerce_tag(value, None)
    return out


def _time(value: object, what: str) -> int:
    n = to_int(value, what)
    return n // 1000 if n > NS_THRESHOLD else n


def convert_span(
    obj: dict[str, Any],
    processes: dict[str, Any],
    trace_id: str | None,
    warns: list[str],
    cache: ProcessCache | None = None,
) -> Span:
    """One Jaeger span dict → :class:`Span`; ``ValueError`` (with the field) when it cannot be."""
    if not isinstance(obj, dict):
        raise ValueError("expected a span object")
    if obj.get("spanID") in (None, ""):
        raise ValueError("spanID: missing")
    span_id = normalize_id(obj["spanID"], 16)
    raw_tid = obj.get("traceID", trace_id)
    if raw_tid in (None, ""):
        raise ValueError("traceID: missing")
    tid = normalize_id(raw_tid, 32)
    if "startTime" in obj:
        start = _time(obj["startTime"], "startTime")
    elif "startTimeMillis" in obj:
        start = to_int(obj["startTimeMillis"], "startTimeMillis") * 1000
    else:
        raise ValueError("startTime: missing")
    duration = _time(obj.get("duration", 0), "duration")
    if duration < 0:
        warns.append(f"span {span_id}: negative duration {duration} set to 0")
        duration = 0

    refs: list[SpanRef] = []
    for ref in obj.get("references") or []:
        if not isinstance(ref, dict) or ref.get("spanID") in (None, ""):
            warns.append(f"span {span_id}: malformed reference ignored")
            continue
        kind = str(ref.get("refType", "CHILD_OF")).upper()
        rtype = RefType.FOLLOWS_FROM if kind == "FOLLOWS_FROM" else RefType.CHILD_OF
        rtid = normalize_id(ref.get("traceID") or tid, 32)
        refs.append(SpanRef(rtype, rtid, normalize_id(ref["spanID"], 16)))
    legacy_parent = obj.get("parentSpanID")
    if not refs and legacy_parent not in (None, "", 0, "0", "0000000000000000"):
        refs.append(SpanRef(RefType.CHILD_OF, tid, normalize_id(legacy_parent, 16)))
    # The parent is a CHILD_OF reference within this trace; a reference into another trace is kept
    # in ``references`` but does not make a parent here.
    same = [r for r in refs if r.trace_id == tid]
    child_of = [r for r in same if r.ref_type is RefType.CHILD_OF]
    parent = child_of[0].span_id if child_of else (same[0].span_id if same else None)
    if len(child_of) > 1:
        warns.append(f"span {span_id}: {len(child_of)} CHILD_OF references; the first is the parent")

    tags = tags_of(obj.get("tags"))
    if obj.get("tag"):
        tags.update(tags_of(obj["tag"]))
    proc = obj.get("process")
    pid = obj.get("processID")
    cached = cache.get(str(pid)) if cache is not None and not isinstance(proc, dict) else None
    if cached is not None:
        service, resource = cached
    else:
        if not isinstance(proc, dict):
            proc = processes.get(str(pid)) if pid is not None else None
        if isinstance(proc, dict):
            service = str(proc.get("serviceName") or "unknown")
            resource = tags_of(proc.get("tags"))
            if proc.get("tag"):
                resource.update(tags_of(proc["tag"]))
            if cache is not None and pid is not None and not isinstance(obj.get("process"), dict):
                cache[str(pid)] = (service, resource)
        else:
            warns.append(f"span {span_id}: no process; service set to 'unknown'")
            service, resource = "unknown", {}
    kind_tag = str(tags.get("span.kind", "")).lower()
    return Span(
        trace_id=tid,
        span_id=span_id,
        parent_span_id=parent,
        service=service,
        operation=str(obj.get("operationName") or ""),
        start_us=start,
        duration_us=duration,
        kind=KINDS.get(kind_tag, SpanKind.UNSPECIFIED),
        references=tuple(refs),
        tags=tags,
        resource=resource,
        error=error_from_tags(tags),
    )


def _fail(msg: str, path: Path | str, line: int | None, where: str, *, skip: bool, on_skip: OnSkip) -> None:
    reject(span_error(msg, path, line, where, "a Jaeger span"), skip, on_skip)


def convert_trace(
    obj: dict[str, Any], path: Path | str, line: int | None, where: str, *, skip: bool, on_skip: OnSkip
) -> Trace:
    spans_raw = obj.get("spans")
    if not isinstance(spans_raw, list):
        raise InputError("no 'spans' list, expected " + EXPECTED, file=path, line=line, field=f"{where}spans")
    processes = obj.get("processes") or {}
    if not isinstance(processes, dict):
        processes = {}
    warns: list[str] = [str(w) for w in (obj.get("warnings") or []) if w]
    spans: list[Span] = []
    # Spans of one trace share its process table: convert each process once (its resource dict is
    # shared by those spans, which treat it as read-only).
    cache: ProcessCache = {}
    for i, raw in enumerate(spans_raw):
        try:
            spans.append(convert_span(raw, processes, obj.get("traceID"), warns, cache))
        except ValueError as exc:
            _fail(str(exc), path, line, f"{where}spans[{i}]", skip=skip, on_skip=on_skip)
    if not spans:
        raise InputError(
            "trace has no valid spans", file=path, line=line, field=f"{where}spans" if where else "spans"
        )
    tid = spans[0].trace_id
    if obj.get("traceID") not in (None, ""):
        try:
            tid = normalize_id(obj["traceID"], 32)
        except ValueError as exc:
            raise InputError(
                f"{exc}, expected a trace ID", file=path, line=line, field=f"{where}traceID"
            ) from None
    return build_trace(tid, spans, source=str(path), warnings=warns)


def read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[Trace]:
    assembler = SpanAssembler(str(path))

    def handle(obj: Any, line: int | None, where: str) -> Iterator[Trace]:
        if isinstance(obj, dict) and isinstance(obj.get("data"), list):
            for i, item in enumerate(obj["data"]):
                yield from handle(item, line, f"{where}data[{i}].")
        elif isinstance(obj, dict) and isinstance(obj.get("hits"), dict):
            for i, hit in enumerate(obj["hits"].get("hits") or []):
                src = hit.get("_source") if isinstance(hit, dict) else None
                yield from handle(src, line, f"{where}hits.hits[{i}]._source.")
        elif isinstance(obj, dict) and ("spans" in obj or ("traceID" in obj and "spanID" not in obj)):
            yield convert_trace(obj, path, line, where, skip=skip, on_skip=on_skip)
        elif isinstance(obj, dict) and "spanID" in obj:
            warns: list[str] = []
            try:
                span = convert_span(obj, {}, None, warns)
            except ValueError as exc:
                _fail(str(exc), path, line, where.rstrip(".") or "span", skip=skip, on_skip=on_skip)
                return
            yield from assembler.add(span, warns)
        elif isinstance(obj, list):
            for i, item in enumerate(obj):
                yield from handle(item, line, f"{where}[{i}].")
        else:
            err = InputError(
                "unexpected value, expected " + EXPECTED,
                file=path,
                line=line,
                field=where.rstrip(".") or None,
            )
            reject(err, skip, on_skip)

    if is_json_lines(path):
        for n, obj in iter_json_lines(path, skip, on_skip, EXPECTED):
            yield from _guard(handle(obj, n, ""), skip=skip, on_skip=on_skip)
    else:
        shape, key = top_level_keys(path, {"data", "hits", "spans", "spanID", "traceID", "processes"})
        if shape == "array":
            for i, item in iter_items(path, "item"):
                yield from _guard(handle(item, None, f"[{i}]."), skip=skip, on_skip=on_skip)
        elif key == "data":
            for i, item in iter_items(path, "data.item"):
                yield from _guard(handle(item, None, f"data[{i}]."), skip=skip, on_skip=on_skip)
        elif key == "hits":
            for i, item in iter_items(path, "hits.hits.item._source"):
                yield from _guard(handle(item, None, f"hits.hits[{i}]._source."), skip=skip, on_skip=on_skip)
        elif key is not None:
            for _, item in iter_items(path, ""):
                yield from handle(item, None, "")
        else:
            raise InputError("JSON of the wrong shape, expected " + EXPECTED, file=path, line=1)
    yield from assembler.flush()


def _guard(it: Iterator[Trace], skip: bool, on_skip: OnSkip) -> Iterator[Trace]:
    try:
        yield from it
    except InputError as err:
        if not skip:
            raise
        on_skip(err)


TRACE_READERS.register("jaeger-json")(
    Reader(
        "jaeger-json",
        "Jaeger v1 JSON (envelope, trace, array, JSONL, ES span documents)",
        sniff,
        read,
        40,
    )
)
