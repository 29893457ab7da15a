"""Reader behaviour on the shapes and quirks real exports have (built from real fixtures where possible)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from harness.common.errors import InputError
from harness.traces import detect_format, read_requests, read_traces
from harness.traces._base import SkipLog, coerce_tag, normalize_id, normalize_otlp_id

pytestmark = pytest.mark.realdata


@pytest.fixture
def genai(realdata: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((realdata / "jaeger-ui/genaiTestTrace.json").read_text())
    return doc


@pytest.fixture
def ui01(realdata: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((realdata / "jaeger/ui_01.json").read_text())
    return doc


def _counts(path: Path) -> list[tuple[str, int]]:
    return sorted((t.trace_id, len(t.spans)) for t in read_traces(path))


def test_jaeger_envelope_array_jsonl_agree(
    tmp_path: Path, genai: dict[str, Any], ui01: dict[str, Any]
) -> None:
    expected = sorted([(genai["traceID"], len(genai["spans"])), ("0" * 31 + "1", len(ui01["spans"]))])
    env = tmp_path / "env.json"
    env.write_text(
        json.dumps({"data": [genai, ui01], "total": 2, "limit": 0, "offset": 0, "errors": None}, indent=1)
    )
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps([genai, ui01], indent=2))
    jsonl = tmp_path / "traces.jsonl"
    jsonl.write_text(json.dumps(genai) + "\n" + json.dumps(ui01) + "\n")
    minified = tmp_path / "min.json"  # one-line envelope: still streamed as a document
    minified.write_text(json.dumps({"data": [genai, ui01]}))
    for p in (env, arr, jsonl, minified):
        assert detect_format(p) == "jaeger-json"
        assert _counts(p) == expected, p.name


def test_elasticsearch_span_documents(tmp_path: Path, genai: dict[str, Any]) -> None:
    docs = []
    for s in genai["spans"]:
        d = {k: v for k, v in s.items() if k != "processID"}
        d["process"] = genai["processes"][s["processID"]]
        docs.append(d)
    docs.reverse()  # ES returns spans in any order
    lines = tmp_path / "spans.jsonl"
    lines.write_text("\n".join(json.dumps(d) for d in docs))
    hits = tmp_path / "hits.json"
    hits.write_text(
        json.dumps({"took": 3, "hits": {"total": len(docs), "hits": [{"_source": d} for d in docs]}})
    )
    for p in (lines, hits):
        [tr] = list(read_traces(p))
        assert len(tr.spans) == len(genai["spans"])
        assert tr.roots == ["0000000000000001"]
        assert tr.spans["0000000000000005"].service == "coding-agent"


def test_id_normalization() -> None:
    assert normalize_id("ABC", 16) == "0000000000000abc"
    assert normalize_id("4A1B", 32) == "4a1b".rjust(32, "0")
    assert normalize_id("span-1", 16) == "span-1"  # non-hex stays opaque
    assert normalize_id(255, 16) == "00000000000000ff"
    raw = bytes.fromhex("5b8efff798038103d269b633813fc60c")
    assert normalize_otlp_id(base64.b64encode(raw).decode(), 32) == raw.hex()
    assert normalize_otlp_id("EEE19B7EC3C1B174", 16) == "eee19b7ec3c1b174"


def test_start_time_forms(tmp_path: Path) -> None:
    """Numeric strings, RFC 3339 strings and nanoseconds all become µs; ES startTimeMillis too."""
    spans = [
        {
            "traceID": "f",
            "spanID": "1",
            "operationName": "a",
            "startTime": "2024-01-01T00:00:00Z",
            "duration": 5,
        },
        {"traceID": "f", "spanID": "2", "operationName": "b", "startTime": "1704067200000001", "duration": 5},
        {
            "traceID": "f",
            "spanID": "3",
            "operationName": "c",
            "startTime": 1704067200000002000,
            "duration": 5,
        },
        {
            "traceID": "f",
            "spanID": "4",
            "operationName": "d",
            "startTimeMillis": 1704067200000,
            "duration": 5,
        },
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceID": "f", "spans": spans, "processes": {}}))
    [tr] = list(read_traces(p))
    epoch_us = 1_704_067_200_000_000
    assert [tr.spans[f"{i:016x}"].start_us for i in (1, 2, 3, 4)] == [
        epoch_us,
        epoch_us + 1,
        epoch_us + 2,
        epoch_us,
    ]
    assert tr.epoch_known
    assert sum("no process" in w for w in tr.warnings) == 4


def test_tag_coercion() -> None:
    assert coerce_tag("123", "int64") == 123
    assert coerce_tag("true", "bool") is True
    assert coerce_tag("FALSE", "bool") is False
    assert coerce_tag("1.5", "float64") == 1.5
    assert coerce_tag("n/a", "int64") == "n/a"  # kept as given when it cannot be the declared type


def test_references_quirks_and_skew(tmp_path: Path) -> None:
    proc = {"p1": {"serviceName": "a", "tags": []}, "p2": {"serviceName": "b"}}
    spans = [
        {
            "traceID": "A1",
            "spanID": "1",
            "operationName": "root",
            "startTime": 5000,
            "duration": 10,
            "processID": "p1",
        },
        # starts before its parent (clock skew); references null, parent given by the legacy parentSpanID
        {
            "traceID": "a1",
            "spanID": "2",
            "operationName": "skewed",
            "startTime": 1000,
            "duration": "7",
            "processID": "p2",
            "references": None,
            "parentSpanID": "1",
        },
        {
            "traceID": "a1",
            "spanID": "3",
            "operationName": "dangling",
            "startTime": 6000,
            "duration": 1,
            "processID": "p2",
            "references": [{"refType": "CHILD_OF", "traceID": "a1", "spanID": "99"}],
        },
        {
            "traceID": "a1",
            "spanID": "4",
            "operationName": "follows",
            "startTime": 7000,
            "duration": 1,
            "processID": "p2",
            "references": [{"refType": "FOLLOWS_FROM", "spanID": "2"}],
        },
        {
            "traceID": "a1",
            "spanID": "1",
            "operationName": "root",
            "startTime": 5000,
            "duration": 10,
            "processID": "p1",
        },
    ]
    p = tmp_path / "quirks.json"
    p.write_text(json.dumps({"traceID": "a1", "spans": spans, "processes": proc}))
    [tr] = list(read_traces(p))
    assert tr.trace_id == "a1".rjust(32, "0")
    assert len(tr.spans) == 4  # the exact repeat of span 1 is dropped
    assert tr.roots == ["0000000000000001"]
    assert tr.children["0000000000000001"] == ["0000000000000002", "0000000000000003"]  # start order
    assert tr.children["0000000000000002"] == ["0000000000000004"]
    assert tr.spans["0000000000000002"].duration_us == 7
    assert not tr.epoch_known
    assert any("orphan span 0000000000000003" in w for w in tr.warnings)
    assert any("exact repeat" in w for w in tr.warnings)


def test_otlp_unions_kinds_base64(tmp_path: Path) -> None:
    tid = bytes(range(16))
    sid = bytes(range(8))
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "lib"},
                        "spans": [
                            {
                                "traceId": base64.b64encode(tid).decode(),
                                "spanId": base64.b64encode(sid).decode(),
                                "name": "op",
                                "kind": "SPAN_KIND_CLIENT",
                                "startTimeUnixNano": 1_700_000_000_000_000_000,
                                "endTimeUnixNano": "1700000000250000000",
                                "status": {"code": "STATUS_CODE_ERROR"},
                                "attributes": [
                                    {"key": "i", "value": {"intValue": "42"}},
                                    {"key": "d", "value": {"doubleValue": 0.5}},
                                    {"key": "b", "value": {"boolValue": True}},
                                    {"key": "a", "value": {"arrayValue": {"values": [{"stringValue": "x"}]}}},
                                ],
                            }
                        ],
                    }
                ],
            }
        ]
    }
    p = tmp_path / "otlp.json"
    p.write_text(json.dumps({"result": doc}, indent=2))
    [tr] = list(read_traces(p))
    span = tr.root
    assert (tr.trace_id, span.span_id) == (tid.hex(), sid.hex())
    assert span.kind.value == "client" and span.error
    assert span.duration_us == 250_000 and span.start_us == 1_700_000_000_000_000
    assert span.tags["i"] == 42 and span.tags["d"] == 0.5 and span.tags["b"] is True
    assert json.loads(str(span.tags["a"])) == ["x"]


def test_burstgpt_per_readme(tmp_path: Path, realdata: Path) -> None:
    """No BurstGPT data file is obtainable here; the rows follow the schema in realdata/burstgpt/README.md."""
    readme = (realdata / "burstgpt/README.md").read_text()
    cols = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
    assert all(f"`{c}`" in readme for c in cols)
    p = tmp_path / "burst.csv"
    p.write_text(
        ",".join(cols) + "\r\n5,ChatGPT,472,18,490,Conversation log\r\n7.5,GPT-4,1000,0,1000,API log\r\n"
    )
    assert detect_format(p) == "burstgpt"
    a, b = list(read_requests(p))
    assert (a.arrival_s, a.input_tokens, a.output_tokens, a.failed) == (0.0, 472, 18, False)
    assert (b.arrival_s, b.failed, b.tags["gen_ai.request.model"], b.operation) == (
        2.5,
        True,
        "GPT-4",
        "API log",
    )


def test_azure_2024_timestamps(tmp_path: Path) -> None:
    p = tmp_path / "az24.csv"
    p.write_bytes(
        b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        b"2024-05-10 00:00:00.0093526+00:00,100,5\r\n2024-05-10 02:00:01.5+02:00,7,3"
    )
    evs = list(read_requests(p))
    # 02:00:01.5+02:00 is 00:00:01.5 UTC
    assert [round(e.arrival_s, 7) for e in evs] == [0.0, round(1.5 - 0.0093526, 7)]


def test_skip_invalid_counts_reasons(tmp_path: Path) -> None:
    p = tmp_path / "mc.jsonl"
    good = '{"timestamp": %d, "input_length": 10, "output_length": 2, "hash_ids": [1]}'
    p.write_bytes(
        (good % 0 + "\n" + "{broken\n" + good % 5 + "\n").encode()
        + b'{"timestamp": 6, "input_length": -1, "output_length": 2}\n'
        + b"\xff\xfe\n"
        + (good % 9).encode()
    )
    with pytest.raises(InputError) as exc:
        list(read_requests(p))
    assert exc.value.line == 2
    log = SkipLog()
    evs = list(read_requests(p, skip_invalid=True, on_skip=log))
    assert [e.line for e in evs] == [1, 3, 6]
    assert log.count == 3
    assert any("UTF-8" in r for r in log.reasons)


def test_wrong_family_is_an_input_error(realdata: Path) -> None:
    with pytest.raises(InputError, match="not an LLM request trace"):
        list(read_requests(realdata / "jaeger/ui_01.json"))
    with pytest.raises(InputError, match="not a distributed trace"):
        list(read_traces(realdata / "splitwise/test_trace.csv"))


def test_assembler_buffer_bound_and_straggler() -> None:
    from harness.traces.model import Span
    from harness.traces.tree import SpanAssembler

    def span(tid: str, sid: str, parent: str | None = None) -> Span:
        return Span(tid, sid, parent, "svc", "op", 0, 1)

    asm = SpanAssembler("mem", max_buffered_spans=3)
    out = []
    for s in [span("a", "1"), span("b", "1"), span("a", "2", "1"), span("c", "1"), span("b", "2", "1")]:
        out += list(asm.add(s))
    # the 4th span overflowed the buffer: the least recently touched trace ("b") was emitted; the 5th
    # (a straggler of "b") overflowed it again: out went "a"
    assert [(t.trace_id, len(t.spans)) for t in out] == [("b", 1), ("a", 2)]
    out += list(asm.flush())
    assert [(t.trace_id, len(t.spans)) for t in out] == [("b", 1), ("a", 2), ("c", 1), ("b", 1)]
    assert any("partial trace" in w for w in out[-1].warnings)
