"""The gate metrics of thinking and answering: ``ttfa_p95`` and ``reasoning_tokens_p50`` from records."""

from __future__ import annotations

import pytest

from harness.common.stats import percentile
from harness.gates.measurement import MetricContext
from harness.gates.metrics import METRICS, format_value
from harness.gates.runs import RunFrame
from harness.load.results import RequestRecord


def _records() -> list[RequestRecord]:
    out = []
    for i in range(100):
        r = RequestRecord(id=f"r{i}", stage="s", intended_s=i, sent_s=i, lateness_ms=0.0, status=200)
        r.ttft_ms, r.ttfa_ms = 50.0, 400.0 + i  # the answer comes after i thinking gaps
        r.reasoning_tokens = 30 + i % 21  # 30 … 50
        out.append(r)
    return out


def test_ttfa_p95_and_reasoning_tokens_p50_come_from_the_records() -> None:
    frame = RunFrame.from_records(_records())
    ttfa = METRICS.get("ttfa_p95").compute(frame, MetricContext())
    assert (ttfa.value, ttfa.n) == (494.0, 100) and ttfa.lo <= 494.0 <= ttfa.hi
    think = METRICS.get("reasoning_tokens_p50")
    m = think.compute(frame, MetricContext())
    want = percentile([30 + i % 21 for i in range(100)], 50)  # the project's one percentile
    assert m.n == 100 and m.value == want == 39.0 and think.direction == "at_most"
    assert format_value(m.value, think.unit) == "39.00 tokens"


def test_a_run_without_answers_has_no_ttfa_to_judge() -> None:
    recs = _records()
    for r in recs:
        r.ttfa_ms = None
    m = METRICS.get("ttfa_p95").compute(RunFrame.from_records(recs), MetricContext())
    assert m.n == 0 and m.value != m.value  # NaN: nothing to judge


@pytest.mark.parametrize("name", ["ttfa_p95", "reasoning_tokens_p50"])
def test_listed_with_a_column(name: str) -> None:
    assert METRICS.get(name).column in ("ttfa_ms", "reasoning_tokens")
