"""The A/B verdict's family-wise rules: Holm–Bonferroni over its tests, α shared over looks and a gate
file, the test each metric's p-value comes from, its power, pooled inter-token gaps, and the looks'
sequential stop (the runner's loop, with its blocks and judgements scripted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.gates.ab import judge_ab
from harness.gates.ab_stats import error_power, holm, levels, ratio_interval
from harness.gates.runs import ResultSet, RunFrame


def test_holm_steps_down_and_stops_at_the_first_it_keeps() -> None:
    # m = 3: the smallest against α/3, the next against α/2, the last against α.
    assert holm([0.001, 0.04, 0.03], 0.05) == [0.05 / 3, None, None]  # 0.03 > 0.025: stop
    assert holm([0.001, 0.04, 0.02], 0.05) == [0.05 / 3, 0.05, 0.025]  # 0.02 < 0.025, then 0.04 < 0.05
    assert holm([0.02, 0.02, 0.02], 0.05) == [None, None, None]  # 0.02 > 0.0167: nothing
    assert holm([], 0.05) == []


def test_alpha_is_shared_over_tests_and_looks() -> None:
    assert levels(0.05, 10, 2) == pytest.approx(0.0025)
    assert levels(0.05, 1) == pytest.approx(0.05)
    with pytest.raises(ValueError):
        levels(0.05, 0)


def _interval(seed: int, shift: float = 1.0, n: int = 240, blocks: int = 8) -> Any:
    rng = np.random.default_rng(seed)
    base, cand = [], []
    for _ in range(blocks):
        x = rng.lognormal(3.0, 0.3, n // blocks)
        base.append(x * rng.lognormal(0, 0.05, x.size))
        cand.append(x * shift * rng.lognormal(0, 0.05, x.size))
    return ratio_interval(base, cand, 50, resamples=400, seed=seed)


def test_the_p_value_and_the_bounds_are_one_test() -> None:
    r = _interval(1, shift=1.2)
    for alpha in (0.05, 0.01, 0.001):
        lo, hi = r.bounds(alpha)
        assert lo < r.ratio < hi
        # proven above a limit at level α exactly when the lower bound at α is above it
        for limit in (1.05, 1.1, 1.15, 1.18):
            assert (r.p_above(limit) < alpha) == (lo > limit), (alpha, limit)


def test_power_grows_with_the_regression_and_shrinks_with_the_level() -> None:
    r = _interval(2)
    assert r.power(1.1, 1.5, 0.01) > r.power(1.1, 1.2, 0.01) > r.power(1.1, 1.12, 0.01)
    assert r.power(1.1, 1.2, 0.05) > r.power(1.1, 1.2, 0.001)
    # an exact binomial power: more requests, more power; none at the limit itself
    assert error_power(400, 0.01, 0.05, 0.001) > error_power(100, 0.01, 0.05, 0.001)
    assert error_power(200, 0.01, 0.01, 0.001) < 0.01


def test_pooled_gaps_pair_whole_requests() -> None:
    rng = np.random.default_rng(3)
    gaps = [np.where(rng.random((30, 7)) < 0.9, rng.lognormal(2.5, 0.2, (30, 7)), np.nan) for _ in range(4)]
    same = ratio_interval(gaps, gaps, 95, resamples=200)
    assert same.ratio == 1.0 and same.lo == pytest.approx(1.0) and same.hi == pytest.approx(1.0)
    slower = ratio_interval(gaps, [g * 1.3 for g in gaps], 50, resamples=200)
    assert slower.ratio == pytest.approx(1.3, rel=1e-6)


def _frame(
    rng: np.random.Generator, ids: list[str], ttft: Any, tpot: Any, *, scale: float, fail: float
) -> RunFrame:
    n = len(ids)
    noise = rng.lognormal(0, 0.04, n)
    return RunFrame.from_columns(
        n, floats={"ttft_ms": ttft * scale * noise, "tpot_ms": tpot * scale * noise}, text={"id": ids},
        ok=rng.random(n) >= fail,
    )  # fmt: skip


def _frames(
    seed: int, shift: float, *, errors: float = 0.0, blocks: int = 4, n: int = 50
) -> list[tuple[ResultSet, ResultSet]]:
    """Block pairs of the same requests: the candidate ``shift`` × the base, with its own noise."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(blocks):
        ids = [f"r{j}-{i}" for i in range(n)]
        ttft, tpot = rng.lognormal(4.0, 0.3, n), rng.lognormal(2.7, 0.1, n)
        base = _frame(rng, ids, ttft, tpot, scale=1.0, fail=0.0)
        cand = _frame(rng, ids, ttft, tpot, scale=shift, fail=errors)
        out.append((ResultSet("base", Path("b"), None, base), ResultSet("cand", Path("c"), None, cand)))
    return out


