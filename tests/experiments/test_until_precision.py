"""``harness run --until-precision``: each phase watches its own gates' percentiles and stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.experiments.paired_spec import prepare
from harness.gates.baseline import precision_min_samples, precision_targets, read_baseline
from harness.load.precision import parse_precision_on
from tests.experiments.helpers import paired_spec
from tests.experiments.test_paired import harness_run, read, write_corpus
from tests.gates.factory import ROOT
from tests.load.helpers import decided_precision
from tests.server.conftest import harness_server

BASELINE = """\
schema_version: 1
confidence: 0.9
gates:
  - {metric: tpot_p95, threshold: 6.0, min_samples: 200, phase: warm}
  - {metric: ttft_p99, threshold: 250, phase: warm}
  - {metric: cold_start_p99, threshold: 850}
  - {metric: prefill_kv_bytes_p95, threshold: 1e6}
  - {metric: error_rate, threshold: 0.01}
  - {metric: e2e_p95, threshold: 400}
"""


def test_precision_targets_are_the_phases_percentile_gates(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(BASELINE)
    b = read_baseline(tmp_path / "b.yaml")
    # cold: cold_start_p99 (its default phase) and e2e_p95 (no phase: every run); never rates or bytes.
    assert precision_targets(b, "cold") == [("ttft_from_intended_ms", 99.0), ("e2e_ms", 95.0)]
    assert precision_targets(b, "warm") == [("tpot_ms", 95.0), ("ttft_ms", 99.0), ("e2e_ms", 95.0)]
    assert precision_min_samples(b, "warm") == 200 and precision_min_samples(b, "cold") is None
    example = read_baseline(ROOT / "fixtures" / "baselines" / "example.yaml")
    for phase in ("cold", "warm"):
        for field, q in precision_targets(example, phase):  # every one is a valid --precision-on
            assert parse_precision_on(f"{field}:{q:g}")[0].field == field


def test_prepare_gives_each_phase_its_gates_to_watch(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(BASELINE)
    corpus = write_corpus(tmp_path / "c.jsonl", 3)
    load = {"corpus": corpus, "rate": 2, "max_duration": 5, "until_precision": "10%"}
    prep = prepare(paired_spec(tmp_path / "out", gate=tmp_path / "b.yaml", **load))
    assert len(prep.planned) == 10  # --max-duration bounds the rate: the progress bar's most
    assert prep.phase_load == {
        "cold": {"precision_on": "ttft_from_intended_ms:99,e2e_ms:95", "precision_confidence": 0.9},
        "warm": {"precision_on": "tpot_ms:95,ttft_ms:99,e2e_ms:95", "precision_confidence": 0.9,
                 "precision_min_samples": 200},
    }  # fmt: skip
    # An explicit --precision-on wins; without --until-precision nothing changes.
    load["precision_on"] = "ttft_ms:50"
    prep = prepare(paired_spec(tmp_path / "out", gate=tmp_path / "b.yaml", **load))
    assert "precision_on" not in prep.phase_load["cold"]
    del load["until_precision"]
    assert prepare(paired_spec(tmp_path / "out", gate=tmp_path / "b.yaml", **load)).phase_load == {}


@pytest.mark.slow
def test_each_phase_stops_once_its_gates_can_judge(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", 4, long=False, chat=False)
    baseline = tmp_path / "b.yaml"
    baseline.write_text(
        "schema_version: 1\ngates:\n"
        "  - {metric: ttft_p50, threshold: 10000, min_samples: 12, phase: cold}\n"
        "  - {metric: tpot_p50, threshold: 10000, min_samples: 8, phase: warm}\n"
    )
    out = tmp_path / "out"
    with harness_server(tmp_path / "plain") as plain:
        proc = harness_run(
            "--url", plain.url, "--corpus", str(corpus), "--rate", "4", "--max-duration", "60",
            "--until-precision", "100%", "--max-tokens-cap", "4", "--start-delay", "0.5",
            "--gate", str(baseline), "--out", str(out),
        )  # fmt: skip
    assert proc.returncode in (0, 1, 6), proc.stdout + proc.stderr
    run = read(out / "run.json")
    for phase, field, floor in (("cold", "ttft_ms", 12), ("warm", "tpot_ms", 8)):
        rec = run["phases"][phase]
        assert rec["stop_reason"].startswith(f"precision reached: {field} P50 ±"), rec
        # The decision: met on the records at hand, and not before the gate's min_samples.
        rel, n = decided_precision(rec["stop_reason"])[f"{field} P50"]
        assert rel <= 1.0 and n >= floor, rec["stop_reason"]
        s = read(out / phase / "summary.json")
        state = s["precision"][f"{field}:50"]
        # The summary's state is over every record, those that drained after the decision too, so it
        # may widen past the target on a busy machine; it never has fewer samples and says so truly.
        assert state["n"] >= n and state["min_n"] == floor
        assert state["met"] == (state["rel_half_width"] <= 1.0), state
        assert floor <= s["requests"] < 4 * 60 / 2  # stopped early, and not before the gate's min_samples
    assert "precision reached" in proc.stderr
