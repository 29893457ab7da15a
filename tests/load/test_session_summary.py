"""Agent sessions as units: outcomes per session and the run's totals in summary.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.load.results import RequestRecord
from harness.load.run_summary import TargetInfo, read_summary, summarize, write_summary
from harness.load.session_summary import agent_sessions, session_outcomes


def call(session: str, k: int, ready: float, sent: float, e2e: float | None, **kw: Any) -> RequestRecord:
    """Call ``k`` of ``session``, ready at ``ready`` and sent at ``sent`` (s), answered in ``e2e`` ms."""
    fields: dict[str, Any] = {"status": 200, "depth": 0 if k == 1 else 1, **kw}
    return RequestRecord(
        id=f"{session}-{k}", stage="replay", intended_s=ready, sent_s=sent, lateness_ms=0.0,
        e2e_ms=e2e, session_id=session, call=k, ready_s=ready, **fields,
    )  # fmt: skip


def records() -> list[RequestRecord]:
    """Session ``a`` (starts at 10 s, all ok: calls 2 and 3 wait for 1) written before session ``b``
    (starts at 5 s: call 2 fails, so call 3, which waits for it, is blocked), and two records of no
    graph (a chat turn, a plain request)."""
    return [
        call("a", 1, 10.0, 10.001, 500.0, prompt_tokens=100, cached_tokens=0),
        call("a", 3, 10.501, 10.502, 1000.0, prompt_tokens=150, cached_tokens=100),  # ends last: 11.502
        call("a", 2, 10.501, 10.602, 300.0, prompt_tokens=200, cached_tokens=100),
        RequestRecord(
            id="chat",
            stage="replay",
            intended_s=1.0,
            sent_s=1.0,
            lateness_ms=0.0,
            status=200,
            e2e_ms=99_000.0,
            session_id="chat-1",
            turn=1,
        ),
        call("b", 1, 5.0, 5.0, 200.0, prompt_tokens=100, cached_tokens=50),
        call("b", 2, 5.2, 5.3, 50.0, status=500, error="HTTP 500"),
        call("b", 3, 5.35, 5.35, None, status=0, error="not sent: call 2 failed", blocked_by=2, depth=2),
        RequestRecord(id="plain", stage="replay", intended_s=2.0, sent_s=2.0, lateness_ms=0.0, status=200),
    ]


def test_outcomes_per_session_in_order_of_start() -> None:
    b, a = session_outcomes(records())
    assert (b.session_id, a.session_id) == ("b", "a")  # b started first, though written last
    assert a.calls == 3 and a.failed == 0 and a.blocked == [] and a.ok
    assert a.start_s == 10.0 and a.makespan_ms == pytest.approx(1502.0)  # the parallel branch ends last
    assert (a.prompt_tokens, a.cached_tokens) == (450, 200)
    # b: a failed call and its blocked dependant both fail the session; the blocked one ends when known.
    assert b.calls == 3 and b.failed == 2 and b.blocked == [3] and not b.ok
    assert b.start_s == 5.0 and b.makespan_ms == pytest.approx(350.0)
    assert (b.prompt_tokens, b.cached_tokens) == (100, 50)  # the failed calls reported none


def test_agent_sessions_totals() -> None:
    s = agent_sessions(records())
    assert s is not None
    assert (s.sessions, s.calls, s.succeeded, s.blocked_calls) == (2, 6, 1, 1)
    assert s.success_rate == 0.5
    assert s.makespan_ms.n == 2 and s.makespan_ms.max == pytest.approx(1502.0)
    assert s.makespan_ms.p50 == pytest.approx(350.0)  # the project's nearest rank
    assert s.prefix_hit_rate == pytest.approx(250 / 550)  # token weighted, over calls reporting both
    assert s.slowest is not None and s.slowest.session_id == "a"
    assert s.failed_sessions == ["b"]


def test_no_graph_records_no_sessions() -> None:
    plain = [r for r in records() if r.call is None]
    assert agent_sessions(plain) is None and session_outcomes(plain) == []
    assert summarize(plain, started_at="t", duration_s=1.0, target=TargetInfo(url="u")).agent_sessions is None


def test_a_broken_time_leaves_the_session_out_of_the_makespans() -> None:
    rs = [call("x", 1, 0.0, 0.0, float("nan")), call("y", 1, 1.0, 1.0, 40.0)]
    s = agent_sessions(rs)
    assert s is not None and s.sessions == 2 and s.makespan_ms.n == 1
    assert s.slowest is not None and s.slowest.session_id == "y"


def test_summary_json_round_trip_and_older_files(tmp_path: Path) -> None:
    summary = summarize(records(), started_at="2026-01-01T00:00:00+00:00", duration_s=7.0,
                        target=TargetInfo(url="http://t"))  # fmt: skip
    assert summary.agent_sessions == agent_sessions(records())
    path = write_summary(tmp_path, summary)
    back = read_summary(tmp_path)
    assert back == summary and back.agent_sessions is not None
    assert back.agent_sessions.slowest is not None and back.agent_sessions.slowest.ok
    # A summary.json from before the field reads as a run without agent sessions.
    raw = json.loads(path.read_text())
    del raw["agent_sessions"]
    path.write_text(json.dumps(raw))
    assert read_summary(tmp_path).agent_sessions is None


def test_the_critical_chain_and_its_time_against_the_trace() -> None:
    """Session ``a``: call 1 ends at 10.501 s, when calls 2 and 3 become ready; call 3 ends last, so
    the chain is 1 → 3 and the target took 500 + 1000 ms on it where the trace took 400 + 600 ms."""
    recs = [
        call("a", 1, 10.0, 10.001, 500.0, recorded_ms=400.0),
        call("a", 3, 10.501, 10.502, 1000.0, recorded_ms=600.0),
        call("a", 2, 10.501, 10.602, 300.0, recorded_ms=50.0),
        call("c", 1, 1.0, 1.0, 100.0),  # no trace durations: no ratio
    ]
    a, c = sorted(session_outcomes(recs), key=lambda o: o.session_id)
    assert a.critical_path == [1, 3]
    assert a.critical_llm_ms == pytest.approx(1500.0) and a.recorded_llm_ms == pytest.approx(1000.0)
    assert c.critical_path == [1] and c.critical_llm_ms == pytest.approx(100.0) and c.recorded_llm_ms is None
    s = agent_sessions(recs)
    assert s is not None and s.critical_vs_recorded is not None
    assert s.critical_vs_recorded.n == 1 and s.critical_vs_recorded.p50 == pytest.approx(1.5)
    # A record whose ready_s matches no end (a converted file) keeps the chain it can follow.
    odd = [call("d", 1, 0.0, 0.0, 100.0), call("d", 2, 0.5, 0.5, 100.0)]
    assert session_outcomes(odd)[0].critical_path == [2]
