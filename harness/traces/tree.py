"""Build a :class:`Trace` (span tree) from a bag of spans, tolerating what real exporters produce.

* Duplicate span IDs: an exact repeat (same service, operation, start, duration) is dropped; a
  different span reusing an ID (Zipkin-style shared client/server IDs) is kept under ``<id>~2``.
* Parents: ``Span.parent_span_id`` (the CHILD_OF reference, else the first reference). A parent that
  is not in the trace makes the span an orphan, re-attached under the earliest root with a warning;
  if no span is a root, the earliest orphan becomes the root.
* Cycles (a span that is its own ancestor) are broken at the earliest span of the cycle.
* Clock skew: structure never depends on timestamps, only child order does (children are sorted by
  start time, then span id), so a child that starts before its parent is still its child.

:class:`SpanAssembler` groups a stream of spans (OTLP lines, Elasticsearch span documents) into
traces with bounded memory: a trace is emitted at end of input, or when the number of buffered
spans exceeds ``max_buffered_spans`` (setting, default 50 000; oldest-touched trace first; a late
straggler of an emitted trace then comes out as a second, partial trace with a warning).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from harness.traces.model import Span, Trace


def build_trace(
    trace_id: str,
    spans: Iterable[Span],
    *,
    source: str = "",
    warnings: list[str] | None = None,
    epoch_known: bool | None = None,
) -> Trace:
    warns = list(warnings or [])
    by_id: dict[str, Span] = {}
    for span in spans:
        old = by_id.get(span.span_id)
        if old is None:
            by_id[span.span_id] = span
            continue
        if (old.service, old.operation, old.start_us, old.duration_us) == (
            span.service,
            span.operation,
            span.start_us,
            span.duration_us,
        ):
            warns.append(f"duplicate span {span.span_id} dropped (exact repeat)")
            continue
        n = 2
        while f"{span.span_id}~{n}" in by_id:
            n += 1
        new_id = f"{span.span_id}~{n}"
        warns.append(f"duplicate span id {span.span_id}: second span '{span.operation}' kept as {new_id}")
        by_id[new_id] = dataclasses.replace(span, span_id=new_id)

    parent: dict[str, str | None] = {}
    orphans: list[str] = []
    for sid, span in by_id.items():
        pid = span.parent_span_id
        if pid is None or pid == sid:
            parent[sid] = None
        elif pid in by_id:
            parent[sid] = pid
        else:
            parent[sid] = None
            orphans.append(sid)

    def order(sid: str) -> tuple[int, str]:
        return (by_id[sid].start_us, sid)

    orphan_set = set(orphans)  # a list lookup here is quadratic on traces with many orphans
    roots = sorted((s for s, p in parent.items() if p is None and s not in orphan_set), key=order)
    orphans.sort(key=order)
    if not roots and orphans:
        first = orphans.pop(0)
        roots = [first]
        warns.append(f"no root span; earliest orphan {first} used as root")

    # Break cycles: anything not reachable from a root or an orphan lies on a parent cycle.
    children: dict[str, list[str]] = {sid: [] for sid in by_id}
    for sid, pid in parent.items():
        if pid is not None:
            children[pid].append(sid)
    reached: set[str] = set()
    stack = list(roots) + orphans
    while stack:
        sid = stack.pop()
        if sid in reached:
            continue
        reached.add(sid)
        stack.extend(children[sid])
    for sid in sorted((s for s in by_id if s not in reached), key=order):
        if sid in reached:
            continue
        pid = parent[sid]
        if pid is not None:
            children[pid].remove(sid)
        parent[sid] = None
        orphans.append(sid)
        warns.append(f"span {sid} is on a parent cycle; cycle broken there")
        stack = [sid]
        while stack:
            cur = stack.pop()
            if cur not in reached:
                reached.add(cur)
                stack.extend(children[cur])

    if roots:
        for sid in orphans:
            if sid == roots[0]:
                continue
            missing = by_id[sid].parent_span_id
            warns.append(f"orphan span {sid}: parent {missing} not in trace; attached to root {roots[0]}")
            children[roots[0]].append(sid)

    for kids in children.values():
        kids.sort(key=order)
    if epoch_known is None:
        epoch_known = all(s.start_us >= EPOCH_MIN_US for s in by_id.values())
    return Trace(
        trace_id=trace_id,
        spans=by_id,
        children={k: v for k, v in children.items() if v},
        roots=roots,
        warnings=warns,
        source=source,
        epoch_known=epoch_known,
    )


EPOCH_MIN_US = 946_684_800_000_000
"""2000-01-01 in µs: smaller start times are offsets from an arbitrary origin, not epochs."""


class SpanAssembler:
    """Groups streamed spans by trace id with a bound on buffered spans (see module docstring)."""

    def __init__(self, source: str, max_buffered_spans: int | None = None) -> None:
        if max_buffered_spans is None:
            from harness.common.settings import load_settings
            from harness.traces.settings import TracesSettings

            max_buffered_spans = load_settings(TracesSettings).max_buffered_spans
        self.source = source
        self.max_buffered = max_buffered_spans
        self._open: OrderedDict[str, list[Span]] = OrderedDict()
        self._warnings: dict[str, list[str]] = {}
        self._buffered = 0
        self._emitted: set[str] = set()

    def add(self, span: Span, warnings: Iterable[str] = ()) -> Iterator[Trace]:
        bucket = self._open.get(span.trace_id)
        if bucket is None:
            bucket = self._open[span.trace_id] = []
            self._warnings[span.trace_id] = []
            if span.trace_id in self._emitted:
                self._warnings[span.trace_id].append(
                    "spans of this trace arrived after it was emitted (buffer limit); this is a partial trace"
                )
        else:
            self._open.move_to_end(span.trace_id)
        bucket.append(span)
        self._warnings[span.trace_id].extend(warnings)
        self._buffered += 1
        while self._buffered > self.max_buffered and len(self._open) > 1:
            tid = next(iter(self._open))
            yield self._emit(tid)

    def _emit(self, tid: str) -> Trace:
        spans = self._open.pop(tid)
        self._buffered -= len(spans)
        self._emitted.add(tid)
        return build_trace(tid, spans, source=self.source, warnings=self._warnings.pop(tid))

    def flush(self) -> Iterator[Trace]:
        while self._open:
            yield self._emit(next(iter(self._open)))
