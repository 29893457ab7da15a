"""Calibration's rule on synthetic runs (every run passes it, a rerun passes, a 2× slower decode fails);
the runs themselves are tests/experiments/test_calibrate_runs.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.errors import CannotJudge, ConfigError
from harness.common.fingerprint import Environment, Hardware, Software
from harness.gates.baseline import Baseline, Gate, read_baseline, write_baseline
from harness.gates.calibration import calibrate, range_factor
from harness.gates.judge import judge
from harness.gates.policy import GatePolicy
from harness.gates.runs import ResultSet, load_result_sets
from harness.load.run_summary import Recipe
from tests.gates.factory import make_run

ENV = Environment(
    hardware=Hardware(cpu_model="AMD EPYC 7B13", cpu_count=2), software=Software(harness="0.1.0")
)
RECIPE = Recipe(rate=4.0, max_tokens_cap=16)


def _paired(path: Path, seed: int, drift: float = 1.0, decode: float = 1.0, **kw: object) -> list[ResultSet]:
    common = {"environment": ENV, "recipe": RECIPE, **kw}
    drift_tpot = drift * decode
    cold = make_run(
        path / "cold", 1000, seed, ttft_ms=50 * drift, tpot_ms=4 * drift_tpot, prefix_hit=0.0, **common
    )
    warm = make_run(
        path / "warm", 1000, seed + 1, ttft_ms=20 * drift, tpot_ms=4 * drift_tpot, hit_l1=0.8, **common
    )
    return load_result_sets([f"cold={cold}", f"warm={warm}"])


def test_the_rule_on_runs_that_drift(tmp_path: Path) -> None:
    drifts = (1.0, 1.06, 0.97)
    runs = [_paired(tmp_path / f"cal-{k}", 10 * k, d) for k, d in enumerate(drifts, start=1)]
    # The runs' rule alone (drift room off: tested below).
    cal = calibrate(
        runs, headroom=0.1, name="t", run_names=["cal-1", "cal-2", "cal-3"], command="harness run …",
        policy=GatePolicy(drift_room=False),
    )  # fmt: skip
    assert cal.not_passed == []  # every calibration run passes what was written
    gates = {(g.metric, g.effective_phase): g for g in cal.baseline.gates}
    tpot = gates[("tpot_p95", "cold")]
    values = [judge(cal.baseline, sets).gates for sets in runs]
    measured = [next(g for g in gs if g.id == "tpot_p95" and g.label == "cold") for gs in values]
    # threshold: the worst run; the limit covers the runs' range (the count test needs no interval of a
    # rerun to fit under it: it fails only what a rerun's count proves beyond the limit)
    assert tpot.threshold == pytest.approx(max(m.measured or 0 for m in measured), rel=1e-4)
    spread = max(m.measured or 0 for m in measured) - min(m.measured or 0 for m in measured)
    assert tpot.tolerance == pytest.approx(max(range_factor(3) * spread, 0.1 * tpot.threshold), rel=1e-2)
    # The regression it must catch, and the share of requests above the limit under it, from the runs.
    assert tpot.detect == 2.0 and tpot.detect_share is not None and tpot.detect_share > 0.05
    assert all(v.power is not None and v.power >= 0.95 for v in measured)
    # An unchanged rerun (within the drift seen) passes; a 2× slower decode fails.
    assert judge(cal.baseline, _paired(tmp_path / "rerun", 99, 1.03)).verdict == "pass"
    slow = judge(cal.baseline, _paired(tmp_path / "slow", 77, 1.0, decode=2.0))
    assert {g.verdict for g in slow.gates if g.metric == "tpot_p95"} == {"fail"} and slow.verdict == "fail"
    # Header, fingerprint, comments with the spread
    assert cal.baseline.fingerprint is not None and cal.baseline.fingerprint.environment == ENV
    assert cal.header[0].startswith(
        "Calibrated by `harness baseline calibrate` on AMD EPYC 7B13 ×2 CPUs, no GPU"
    )
    assert any("over 3 runs" in c and "spread" in c for c in cal.comments.values())
    assert not any(s.startswith("cold: tpot_p95") for s in cal.skipped)


def _measured(baseline: Baseline, sets: list[ResultSet], gate: Gate) -> float:
    return next(r.measured for r in judge(baseline, sets).gates if r.id == gate.id and r.measured is not None)


def test_drift_room_moves_latency_limits_out_as_far_as_catching_2x_allows(tmp_path: Path) -> None:
    """Three runs close together, then the machine drifts 25 % slower: the spread-only limits fail the
    unchanged target, the roomy ones pass it and still fail a 2× slower decode."""
    runs = [_paired(tmp_path / f"cal-{k}", 10 * k, d) for k, d in enumerate((1.0, 1.01, 0.99), start=1)]
    tight = calibrate(runs, headroom=0.1, policy=GatePolicy(drift_room=False)).baseline
    roomy_cal = calibrate(runs, headroom=0.1)
    roomy = roomy_cal.baseline
    assert roomy_cal.not_passed == []
    by = {(g.metric, g.effective_phase): g for g in roomy.gates}
    for key, g in {(g.metric, g.effective_phase): g for g in tight.gates}.items():
        if g.spec.unit == "ms" and g.detect is not None:
            # further out (a pooled gate when its interval allows), below 2× the fastest run (never
            # blind), and it says why
            fastest = min(_measured(tight, sets, g) for sets in runs)
            assert g.limit <= by[key].limit < 2 * fastest and not by[key].blind, key
            if g.spec.kind == "percentile":
                assert by[key].limit > g.limit
                assert "drift room" in roomy_cal.comments[roomy.gates.index(by[key])]
        else:  # rates, memory: the policy's or the runs' own limit
            assert by[key].limit == pytest.approx(g.limit), key
    drifted = _paired(tmp_path / "drifted", 99, 1.25)
    assert judge(tight, drifted).verdict == "fail"  # what a machine's hour did to the spread-only rule
    assert judge(roomy, drifted).verdict == "pass"
    slow = judge(roomy, _paired(tmp_path / "slow", 77, 1.0, decode=2.0))
    assert slow.verdict == "fail" and any(
        g.verdict == "fail" and g.metric.startswith("tpot") for g in slow.gates
    )


def test_a_run_that_cannot_be_measured_from_is_refused(tmp_path: Path) -> None:
    good = _paired(tmp_path / "a", 1)
    bad = _paired(tmp_path / "b", 2, interrupted=True)
    with pytest.raises(
        CannotJudge, match="calibration run 2 cannot be measured from: the run was interrupted"
    ):
        calibrate([good, bad, good], headroom=0.1)
    with pytest.raises(ConfigError, match="at least 3"):
        calibrate([good, good], headroom=0.1)


def test_range_factor_is_the_normal_prediction_quantile() -> None:
    import numpy as np

    assert range_factor(3) == pytest.approx(3.73, rel=0.05) and range_factor(5) == pytest.approx(
        1.19, rel=0.05
    )
    # Checked against fresh draws: one more run beyond max + k·range about 1 % of the time.
    x = np.random.default_rng(7).standard_normal((200_000, 4))
    top, low = x[:, :3].max(axis=1), x[:, :3].min(axis=1)
    assert (x[:, 3] > top + range_factor(3) * (top - low)).mean() == pytest.approx(0.01, abs=0.002)


def test_runs_too_scattered_to_catch_a_2x_slowdown_make_blind_gates_that_never_pass(tmp_path: Path) -> None:
    """Calibrated where runs scatter by 2× (a starved machine), a latency limit lands at ≥ twice its
    threshold: a 2× slower target would pass it, so within it is cannot be judged, never pass; the
    calibration itself still writes the baseline (its runs are not failures) and says why."""
    runs = [_paired(tmp_path / f"cal-{k}", 10 * k, d) for k, d in enumerate((1.0, 2.0, 1.3), start=1)]
    cal = calibrate(runs, headroom=0.1, name="t", run_names=["a", "b", "c"], command="harness run …")
    blind = [g for g in cal.baseline.gates if g.blind]
    assert blind and all(g.limit >= 2 * g.threshold for g in blind)
    assert cal.not_passed == []
    assert any("too wide for the gate to catch a 2× slowdown" in w for w in cal.warnings)
    rerun = judge(cal.baseline, _paired(tmp_path / "rerun", 99, 1.0))
    assert rerun.verdict == "unjudgeable"  # never "pass" …
    gates = {g.id: g for g in rerun.gates}
    for g in blind:
        assert gates[g.id].verdict == "inconclusive" and "proves nothing" in gates[g.id].reason
    # … and a run beyond a blind limit still fails.
    awful = judge(cal.baseline, _paired(tmp_path / "awful", 7, 1.0, decode=12.0))
    assert awful.verdict == "fail"
    # The written file keeps the mark; gates without it do not carry the key.
    out = tmp_path / "b.yaml"
    write_baseline(out, cal.baseline, cal.comments, cal.header)
    text = out.read_text()
    assert text.count("blind: true") == len(blind) and "blind: false" not in text
    assert [g.blind for g in read_baseline(out).gates] == [g.blind for g in cal.baseline.gates]


def test_blind_gates_are_left_out_where_another_latency_gate_sees(tmp_path: Path) -> None:
    """Warm latencies over cache hits scatter by 2× between runs while cold ones hold (the demo's
    first busy machines): the blind warm gates would veto every pass, and the cold gates see the same
    quantities (TTFT, TPOT), so calibration leaves the blind ones out and lists them with what gates
    each instead. The unchanged target passes, a slower engine still fails; a blind gate whose
    quantity no gate sees stays blind (test above, and the next one)."""
    common = {"environment": ENV, "recipe": RECIPE}

    def paired(path: Path, seed: int, warm: float, slow: float = 1.0) -> list[ResultSet]:
        cold = make_run(path / "cold", 1000, seed, ttft_ms=50 * slow, tpot_ms=4 * slow, **common)
        warm_dir = make_run(
            path / "warm", 1000, seed + 1, ttft_ms=2 * warm, tpot_ms=0.03 * warm, hit_l1=0.8, **common
        )
        return load_result_sets([f"cold={cold}", f"warm={warm_dir}"])

    runs = [paired(tmp_path / f"cal-{k}", 10 * k, w) for k, w in enumerate((1.0, 2.0, 1.3), start=1)]
    cal = calibrate(runs, headroom=0.1, name="t", run_names=["a", "b", "c"])
    assert not any(g.blind for g in cal.baseline.gates)
    latency = {(g.id, g.effective_phase) for g in cal.baseline.gates if g.spec.unit == "ms"}
    assert ("ttft_p50", "cold") in latency and ("tpot_p50", "cold") in latency
    assert not any(phase == "warm" for _, phase in latency)
    left_out = [s for s in cal.skipped if s.startswith("warm: ") and "cannot catch one" in s]
    assert any(s.startswith("warm: ttft_p50:") and "ttft_p50@cold" in s for s in left_out), cal.skipped
    assert any(s.startswith("warm: tpot_p50:") and "tpot_p50@cold" in s for s in left_out)
    assert not any("tpot_p50@cold" in s for s in left_out if s.startswith("warm: ttft"))  # by quantity
    assert cal.spread_blind  # more runs could make them see (--max-runs)
    assert judge(cal.baseline, paired(tmp_path / "rerun", 99, 1.1)).verdict == "pass"
    assert judge(cal.baseline, paired(tmp_path / "slow", 98, 1.1, slow=2.0)).verdict == "fail"


def test_a_blind_decode_gate_is_not_covered_by_ttft(tmp_path: Path) -> None:
    """TPOT scatters by 2× between runs in both phases while TTFT holds: no gate sees TPOT, and TTFT
    does not see a decode slowdown, so the TPOT gates stay blind: the unchanged target cannot be
    judged, and a 2× slower decode is never passed."""
    common = {"environment": ENV, "recipe": RECIPE}

    def paired(path: Path, seed: int, decode: float) -> list[ResultSet]:
        cold = make_run(path / "cold", 1000, seed, ttft_ms=50, tpot_ms=4 * decode, **common)
        warm = make_run(path / "warm", 1000, seed + 1, ttft_ms=20, tpot_ms=4 * decode, hit_l1=0.8, **common)
        return load_result_sets([f"cold={cold}", f"warm={warm}"])

    runs = [paired(tmp_path / f"cal-{k}", 10 * k, d) for k, d in enumerate((1.0, 2.0, 1.3), start=1)]
    cal = calibrate(runs, headroom=0.1, name="t", run_names=["a", "b", "c"])
    blind = {(g.id, g.effective_phase) for g in cal.baseline.gates if g.blind}
    assert ("tpot_p50", "cold") in blind and ("tpot_p50", "warm") in blind
    assert not any(g.blind for g in cal.baseline.gates if g.spec.column == "ttft_ms")
    assert judge(cal.baseline, paired(tmp_path / "rerun", 99, 1.0)).verdict == "unjudgeable"
    assert judge(cal.baseline, paired(tmp_path / "slow", 98, 2.0)).verdict != "pass"


def test_gates_on_what_one_slowdown_moves_together_cover_each_other() -> None:
    """A blind pooled ITL gate is covered by a seeing TPOT gate (a request's TPOT is its gaps' mean), a
    blind cold_start_p99 by a seeing TTFT gate (the same TTFT, timed from the intended send); TTFT
    never covers decode."""
    from harness.gates.calibration import _quantity

    q = {
        m: _quantity(Gate(metric=m, threshold=1.0))
        for m in ("itl_p95", "tpot_p50", "cold_start_p99", "ttft_p95")
    }
    assert q["itl_p95"] == q["tpot_p50"] == "tpot_ms"
    assert q["cold_start_p99"] == q["ttft_p95"] == "ttft_ms"


def test_a_warm_gate_never_covers_a_blind_cold_one(tmp_path: Path) -> None:
    """Cold latencies scatter by 2× between runs while warm ones (cache hits) hold: the warm gates do
    not see the engine, so the cold gates stay blind rather than being left out, and a 2× slower
    engine is never passed (it was, when warm TTFT "covered" cold TTFT)."""
    common = {"environment": ENV, "recipe": RECIPE}

    def paired(path: Path, seed: int, cold: float, slow: float = 1.0) -> list[ResultSet]:
        c = make_run(path / "cold", 1000, seed, ttft_ms=50 * cold * slow, tpot_ms=4 * cold * slow, **common)
        w = make_run(path / "warm", 1000, seed + 1, ttft_ms=2, tpot_ms=0.03, hit_l1=0.8, **common)
        return load_result_sets([f"cold={c}", f"warm={w}"])

    runs = [paired(tmp_path / f"cal-{k}", 10 * k, c) for k, c in enumerate((1.0, 2.0, 1.3), start=1)]
    cal = calibrate(runs, headroom=0.1, name="t", run_names=["a", "b", "c"])
    blind = {(g.id, g.effective_phase) for g in cal.baseline.gates if g.blind}
    assert ("ttft_p50", "cold") in blind and ("tpot_p50", "cold") in blind
    assert not any(s.startswith("cold: ttft_p50:") for s in cal.skipped)
    assert judge(cal.baseline, paired(tmp_path / "slow", 98, 1.0, slow=2.0)).verdict != "pass"
