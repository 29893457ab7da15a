"""Gates over agent sessions: makespan P95 and success rate, one sample per session."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from harness.gates.ab import ab_metric_names
from harness.gates.baseline import Baseline, Gate, precision_targets
from harness.gates.judge import GateResult, judge
from harness.gates.runs import ResultSet, RunFrame, load_result_set, pooled_set
from harness.gates.slo import slo_metrics
from harness.gates.update import baseline_from_results
from harness.load.results import RequestRecord
from harness.load.session_summary import session_outcomes
from tests.gates.factory import make_run, write_run

SESSION_GATES = ("session_makespan_p95", "session_success_rate")


def session_records(
    sessions: int, seed: int, *, slow: float = 1.0, fail_share: float = 0.0
) -> list[RequestRecord]:
    """``sessions`` agent sessions of three calls: call 1, then calls 2 and 3 in parallel after it.
    A failed call 1 (``fail_share`` of sessions) blocks both; ``slow`` scales every answer's time."""
    rng = np.random.default_rng(seed)
    out: list[RequestRecord] = []

    def rec(sid: str, k: int, ready: float, sent: float | None = None, **kw: object) -> RequestRecord:
        sent = ready if sent is None else sent
        return RequestRecord.parse({
            "id": f"{sid}-{k}", "stage": "replay", "scenario": "agent", "intended_s": sent, "sent_s": sent,
            "lateness_ms": 0.0, "status": 200, "session_id": sid, "call": k, "depth": min(k - 1, 1),
            "ready_s": ready, **kw,
        })  # fmt: skip

    for s in range(sessions):
        sid, start = f"s{s}", s * 0.5
        if rng.random() < fail_share:
            out.append(rec(sid, 1, start, status=500, error="HTTP 500", e2e_ms=20.0))
            for k in (2, 3):
                out.append(rec(sid, k, start + 0.02, status=0, error=f"not sent: call 1 of session {sid} "
                               "failed", blocked_by=1))  # fmt: skip
            continue
        first = slow * 400.0 * float(rng.lognormal(0.0, 0.3))
        out.append(rec(sid, 1, start, e2e_ms=first, prompt_tokens=100, cached_tokens=0))
        ready = start + first / 1000
        for k in (2, 3):
            e2e = slow * 600.0 * float(rng.lognormal(0.0, 0.3))
            out.append(rec(sid, k, ready, sent=ready + 0.05, e2e_ms=e2e, prompt_tokens=300, cached_tokens=90))
    return out


def session_run(path: Path, sessions: int = 400, seed: int = 0, **kw: float) -> ResultSet:
    return load_result_set(write_run(path, session_records(sessions, seed, **kw)))


def session_gates(report_gates: list[GateResult]) -> dict[str, GateResult]:
    return {g.metric: g for g in report_gates if g.metric in SESSION_GATES}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """The baseline ``harness baseline update`` writes from a run of 400 agent sessions."""
    rs = session_run(tmp_path_factory.mktemp("base") / "run", seed=0)
    b, comments, _ = baseline_from_results([rs], headroom=0.1)
    assert {g.metric for g in b.gates} >= set(SESSION_GATES)
    # Their notes count sessions, not requests.
    for i, g in enumerate(b.gates):
        if g.metric in SESSION_GATES:
            assert "sessions" in comments[i] and "requests" not in comments[i], comments[i]
    return b


def test_the_frame_holds_one_row_per_session_from_the_summary_s_outcomes(tmp_path: Path) -> None:
    records = session_records(50, 3, fail_share=0.2)
    frame = RunFrame.from_records(records)
    makespans = frame.col("session_makespan_ms")
    outcomes = session_outcomes(records)
    assert int((~np.isnan(makespans)).sum()) == len(outcomes) == 50
    assert sorted(makespans[~np.isnan(makespans)]) == pytest.approx(sorted(o.makespan_ms for o in outcomes))
    ok = frame.col("session_ok")
    assert int(np.nansum(ok)) == sum(o.ok for o in outcomes)
    # A selection or a pool keeps whole sessions (their one row).
    assert int((~np.isnan(frame.select(scenario="agent").col("session_ok"))).sum()) == 50
    pooled = pooled_set([load_result_set(write_run(tmp_path / "r", records))] * 2, "both")
    assert int((~np.isnan(pooled.frame.col("session_ok"))).sum()) == 100


