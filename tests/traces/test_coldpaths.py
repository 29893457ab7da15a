"""Cold-path extraction on the real GenAI agent trace (jaeger-ui/genaiTestTrace.json), hand-checked.

Reading the file: span 01 api-edge ``POST /api/graphql`` (server, http) is the entry; its only child
span 02 graphql-gateway ``Query.assistantReply`` (server, no http.*/rpc.* attributes, 43 s) is the
first hop. Below, coding-agent calls mcp-gateway ``POST /mcp/tools/call`` (server, http, 850 ms) at
spans 08, 0d, 17, 1c, 26, 2b and 33 (3.9 s; its subtree holds summarizer's ``chat model-b`` with
gen_ai.usage.cache_read.input_tokens=460); trace-store ``GET /api/traces`` is exactly 500 ms (0f, 1e,
2d: not *over* the threshold); span 11 (k8s-api, under 0d) has error=true.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.traces import read_requests, read_traces
from harness.traces.coldpaths import ColdPathConfig, ColdPathStats, extract
from harness.traces.model import ColdPathRecord
from harness.traces.scenarios import build_scenarios

pytestmark = pytest.mark.realdata
MCP_HOPS = [
    "0000000000000008",
    "000000000000000d",
    "0000000000000017",
    "000000000000001c",
    "0000000000000026",
    "000000000000002b",
]


@pytest.fixture
def raw(realdata: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((realdata / "jaeger-ui/genaiTestTrace.json").read_text())
    return doc


@pytest.fixture
def trace(realdata: Path):
    return next(read_traces(realdata / "jaeger-ui/genaiTestTrace.json"))


def _tag(span: dict[str, Any], key: str):
    return next((t["value"] for t in span["tags"] if t["key"] == key), None)


def test_default_first_hop_is_the_graphql_gateway_and_is_filtered(trace) -> None:
    stats = ColdPathStats()
    assert extract(trace, ColdPathConfig.build(), stats) == []
    assert stats.hops == 1  # only span 02 is a first hop under the entry
    assert stats.rejected == {"protocol other not selected": 1}


def test_any_protocol_hop_scope_keeps_span_02_with_summed_tokens(trace, raw) -> None:
    cfg = ColdPathConfig.build(
        protocols="any", cache_scope="hop", cache_hit=["gen_ai.usage.cache_read.input_tokens>0"]
    )
    [cp] = extract(trace, cfg)
    assert (cp.hop_span_id, cp.latency_ms, cp.service_path) == (
        "0000000000000002",
        43000.0,
        ["api-edge", "graphql-gateway"],
    )
    # everything below span 02 is the whole trace minus the entry: sum the usage tags from the raw file
    below = [s for s in raw["spans"] if s["spanID"] != "0000000000000001"]
    assert cp.input_tokens == sum(_tag(s, "gen_ai.usage.input_tokens") or 0 for s in below) == 1840 * 4 + 920
    assert cp.output_tokens == sum(_tag(s, "gen_ai.usage.output_tokens") or 0 for s in below)
    assert cp.error  # span 11 (k8s-api) has error=true
    assert cp.model == "model-a"
    # with the default subtree scope the GenAI prompt-cache reads below count as a cache hit
    assert (
        extract(
            trace, ColdPathConfig.build(protocols="any", cache_hit=["gen_ai.usage.cache_read.input_tokens>0"])
        )
        == []
    )


def test_all_hops(trace) -> None:
    stats = ColdPathStats()
    paths = extract(trace, ColdPathConfig.build(hops="all"), stats)
    assert [p.hop_span_id for p in paths] == MCP_HOPS
    assert all(p.latency_ms == 850.0 and p.operation == "POST /mcp/tools/call" for p in paths)
    assert all(
        p.service_path == ["api-edge", "graphql-gateway", "coding-agent", "mcp-gateway"] for p in paths
    )
    assert [p.error for p in paths] == [False, True, False, False, False, False]  # 0d contains span 11
    assert stats.rejected["cache hit"] == 1  # span 33
    # with the cache test on the hop only, span 33 (3.9 s) is cold and carries model-b's tokens
    hop_scope = extract(trace, ColdPathConfig.build(hops="all", cache_scope="hop"))
    [p33] = [p for p in hop_scope if p.hop_span_id == "0000000000000033"]
    assert (p33.latency_ms, p33.input_tokens, p33.output_tokens, p33.cache_read_tokens) == (
        3900.0,
        920,
        140,
        460,
    )
    # a lower threshold admits the 500 ms trace-store hops
    low = extract(trace, ColdPathConfig.build(hops="all", threshold_ms=499))
    assert {"000000000000000f", "000000000000001e", "000000000000002d"} <= {p.hop_span_id for p in low}


def test_cache_hit_predicates(trace) -> None:
    # a predicate that matches the hop's own tag rejects it
    cfg = ColdPathConfig.build(hops="all", cache_hit=["http.route=/mcp/tools/call"], cache_scope="hop")
    assert extract(trace, cfg) == []
    cfg = ColdPathConfig.build(hops="all", cache_hit=["http.route~MCP"], cache_scope="hop")
    assert extract(trace, cfg) == []


def test_written_coldpaths_read_back_as_requests(trace, tmp_path: Path) -> None:
    from harness.common.io import write_jsonl

    paths = extract(trace, ColdPathConfig.build(hops="all", cache_scope="hop"))
    out = tmp_path / "cp.jsonl"
    write_jsonl(out, (p.model_dump(mode="json") for p in paths))
    events = list(read_requests(out))
    assert [e.source_trace_id for e in events] == [trace.trace_id] * 7
    assert [e.arrival_s for e in events] == [(p.start_us - paths[0].start_us) / 1e6 for p in paths]
    last = events[-1]
    assert (last.input_tokens, last.output_tokens, last.service) == (920, 140, "mcp-gateway")
    assert last.tags["tokens_known"] is True and events[0].tags["tokens_known"] is False


def test_scenarios_cap_and_clusters() -> None:
    def rec(i: int, path: list[str], lat: float, tok: int | None) -> ColdPathRecord:
        return ColdPathRecord(
            trace_id=f"{i:032x}",
            entry_span_id="1",
            hop_span_id=f"{i:016x}",
            start_us=i,
            latency_ms=lat,
            service_path=path,
            service=path[-1],
            operation=f"op-{path[-1]}",
            protocol="http",
            input_tokens=tok,
            output_tokens=None if tok is None else tok // 10,
        )

    recs = [rec(i, ["edge", "search"], 600 + i, None) for i in range(30)]
    recs += [rec(100 + i, ["edge", "llm"], 5000 + 10 * i, 2000 + i) for i in range(10)]
    scen, warnings = build_scenarios(recs, k=12, threshold_ms=500)
    assert scen.k == 2 and warnings and "capped to 2" in warnings[0]
    big, small = scen.classes
    assert (big.size, small.size) == (30, 10)
    assert big.weight == pytest.approx(0.75) and small.weight == pytest.approx(0.25)
    assert big.service_path == ["edge", "search"] and big.input_tokens is None
    assert small.latency_ms.min == 5000 and small.latency_ms.max == 5090
    assert small.input_tokens is not None and small.input_tokens.p50 == 2004  # nearest rank: the 5th of 10
    assert small.examples[0] == f"{100:032x}"
