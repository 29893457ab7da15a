"""Gate verdicts on crafted result sets: pass, fail, NaN, zero samples, client-bound, interrupted,
estimated peak, missing summary, missing metric, missing phase; JUnit and JSON outputs."""

from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from harness.common.errors import ExitCode
from harness.gates.baseline import Baseline, Gate
from harness.gates.judge import GateReport, decide, judge, read_report_json, write_report_json
from harness.gates.measurement import Measurement, MetricContext, rate_interval
from harness.gates.metrics import METRICS
from harness.gates.output import junit_xml, write_junit
from harness.gates.runs import RunFrame, load_result_set, load_result_sets
from harness.load.results import hit_rates, read_records
from harness.load.run_summary import WorkerShare, read_summary
from tests.gates.factory import make_records, make_run, write_run


def baseline(*gates: Gate, confidence: float = 0.95) -> Baseline:
    return Baseline(schema_version=1, name="t", confidence=confidence, gates=list(gates))


TPOT = Gate(metric="tpot_p95", threshold=4.6, rel_tolerance=0.1)  # the factory's TPOT P95 ≈ 4.6 ms
TTFT = Gate(metric="ttft_p95", threshold=90.0, rel_tolerance=0.1)  # TTFT P95 ≈ 50·e^(1.645·0.35) ≈ 89 ms
PEAK = Gate(metric="prefill_peak_bytes_max", threshold=1_500_000, rel_tolerance=0.1)


# ------------------------------------------------------------------------------- the decision rule


@pytest.mark.parametrize(
    ("lo", "hi", "direction", "verdict"),
    [
        (8.0, 9.9, "at_most", "pass"),
        (8.0, 10.0, "at_most", "pass"),  # the upper end exactly at the limit is within it
        (10.01, 12.0, "at_most", "fail"),
        (9.0, 11.0, "at_most", "inconclusive"),
        (9.0, math.inf, "at_most", "inconclusive"),  # P99 of too few samples: no upper bound
        (10.0, 12.0, "at_least", "pass"),
        (7.0, 9.99, "at_least", "fail"),
        (9.0, 11.0, "at_least", "inconclusive"),
    ],
)
def test_decide_uses_the_whole_interval(lo: float, hi: float, direction: str, verdict: str) -> None:
    m = Measurement(value=(lo + min(hi, 100)) / 2, lo=lo, hi=hi, n=1000)
    got, _ = decide(m, 10.0, direction, min_samples=100)  # type: ignore[arg-type]
    assert got == verdict


def test_decide_refuses_what_cannot_be_judged() -> None:
    limit = 10.0
    assert decide(Measurement(5, 4, 6, 50), limit, "at_most", 100)[0] == "unjudgeable"  # too few
    assert decide(Measurement(math.nan, math.nan, math.nan, 0), limit, "at_most", 1)[0] == "unjudgeable"
    assert decide(Measurement(5, 4, 6, 500, ("broken",)), limit, "at_most", 1) == ("unjudgeable", "broken")


def test_rate_interval_is_exact_clopper_pearson() -> None:
    lo, hi = rate_interval(0, 300)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 300), rel=1e-9)
    lo, hi = rate_interval(300, 300)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 300), rel=1e-9)
    lo, hi = rate_interval(50, 100)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.2033, abs=1e-3)


# -------------------------------------------------------------------------- crafted result sets


def test_pass_and_fail(tmp_path: Path) -> None:
    ok = load_result_set(make_run(tmp_path / "ok", 2000, 1))
    slow = load_result_set(make_run(tmp_path / "slow", 2000, 1, tpot_ms=5.2))
    r = judge(baseline(TPOT, TTFT), [ok])
    assert r.verdict == "pass" and r.exit_code == 0
    assert all(
        g.verdict == "pass" and g.lo is not None and g.hi is not None and g.lo <= g.hi for g in r.gates
    )
    r = judge(baseline(TPOT, TTFT), [slow])
    assert r.verdict == "fail" and r.exit_code == ExitCode.CHECK_FAILED
    failed = next(g for g in r.gates if g.id == "tpot_p95")
    assert failed.verdict == "fail" and failed.lo is not None and failed.lo > failed.limit
    assert (
        "tpot_p95 = 6." in failed.reason
        and "required ≤ 5.06 ms" in failed.reason
        and "n = 2000" in failed.reason
    )
    assert failed.delta_pct is not None and failed.delta_pct > 20


