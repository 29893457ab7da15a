"""Cold-path JSONL (written by ``harness traces coldpaths``) read back as request events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from harness.common.formats import Reader, first_line
from harness.common.io import parse_jsonl_line
from harness.traces._base import (
    REQUEST_READERS,
    ArrivalClock,
    OnSkip,
    convert_rows,
    iter_lines,
)
from harness.traces.model import ColdPathRecord, RequestEvent, TagValue

EXPECTED = "a cold-path record written by `harness traces coldpaths`"


def sniff(path: Path, head: bytes) -> bool:
    line = first_line(head)
    return line.startswith(b"{") and b'"coldpath"' in line and b'"hop_span_id"' in line


def to_event(rec: ColdPathRecord, arrival_s: float, source: str, line: int) -> RequestEvent:
    tags: dict[str, TagValue] = {
        "latency_ms": rec.latency_ms,
        "protocol": rec.protocol,
        "service_path": " > ".join(rec.service_path),
        "hop_span_id": rec.hop_span_id,
        "tokens_known": rec.input_tokens is not None,
    }
    if rec.cache_read_tokens is not None:
        tags["gen_ai.usage.cache_read.input_tokens"] = rec.cache_read_tokens
    if rec.model:
        tags["gen_ai.request.model"] = rec.model
    if rec.error:
        tags["error"] = True
    return RequestEvent(
        arrival_s=arrival_s,
        input_tokens=rec.input_tokens or 0,
        output_tokens=rec.output_tokens or 0,
        service=rec.service,
        operation=rec.operation,
        tenant=rec.tenant,
        tags=tags,
        source_trace_id=rec.trace_id,
        source=source,
        line=line,
    )


def _read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[tuple[int, tuple[ColdPathRecord, float]]]:
    clock = ArrivalClock(path, "start_us", what="start_us", order="start", per_second=1e6)

    def convert(n: int, text: str) -> tuple[ColdPathRecord, float]:
        rec = parse_jsonl_line(text, n, ColdPathRecord, file=path, expected=EXPECTED)
        return rec, clock.offset(n, rec.start_us)

    return convert_rows(iter_lines(path, skip, on_skip, blank=False), convert, skip, on_skip)


def read_records(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[tuple[int, ColdPathRecord]]:
    """(line, record) per cold path; records must be in ``start_us`` order (as the command writes them)."""
    for n, (rec, _) in _read(path, skip, on_skip):
        yield n, rec


def read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[RequestEvent]:
    source = f"coldpaths:{path}"
    for n, (rec, arrival_s) in _read(path, skip, on_skip):
        yield to_event(rec, arrival_s, source, n)


REQUEST_READERS.register("coldpaths")(
    Reader("coldpaths", "cold-path JSONL from `harness traces coldpaths`", sniff, read, 5)
)
