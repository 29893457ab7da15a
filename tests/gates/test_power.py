"""The exact count test at its edges, its power against brute force, the rate and percentile gates it
decides, and the pooled ITL interval against a brute-force cluster bootstrap."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

from harness.gates.baseline import Baseline, Gate
from harness.gates.judge import judge
from harness.gates.policy import GatePolicy, Measured
from harness.gates.pooled import cluster_percentile_interval
from harness.gates.power import CountTest, critical_count, power, proves_beyond, samples_for_power
from harness.gates.runs import ResultSet, RunFrame

ALPHA = 0.05


def test_critical_counts_match_brute_force() -> None:
    for n in (1, 2, 7, 40, 181, 400):
        for p0 in (0.01, 0.05, 0.5, 0.9, 0.95):
            up = next((k for k in range(n + 1) if binom.sf(k - 1, n, p0) <= ALPHA), None)
            down = max((k for k in range(n + 1) if binom.cdf(k, n, p0) <= ALPHA), default=None)
            assert critical_count(n, p0, ALPHA, True) == up, (n, p0)
            assert critical_count(n, p0, ALPHA, False) == down, (n, p0)


def test_the_error_test_at_its_edges() -> None:
    """0 errors never fails; all errors fails; the count that just decides is the first whose tail
    probability at the limit drops to α, and one fewer does not fail."""
    n, limit = 40, 0.02
    assert not proves_beyond(0, n, limit, ALPHA)
    assert proves_beyond(n, n, limit, ALPHA)
    crit = critical_count(n, limit, ALPHA)
    assert crit is not None
    assert binom.sf(crit - 1, n, limit) <= ALPHA < binom.sf(crit - 2, n, limit)
    assert proves_beyond(crit, n, limit, ALPHA) and not proves_beyond(crit - 1, n, limit, ALPHA)
    # A single request proves nothing at a 1 % limit (1 error of 1 has probability 0.01 ≤ α though).
    assert proves_beyond(1, 1, 0.01, ALPHA) and not proves_beyond(0, 1, 0.01, ALPHA)


def test_power_is_the_chance_of_failing_at_the_regression() -> None:
    """Power by the formula equals a simulation's failure rate; the size it asks for is the first that
    reaches the power, and 5 % errors against a 1 % limit needs about a hundred and eighty."""
    rng = np.random.default_rng(0)
    n, p0, p1 = 120, 0.01, 0.05
    sims = rng.binomial(n, p1, size=200_000)
    simulated = float(np.mean([proves_beyond(int(k), n, p0, ALPHA) for k in np.bincount(sims).nonzero()[0]]))
    crit = critical_count(n, p0, ALPHA)
    assert crit is not None
    assert power(n, p0, p1, ALPHA) == pytest.approx(float((sims >= crit).mean()), abs=0.005)
    assert simulated >= 0  # every observed count was judged
    need = samples_for_power(0.01, 0.05, ALPHA, 0.95)
    assert need is not None and 150 <= need <= 350
    assert power(need, 0.01, 0.05, ALPHA) >= 0.95 > power(need - 1, 0.01, 0.05, ALPHA)
    # Hits are tested from below: a cache at 70 % against a 95 % limit is caught from a few dozen.
    need_hits = samples_for_power(0.95, 0.70, ALPHA, 0.95, upper=False)
    assert need_hits is not None and need_hits < 40
    assert samples_for_power(0.05, 0.01, ALPHA, 0.95) is None  # no regression to catch


def test_the_powered_rule_on_error_rates() -> None:
    """Fail when proven beyond the limit; pass only when the run had the power asked for; otherwise
    cannot be judged, naming the size that would decide."""
    gate = Gate(metric="error_rate", threshold=0.02, detect=0.20, min_samples=5)
    b = Baseline(schema_version=1, gates=[gate], power=0.95)

    def run(n: int, errors: int) -> ResultSet:
        ok = np.ones(n, dtype=bool)
        ok[:errors] = False
        return ResultSet(label="run", path=Path("sim"), summary=None, frame=RunFrame.from_columns(n, ok=ok))

    assert judge(b, [run(40, 0)]).verdict == "pass"  # 0 of 40: powered against 20 %
    assert judge(b, [run(40, 8)]).verdict == "fail"  # 20 % errors
    small = judge(b, [run(10, 0)])
    assert small.verdict == "unjudgeable"
    (g,) = small.gates
    assert g.verdict == "inconclusive" and g.needed is not None and g.needed > 10
    assert f"{g.needed:,} would reach power 0.95" in g.reason


def test_an_erroring_target_fails_a_hit_rate_gate_instead_of_blinding_it() -> None:
    """A failed request counts as a miss: 20 % errors on an otherwise all-hit warm phase fail the
    hit-rate gate (before, they left the gate too few samples to judge)."""
    gate = Gate(metric="hit_rate_any", threshold=1.0, abs_tolerance=0.05, detect=0.7)
    b = Baseline(schema_version=1, gates=[gate])
    n = 40
    ok = np.ones(n, dtype=bool)
    ok[:8] = False
    frame = RunFrame.from_columns(n, text={"cache": ["HIT-L1"] * n}, ok=ok)
    report = judge(b, [ResultSet(label="warm", path=Path("sim"), summary=None, frame=frame)])
    (g,) = report.gates
    assert g.verdict == "fail" and g.n == 40 and g.measured == pytest.approx(0.8)


def _tpot_run(rng: np.random.Generator, n: int, shift: float = 1.0) -> ResultSet:
    tpot = 10.0 * shift * rng.lognormal(0.0, 0.1, n)
    frame = RunFrame.from_columns(n, floats={"tpot_ms": tpot})
    return ResultSet(label="run", path=Path("sim"), summary=None, frame=frame)


def test_a_percentile_gate_counts_the_requests_above_its_limit() -> None:
    """tpot_p95 ≤ 14 ms is the statement that at most 5 % of requests lie above 14 ms: a run of
    unchanged requests passes (powered against 1.3×), a 1.5× slower one fails, each from 60 requests
    (an interval-only P95 gate needs 72 just to have an upper bound)."""
    rng = np.random.default_rng(1)
    policy = GatePolicy(detect_slowdown=1.3)
    calib = [_tpot_run(rng, 60) for _ in range(3)]
    gate = Gate(metric="tpot_p95", threshold=11.8, abs_tolerance=2.2)
    samples = [rs.frame.col("tpot_ms") for rs in calib]
    declared, notes = policy.declare(
        gate,
        [Measured(float(np.quantile(x, 0.95)), x.size, x) for x in samples],
        confidence=0.95,
    )
    assert declared is not None and declared.detect == 1.3, notes
    assert declared.detect_share is not None and declared.detect_share > 0.05  # 5 % at the limit
    b = Baseline(schema_version=1, gates=[declared])
    verdicts = [judge(b, [_tpot_run(rng, 60)]).verdict for _ in range(50)]
    assert verdicts.count("fail") == 0 and verdicts.count("pass") >= 48
    slow = [judge(b, [_tpot_run(rng, 60, shift=1.5)]).verdict for _ in range(50)]
    assert slow.count("fail") == 50


def test_the_policy_leaves_out_what_the_runs_cannot_power() -> None:
    policy = GatePolicy()  # 5 % errors against a 1 % limit: 181 requests
    gate = Gate(metric="error_rate", threshold=0.0)
    kept, _ = policy.declare(gate, [Measured(0.0, 400)], confidence=0.95)
    assert kept is not None and (kept.threshold, kept.detect) == (0.01, 0.05)
    dropped, why = policy.declare(gate, [Measured(0.0, 40)], confidence=0.95)
    assert dropped is None and "181 requests a phase" in why[0] and "these runs had 40" in why[0]
    # A flaky target's own errors raise the limit to what its runs could have come from, flagged.
    flaky, notes = GatePolicy(detect_errors=0.5).declare(gate, [Measured(0.15, 400)], confidence=0.95)
    assert flaky is not None and flaky.threshold > 0.15 and any(n.startswith("LOOSE") for n in notes)
    # A hit rate too small to lose 30 % of, beyond a 5-point drop, is no gate.
    none, why = policy.declare(
        Gate(metric="hit_rate_prefix", threshold=0.1), [Measured(0.1, 400)], confidence=0.95
    )
    assert none is None and "leaves no room" in why[0]


def test_the_cluster_interval_is_the_brute_force_bootstrap() -> None:
    """The vectorised interval equals a plain bootstrap that draws whole requests with the same counts
    and takes the nearest-rank percentile of their pooled gaps."""
    rng = np.random.default_rng(3)
    groups = [rng.lognormal(3.0, 0.3, int(rng.integers(1, 12))) * rng.uniform(0.5, 2.0) for _ in range(50)]
    lo, hi = cluster_percentile_interval(groups, 95, 0.9, resamples=300, seed=11)
    draw = np.random.default_rng(11)
    n = len(groups)
    reps = []
    for _ in range(300):
        counts = draw.multinomial(n, np.full(n, 1.0 / n))
        pooled = np.sort(np.concatenate([np.repeat(g, c) for g, c in zip(groups, counts, strict=True) if c]))
        reps.append(pooled[max(1, math.ceil(0.95 * pooled.size - 1e-9)) - 1])
    assert (lo, hi) == (
        float(np.quantile(reps, 0.05, method="inverted_cdf")),
        float(np.quantile(reps, 0.95, method="inverted_cdf")),
    )
    # Correlated gaps: resampling whole requests gives a wider interval than resampling gaps.
    flat = cluster_percentile_interval([[x] for g in groups for x in g], 95, 0.9, resamples=300, seed=11)
    assert hi - lo > flat[1] - flat[0]


def test_the_pooled_itl_gate_rules_a_regression_out_or_cannot_judge() -> None:
    rng = np.random.default_rng(5)

    def run(n: int, shift: float = 1.0) -> ResultSet:
        itl = [list(shift * rng.lognormal(2.3, 0.2, 10)) for _ in range(n)]
        frame = RunFrame.from_columns(n, itl=itl)
        return ResultSet(label="run", path=Path("sim"), summary=None, frame=frame)

    gate = Gate(metric="itl_p95", threshold=14.0, rel_tolerance=0.15, detect=1.5)
    b = Baseline(schema_version=1, gates=[gate])
    assert judge(b, [run(80)]).verdict == "pass"
    assert judge(b, [run(80, shift=2.0)]).verdict == "fail"
    assert "fewer than min_samples 20" in judge(b, [run(5)]).gates[0].reason  # too few for a bootstrap
    # One request in twenty streams at 30 ms a token: P95 is still 10 ms, but a rerun that drew it twice
    # would not be, so the interval (resampling requests) cannot rule a 1.5x regression out.
    lumpy = [[10.0] * 10 for _ in range(19)] + [[30.0] * 10]
    frame = RunFrame.from_columns(20, itl=lumpy)
    wide = judge(b, [ResultSet(label="run", path=Path("sim"), summary=None, frame=frame)])
    assert wide.gates[0].measured == 10.0
    assert wide.verdict == "unjudgeable" and "too few requests to rule" in wide.gates[0].reason


def test_a_count_test_says_what_it_needs() -> None:
    t = CountTest(k=0, n=10, p0=0.01, p1=0.05, alpha=ALPHA, upper=True, want=0.95)
    assert not t.failed and not t.powered and t.needed is not None and t.needed > 10