def test_gate_numbers_are_the_summary_numbers(tmp_path: Path) -> None:
    """One percentile definition: the gate's P95 is summary.json's P95; its hit rates are the summary's."""
    run = make_run(tmp_path / "r", 1500, 4, error_rate=0.02)
    rs = load_result_set(run)
    s = read_summary(run)
    ctx = MetricContext()
    for metric, column, q in (
        ("tpot_p95", "tpot_ms", 95),
        ("ttft_p99", "ttft_ms", 99),
        ("e2e_p95", "e2e_ms", 95),
    ):
        assert METRICS.get(metric).compute(rs.frame, ctx).value == s.metrics[column].percentile(q)
    rates = hit_rates(read_records(run))
    for tier, metric in (("any", "hit_rate_any"), ("HIT-L1", "hit_rate_l1"), ("prefix", "hit_rate_prefix")):
        assert METRICS.get(metric).compute(rs.frame, ctx).value == pytest.approx(rates[tier])
    assert METRICS.get("error_rate").compute(rs.frame, ctx).value == pytest.approx(s.errors / s.requests)


def test_nan_samples_make_the_metric_unjudgeable(tmp_path: Path) -> None:
    run = make_run(tmp_path / "nan", 1000, 1)
    lines = (run / "records.jsonl").read_text().splitlines()
    row = json.loads(lines[7])
    row["tpot_ms"] = math.nan
    lines[7] = json.dumps(row)  # Python's json writes the NaN literal
    assert "NaN" in lines[7]
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")
    r = judge(baseline(TPOT, TTFT), [load_result_set(run)])
    by = {g.id: g for g in r.gates}
    assert by["tpot_p95"].verdict == "unjudgeable" and "NaN" in by["tpot_p95"].reason
    assert by["ttft_p95"].verdict == "pass"  # the other metrics of the run are still judged
    assert r.verdict == "unjudgeable" and r.exit_code == ExitCode.UNJUDGEABLE == 6


def test_zero_samples(tmp_path: Path) -> None:
    run = write_run(tmp_path / "empty", [])
    assert (run / "records.jsonl").stat().st_size == 0
    r = judge(
        baseline(TPOT, Gate(metric="error_rate", threshold=0.0, abs_tolerance=0.01)), [load_result_set(run)]
    )
    assert r.verdict == "unjudgeable"
    assert all(g.verdict == "unjudgeable" and g.n == 0 and g.measured is None for g in r.gates)


def test_too_few_samples(tmp_path: Path) -> None:
    rs = load_result_set(make_run(tmp_path / "small", 60, 1))
    r = judge(baseline(TPOT), [rs])
    assert r.gates[0].verdict == "unjudgeable" and "fewer than min_samples 72" in r.gates[0].reason
    # P99 with 200 samples has no upper bound: it can never pass, and says why.
    rs = load_result_set(make_run(tmp_path / "p99", 400, 1))
    r = judge(
        baseline(Gate(metric="ttft_p99", threshold=500, min_samples=100)),
        [
            rs.__class__(
                label=rs.label,
                path=rs.path,
                summary=rs.summary,
                frame=rs.frame.take(np.arange(200)),
                problems=(),
            )
        ],
    )
    assert r.gates[0].verdict == "inconclusive" and r.gates[0].hi is None and r.verdict == "unjudgeable"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"client_cpu_pct": 97.0}, "client-bound"),
        ({"interrupted": True}, "interrupted"),
        ({"workers": [WorkerShare(worker=1, scheduled=500, recorded=120, missing=True)]}, "lost"),
    ],
)
def test_untrustworthy_runs_cannot_be_judged(tmp_path: Path, kwargs: dict[str, object], reason: str) -> None:
    rs = load_result_set(make_run(tmp_path / "r", 1000, 1, **kwargs))
    assert rs.problems and reason in " ".join(rs.problems)
    r = judge(baseline(TPOT, TTFT), [rs])
    assert r.verdict == "unjudgeable" and r.exit_code == 6
    for g in r.gates:
        assert g.verdict == "unjudgeable" and reason in g.reason
        assert g.measured is not None  # the numbers are still shown


def test_a_slow_and_client_bound_run_is_still_not_a_pass(tmp_path: Path) -> None:
    rs = load_result_set(make_run(tmp_path / "r", 1000, 1, ttft_ms=80.0, client_cpu_pct=97.0))
    assert judge(baseline(TTFT), [rs]).verdict == "unjudgeable"


