"""``harness capacity`` for real: the CLI in a subprocess, headless Locust probes, and a test server
of known capacity (:mod:`tests.experiments.capacity_server`: 4 slots × 0.5 s = 8 requests/s).

Assertions are about where the answer lies relative to the known capacity, never about timings; the
server's hold times are absolute (from when a slot was taken), so a busy machine does not move its
capacity. Probes are small (40 requests) to keep these tests short, so their terms are medians: the
interval of a P90 of 40 requests ends at the slowest one, and one request a busy machine stalls for
45 ms made a probe well below capacity inconclusive. The median's interval spans ranks 14 to 27, and
past capacity the queue moves it by far more than that (about 120 ms at 8.4 requests/s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.common.errors import ExitCode
from harness.experiments.capacity_result import read_capacity
from tests.experiments.capacity_server import Capacity, CapacityServer
from tests.gates.factory import ROOT
from tests.load.helpers import make_corpus

SLO = "ttft_from_intended_p50<=3x,error_rate<=0.1"
SMALL = ("--probe-requests", "40", "--probe-seconds", "2", "--slo", SLO)


def harness_capacity(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "harness.cli", "capacity", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return make_corpus(tmp_path / "corpus.jsonl", 20)


@pytest.mark.slow
def test_finds_a_known_capacity_within_its_interval(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "cap"
    with CapacityServer(Capacity(slots=4, hold_s=0.5)) as srv:
        proc = harness_capacity(
            "--url",
            srv.url,
            "--corpus",
            str(corpus),
            "--out",
            str(out),
            "--min-rate",
            "5",
            "--resolution",
            "0.25",
            "--json-out",
            str(tmp_path / "answer.json"),
            *SMALL,
        )
    assert proc.returncode == 0, proc.stderr
    result = read_capacity(out / "capacity.json")
    assert json.loads((tmp_path / "answer.json").read_text()) == result.model_dump(mode="json")
    assert result.bounded and result.high is not None
    # 8 requests/s lies in the bracket the probes proved: passes at low, fails at high.
    assert result.low <= 8.0 <= result.high
    assert result.low <= result.capacity_rps <= result.high
    assert result.high / result.low <= 1.25
    rates = [p.rate for p in result.probes]
    assert rates[:2] == [5.0, 10.0]  # the reference, then ×2, which fails
    assert result.reference is not None and result.reference.endswith("01-5rps")
    # Every probe is a normal run directory the gates can read.
    for p in result.probes:
        assert (Path(p.dir) / "summary.json").exists() and (Path(p.dir) / "records.jsonl").exists()
        assert p.requests == 40
    assert "capacity:" in proc.stdout and f"{result.capacity_rps:.4g} req/s" in proc.stdout


@pytest.mark.slow
def test_every_probe_passing_up_to_max_rate_says_at_least(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "cap"
    with CapacityServer(Capacity(slots=4, hold_s=0.5)) as srv:
        proc = harness_capacity(
            "--url",
            srv.url,
            "--corpus",
            str(corpus),
            "--out",
            str(out),
            "--min-rate",
            "3",
            "--max-rate",
            "5",
            *SMALL,
        )
    assert proc.returncode == 0, proc.stderr
    result = read_capacity(out / "capacity.json")
    assert [p.rate for p in result.probes] == [3.0, 5.0]
    assert (result.capacity_rps, result.low, result.high, result.bounded) == (5.0, 5.0, None, False)
    assert "at least 5 req/s" in proc.stdout


@pytest.mark.slow
def test_no_rate_meets_a_tight_absolute_slo_exit_1(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "cap"
    with CapacityServer(Capacity(slots=4, hold_s=0.5)) as srv:
        proc = harness_capacity(
            "--url",
            srv.url,
            "--corpus",
            str(corpus),
            "--out",
            str(out),
            "--min-rate",
            "16",
            "--probe-requests",
            "40",
            "--slo",
            "ttft_from_intended_p90<=100,error_rate<=0.1",
        )
    assert proc.returncode == int(ExitCode.CHECK_FAILED), proc.stderr
    result = read_capacity(out / "capacity.json")
    assert (result.capacity_rps, result.low, result.high) == (0.0, 0.0, 16.0)
    assert len(result.probes) == 1 and result.probes[0].verdict == "fail"
    assert "no rate meets the SLO" in proc.stderr


@pytest.mark.slow
def test_a_server_that_falls_over_is_a_cliff_in_errors(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "cap"
    with CapacityServer(Capacity(slots=4, hold_s=0.5, mode="collapse")) as srv:
        proc = harness_capacity(
            "--url",
            srv.url,
            "--corpus",
            str(corpus),
            "--out",
            str(out),
            "--min-rate",
            "5",
            "--resolution",
            "0.5",
            *SMALL,
        )
        rejected = srv.rejected
    assert proc.returncode == 0, proc.stderr
    result = read_capacity(out / "capacity.json")
    assert rejected > 0
    assert result.cliff and result.cliff_term == "error_rate"
    assert result.cliff_rates == [result.low, result.high]
    assert result.high is not None and result.low <= 8.0 <= result.high
    assert "a cliff in error_rate" in proc.stdout


@pytest.mark.slow
def test_a_target_answering_some_errors_gets_its_error_rate_not_exit_5(tmp_path: Path, corpus: Path) -> None:
    """Every 4th request answered 500, the calibration's 4th among them: the search goes on (it once
    ended there as "the target does not serve", exit 5) and answers with the error rate: 10 of the
    probe's 40 fail the 10 % term, 11 of 44 with the calibration's."""
    out = tmp_path / "cap"
    with CapacityServer(Capacity(slots=4, hold_s=0.1, first_token_s=0.02, error_share=0.25)) as srv:
        proc = harness_capacity(
            "--url", srv.url, "--corpus", str(corpus), "--out", str(out), "--max-probes", "1",
            "--probe-requests", "40", "--probe-seconds", "0", "--slo", SLO,
        )  # fmt: skip
    assert proc.returncode == int(ExitCode.CHECK_FAILED), proc.stderr
    result = read_capacity(out / "capacity.json")
    assert result.calibration is not None and result.calibration.errors == 1
    assert [(p.requests, p.errors) for p in result.probes] == [(40, 10)]
    assert result.limited_by_errors and result.errors is not None
    assert (result.errors.errors, result.errors.requests) == (11, 44)
    assert "because of the target's errors" in proc.stderr and "11 of 44 requests failed" in proc.stderr


def test_bad_slo_and_an_unreachable_target_exit_before_probing(tmp_path: Path, corpus: Path) -> None:
    bad = harness_capacity(
        "--url",
        "http://127.0.0.1:9",
        "--corpus",
        str(corpus),
        "--slo",
        "ttft_p95<=x",
        "--out",
        str(tmp_path / "a"),
    )
    assert bad.returncode == int(ExitCode.CONFIG) and "ttft_p95<=x" in bad.stderr
    small = harness_capacity(
        "--url",
        "http://127.0.0.1:9",
        "--corpus",
        str(corpus),
        "--slo",
        "error_rate<=0.01",
        "--out",
        str(tmp_path / "b"),
    )
    assert small.returncode == int(ExitCode.CONFIG) and "--probe-requests 368" in small.stderr
    gone = harness_capacity(
        "--url", "http://127.0.0.1:9", "--corpus", str(corpus), "--out", str(tmp_path / "c")
    )
    assert gone.returncode == int(ExitCode.UNAVAILABLE), gone.stderr


@pytest.mark.slow
def test_run_at_half_of_the_capacity_it_measures_first(tmp_path: Path, corpus: Path) -> None:
    from harness.experiments.paired import PairedRunner
    from harness.experiments.paired_spec import PairedSpec
    from harness.experiments.recipe import Recipe

    out = tmp_path / "run"
    with CapacityServer(Capacity(slots=4, hold_s=0.5)) as srv:
        recipe = Recipe.model_validate({
            "target": {"url": srv.url},
            "load": {"corpus": corpus, "duration": 2.0, "rate": "50%"},
            "warmup": {"probes": 4},
            "capacity": {"slo": SLO, "min_rate": 5.0, "probe_requests": 40, "probe_seconds": 2.0,
                         "resolution": 1.0},
        })  # fmt: skip
        record = PairedRunner(PairedSpec(recipe, out=out)).run()
    cap = record.capacity
    assert cap is not None and cap.source == "measured" and cap.rate_share == 0.5
    assert cap.low is not None and cap.high is not None and cap.low <= 8.0 <= cap.high
    assert cap.rate_rps == pytest.approx(0.5 * cap.capacity_rps, rel=1e-3)
    measured = read_capacity(out / "capacity" / "capacity.json")
    assert measured.capacity_rps == cap.capacity_rps
    # Both phases ran at the resolved rate; run.json says so in its load arguments too.
    for phase in ("cold", "warm"):
        summary = json.loads((out / phase / "summary.json").read_text())
        assert summary["target_rate"] == pytest.approx(cap.rate_rps)
    args = record.load["args"]
    assert args[args.index("--rate") + 1] == "50%"
    assert args[args.index("--capacity") + 1] == str(cap.capacity_rps)
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["capacity"]["capacity_rps"] == cap.capacity_rps


@pytest.mark.slow
def test_without_model_the_calibration_and_probes_name_the_targets(tmp_path: Path, corpus: Path) -> None:
    """A target that answers 400 to a body without ``model`` (as one enforcing the OpenAI API does):
    the calibration requests and the probe's Locust run name its first ``GET /v1/models`` id."""
    from tests.load.sse_server import Behaviour, SSEServer

    strict = Behaviour(
        first_token_s=0.005, gap_s=0.001, tokens=3, models=("served-model",), require_model=True
    )
    out = tmp_path / "cap"
    with SSEServer(strict) as srv:
        proc = harness_capacity(
            "--url", srv.url, "--corpus", str(corpus), "--out", str(out), "--max-probes", "1",
            "--max-rate", "10", "--probe-requests", "20", "--probe-seconds", "1", "--slo", "error_rate<=0.5",
        )  # fmt: skip
        served = srv.requests
    assert proc.returncode == 0, proc.stderr
    result = read_capacity(out / "capacity.json")
    assert result.calibration is not None and [p.errors for p in result.probes] == [0]
    assert len(served) == 4 + 20 and {(x.status, x.body.get("model")) for x in served} == {
        (200, "served-model")
    }
