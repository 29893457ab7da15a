"""Gates that know where they were calibrated: on another machine, target or recipe than the baseline's
its absolute-latency gates are skipped (never failed, never refused: the job passes on the rest) while
rates and bytes are still judged; the ``*_rel`` metrics divide by a ``reference`` set and travel;
``update`` says what a gate it leaves out needs."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from harness.common.fingerprint import Environment, Hardware, Software
from harness.common.host import HostLoad
from harness.common.stats import percentile, percentile_interval
from harness.gates.baseline import Baseline, Gate, read_baseline, write_baseline
from harness.gates.fingerprints import busier_than_calibrated, fingerprint_from_results
from harness.gates.judge import GateReport, judge, judge_gate, read_report_json, write_report_json
from harness.gates.measurement import MetricContext, relative_confidence
from harness.gates.metrics import METRICS
from harness.gates.runs import ResultSet, RunFrame, load_result_set, load_result_sets
from harness.gates.update import baseline_from_results, rerun_margin, rerun_min_samples
from harness.load.run_summary import Recipe, TargetInfo, target_identity
from tests.gates.factory import harness_cli, make_run

SOFTWARE = Software(python="3.11.7", torch="2.13.0+cpu", harness="0.1.0")
HERE = Environment(hardware=Hardware(cpu_model="AMD EPYC 7B13", cpu_count=2), software=SOFTWARE)
THERE = Environment(
    hardware=Hardware(cpu_model="Intel Xeon Platinum 8480+", cpu_count=16, gpus=["NVIDIA H200"]),
    software=SOFTWARE,
)
RECIPE = Recipe(corpus_sha256="c" * 64, rate=4.0, arrival="constant", duration=100.0, max_tokens_cap=16)
MODELS = {
    "object": "list",
    "data": [
        {
            "id": "tiny", "object": "model", "created": 1, "owned_by": "harness", "max_model_len": 2048,
            "harness": {"preset": "tiny", "weights": "abc", "device": "cpu", "response_cache": True,
                        "version": "0.1.0"},
        }
    ],
}  # fmt: skip


def _target(**harness: Any) -> TargetInfo:
    models: dict[str, Any] = {
        "data": [{**MODELS["data"][0], "harness": {**MODELS["data"][0]["harness"], **harness}}]
    }
    return TargetInfo(url="http://127.0.0.1:8000", model="tiny", identity=target_identity(models))


def _run(path: Path, n: int = 600, seed: int = 0, *, env: Environment | None = HERE, **kw: Any) -> Path:
    kw.setdefault("recipe", RECIPE)
    kw.setdefault("target", _target())
    return make_run(path, n, seed, environment=env, **kw)


def _update(tmp_path: Path, *dirs: str) -> Baseline:
    base, _, _ = baseline_from_results(load_result_sets(list(dirs)), headroom=0.1)
    out = tmp_path / "baseline.yaml"
    write_baseline(out, base)
    return read_baseline(out)  # what a CI job reads back


def _verdicts(report: GateReport) -> dict[str, str]:
    return {f"{g.id}@{g.label}": g.verdict for g in report.gates}


def test_identity_keeps_what_identifies_and_drops_what_changes_per_start() -> None:
    ident = target_identity(MODELS)
    assert ident == {
        "models": [{k: v for k, v in MODELS["data"][0].items() if k not in ("object", "created")}]
    }
    assert target_identity({"detail": "not found"}) is None
    big = {"data": [{"id": "x" * 10_000, "permission": [{"created": 5}]}] * 50}
    bounded = target_identity(big)
    assert bounded is not None and len(bounded["models"]) == 8 and len(bounded["models"][0]["id"]) == 200
    assert "permission" not in bounded["models"][0]


def test_the_baseline_records_its_fingerprint(tmp_path: Path) -> None:
    base = _update(tmp_path, f"cold={_run(tmp_path / 'c')}", f"warm={_run(tmp_path / 'w', seed=1)}")
    fp = base.fingerprint
    assert fp is not None and fp.environment == HERE and fp.notes == []
    assert fp.recipes == {"cold": RECIPE, "warm": RECIPE}
    assert fp.target is not None and fp.target["models"][0]["harness"]["weights"] == "abc"


def test_runs_that_disagree_are_named(tmp_path: Path) -> None:
    base = _update(
        tmp_path, f"cold={_run(tmp_path / 'c')}", f"warm={_run(tmp_path / 'w', seed=1, env=THERE)}"
    )
    assert base.fingerprint is not None
    assert len(base.fingerprint.notes) == 1 and "disagree on the machine" in base.fingerprint.notes[0]


def test_another_machine_skips_latency_gates_and_judges_the_rest(tmp_path: Path) -> None:
    base = _update(tmp_path, _run(tmp_path / "cal"))
    # The same system on a machine three times slower: measured there, every latency is far beyond
    # the limits; on a different fingerprint that is no regression, and rates are still judged.
    slow = load_result_set(_run(tmp_path / "there", seed=5, env=THERE, ttft_ms=150, tpot_ms=12))
    r = judge(base, [slow])
    latency = [g for g in r.gates if METRICS.get(g.metric).speed_dependent]
    rest = [g for g in r.gates if not METRICS.get(g.metric).speed_dependent]
    assert latency and rest
    assert {g.verdict for g in latency} == {"skipped"}
    # The numbers are kept: measured value and interval, as for any gate.
    assert all(g.measured is not None and g.measured > g.limit for g in latency if g.metric != "lateness_p99")
    assert all(g.lo is not None and g.hi is not None and g.n > 0 for g in latency)
    why = latency[0].why
    assert why.startswith("calibrated on AMD EPYC 7B13 ×2 CPUs, no GPU, measured on Intel Xeon Platinum")
    assert "absolute latencies do not travel between machines" in why
    assert why.endswith(
        "; its latency gates are skipped here (calibrate a baseline on this runner type to judge them: "
        "harness baseline calibrate)"
    )
    assert latency[0].reason.startswith(f"skipped: {latency[0].metric} = ")
    assert {g.verdict for g in rest} == {"pass"}
    # Skipped counts neither as a pass nor as cannot-be-judged: the rest decide, and they pass.
    assert r.verdict == "pass" and r.exit_code == 0
    assert r.counts()["skipped"] == len(latency) and r.counts()["pass"] == len(rest)
    assert r.headline() == (
        f"PASS: {len(rest)} passed, 0 failed, 0 cannot be judged, {len(latency)} skipped "
        "(latency gates on a machine, target or recipe other than the baseline's)"
    )
    match = r.results[0].environment_match
    assert match is not None and not match.judged and match.hardware == "different"
    assert "CPU model: AMD EPYC 7B13 vs Intel Xeon Platinum 8480+" in match.differences
    # Rates still fail there: a target that errs is a regression on any machine.
    erring = load_result_set(_run(tmp_path / "err", seed=6, env=THERE, error_rate=0.2))
    r = judge(base, [erring])
    assert _verdicts(r)["error_rate@err"] == "fail" and r.verdict == "fail"


def test_a_fingerprint_of_another_runner_type_skips_latency_and_exits_0(tmp_path: Path) -> None:
    """A CI job copied to another runner type: the stored baseline's fingerprint (edited here to another
    CPU model and core count) does not match the runner, so `harness gate` skips its latency gates,
    judges the rest and passes (exit 0) an unchanged target; a rate that regressed still fails (1)."""
    _update(tmp_path, _run(tmp_path / "cal"))
    path = tmp_path / "baseline.yaml"
    text = path.read_text()
    here = "cpu_model: AMD EPYC 7B13\n      cpu_count: 2\n"
    assert here in text
    path.write_text(text.replace(here, "cpu_model: Intel Xeon Platinum 8480+\n      cpu_count: 16\n"))
    edited = read_baseline(path)
    assert edited.fingerprint is not None and edited.fingerprint.environment is not None
    assert edited.fingerprint.environment.hardware.cpu_count == 16

    run, verdict, junit = _run(tmp_path / "rerun", seed=3), tmp_path / "gate.json", tmp_path / "j.xml"
    res = harness_cli("gate", "--baseline", str(path), str(run), "--json-out", str(verdict),
                      "--junit", str(junit))  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    report = read_report_json(verdict)
    assert report.verdict == "pass" and report.exit_code == 0
    match = report.results[0].environment_match
    assert match is not None and not match.judged and match.hardware == "different"
    assert "CPU model: Intel Xeon Platinum 8480+ vs AMD EPYC 7B13" in match.differences
    by = {g.metric: g for g in report.gates}
    latency = [m for m in by if METRICS.get(m).speed_dependent]
    assert latency and all(by[m].verdict == "skipped" for m in latency)
    assert all(by[m].measured is not None and by[m].lo is not None for m in latency)
    assert "its latency gates are skipped here" in by["tpot_p95"].why
    # The speed-independent gates are judged on any runner.
    for m in ("error_rate", "hit_rate_any", "prefill_kv_bytes_p95"):
        assert by[m].verdict == "pass", by[m].reason
    assert f"{len(latency)} skipped" in report.headline() and "skipped" in res.stdout
    # JUnit: a skipped test case, not an error; the suite counts it.
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "0" and root.get("failures") == "0"
    assert root.get("skipped") == str(len(latency))
    case = next(c for c in root.iter("testcase") if c.get("name") == "tpot_p95")
    skipped = case.find("skipped")
    assert skipped is not None and skipped.get("message", "").startswith("skipped: tpot_p95 = ")
    assert case.find("error") is None

    # A rate gate that fails there fails the job, whatever the runner type.
    erring = _run(tmp_path / "err", seed=6, error_rate=0.2)
    res = harness_cli("gate", "--baseline", str(path), str(erring), "--json-out", str(verdict),
                      "--junit", str(junit))  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    data = json.loads(verdict.read_text())
    by_json = {g["metric"]: g["verdict"] for g in data["gates"]}
    assert data["verdict"] == "fail" and by_json["error_rate"] == "fail" and by_json["tpot_p95"] == "skipped"


def test_every_gate_skipped_is_a_pass_that_says_so(tmp_path: Path) -> None:
    """A baseline of latency gates only, on another machine: nothing is judged, nothing refused: a pass
    (exit 0) whose headline counts the skipped gates so nobody reads it as a judged pass."""
    base = Baseline(
        schema_version=1, name="latency", gates=[Gate(metric="tpot_p95", threshold=4.6, rel_tolerance=0.1),
                                                 Gate(metric="ttft_p95", threshold=90.0, rel_tolerance=0.1)],
        fingerprint=fingerprint_from_results([[load_result_set(_run(tmp_path / "cal"))]]),
    )  # fmt: skip
    r = judge(base, [load_result_set(_run(tmp_path / "there", seed=5, env=THERE))])
    assert [g.verdict for g in r.gates] == ["skipped", "skipped"]
    assert r.verdict == "pass" and r.exit_code == 0 and r.all_skipped
    assert r.headline() == (
        "PASS: 0 passed, 0 failed, 0 cannot be judged, 2 skipped "
        "(every gate skipped: nothing was judged on this run)"
    )
    # Skipped gates do not mask what cannot be judged: a set too small for a judged gate is still 6.
    small = Baseline(
        schema_version=1, gates=[*base.gates, Gate(metric="error_rate", threshold=0.0, min_samples=10**6)],
        fingerprint=base.fingerprint,
    )  # fmt: skip
    r = judge(small, [load_result_set(_run(tmp_path / "there2", seed=6, env=THERE))])
    assert [g.verdict for g in r.gates] == ["skipped", "skipped", "unjudgeable"]
    assert r.verdict == "unjudgeable" and r.exit_code == 6 and not r.all_skipped


def test_same_machine_judges_latency(tmp_path: Path) -> None:
    base = _update(tmp_path, _run(tmp_path / "cal"))
    same = judge(base, [load_result_set(_run(tmp_path / "rerun", seed=3))])
    assert same.results[0].environment_match is not None and same.results[0].environment_match.judged
    assert same.verdict == "pass"
    slow = judge(base, [load_result_set(_run(tmp_path / "slow", seed=4, tpot_ms=8))])
    assert _verdicts(slow)["tpot_p95@slow"] == "fail" and slow.verdict == "fail"


def _load(others: float | None, steal: float = 0.0) -> HostLoad | None:
    if others is None:
        return None
    return HostLoad(cpus=2, others_cores=others, steal_cores=steal, wall_s=30.0)


def test_a_busier_machine_voids_a_latency_fail_and_keeps_a_pass(tmp_path: Path) -> None:
    """A neighbour that starts between calibration and the gated run slows the target as a regression
    does: on a run where other work took clearly more of the machine than in any calibration run, a
    latency *fail* cannot be judged; a pass won against that handicap, and rates, are judged as ever."""
    base = _update(tmp_path, _run(tmp_path / "cal", interference=_load(0.2)))
    assert base.fingerprint is not None and base.fingerprint.interference == {"cal": _load(0.2)}
    # Calibrated from several runs, the fingerprint keeps the median run's load of each set (one busy
    # calibration run does not stretch what is covered), and none for a set one of whose runs did not
    # measure it.
    runs = [
        [load_result_set(_run(tmp_path / f"r{i}{label}", interference=_load(busy)), label=label)
         for label, busy in (("cold", cold), ("warm", warm))]
        for i, (cold, warm) in enumerate([(0.1, 0.3), (0.4, None), (0.2, 0.1)])
    ]  # fmt: skip
    fp = fingerprint_from_results(runs)
    assert fp.interference == {"cold": _load(0.2)}
    # … and says where the machine's load changed between them (0.1 → 0.4 cores: a different machine).
    assert fp.notes == [
        "the machine's load changed between the runs: during run 1 cold other work took 0.10 of 2 cores, "
        "during run 2 cold other work took 0.40 of 2 cores; calibrate where the load stays as it is"
    ]

    def tpot(name: str, load: HostLoad | None, **kw: Any) -> tuple[str, GateReport]:
        r = judge(base, [load_result_set(_run(tmp_path / name, seed=4, interference=load, **kw))])
        return _verdicts(r)[f"tpot_p95@{name}"], r

    # Slower beside a neighbour that took one more core: not judged, and says why.
    verdict, r = tpot("busy", _load(1.1), tpot_ms=8)
    assert verdict == "unjudgeable" and r.verdict == "unjudgeable" and r.exit_code == 6
    match = r.results[0].environment_match
    assert match is not None and match.busier and match.judged  # the machine is the same one
    gate = next(g for g in r.gates if g.metric == "tpot_p95")
    assert gate.why.startswith("this machine was busier than in its calibration runs: other work took 1.10")
    assert "interference: 1.10 vs 0.20 of 2 cores" in match.differences
    # … the same slowdown with steal, the hypervisor's neighbour, counts the same.
    assert tpot("stolen", _load(0.2, steal=0.9), tpot_ms=8)[0] == "unjudgeable"
    # … but as busy as the calibration runs (within their spread), the slowdown is the target's.
    assert tpot("same", _load(0.3), tpot_ms=8)[0] == "fail"
    # … and a run that did not measure it is judged as before, with a note.
    verdict, r = tpot("unmeasured", None, tpot_ms=8)
    match = r.results[0].environment_match
    assert verdict == "fail" and match is not None and match.note and "did not measure" in match.note
    # A pass beside a neighbour stands: the target held its limits with less of the machine.
    assert tpot("busy_pass", _load(1.1))[0] == "pass"
    # Rates are no machine's speed: a target that errs fails however busy the machine.
    r = judge(
        base, [load_result_set(_run(tmp_path / "err", seed=6, interference=_load(1.5), error_rate=0.2))]
    )
    assert _verdicts(r)["error_rate@err"] == "fail" and r.verdict == "fail"


@pytest.mark.parametrize(
    ("then", "now", "busier"),
    [
        (0.2, 0.45, False),  # 1.55 of 2 cores left against 1.8: within 15 %
        (0.2, 0.5, True),  # 1.5 left: more than 15 % less
        (1.85, 1.9, False),  # little left either way, but 0.05 cores more is the machine's own ticks
        (1.75, 1.9, True),  # most of what was left is gone
        (0.5, 0.1, False),  # quieter than calibration: never busier
    ],
)
def test_busier_is_a_share_of_what_other_work_left(then: float, now: float, busier: bool) -> None:
    assert (busier_than_calibrated(_load(then), _load(now)) is not None) == busier


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"target": _target(weights="def")}, "target models[tiny].harness.weights: abc vs def"),
        ({"target": _target(preset="small")}, "target models[tiny].harness.preset: tiny vs small"),
        ({"recipe": RECIPE.model_copy(update={"rate": 8.0})}, "recipe.rate: 4.0 vs 8.0"),
        ({"recipe": RECIPE.model_copy(update={"max_tokens_cap": 32})}, "recipe.max_tokens_cap: 16 vs 32"),
        ({"env": None}, "machine: the run's summary.json does not record where it was measured"),
    ],
)
def test_another_target_or_recipe_is_named(tmp_path: Path, kw: dict[str, Any], field: str) -> None:
    base = _update(tmp_path, _run(tmp_path / "cal"))
    r = judge(base, [load_result_set(_run(tmp_path / "other", seed=3, **kw))])
    match = r.results[0].environment_match
    assert match is not None and not match.judged and field in match.differences
    latency = [g for g in r.gates if METRICS.get(g.metric).speed_dependent]
    assert {g.verdict for g in latency} == {"skipped"} and field.partition(":")[0] in latency[0].why
    assert all(g.verdict == "pass" for g in r.gates if not METRICS.get(g.metric).speed_dependent)
    assert r.verdict == "pass" and r.exit_code == 0
    # The harness version is not the target: an upgrade is what the gate must judge.
    r = judge(base, [load_result_set(_run(tmp_path / "upgraded", seed=3, target=_target(version="9.9")))])
    assert r.results[0].environment_match is not None and r.results[0].environment_match.judged


def test_a_rate_of_capacity_is_compared_instead_of_the_rate(tmp_path: Path) -> None:
    half = RECIPE.model_copy(update={"rate_of_capacity": 0.5})
    base = _update(tmp_path, _run(tmp_path / "cal", recipe=half))
    other_rate = half.model_copy(update={"rate": 7.5})
    r = judge(base, [load_result_set(_run(tmp_path / "x", seed=3, recipe=other_rate))])
    assert r.results[0].environment_match is not None and r.results[0].environment_match.judged
    # The sent rate is rounded to 4 significant digits, so a share comes back as 0.5001 or 0.4999.
    rounded = half.model_copy(update={"rate": 7.501, "rate_of_capacity": 0.5001})
    r = judge(base, [load_result_set(_run(tmp_path / "y", seed=3, recipe=rounded))])
    assert r.results[0].environment_match is not None and r.results[0].environment_match.judged
    other_share = half.model_copy(update={"rate_of_capacity": 0.7})
    r = judge(base, [load_result_set(_run(tmp_path / "z", seed=3, recipe=other_share))])
    assert r.results[0].environment_match is not None and not r.results[0].environment_match.judged


def test_a_baseline_without_fingerprint_is_judged_as_before_with_a_note(
    tmp_path: Path, repo_root: Path
) -> None:
    # A file written before fingerprints existed: the bundled baseline without its fingerprint.
    old = read_baseline(repo_root / "fixtures" / "baselines" / "tiny-cpu.yaml").model_copy(
        update={"fingerprint": None}
    )
    r = judge(old, load_result_sets([f"cold={_run(tmp_path / 'c', env=THERE)}"]))
    match = r.results[0].environment_match
    assert match is not None and match.judged and match.hardware == "unknown"
    assert match.note is not None and "no fingerprint" in match.note
    assert not any("calibrated on" in g.why for g in r.gates)
    out = tmp_path / "gate.json"
    write_report_json(out, r)
    assert read_report_json(out).results[0].environment_match == match


# ------------------------------------------------------------------------------- travelling gates


def test_rel_metric_value_and_interval(tmp_path: Path) -> None:
    phase = load_result_set(_run(tmp_path / "warm", 1500, 1, ttft_ms=100), "warm")
    ref = load_result_set(_run(tmp_path / "reference", 600, 2, ttft_ms=50), "reference")
    m = METRICS.get("ttft_p95_rel").compute(phase.frame, MetricContext(reference=ref.frame))
    p, r = phase.frame.col("ttft_ms"), ref.frame.col("ttft_ms")
    assert m.value == pytest.approx(percentile(p, 95) / percentile(r, 95))
    c = relative_confidence(0.95)
    (lo_p, hi_p), (lo_r, hi_r) = percentile_interval(p, 95, c), percentile_interval(r, 95, c)
    assert (m.lo, m.hi) == pytest.approx((lo_p / hi_r, hi_p / lo_r))
    assert m.lo < 2.0 < m.hi and m.n == 1500 and not m.problems
    assert METRICS.get("ttft_p95_rel").unit == "x" and not METRICS.get("ttft_p95_rel").speed_dependent


def test_warm_gain_is_one_minus_the_rel_ratio_with_its_interval_turned_over(tmp_path: Path) -> None:
    planned = load_result_set(_run(tmp_path / "planned", 1500, 1, ttft_ms=50), "planned")
    cold = load_result_set(_run(tmp_path / "reference", 600, 2, ttft_ms=100), "reference")
    ctx = MetricContext(reference=cold.frame)
    rel = METRICS.get("ttft_p95_rel").compute(planned.frame, ctx)
    gain = METRICS.get("warm_gain_ttft_p95").compute(planned.frame, ctx)
    assert gain.value == pytest.approx(1 - rel.value) and 0.3 < gain.value < 0.7
    assert (gain.lo, gain.hi) == pytest.approx((1 - rel.hi, 1 - rel.lo))
    spec = METRICS.get("warm_gain_ttft_p95")
    assert spec.direction == "at_least" and spec.default_phase == "planned" and not spec.speed_dependent
    # Judged as a gate: a seed-sized cut (41 %) passes when the interval is above it, fails below.
    for threshold, verdict in ((0.2, "pass"), (0.9, "fail")):
        gate = Gate(metric="warm_gain_ttft_p95", threshold=threshold)
        result = judge_gate(gate, planned, 0.95, reference=cold)
        assert result.verdict == verdict, result.reason


def test_rel_gates_travel_and_catch_a_code_regression(tmp_path: Path) -> None:
    base = _update(
        tmp_path,
        f"warm={_run(tmp_path / 'w', 1500, 1)}",
        f"reference={_run(tmp_path / 'r', 1500, 2)}",
    )
    rel = [g for g in base.gates if g.metric.endswith("_rel")]
    assert {g.metric for g in rel} == {"ttft_p95_rel", "tpot_p95_rel", "e2e_p95_rel"}
    assert all(g.phase == "warm" and 0.8 < g.threshold < 1.25 for g in rel)
    # Another machine, everything 3× slower, phase and reference alike: absolute gates are skipped,
    # the ratios pass.
    slow = {"env": THERE, "ttft_ms": 150.0, "tpot_ms": 12.0}
    sets = load_result_sets(
        [
            f"warm={_run(tmp_path / 'w2', 1500, 3, **slow)}",
            f"reference={_run(tmp_path / 'r2', 1500, 4, **slow)}",
        ]
    )
    r = judge(base, sets)
    v = _verdicts(r)
    assert {v[f"{m}@warm"] for m in ("ttft_p95_rel", "tpot_p95_rel", "e2e_p95_rel")} == {"pass"}
    assert v["tpot_p95@warm"] == "skipped" and r.verdict == "pass"
    # There, decode got 2× slower in the code (the reference too is slower by the machine only).
    regressed = {**slow, "tpot_ms": 24.0}
    sets = load_result_sets(
        [
            f"warm={_run(tmp_path / 'w3', 1500, 5, **regressed)}",
            f"reference={_run(tmp_path / 'r3', 1500, 6, **slow)}",
        ]
    )
    r = judge(base, sets)
    assert _verdicts(r)["tpot_p95_rel@warm"] == "fail" and r.verdict == "fail"


def test_rel_gates_need_a_reference_on_the_same_machine(tmp_path: Path) -> None:
    gate = Gate(metric="ttft_p95_rel", threshold=1.0, rel_tolerance=0.2)
    base = Baseline(schema_version=1, gates=[gate])
    warm = _run(tmp_path / "warm", 1500, 1)
    r = judge(base, load_result_sets([f"warm={warm}"]))
    assert r.gates[0].verdict == "unjudgeable" and "no result set labelled 'reference'" in r.gates[0].why
    elsewhere = _run(tmp_path / "ref", 600, 2, env=THERE)
    r = judge(base, load_result_sets([f"warm={warm}", f"reference={elsewhere}"]))
    # A gate without a phase is not applied to the reference itself.
    assert [g.label for g in r.gates] == ["warm"]
    assert r.gates[0].verdict == "unjudgeable" and "a ratio needs both on one machine" in r.gates[0].why
    # A ratio threshold is not a 0–1 rate.
    assert Gate(metric="tpot_p95_rel", threshold=3.0).limit == 3.0


# ------------------------------------------------------------------------------- what a gate needs


def _frame(n: int) -> RunFrame:
    import numpy as np

    rng = np.random.default_rng(n)
    return RunFrame.from_columns(n, floats={"ttft_ms": rng.lognormal(3.0, 0.5, n)})


@pytest.mark.parametrize("q", [95, 99])
def test_rerun_min_samples_is_the_smallest_n_with_a_margin(q: int) -> None:
    n = rerun_min_samples(q, 0.95)
    metric = METRICS.get(f"ttft_p{q}")
    assert math.isfinite(rerun_margin(metric, _frame(n), confidence=0.95))
    assert math.isinf(rerun_margin(metric, _frame(n - 1), confidence=0.95))


def test_update_says_how_many_requests_a_skipped_gate_needs(tmp_path: Path) -> None:
    rs: ResultSet = load_result_set(_run(tmp_path / "small", 600))
    _, _, skipped = baseline_from_results([rs], headroom=0.1)
    p99 = next(s for s in skipped if s.startswith("small: ttft_p99"))
    assert f"P99 needs ≥ {rerun_min_samples(99, 0.95)} samples, this run has 600" in p99
    tiny: ResultSet = load_result_set(_run(tmp_path / "tiny", 100))
    _, _, skipped = baseline_from_results([tiny], headroom=0.1)
    p99 = next(s for s in skipped if s.startswith("tiny: ttft_p99"))
    assert f"P99 needs ≥ {rerun_min_samples(99, 0.95)} samples" in p99