# ------------------------------------------------------- client jitter widens, saturation is judged


def _frame(ttft: np.ndarray, lateness: float, queue_wait: float | None = None) -> RunFrame:
    n = ttft.size
    floats = {"ttft_ms": ttft, "lateness_ms": np.full(n, lateness)}
    if queue_wait is not None:
        floats["queue_wait_ms"] = np.full(n, queue_wait)
    return RunFrame.from_columns(n, floats=floats)


SLOW_TTFT = np.random.default_rng(11).lognormal(np.log(300.0), 0.3, 2000)
"""A P95 of hundreds of ms (≈ 490 ms)."""


def _p95_gate(limit: float) -> Gate:
    return Gate(metric="ttft_p95", threshold=limit)


def test_client_jitter_widens_a_latency_interval_by_its_own_lateness_at_the_same_quantile() -> None:
    ctx = MetricContext()
    quiet = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 0.0), ctx)
    # Every request 6.1 ms late by the client's own doing (a user was free: queue wait 0).
    own = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 6.1, 0.0), ctx)
    assert own.value == quiet.value and own.jitter == pytest.approx(6.1)
    assert own.lo == pytest.approx(quiet.lo - 6.1) and own.hi == pytest.approx(quiet.hi + 6.1)
    # Records without queue_wait_ms (older files) count all their lateness as the client's.
    assert METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 6.1), ctx).jitter == pytest.approx(6.1)
    # Lateness that was queue wait (every user busy: the target's backpressure) widens nothing.
    saturated = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 900.0, 899.0), ctx)
    assert saturated.jitter == pytest.approx(1.0) and saturated.hi == pytest.approx(quiet.hi + 1.0)
    # Never below 0.
    tiny = METRICS.get("ttft_p95").compute(_frame(np.full(500, 2.0), 6.1, 0.0), ctx)
    assert tiny.lo == 0.0 and tiny.hi == pytest.approx(8.1)


def test_only_client_timed_latencies_are_widened() -> None:
    n = 2000
    rng = np.random.default_rng(3)
    cols = {c: rng.lognormal(3.0, 0.3, n) for c in ("ttft_ms", "ttft_from_intended_ms", "tpot_ms", "e2e_ms",
                                                  "e2e_from_intended_ms", "prefill_kv_bytes", "ttfa_ms",
                                                  "reasoning_tokens")}  # fmt: skip
    cols["prompt_tokens"] = np.full(n, 100.0)
    late = {"lateness_ms": np.full(n, 6.0), "queue_wait_ms": np.zeros(n)}
    ctx = MetricContext()
    for _, m in METRICS.items():
        if m.kind != "percentile":
            continue
        widened = m.compute(RunFrame.from_columns(n, floats={**cols, **late}), ctx)
        assert widened.jitter == (6.0 if m.client_timed else 0.0), m.name
    assert {m.name for _, m in METRICS.items() if m.client_timed} >= {
        "ttft_p95", "tpot_p95", "e2e_p99", "ttft_from_intended_p95", "e2e_from_intended_p99", "cold_start_p99"
    }  # fmt: skip
    assert (
        not METRICS.get("lateness_p99").client_timed and not METRICS.get("prefill_kv_bytes_p95").client_timed
    )


def test_six_ms_of_jitter_does_not_flip_a_p95_of_hundreds_of_ms() -> None:
    ctx = MetricContext()
    quiet = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 0.0), ctx)
    limit = quiet.value * 1.1  # a 10 % tolerance: ≈ 50 ms of margin
    jittery = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 6.0, 0.0), ctx)
    assert decide(quiet, limit, "at_most", 100)[0] == "pass"
    assert decide(jittery, limit, "at_most", 100)[0] == "pass"


def test_a_regression_beyond_the_widened_interval_still_fails() -> None:
    ctx = MetricContext()
    limit = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 0.0), ctx).value * 1.1
    slower = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT * 1.3, 6.0, 0.0), ctx)
    assert slower.lo > limit and decide(slower, limit, "at_most", 100)[0] == "fail"


