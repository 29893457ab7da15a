"""The baseline file: validated strictly, errors name file, line and field; written by `baseline update`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.common.errors import ConfigError, InputError
from harness.gates.baseline import Baseline, Gate, read_baseline, write_baseline
from harness.gates.judge import judge
from harness.gates.measurement import min_samples_for_bound
from harness.gates.metrics import METRICS
from harness.gates.runs import load_result_set, load_result_sets
from harness.gates.update import baseline_from_results, parse_headroom
from tests.gates.factory import make_run

REQUIRED_METRICS = {
    "tpot_p95",
    "ttft_p95",
    "ttft_p99",
    "e2e_p95",
    "prefill_kv_bytes_per_token_p95",
    "prefill_peak_bytes_max",
    "error_rate",
    "hit_rate_any",
    "hit_rate_l1",
    "hit_rate_l2",
    "hit_rate_l3",
    "hit_rate_prefix",
    "lateness_p99",
    "cold_start_p99",
    "warm_rate",
}


def test_registry_has_every_metric_the_issue_asks_for() -> None:
    assert set(METRICS.names()) >= REQUIRED_METRICS
    assert METRICS.get("cold_start_p99").default_phase == "cold"
    assert METRICS.get("warm_rate").default_phase == "warm"


def test_example_baseline_parses_and_covers_the_required_metrics(repo_root: Path) -> None:
    b = read_baseline(repo_root / "fixtures" / "baselines" / "example.yaml")
    assert b.schema_version == 1
    assert REQUIRED_METRICS - {"hit_rate_l2", "hit_rate_l3"} <= {g.metric for g in b.gates}
    seed = {g.metric: g for g in b.gates if g.metric in ("cold_start_p99", "warm_rate")}
    assert seed["cold_start_p99"].limit == 850 and seed["cold_start_p99"].effective_phase == "cold"
    assert (
        seed["warm_rate"].limit == pytest.approx(0.92) and seed["warm_rate"].effective_direction == "at_least"
    )
    assert any(g.scenario == "chat" for g in b.gates)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "b.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (
            "schema_version: 1\ngates:\n  - metric: tpot_p95\n    threshold: 4\n    tolerance: 1\n",
            5,
            "gates.0.tolerance",
            "Extra inputs",
        ),
        ("schema_version: 2\ngates:\n  - {metric: tpot_p95, threshold: 4}\n", 1, "schema_version", "1"),
        ("schema_version: 1\ngates:\n  - {metric: tpot_p9, threshold: 4}\n", 3, "gates.0.metric", "tpot_p9"),
        ("schema_version: 1\ngates:\n  - {metric: warm_rate, threshold: 92}\n", 3, "gates.0", "0.92"),
        (
            "schema_version: 1\ngates:\n  - {metric: ttft_p95, threshold: 4, require_measured: true}\n",
            3,
            "gates.0",
            "require_measured",
        ),
        (
            "schema_version: 1\ngates:\n  - {metric: ttft_p95, threshold: .nan}\n",
            3,
            "gates.0.threshold",
            "finite",
        ),
        ("schema_version: 1\ngates: []\n", 2, "gates", "at least 1"),
        ("gates:\n  - {metric: ttft_p95, threshold: 4}\n", 1, "schema_version", "required"),
        (
            "schema_version: 1\ngates:\n  - {metric: ttft_p95, threshold: 4}\n"
            "  - {metric: ttft_p95, threshold: 5}\n",
            None,
            None,
            "two gates named 'ttft_p95'",
        ),
    ],
)
def test_bad_baselines_name_line_and_field(
    tmp_path: Path, text: str, line: int | None, field: str | None, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        read_baseline(_write(tmp_path, text))
    assert message in err.value.message
    if line is not None:
        assert err.value.line == line
    if field is not None:
        assert err.value.field == field
    assert err.value.file is not None


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        read_baseline(_write(tmp_path, "schema_version: 1\ngates:\n  - {metric: [\n"))
    assert err.value.line is not None and "YAML" in err.value.message


def test_tolerances_and_limits() -> None:
    g = Gate(metric="tpot_p95", threshold=40.0, rel_tolerance="10%", abs_tolerance=1.0)  # type: ignore[arg-type]
    assert g.rel_tolerance == pytest.approx(0.1)
    assert g.limit == pytest.approx(44.0)  # the larger tolerance wins
    g = Gate(metric="tpot_p95", threshold=4.0, rel_tolerance=0.1, abs_tolerance=1.0)
    assert g.limit == pytest.approx(5.0)
    g = Gate(metric="hit_rate_any", threshold=0.9, rel_tolerance=0.1)
    assert g.effective_direction == "at_least" and g.limit == pytest.approx(0.81)
    g = Gate(metric="tpot_p95", threshold=40.0, direction="at_least")
    assert g.limit == 40.0 and g.effective_direction == "at_least"
    assert (
        Gate(metric="tpot_p95", threshold=1).effective_min_samples(0.95)
        == min_samples_for_bound(95, 0.95)
        == 72
    )
    assert Gate(metric="ttft_p99", threshold=1).effective_min_samples(0.95) == 368
    assert (
        Gate(metric="ttft_p95", threshold=1, scenario="chat", stage="warm").id
        == "ttft_p95[scenario=chat,stage=warm]"
    )
    assert parse_headroom("10%") == pytest.approx(0.1) and parse_headroom("0.25") == 0.25
    with pytest.raises(ConfigError):
        parse_headroom("lots")
    with pytest.raises(ConfigError):
        parse_headroom("150%")


def test_update_writes_a_baseline_the_same_run_passes(tmp_path: Path) -> None:
    from harness.gates.judge import judge

    # 1300 requests each: enough for a P99 gate (baseline update writes one from about 1,200 samples).
    make_run(tmp_path / "cold", 1300, 1, ttft_ms=300, hit_l1=0, hit_l2=0, hit_l3=0, prefix_hit=0.0)
    make_run(tmp_path / "warm", 1300, 2)
    sets = load_result_sets([str(tmp_path / "cold"), str(tmp_path / "warm")])
    b, comments, skipped = baseline_from_results(sets, headroom=0.1, name="t", per_scenario=True)
    out = tmp_path / "base.yaml"
    write_baseline(out, b, comments)
    text = out.read_text()
    assert "# " in text and "provenance:" in text
    back = read_baseline(out)
    assert [g.id for g in back.gates] == [g.id for g in b.gates]
    by = {(g.id, g.effective_phase): g for g in back.gates}
    assert ("cold_start_p99", "cold") in by and ("warm_rate", "warm") in by
    assert ("tpot_p95[scenario=chat]", "warm") in by
    tpot = by[("tpot_p95", "warm")]
    assert tpot.rel_tolerance == pytest.approx(0.1) and tpot.min_samples == 650
    # The cold run has no hits at all: nothing to gate there, and it says so.
    assert any(s.startswith("cold: hit_rate_any") for s in skipped)
    # Estimated peaks (the factory's CPU-like records) are accepted, visibly.
    assert by[("prefill_peak_bytes_max", "warm")].require_measured is True
    report = judge(back, sets)
    assert report.verdict == "pass", report.headline()


def test_update_marks_estimated_peaks_and_refuses_untrustworthy_runs(tmp_path: Path) -> None:
    make_run(tmp_path / "est", 600, 1, peak_measured=False)
    b, comments, _ = baseline_from_results([load_result_set(tmp_path / "est")], headroom=0.1)
    peak = next(g for g in b.gates if g.metric == "prefill_peak_bytes_max")
    assert peak.require_measured is False
    assert any("estimated" in c for c in comments.values())
    make_run(tmp_path / "starved", 600, 1, client_cpu_pct=97.0)
    with pytest.raises(InputError, match="client-bound"):
        baseline_from_results([load_result_set(tmp_path / "starved")], headroom=0.1)


def test_update_accepts_a_jittery_client_and_widens_latency_tolerances_by_it(tmp_path: Path) -> None:
    """A co-located client that woke late (own lateness ≈ 6 ms at P95, no queue wait) is not
    client-bound: its baseline's latency gates carry the jitter in their tolerance, so its own reruns
    are not called inconclusive, and the comment says why."""
    rs = load_result_set(make_run(tmp_path / "jittery", 2000, 1, lateness_ms=2.0))
    assert not rs.problems and rs.summary is not None and not rs.summary.client_bound
    quiet = load_result_set(make_run(tmp_path / "quiet", 2000, 1))
    b, comments, _ = baseline_from_results([rs], headroom=0.1)
    bq, _, _ = baseline_from_results([quiet], headroom=0.1)
    ttft = next(i for i, g in enumerate(b.gates) if g.metric == "ttft_p95")
    ttft_quiet = next(g for g in bq.gates if g.metric == "ttft_p95")
    # Exponential lateness, mean 2 ms: its P95 is about 6 ms, and a rerun's may reach further.
    assert b.gates[ttft].abs_tolerance >= ttft_quiet.abs_tolerance + 5.0
    assert "client's jitter (own P95 lateness" in comments[ttft]
    assert judge(b, [rs]).verdict == "pass"


def test_written_yaml_is_plain_yaml(tmp_path: Path) -> None:
    make_run(tmp_path / "r", 400, 3)
    b, comments, _ = baseline_from_results([load_result_set(tmp_path / "r")], headroom=0.2)
    write_baseline(tmp_path / "b.yaml", b, comments)
    data = yaml.safe_load((tmp_path / "b.yaml").read_text())
    assert Baseline.model_validate(data).gates[0].rel_tolerance == pytest.approx(0.2)
