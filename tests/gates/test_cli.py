"""`harness gate` and `harness baseline …` through the real `harness` entry point: exit codes, files."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.common.errors import ExitCode
from tests.gates.factory import harness_cli, make_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("runs")
    return {
        "cold": make_run(d / "cold", 800, 1, ttft_ms=200, hit_l1=0, hit_l2=0, hit_l3=0, prefix_hit=0.0),
        "warm": make_run(d / "warm", 800, 2),
        "warm2": make_run(d / "warm2", 800, 3),
        "slow": make_run(d / "slow", 800, 2, tpot_ms=6.0),
        "starved": make_run(d / "starved", 800, 2, client_cpu_pct=97.0),
    }


@pytest.fixture(scope="module")
def base(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "baseline.yaml"
    res = harness_cli(
        "baseline",
        "update",
        f"cold={runs['cold']}",
        f"warm={runs['warm']}",
        "--out",
        str(out),
        "--headroom",
        "10%",
    )
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stderr and out.is_file()
    return out


def test_gate_pass_writes_table_junit_and_json(runs: dict[str, Path], base: Path, tmp_path: Path) -> None:
    junit, verdict = tmp_path / "j.xml", tmp_path / "v.json"
    res = harness_cli(
        "gate",
        "--baseline",
        str(base),
        f"cold={runs['cold']}",
        f"warm={runs['warm2']}",
        "--junit",
        str(junit),
        "--json-out",
        str(verdict),
    )
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    for col in ("metric", "baseline", "measured", "delta", "interval", "verdict"):
        assert col in res.stdout
    assert "tpot_p95" in res.stdout and "PASS" in res.stdout
    assert ET.parse(junit).getroot().get("failures") == "0"
    assert json.loads(verdict.read_text())["verdict"] == "pass"


def test_gate_fail_exits_1(runs: dict[str, Path], base: Path) -> None:
    res = harness_cli("gate", "--baseline", str(base), f"cold={runs['cold']}", f"warm={runs['slow']}")
    assert res.returncode == ExitCode.CHECK_FAILED == 1, res.stdout + res.stderr
    assert "FAIL" in res.stderr and "tpot_p95@warm" in res.stderr
    assert "Traceback" not in res.stderr
    # Defaults: the outputs land in the first results directory.
    assert json.loads((runs["cold"] / "gate.json").read_text())["exit_code"] == 1
    assert (runs["cold"] / "gate.junit.xml").is_file()


def test_gate_cannot_judge_exits_6(runs: dict[str, Path], base: Path) -> None:
    res = harness_cli("gate", "--baseline", str(base), f"cold={runs['cold']}", f"warm={runs['starved']}")
    assert res.returncode == ExitCode.UNJUDGEABLE == 6, res.stdout + res.stderr
    assert "client-bound" in res.stderr and "Traceback" not in res.stderr
    # A paired baseline on one run: its cold gates have no run to judge.
    res = harness_cli("gate", "--baseline", str(base), f"warm={runs['warm2']}")
    assert res.returncode == 6 and "cold=DIR" in res.stdout + res.stderr


def test_usage_and_input_errors_keep_their_own_codes(
    runs: dict[str, Path], base: Path, tmp_path: Path
) -> None:
    res = harness_cli("gate", str(runs["warm"]))  # no --baseline
    assert res.returncode == ExitCode.USAGE == 2 and "--baseline" in res.stderr
    res = harness_cli("gate", "--baseline", str(base), str(tmp_path / "missing"))
    assert res.returncode == ExitCode.INPUT == 3 and "no such results directory" in res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\ngates:\n  - {metric: tpot_p95, threshold: 4, tolerence: 1}\n")
    res = harness_cli("gate", "--baseline", str(bad), str(runs["warm"]))
    assert res.returncode == ExitCode.CONFIG == 4
    assert f"{bad}:3: field 'gates.0.tolerence'" in res.stderr and "Traceback" not in res.stderr
    res = harness_cli("gate", "--baseline", str(base), f"a={runs['warm']}", f"a={runs['warm2']}")
    assert res.returncode == ExitCode.INPUT and "two result sets are labelled 'a'" in res.stderr


def test_baseline_check_metrics_and_noise(runs: dict[str, Path], base: Path) -> None:
    res = harness_cli("baseline", "check", str(base))
    assert res.returncode == 0 and "tpot_p95" in res.stdout and "warm_rate" in res.stdout
    res = harness_cli("baseline", "metrics")
    assert res.returncode == 0 and "prefill_peak_bytes_max" in res.stdout
    res = harness_cli(
        "baseline",
        "noise",
        "--baseline",
        str(base),
        f"cold={runs['cold']}",
        f"warm={runs['warm']}",
        "--repeats",
        "20",
    )
    assert res.returncode == 0, res.stderr
    assert "20 bootstrap reruns" in res.stdout and "tpot_p95@warm" in res.stdout


def test_help_lists_the_top_level_commands() -> None:
    res = harness_cli("--help")
    assert res.returncode == 0
    for name in ("gate", "report", "baseline"):
        assert name in res.stdout
