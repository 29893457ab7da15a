"""Cold-path JSONL (written by ``harness traces coldpaths``) read back as request events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from harness.common.errors import InputError
from harness.traces._base import READERS, OnSkip, Reader, first_line, iter_lines, pydantic_error
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


def read_records(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[tuple[int, ColdPathRecord]]:
    """(line, record) per cold path; records must be in ``start_us`` order (as the command writes them)."""
    origin: int | None = None
    for n, text in iter_lines(path, skip, on_skip):
        if not text.strip():
            continue
        try:
            try:
                rec = ColdPathRecord.model_validate_json(text)
            except ValidationError as exc:
                raise pydantic_error(exc, path, n, EXPECTED) from None
            if origin is None:
                origin = rec.start_us
            if rec.start_us < origin:
                raise InputError(
                    "start_us is before the first row's (expected rows in start order)",
                    file=path,
                    line=n,
                    field="start_us",
                )
        except InputError as err:
            if not skip:
                raise
            on_skip(err)
            continue
        yield n, rec


def read(path: Path, skip: bool, on_skip: OnSkip) -> Iterator[RequestEvent]:
    origin: int | None = None
    source = f"coldpaths:{path}"
    for n, rec in read_records(path, skip, on_skip):
        if origin is None:
            origin = rec.start_us
        yield to_event(rec, (rec.start_us - origin) / 1e6, source, n)


READERS.register("coldpaths")(
    Reader("coldpaths", "requests", "cold-path JSONL from `harness traces coldpaths`", sniff, read, 5)
)