def test_jitter_comparable_to_the_margin_is_inconclusive() -> None:
    ctx = MetricContext()
    quiet = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 0.0), ctx)
    limit = quiet.hi + 3.0  # passes with 3 ms to spare; 6 ms of the client's own lateness eats it
    jittery = METRICS.get("ttft_p95").compute(_frame(SLOW_TTFT, 6.0, 0.0), ctx)
    assert decide(quiet, limit, "at_most", 100)[0] == "pass"
    assert decide(jittery, limit, "at_most", 100)[0] == "inconclusive"


def test_the_reason_says_the_interval_was_widened(tmp_path: Path) -> None:
    recs = [
        dataclasses.replace(r, lateness_ms=6.1, queue_wait_ms=0.0, sent_s=r.intended_s + 0.0061)
        for r in make_records(2000, 1)
    ]
    rs = load_result_set(write_run(tmp_path / "jittery", recs))
    assert not rs.problems and rs.summary is not None and not rs.summary.client_bound
    assert any(w.startswith("client jitter:") for w in rs.summary.warnings)
    g = judge(baseline(Gate(metric="ttft_p95", threshold=200.0)), [rs]).gates[0]
    assert g.verdict == "pass" and g.jitter == pytest.approx(6.1)
    assert "interval widened by the client's own p95 lateness 6.10 ms" in g.reason


def test_a_saturated_target_is_judged_and_a_proven_regression_fails(tmp_path: Path) -> None:
    """Every request waited ~2 s for a free user (the target did not keep up), 0.2 ms of the client's
    own lateness: the run is judged like any other; its from-intended latencies carry the wait."""
    recs = [
        dataclasses.replace(
            r,
            **{
                "lateness_ms": 2000.2,
                "queue_wait_ms": 2000.0,
                "ttft_from_intended_ms": (r.ttft_ms or 0.0) + 2000.2,
            },
        )
        for r in make_records(2000, 1)
    ]
    rs = load_result_set(write_run(tmp_path / "saturated", recs))
    assert rs.summary is not None and not rs.summary.client_bound and not rs.problems
    assert any(w.startswith("saturated: 2000 of 2000 requests") for w in rs.summary.warnings)
    r = judge(baseline(TTFT, Gate(metric="ttft_from_intended_p95", threshold=300.0, rel_tolerance=0.1)), [rs])
    by = {g.id: g for g in r.gates}
    assert by["ttft_p95"].verdict == "pass" and by["ttft_p95"].jitter == pytest.approx(0.2)
    assert by["ttft_from_intended_p95"].verdict == "fail"
    assert r.verdict == "fail" and r.exit_code == ExitCode.CHECK_FAILED == 1


