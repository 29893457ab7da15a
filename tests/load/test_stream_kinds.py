"""Reasoning and tool-call streams measured truthfully: real headless Locust runs against the ground-truth
SSE server (``tests/load/sse_server.py``), which logs when it wrote each token.

The truth is the server's schedule: its first token 50 ms after a request arrives, one token every
10 ms after. A stream of 40 thinking tokens then 20 answer tokens therefore has its first token at
50 ms (TTFT), its first answer token at 50 + 40 × 10 = 450 ms (TTFA), 40 thinking tokens and every
gap 10 ms; a stream of 20 tool-call argument fragments has its first token at 50 ms. The client is
compared with what the server logged doing (its own first-write and gap times, which a busy machine
may stretch), within 3 ms for TTFT / TTFA plus the client's own lateness, and 1 ms for the ITL
median: the transport (loopback, one line a token) and the client's wake-up, nothing systematic.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.stats import percentile
from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from tests.load.sse_server import Behaviour, Served, SSEServer

pytestmark = pytest.mark.slow
TIMEOUT_S = 180
FIRST_S, GAP_S = 0.050, 0.010


def _run(tmp_path: Path, corpus: Path, behaviour: Behaviour, name: str) -> tuple[list[Served], Path]:
    with SSEServer(behaviour) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=4, duration=3, results_dir=tmp_path / name,
                        start_delay=1.0, concurrency=8, api="chat")  # fmt: skip
        assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
        return srv.requests, tmp_path / name


def _server_ms(served: list[Served], token: int) -> float:
    """The server's own median time from a request's arrival to its ``token``-th write (0-based)."""
    return percentile([(x.writes[token] - x.received) * 1000.0 for x in served], 50)


@pytest.mark.parametrize("usage", ["continuous", "final"])
def test_forty_thinking_then_twenty_answer_tokens(tmp_path: Path, corpus: Path, usage: str) -> None:
    b = Behaviour(first_token_s=FIRST_S, gap_s=GAP_S, tokens=60, reasoning_tokens=40, usage=usage)
    served, out = _run(tmp_path, corpus, b, usage)
    s = read_summary(out)
    assert s.requests == 12 == len(served) and s.errors == 0
    assert s.token_counting == {"usage" if usage == "continuous" else "final-usage": 12}
    late = s.metrics["lateness_ms"].p90 or 0.0
    ttft, ttfa = s.metrics["ttft_ms"], s.metrics["ttfa_ms"]
    assert ttft.n == ttfa.n == 12 and ttft.p50 is not None and ttfa.p50 is not None
    # The truth: 50 ms and 450 ms; the server's log says how late it itself was on this machine.
    assert abs(ttft.p50 - _server_ms(served, 0)) <= 3.0 + late, (ttft.p50, _server_ms(served, 0))
    assert abs(ttfa.p50 - _server_ms(served, 40)) <= 3.0 + late, (ttfa.p50, _server_ms(served, 40))
    assert abs(ttft.p50 - 50.0) <= 3.0 + late + max(0.0, _server_ms(served, 0) - 50.0)
    assert abs(ttfa.p50 - 450.0) <= 3.0 + late + max(0.0, _server_ms(served, 40) - 450.0)
    server_gap = percentile([g for x in served for g in x.gaps_ms], 50)
    for name, n in (("itl_ms", 59), ("itl_reasoning_ms", 39), ("itl_answer_ms", 20)):
        d = s.metrics[name]
        assert d.n == 12 * n and d.p50 is not None, name
        assert abs(d.p50 - server_gap) <= 1.0 and abs(d.p50 - 10.0) <= 1.0 + max(0.0, server_gap - 10.0), name
    tpot = s.metrics["tpot_ms"].p50
    assert tpot is not None and abs(tpot - 10.0) <= 1.0 + max(0.0, server_gap - 10.0)
    recs = list(read_records(out))
    assert {(r.completion_tokens, r.reasoning_tokens, r.reasoning_source) for r in recs} == {
        (60, 40, "counted")
    }
    assert all(r.itl_reasoning == [(0, 39)] for r in recs)
    assert s.metrics["reasoning_tokens"].p50 == 40 and s.reasoning_counting == {"counted": 12}
    assert not any(w.startswith("unread") for w in s.warnings)


def test_twenty_tool_call_argument_fragments(tmp_path: Path, corpus: Path) -> None:
    b = Behaviour(first_token_s=FIRST_S, gap_s=GAP_S, tokens=20, tool_call="search", usage="final")
    served, out = _run(tmp_path, corpus, b, "tool")
    s = read_summary(out)
    assert s.requests == 12 and s.errors == 0 and s.token_counting == {"final-usage": 12}
    late = s.metrics["lateness_ms"].p90 or 0.0
    ttft, ttfa, itl = s.metrics["ttft_ms"], s.metrics["ttfa_ms"], s.metrics["itl_ms"]
    assert ttft.n == ttfa.n == 12 and itl.n == 12 * 19 and s.metrics["tpot_ms"].n == 12
    assert ttft.p50 == ttfa.p50 and ttft.p50 is not None
    assert abs(ttft.p50 - _server_ms(served, 0)) <= 3.0 + late
    server_gap = percentile([g for x in served for g in x.gaps_ms], 50)
    assert itl.p50 is not None and abs(itl.p50 - server_gap) <= 1.0
    recs = list(read_records(out))
    assert {(r.completion_tokens, r.tool_calls, tuple(r.tool_names), r.reasoning_tokens) for r in recs} == {
        (20, 1, ("search",), 0)
    }
    assert s.tool_calls is not None and (s.tool_calls.requests, s.tool_calls.calls) == (12, 12)
    assert s.tool_calls.names == {"search": 12}


def test_think_inline_in_content_is_counted_as_content(tmp_path: Path, corpus: Path) -> None:
    """A server without a reasoning parser sends ``<think>…</think>`` as content and counts it so: the
    client does too (its first token is the first answer token, and no thinking is counted)."""
    b = Behaviour(first_token_s=FIRST_S, gap_s=GAP_S, tokens=30, reasoning_tokens=20, think_inline=True)
    served, out = _run(tmp_path, corpus, b, "inline")
    s = read_summary(out)
    assert s.errors == 0 and s.requests == 12
    recs = list(read_records(out))
    assert all(r.ttfa_ms == r.ttft_ms and r.reasoning_tokens == 0 and r.completion_tokens == 30 for r in recs)
    assert all(r.itl_reasoning == [] for r in recs) and s.reasoning_counting == {}
    assert all(x.reply.startswith(" <think>") or x.reply.startswith("<think>") for x in served)
