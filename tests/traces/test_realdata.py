"""Every real file under $HARNESS_REALDATA parses, with counts computed independently from the raw file."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from harness.common.errors import InputError
from harness.traces import detect_format, read_requests, read_traces

pytestmark = pytest.mark.realdata

JAEGER_FILES = [
    "jaeger/fixture.json",
    "jaeger/ui_01.json",
    "jaeger-ui/genaiTestTrace.json",
    "jaeger-ui/tableValuesTestTrace/spanLongerAsParent.json",
    "jaeger-ui/tableValuesTestTrace/testTrace.json",
    "jaeger-ui/tableValuesTestTrace/traceWithMultipleSpansWithTheSameValueInDifferentTags.json",
    "jaeger-ui/tableValuesTestTrace/traceWithOverlappingChildren.json",
]
OTLP_FILES = ["otlp/trace.json", "jaeger/apiv3/FindTraces.json", "jaeger/apiv3/GetTrace.json"]


def test_every_file_is_covered(realdata: Path) -> None:
    """Guards against new real files being added without a test here."""
    covered = set(JAEGER_FILES) | set(OTLP_FILES)
    covered |= {
        "jaeger-ui/otlp2jaeger-multi-in.json.txt",
        "mooncake/synthetic_trace.jsonl",
        "azure/AzureLLMInferenceTrace_code.csv",
        "splitwise/test_trace.csv",
        "jaeger/apiv3/FindTraceSummaries.json",
        "jaeger/apiv3/GetOperations.json",
        "jaeger/apiv3/GetServices.json",
    }
    data = set()
    for sub in ("jaeger", "jaeger-ui", "otlp", "mooncake", "azure", "splitwise"):
        for p in (realdata / sub).rglob("*"):
            if p.is_file() and p.suffix != ".md":
                data.add(str(p.relative_to(realdata)))
    assert data == covered


def _expected_spans(raw: dict[str, Any]) -> int:
    """Spans after dropping exact repeats (same id, operation, process, start, duration)."""
    seen = {
        (s["spanID"], s["operationName"], s["processID"], s["startTime"], s["duration"]) for s in raw["spans"]
    }
    return len(seen)


@pytest.mark.parametrize("name", JAEGER_FILES)
def test_jaeger_files(realdata: Path, name: str) -> None:
    path = realdata / name
    raw = json.loads(path.read_text())
    assert detect_format(path) == "jaeger-json"
    traces = list(read_traces(path))
    assert len(traces) == 1
    tr = traces[0]
    assert len(tr.spans) == _expected_spans(raw)
    assert tr.services == {raw["processes"][s["processID"]]["serviceName"] for s in raw["spans"]}
    raw_ids = {s["spanID"].lower() for s in raw["spans"]}
    assert {sid.split("~")[0].lstrip("0") for sid in tr.spans} == {i.lstrip("0") for i in raw_ids}
    # every span is in the tree exactly once: reachable from the roots
    reach, stack = set(), list(tr.roots)
    while stack:
        sid = stack.pop()
        assert sid not in reach
        reach.add(sid)
        stack.extend(tr.children.get(sid, []))
    assert reach == set(tr.spans)
    starts = [s["startTime"] for s in raw["spans"]]
    assert tr.start_us == min(starts)
    assert tr.epoch_known == (min(starts) > 946_684_800_000_000)


def test_ui01_ids_tags_references(realdata: Path) -> None:
    tr = next(read_traces(realdata / "jaeger/ui_01.json"))
    assert tr.trace_id == "0" * 31 + "1"
    dup = tr.spans["0000000000000002~2"]  # the second span reusing id ...02 is kept, renamed
    assert dup.operation == "some-operation"
    assert dup.tags["javascript_limit"] == 9223372036854775222  # int64 written as a string
    assert dup.tags["error"] is True and dup.error
    four = tr.spans["0000000000000004"]
    # three references: a CHILD_OF into another trace, a CHILD_OF and a FOLLOWS_FROM in this one
    assert len(four.references) == 3
    assert four.parent_span_id == "0000000000000002"
    assert any("duplicate span id" in w for w in tr.warnings)


def test_fixture_null_references_and_non_epoch(realdata: Path) -> None:
    tr = next(read_traces(realdata / "jaeger/fixture.json"))
    assert tr.trace_id == "abc0".rjust(32, "0")
    assert tr.roots == ["000000000000abc0"]
    assert not tr.epoch_known  # startTime 1000 is not an epoch
    assert tr.spans["0000000000000567"].references[0].ref_type.value == "FOLLOWS_FROM"
    assert tr.spans["0000000000000123"].tags == {
        "error": True,
        "int64": 123,
        "float64": 123.567,
        "binary": "AQ==",
    }


def _otlp_expected(docs: list[dict[str, Any]]) -> tuple[int, set[str]]:
    spans, traces = 0, set()
    for outer in docs:
        doc = outer.get("result", outer)
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans += len(ss["spans"])
                traces |= {s["traceId"].lower() for s in ss["spans"]}
    return spans, traces


@pytest.mark.parametrize("name", OTLP_FILES)
def test_otlp_files(realdata: Path, name: str) -> None:
    path = realdata / name
    n_spans, trace_ids = _otlp_expected([json.loads(path.read_text())])
    assert detect_format(path) == "otlp-json"
    traces = list(read_traces(path))
    assert {t.trace_id for t in traces} == trace_ids
    assert sum(len(t.spans) for t in traces) == n_spans


def test_otlp_json_lines(realdata: Path) -> None:
    path = realdata / "jaeger-ui/otlp2jaeger-multi-in.json.txt"
    docs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    n_spans, trace_ids = _otlp_expected(docs)
    traces = list(read_traces(path))
    assert {t.trace_id for t in traces} == trace_ids
    assert sum(len(t.spans) for t in traces) == n_spans == 4
    tr = traces[0]
    # the four lines hold one trace: main → info → two ohboy.do spans
    root = tr.root
    assert root.operation == "main" and root.parent_span_id is None
    assert [tr.spans[c].operation for c in tr.children[root.span_id]] == ["info"]
    assert root.start_us == 1711138246940000 and root.duration_us == 176321  # ns → µs, floor


def test_otlp_example_uppercase_ids_and_missing_parent(realdata: Path) -> None:
    tr = next(read_traces(realdata / "otlp/trace.json"))
    assert tr.trace_id == "5b8efff798038103d269b633813fc60c"
    span = tr.root
    assert span.span_id == "eee19b7ec3c1b174" and span.parent_span_id == "eee19b7ec3c1b173"
    assert span.kind.value == "server" and span.service == "my.service"
    assert span.duration_us == 1_000_000
    assert any("no root span" in w for w in tr.warnings)


def test_apiv3_non_trace_responses_are_rejected(realdata: Path) -> None:
    for name in ("GetServices.json", "GetOperations.json", "FindTraceSummaries.json"):
        with pytest.raises(InputError, match="unrecognised format"):
            detect_format(realdata / "jaeger/apiv3" / name)


def test_mooncake(realdata: Path) -> None:
    path = realdata / "mooncake/synthetic_trace.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    events = list(read_requests(path))
    assert detect_format(path) == "mooncake"
    assert len(events) == len(rows) == 3993
    assert sum(e.input_tokens for e in events) == sum(r["input_length"] for r in rows)
    assert sum(e.output_tokens for e in events) == sum(r["output_length"] for r in rows)
    for i in (0, 1000, len(rows) - 1):
        assert events[i].prefix_block_ids == tuple(rows[i]["hash_ids"])
        assert events[i].arrival_s == pytest.approx((rows[i]["timestamp"] - rows[0]["timestamp"]) / 1000)
    assert all(e.block_size == 512 for e in events)


def test_azure(realdata: Path) -> None:
    path = realdata / "azure/AzureLLMInferenceTrace_code.csv"
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    events = list(read_requests(path))
    assert detect_format(path) == "azure"
    assert len(events) == len(rows) == 8819
    assert [e.input_tokens for e in events] == [int(r["ContextTokens"]) for r in rows]
    assert [e.output_tokens for e in events] == [int(r["GeneratedTokens"]) for r in rows]

    def parse(ts: str) -> dt.datetime:  # drop the 7th fractional digit, which strptime cannot read
        head, frac = ts.split(".")
        return dt.datetime.strptime(f"{head}.{frac[:6]}", "%Y-%m-%d %H:%M:%S.%f")

    t0 = parse(rows[0]["TIMESTAMP"])
    span = (parse(rows[-1]["TIMESTAMP"]) - t0).total_seconds()
    assert events[-1].arrival_s == pytest.approx(span, abs=1e-6)
    assert events[-1].line == len(rows)


def test_splitwise(realdata: Path) -> None:
    path = realdata / "splitwise/test_trace.csv"
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    events = list(read_requests(path))
    assert detect_format(path) == "splitwise"
    assert [(e.input_tokens, e.output_tokens) for e in events] == [
        (int(r["prompt_size"]), int(r["token_size"])) for r in rows
    ]
    t0 = float(rows[0]["arrival_timestamp"])
    assert [e.arrival_s for e in events] == [float(r["arrival_timestamp"]) - t0 for r in rows]
