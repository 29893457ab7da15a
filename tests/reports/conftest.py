"""Result sets for the report tests: a paired cold/warm run and a warmup ladder with a rollback."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.gates import ResultSet, load_result_sets
from harness.load.results import StageOutcome
from tests.gates.factory import make_records, make_run, write_run


@pytest.fixture(scope="session")
def run_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("report-runs")
    ladder = make_records(900, 5, stages=("stage-1", "stage-2", "stage-3"), rate=30)
    stages = [
        StageOutcome(name="stage-1", target_rate=10, started_s=0, ended_s=10, requests=300),
        StageOutcome(
            name="stage-2",
            target_rate=30,
            started_s=10,
            ended_s=20,
            requests=300,
            errors=36,
            failure_rate=0.12,
            tolerance=0.05,
            verdict="rolled_back",
            rolled_back_to="stage-1",
        ),
        StageOutcome(name="stage-3", target_rate=10, started_s=20, ended_s=30, requests=300),
    ]
    return {
        "cold": make_run(
            d / "cold", 600, 1, ttft_ms=250, hit_l1=0, hit_l2=0, hit_l3=0, prefix_hit=0.0, stages=("cold",)
        ),
        "warm": make_run(d / "warm", 600, 2, stages=("warm",)),
        "ladder": write_run(d / "ladder", ladder, stages=stages),
    }


@pytest.fixture(scope="session")
def paired(run_dirs: dict[str, Path]) -> list[ResultSet]:
    return load_result_sets(
        [f"cold={run_dirs['cold']}", f"warm={run_dirs['warm']}", f"ladder={run_dirs['ladder']}"]
    )