def test_an_unchanged_candidate_fails_nothing_over_many_seeds_a_slower_one_fails() -> None:
    """Seeded, so deterministic: the family's false alarms over 40 unchanged judgements (each of two
    metrics and the error rate) stay at none, and a 1.3× slower candidate fails every time."""
    unchanged = [
        judge_ab(
            _frames(s, 1.0), metrics="ttft_p50,tpot_p50", resamples=300, seed=s, looks=2, other_tests=1
        ).verdict
        for s in range(40)
    ]
    assert "fail" not in unchanged
    slower = [
        judge_ab(_frames(s, 1.3), metrics="ttft_p50,tpot_p50", resamples=300, seed=s).verdict
        for s in range(5)
    ]
    assert slower == ["fail"] * 5


def test_a_failed_metric_s_bounds_are_at_the_level_holm_rejected_it_at() -> None:
    """Near the limit, Holm's later steps reject what the first level would not: the failed metric's
    interval is then the one at its own step, and lies above the limit it failed."""
    later = 0
    for s in range(30):
        j = judge_ab(_frames(s, 1.25, n=30), metrics="ttft_p50,tpot_p50", resamples=300, seed=s, looks=2)
        first = min(x.tested_at or 1.0 for x in [*j.metrics, j.error_rate])
        for m in j.metrics:
            assert m.tested_at is not None and m.lo is not None and m.p_value is not None
            if m.verdict == "fail":
                assert m.lo > 1.1 and m.p_value < m.tested_at, (s, m)
                later += m.tested_at > first
            else:
                assert m.tested_at == pytest.approx(first)
    assert later > 0  # the case the rule is for happened


def test_the_judgement_states_its_family_and_errors_fail_whatever_else() -> None:
    j = judge_ab(
        _frames(0, 1.0, errors=0.2), metrics="ttft_p50,tpot_p50", resamples=300, looks=3, other_tests=2
    )
    assert j.family_alpha == pytest.approx(0.05) and j.tests == 5 and j.looks == 3
    assert j.error_rate.verdict == "fail" and j.verdict == "fail" and j.exit_code == 1
    assert j.error_rate.tested_at == pytest.approx(0.05 / 5 / 3)
    assert all(m.tested_at == pytest.approx(0.05 / 5 / 3) and m.power is not None for m in j.metrics)
    assert "family-wise false-alarm rate 5%" in j.headline and "look 1 of at most 3" in j.headline
    # A warm pass's errors count in the candidate's error rate, not in the ratios.
    warm = _frames(9, 1.0, errors=0.5, blocks=1)
    clean = judge_ab(_frames(1, 1.0), metrics="ttft_p50", resamples=300)
    with_warm = judge_ab(
        _frames(1, 1.0), metrics="ttft_p50", resamples=300, more_errors=warm, look=3, looks=3
    )
    assert clean.error_rate.verdict == "pass" and with_warm.error_rate.verdict == "fail"
    assert "block pairs after look 2 and the warm pass, judgement 3 of at most 3;" in with_warm.headline
    assert with_warm.metrics[0].ratio == clean.metrics[0].ratio


# ---- the looks: the runner's loop, its blocks and judgements scripted -------------------------------


class _Scripted:
    def __init__(self, verdicts: list[str]) -> None:
        self.verdicts = verdicts
        self.blocks: list[tuple[int, str]] = []
        self.judged = 0