def test_missing_summary_means_unfinished(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", make_records(500, 1), summary=False)
    rs = load_result_set(run)
    assert "did not finish" in rs.problems[0]
    assert judge(baseline(TPOT), [rs]).verdict == "unjudgeable"


def test_summary_disagreeing_with_records_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", 500, 1)
    lines = (run / "records.jsonl").read_text().splitlines()
    (run / "records.jsonl").write_text("\n".join(lines[:400]) + "\n")
    rs = load_result_set(run)
    assert any("counts 500 requests" in p for p in rs.problems)


def test_estimated_peak_where_measured_is_required(tmp_path: Path) -> None:
    est = load_result_set(make_run(tmp_path / "est", 600, 1, peak_measured=False))
    measured = load_result_set(make_run(tmp_path / "gpu", 600, 1, peak_measured=True))
    r = judge(baseline(PEAK), [est])
    assert r.gates[0].verdict == "unjudgeable" and "estimated" in r.gates[0].reason
    assert judge(baseline(PEAK), [measured]).verdict == "pass"
    relaxed = PEAK.model_copy(update={"require_measured": False})
    assert judge(baseline(relaxed), [est]).verdict == "pass"
    # Response-cache hits report a 0-byte unmeasured peak (no prefill ran): they do not count.
    assert (measured.frame.col("prefill_peak_bytes") == 0).any()


def test_missing_metric_and_empty_selection(tmp_path: Path) -> None:
    recs = [
        dataclasses.replace(
            r, **{"prefill_kv_bytes": None, "prefill_peak_bytes": None, "peak_measured": None}
        )
        for r in make_records(500, 1)
    ]
    rs = load_result_set(write_run(tmp_path / "vllm", recs))
    kv = Gate(metric="prefill_kv_bytes_per_token_p95", threshold=2048)
    r = judge(baseline(kv, PEAK, Gate(metric="ttft_p95", threshold=90, scenario="nope")), [rs])
    assert [g.verdict for g in r.gates] == ["unjudgeable"] * 3
    assert "no samples" in r.gates[0].reason and "no records with scenario='nope'" in r.gates[2].reason


def test_phases_pick_their_result_set(tmp_path: Path) -> None:
    # P99 of 800 cold samples: ~460 ms, its interval's upper end (~590 ms) well under the seed's 850 ms.
    cold = make_run(tmp_path / "c", 800, 1, ttft_ms=200, hit_l1=0, hit_l2=0, hit_l3=0, prefix_hit=0.0)
    warm = make_run(tmp_path / "w", 800, 2, hit_l1=0.7, hit_l2=0.1, hit_l3=0.05, prefix_hit=0.9)
    seed = baseline(
        Gate(metric="cold_start_p99", threshold=850),
        Gate(metric="warm_rate", threshold=0.92),
        Gate(metric="ttft_p95", threshold=90, rel_tolerance=0.1, phase="warm"),
    )
    sets = load_result_sets([f"cold={cold}", f"warm={warm}"])
    r = judge(seed, sets)
    assert [(g.id, g.label, g.verdict) for g in r.gates] == [
        ("cold_start_p99", "cold", "pass"),
        ("warm_rate", "warm", "pass"),
        ("ttft_p95", "warm", "pass"),
    ]
    # Only one run given: the cold-start gate has nothing to judge, and the gate fails closed.
    r = judge(seed, load_result_sets([f"warm={warm}"]))
    assert r.gates[0].verdict == "unjudgeable" and "cold=DIR" in r.gates[0].reason
    assert r.verdict == "unjudgeable"
    # A gate without a phase applies to every run given.
    r = judge(baseline(TTFT), sets)
    assert [g.label for g in r.gates] == ["cold", "warm"]
    assert [g.verdict for g in r.gates] == ["fail", "pass"]


def test_fail_outranks_cannot_judge(tmp_path: Path) -> None:
    slow = load_result_set(make_run(tmp_path / "slow", 1000, 1, tpot_ms=6.0))
    r = judge(baseline(TPOT, Gate(metric="ttft_p99", threshold=120, min_samples=5000)), [slow])
    assert {g.verdict for g in r.gates} == {"fail", "unjudgeable"}
    assert r.verdict == "fail" and r.exit_code == 1


def test_stage_selector(tmp_path: Path) -> None:
    recs = make_records(1200, 1, stages=("stage-1", "stage-2"))
    recs = [
        dataclasses.replace(r, tpot_ms=r.tpot_ms * 2) if r.stage == "stage-2" and r.tpot_ms else r
        for r in recs
    ]
    rs = load_result_set(write_run(tmp_path / "ladder", recs))
    r = judge(
        baseline(TPOT.model_copy(update={"stage": "stage-1"}), TPOT.model_copy(update={"stage": "stage-2"})),
        [rs],
    )
    assert [g.verdict for g in r.gates] == ["pass", "fail"]
    assert [g.id for g in r.gates] == ["tpot_p95[stage=stage-1]", "tpot_p95[stage=stage-2]"]


# ----------------------------------------------------------------------------------- outputs


def _mixed_report(tmp_path: Path) -> GateReport:
    cold = make_run(tmp_path / "cold", 800, 1, ttft_ms=300, hit_l1=0, hit_l2=0, hit_l3=0, prefix_hit=0.0)
    warm = make_run(tmp_path / "warm", 800, 2, tpot_ms=6.0, peak_measured=False)
    b = baseline(
        TPOT.model_copy(update={"phase": "warm"}),
        TTFT.model_copy(update={"phase": "warm"}),
        PEAK.model_copy(update={"phase": "warm"}),
        Gate(metric="cold_start_p99", threshold=850),
        Gate(metric="hit_rate_any", threshold=0.4, abs_tolerance=0.05, phase="warm"),
        Gate(metric="error_rate", threshold=0.0, abs_tolerance=0.02),
    )
    return judge(b, load_result_sets([f"cold={cold}", f"warm={warm}"]))


def test_junit_parses_and_names_every_metric(tmp_path: Path) -> None:
    report = _mixed_report(tmp_path)
    out = tmp_path / "junit.xml"
    write_junit(out, report)
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    cases = root.findall("./testsuite/testcase")
    assert sorted((c.get("classname"), c.get("name")) for c in cases) == sorted(
        (f"gate.{g.label}", g.id) for g in report.gates
    )
    assert {c.get("name") for c in cases} == {g.id for g in report.gates}
    assert int(root.get("tests", "0")) == len(report.gates) == len(cases)
    tpot = next(c for c in cases if c.get("name") == "tpot_p95")
    failure = tpot.find("failure")
    assert failure is not None and failure.get("type") == "regression"
    msg = failure.get("message", "")
    assert "tpot_p95 =" in msg and "required ≤" in msg and "interval" in msg and "n = 800" in msg
    peak = next(c for c in cases if c.get("name") == "prefill_peak_bytes_max")
    err = peak.find("error")
    assert err is not None and err.get("type") == "unjudgeable" and "estimated" in err.get("message", "")
    assert int(root.get("failures", "0")) == sum(g.verdict == "fail" for g in report.gates)
    assert int(root.get("errors", "0")) == sum(
        g.verdict in ("unjudgeable", "inconclusive") for g in report.gates
    )
    passed = [c for c in cases if c.find("failure") is None and c.find("error") is None]
    assert passed and all((c.findtext("system-out") or "").startswith("pass:") for c in passed)


def test_junit_escapes_user_text() -> None:
    rep = GateReport.model_validate(
        {
            "verdict": "fail",
            "exit_code": 1,
            "baseline": {"name": 'a"<b>&'},
            "confidence": 0.95,
            "results": [],
            "gates": [
                {
                    "id": 'ttft_p95[scenario=<x>&"y"]',
                    "metric": "ttft_p95",
                    "label": "w",
                    "unit": "ms",
                    "direction": "at_most",
                    "baseline": 1.0,
                    "limit": 1.1,
                    "measured": 2.0,
                    "delta": 1.0,
                    "delta_pct": 100.0,
                    "lo": 1.5,
                    "hi": 2.5,
                    "confidence": 0.95,
                    "n": 100,
                    "min_samples": 72,
                    "verdict": "fail",
                    "reason": "fail: <&>",
                    "why": "<&>",
                }
            ],
        }
    )
    text = ET.tostring(junit_xml(rep), encoding="unicode")
    case = ET.fromstring(text).find("./testsuite/testcase")
    assert case is not None and case.get("name") == 'ttft_p95[scenario=<x>&"y"]'


def test_json_verdict_round_trips(tmp_path: Path) -> None:
    report = _mixed_report(tmp_path)
    write_report_json(tmp_path / "v.json", report)
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["verdict"] == report.verdict == "fail" and data["exit_code"] == 1
    assert {g["verdict"] for g in data["gates"]} >= {"pass", "fail", "unjudgeable"}
    assert read_report_json(tmp_path / "v.json") == report


def test_gate_runs_api_for_harness_run(tmp_path: Path) -> None:
    """The call `harness run --gate FILE` makes: labelled dirs in, files written, verdict returned."""
    from harness.gates import gate_runs

    cold = make_run(tmp_path / "c", 800, 1, ttft_ms=200, hit_l1=0, hit_l2=0, hit_l3=0, prefix_hit=0.0)
    warm = make_run(tmp_path / "w", 800, 2, hit_l1=0.7, hit_l2=0.1, hit_l3=0.05, prefix_hit=0.9)
    base = tmp_path / "b.yaml"
    base.write_text(
        "schema_version: 1\ngates:\n  - {metric: cold_start_p99, threshold: 850}\n"
        "  - {metric: warm_rate, threshold: 0.92}\n"
        "  - {metric: tpot_p95, threshold: 4.6, rel_tolerance: 10%}\n"
    )
    report = gate_runs(
        {"cold": cold, "warm": warm}, base, junit=tmp_path / "j.xml", json_path=tmp_path / "v.json"
    )
    assert report.exit_code == 0, report.headline()
    assert [(g.id, g.label) for g in report.gates] == [
        ("cold_start_p99", "cold"),
        ("warm_rate", "warm"),
        ("tpot_p95", "cold"),
        ("tpot_p95", "warm"),
    ]
    assert report.baseline.sha256 is not None and len(report.baseline.sha256) == 64
    assert read_report_json(tmp_path / "v.json") == report
    assert ET.parse(tmp_path / "j.xml").getroot().get("tests") == "4"
