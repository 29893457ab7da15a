"""The warmup ladder: plan validation and the rollback state machine (pure logic, no Locust)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.errors import ConfigError, InputError
from harness.load.inputs import Inputs
from harness.load.options import LoadOptions
from harness.load.plan import Ladder, Plan, parse_share, plan_preload, read_plan, share_stages, write_plan
from tests.load.helpers import make_corpus

ROOT = Path(__file__).resolve().parents[2]


def plan(on_failure: str = "stop", retries: int = 1) -> Plan:
    return Plan.model_validate({
        "policy": {"on_failure": on_failure, "max_retries": retries, "min_requests": 5, "rollback_hold_s": 2},
        "stages": [
            {"name": "a", "qps": 10, "duration_s": 4, "max_failure_rate": 0.1},
            {"name": "b", "qps": 20, "duration_s": 4, "max_failure_rate": 0.1},
            {"name": "c", "qps": 40, "duration_s": 4, "max_failure_rate": 0.1},
        ],
    })  # fmt: skip


def fails_above(rate: float, ladder: Ladder):
    """Window stats of a service that fails every request of a stage faster than ``rate``."""

    def stats(start: float, end: float) -> tuple[int, int]:
        a = next(x for x in reversed(ladder.attempts) if x.start_s <= start)
        qps = ladder.plan.stages[a.stage].qps
        n = int(qps * max(0.0, end - start))
        return n, n if qps > rate else 0

    return stats


def run(ladder: Ladder, stats, until: float = 60.0) -> None:
    ladder.start(0.0)
    t = 0.0
    while not ladder.done and t < until:
        t += 0.5
        ladder.tick(t, stats)


def test_seed_and_tiny_plans_validate() -> None:
    seed = read_plan(ROOT / "fixtures" / "plans" / "seed.yaml")
    assert [(s.qps, s.max_failure_rate, s.duration_s) for s in seed.stages] == [
        (100, 0.08, 60), (300, 0.05, 60), (800, 0.03, 60)]  # fmt: skip
    assert read_plan(ROOT / "fixtures" / "plans" / "tiny.yaml").stages


def test_unknown_keys_and_bad_values_name_the_field(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("stages:\n  - {name: a, qps: 10, duration_s: 5, max_failure_rate: 0.1, qsp: 3}\n")
    with pytest.raises(InputError) as err:
        read_plan(p)
    assert err.value.field == "stages.0.qsp" and err.value.file == str(p)
    p.write_text("stages:\n  - {name: a, qps: -1, duration_s: 5, max_failure_rate: 0.1}\n")
    with pytest.raises(InputError, match="greater than 0"):
        read_plan(p)
    p.write_text("stages: [\n")
    with pytest.raises(InputError) as err:
        read_plan(p)
    assert err.value.line is not None


def test_failure_rolls_back_to_the_last_safe_stage_not_zero_then_stops() -> None:
    ladder = Ladder(plan("stop"))
    run(ladder, fails_above(30, ladder))
    out = ladder.outcomes()
    assert [(o.name, o.verdict) for o in out] == [
        ("a", "passed"), ("b", "passed"), ("c", "rolled_back"), ("b:rollback", "passed")]  # fmt: skip
    assert out[2].rolled_back_to == "b" and out[2].failure_rate == 1.0
    assert ladder.stopped and ladder.done
    assert out[2].ended_s < 12.0  # cut short once min_requests had failed, not held to its end


def test_retry_policy_climbs_again_then_stops_after_max_retries() -> None:
    ladder = Ladder(plan("retry", retries=1))
    run(ladder, fails_above(30, ladder))
    names = [(o.name, o.verdict) for o in ladder.outcomes()]
    assert names == [("a", "passed"), ("b", "passed"), ("c", "rolled_back"), ("b:rollback", "passed"),
                     ("c:retry", "rolled_back"), ("b:rollback", "passed")]  # fmt: skip
    assert ladder.stopped


def test_a_passing_ladder_runs_every_stage_once() -> None:
    ladder = Ladder(plan())
    run(ladder, fails_above(1000, ladder))
    assert [o.verdict for o in ladder.outcomes()] == ["passed"] * 3 and not ladder.stopped
    segs = Ladder(plan()).start(1.0)
    assert [(s.start_s, s.end_s, s.rate) for s in segs] == [(1, 5, 10), (5, 9, 20), (9, 13, 40)]


def test_first_stage_failing_has_no_safe_stage_and_stops() -> None:
    ladder = Ladder(plan("retry"))
    run(ladder, fails_above(5, ladder))
    assert [(o.name, o.verdict) for o in ladder.outcomes()] == [("a", "stopped")]
    assert ladder.stopped and ladder.segments() == []


def test_write_plan_reads_back_equal_and_the_preload_is_beside_the_plan(tmp_path: Path) -> None:
    p = plan("retry").model_copy(update={"preload": "preload.jsonl", "name": "from-analysis"})
    path = write_plan(tmp_path / "sub" / "ladder.yaml", p, comment="line one\nline two")
    text = path.read_text()
    assert text.startswith("# line one\n# line two\n")
    assert read_plan(path) == p
    assert plan_preload(p, path) == tmp_path / "sub" / "preload.jsonl"
    assert plan_preload(p.model_copy(update={"preload": "/abs/x.jsonl"}), path) == Path("/abs/x.jsonl")
    assert plan_preload(plan(), path) is None
    # Without a preload, the key is not written at all (a plan a person wrote looks the same).
    write_plan(tmp_path / "plain.yaml", plan())
    assert "preload" not in (tmp_path / "plain.yaml").read_text()


def test_stages_in_shares_of_capacity_resolve_with_the_capacity(tmp_path: Path) -> None:
    plan = read_plan(ROOT / "fixtures" / "plans" / "relative.yaml", capacity=8.0)
    assert [s.qps for s in plan.stages] == [2.0, 4.0, 6.0]
    assert share_stages(ROOT / "fixtures" / "plans" / "relative.yaml") == [
        (0, "s1-25pct"), (1, "s2-50pct"), (2, "s3-75pct")]  # fmt: skip
    assert share_stages(ROOT / "fixtures" / "plans" / "tiny.yaml") == []
    # Absolute and relative stages mix; capacity does not touch the absolute ones.
    p = tmp_path / "p.yaml"
    p.write_text("stages:\n  - {name: a, qps: 3, duration_s: 5, max_failure_rate: 0.1}\n"
                 "  - {name: b, qps: 150%, duration_s: 5, max_failure_rate: 0.1}\n")  # fmt: skip
    assert [s.qps for s in read_plan(p, capacity=10).stages] == [3.0, 15.0]


def test_shares_without_a_capacity_are_a_config_error_naming_the_stage(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        read_plan(ROOT / "fixtures" / "plans" / "relative.yaml")
    assert err.value.field == "stages.0.qps" and "s1-25pct" in str(err.value)
    assert err.value.file is not None and err.value.file.endswith("relative.yaml")
    p = tmp_path / "p.yaml"
    p.write_text("stages:\n  - {name: a, qps: -5%, duration_s: 5, max_failure_rate: 0.1}\n")
    with pytest.raises(InputError, match="above 0 %") as bad:
        read_plan(p, capacity=8)
    assert bad.value.field == "stages.0.qps" and bad.value.line == 2
    with pytest.raises(ValueError, match="not a percentage"):
        parse_share("x%")
    assert parse_share("50%") == 0.5 and parse_share("50") is None


def test_the_load_stage_reads_a_plan_in_shares_with_its_capacity_option(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "c.jsonl", 4)
    plan = ROOT / "fixtures" / "plans" / "relative.yaml"
    inputs = Inputs.load(LoadOptions(corpus=corpus, plan=plan, capacity=4.0), ladder=True)
    assert inputs.ladder is not None and [s.qps for s in inputs.ladder.plan.stages] == [1.0, 2.0, 3.0]
    with pytest.raises(ConfigError, match="no capacity was given"):
        Inputs.load(LoadOptions(corpus=corpus, plan=plan), ladder=True)
    assert "--capacity" in LoadOptions(capacity=4.0).to_args()