def _run_looks(tmp_path: Path, verdicts: list[str], *, looks: int, warm: int = 0) -> tuple[Any, _Scripted]:
    from harness.experiments.ab import ABRunner
    from harness.experiments.ab_cli import AB_OPTIONS
    from harness.experiments.ab_spec import ABSpec, prepare
    from harness.experiments.recipe import resolve
    from harness.gates.ab import ABJudgement, ErrorVerdict
    from tests.load.helpers import make_corpus

    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(tmp_path / "c.jsonl", 40)
    given = {
        "load": {"corpus": str(corpus), "rate": "4"},
        "ab": {"base_url": "http://127.0.0.1:9", "candidate_url": "http://127.0.0.1:10", "blocks": 2,
               "block_requests": 4, "looks": looks, "warm_requests": warm, "bypass_cache": warm == 0},
    }  # fmt: skip
    spec = ABSpec(resolve(None, given, AB_OPTIONS), out=tmp_path / "ab")
    plan = prepare(spec)
    runner = ABRunner(spec)
    runner.out.mkdir(parents=True)
    script = _Scripted(verdicts)

    def block(_plan: Any, _target: Any, arm: str, pair: int, _corpus: Path) -> None:
        script.blocks.append((pair, arm))

    def judge(look: int, more: Any = ()) -> ABJudgement:
        verdict: Any = script.verdicts[script.judged]
        script.judged += 1
        e = ErrorVerdict(
            base_errors=0, base_requests=1, candidate_errors=0, candidate_requests=1, rate=0, lo=0, hi=1,
            max_error_rate=0.01, p_value=1, verdict="pass", reason="",
        )  # fmt: skip
        return ABJudgement(
            verdict=verdict, exit_code=0, headline=verdict, confidence=0.95, limit=1.1, detect=1.3,
            block_pairs=runner.pairs_run, resamples=1, seed=0, metrics=[], error_rate=e, problems=[],
        )  # fmt: skip

    runner._block = block  # type: ignore[method-assign]
    runner._judge = judge  # type: ignore[method-assign]
    files = [tmp_path / f"{j + 1:02d}.jsonl" for j in range(len(plan.blocks))]
    runner._looks(plan, {"base": None, "candidate": None}, files)  # type: ignore[dict-item]
    return runner.record, script


def test_the_looks_stop_at_the_first_that_decides(tmp_path: Path) -> None:
    record, script = _run_looks(tmp_path / "a", ["unjudgeable", "fail", "pass"], looks=3)
    assert [lk.verdict for lk in record.looks] == ["unjudgeable", "fail"]
    assert record.stop_reason == "look 2 decided: fail"
    # each look runs its own block pairs, alternating A B, B A across looks
    assert script.blocks == [(1, "base"), (1, "candidate"), (2, "candidate"), (2, "base"),
                             (3, "base"), (3, "candidate"), (4, "candidate"), (4, "base")]  # fmt: skip
    record, _ = _run_looks(tmp_path / "b", ["unjudgeable"] * 3, looks=3)
    assert len(record.looks) == 3 and record.stop_reason == "the last look (3)"


def test_a_pass_waits_for_the_warm_pass_requests_a_fail_never_waits(tmp_path: Path) -> None:
    # 2 pairs of 4 a look: 8 requests sent after look 1, 16 after look 2; the warm pass wants 12.
    record, _ = _run_looks(tmp_path / "a", ["pass", "pass", "pass"], looks=3, warm=12)
    assert [lk.look for lk in record.looks] == [1, 2] and record.stop_reason == "look 2 decided: pass"
    record, _ = _run_looks(tmp_path / "b", ["fail", "pass"], looks=3, warm=12)
    assert len(record.looks) == 1


def test_each_prefill_kv_bytes_metric_takes_its_own_percentile() -> None:
    from harness.gates.measurement import MetricContext
    from harness.gates.metrics import METRICS

    frame = RunFrame.from_columns(5, floats={"prefill_kv_bytes": np.array([1.0, 2.0, 3.0, 4.0, 100.0])})
    ctx = MetricContext(confidence=0.95, require_measured=False)
    assert METRICS.get("prefill_kv_bytes_p50").compute(frame, ctx).value == 3.0
    assert METRICS.get("prefill_kv_bytes_p95").compute(frame, ctx).value == 100.0