def test_equal_runs_pass(tmp_path: Path, base: Baseline) -> None:
    report = judge(base, [session_run(tmp_path / "again", seed=1)])
    gates = session_gates(report.gates)
    assert {m: g.verdict for m, g in gates.items()} == dict.fromkeys(SESSION_GATES, "pass")
    assert gates["session_makespan_p95"].n == 400 and gates["session_success_rate"].n == 400


def test_a_slower_session_makespan_fails(tmp_path: Path, base: Baseline) -> None:
    report = judge(base, [session_run(tmp_path / "slow", seed=1, slow=1.5)])
    gates = session_gates(report.gates)
    assert gates["session_makespan_p95"].verdict == "fail", gates["session_makespan_p95"].reason
    assert gates["session_success_rate"].verdict == "pass"
    assert report.verdict == "fail"


def test_a_drop_in_session_success_fails(tmp_path: Path, base: Baseline) -> None:
    report = judge(base, [session_run(tmp_path / "failing", seed=1, fail_share=0.3)])
    rate = session_gates(report.gates)["session_success_rate"]
    assert rate.verdict == "fail" and rate.measured is not None and rate.measured < 0.8
    assert "successful sessions of 400" in rate.reason


def test_a_hand_written_success_gate_is_judged_by_its_exact_interval(tmp_path: Path) -> None:
    b = Baseline(schema_version=1, gates=[Gate(metric="session_success_rate", threshold=0.99)])
    ok = judge(b, [session_run(tmp_path / "ok", sessions=400, seed=2)])
    # 400 of 400: the Clopper–Pearson interval's low end (0.025^(1/400) ≈ 0.9908) is within 0.99.
    assert ok.gates[0].verdict == "pass" and ok.gates[0].lo == pytest.approx(0.025 ** (1 / 400))
    bad = judge(b, [session_run(tmp_path / "bad", sessions=400, seed=2, fail_share=0.1)])
    assert bad.gates[0].verdict == "fail"


def test_runs_without_agent_sessions_do_not_gate_them(tmp_path: Path, base: Baseline) -> None:
    plain = load_result_set(make_run(tmp_path / "plain", 600, 1))
    assert np.isnan(plain.frame.col("session_makespan_ms")).all()
    # baseline update: no data, so no gate, listed as skipped like any metric without samples.
    b, _, skipped = baseline_from_results([plain], headroom=0.1)
    assert not {g.metric for g in b.gates} & set(SESSION_GATES)
    assert {f"plain: {m}: no samples" for m in SESSION_GATES} <= set(skipped)
    # A baseline that has them cannot judge them on such a run (fail closed: no samples).
    gates = session_gates(judge(base, [plain]).gates)
    assert {g.verdict for g in gates.values()} == {"unjudgeable"}
    assert all("no samples" in g.why for g in gates.values())


def test_a_broken_time_is_refused_not_dropped() -> None:
    records = session_records(100, 4)
    records[0].e2e_ms = math.inf  # as read from an `Infinity` literal in the file
    frame = RunFrame.from_records(records)
    assert frame.bad("session_makespan_ms").sum() == 1
    b = Baseline(schema_version=1, gates=[Gate(metric="session_makespan_p95", threshold=5000.0)])
    rs = ResultSet(label="r", path=Path("sim"), summary=None, frame=frame)
    result = judge(b, [rs]).gates[0]
    assert result.verdict == "unjudgeable" and "NaN or infinite" in result.why


def test_session_metrics_are_no_slo_precision_or_ab_terms(base: Baseline) -> None:
    # Their samples are sessions, not record fields: a probe, --until-precision and an A/B pairing
    # request by request cannot take them.
    assert not set(SESSION_GATES) & (set(slo_metrics()) | set(ab_metric_names()))
    assert not [column for column, _ in precision_targets(base) if column.startswith("session")]
