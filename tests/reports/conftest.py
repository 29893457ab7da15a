"""Result sets for the report tests: a paired cold/warm run and a warmup ladder with a rollback."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.gates import ResultSet, load_result_sets
from harness.load.run_summary import StageOutcome
from harness.load.server_metrics import SERVER_METRICS_FILE, ServerSample
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
    dirs = {
        "cold": make_run(
            d / "cold", 600, 1, ttft_ms=250, hit_l1=0, hit_l2=0, hit_l3=0, prefix_hit=0.0, stages=("cold",)
        ),
        "warm": make_run(d / "warm", 600, 2, stages=("warm",)),
        "ladder": write_run(d / "ladder", ladder, stages=stages),
    }
    for name, hit in (("cold", 0.0), ("warm", 0.8), ("ladder", 0.5)):
        write_server_metrics(dirs[name], 30, hit)
    return dirs


def write_server_metrics(run: Path, seconds: int, hit: float) -> None:
    """A scrape a second, as the load stage writes them: 100 prompt tokens looked up per second,
    ``hit`` of them served by the prefix cache."""
    lines = [
        ServerSample(t_s=t - 0.5, kind="vllm", prefix_queries=100.0 * t, prefix_hits=100.0 * hit * t,
                     running=float(t % 4), waiting=float(t % 3 == 0), kv_usage=min(1.0, t / seconds))
        for t in range(seconds + 1)
    ]  # fmt: skip
    (run / SERVER_METRICS_FILE).write_text(
        "".join(x.model_dump_json(exclude_none=True) + "\n" for x in lines)
    )


@pytest.fixture(scope="session")
def paired(run_dirs: dict[str, Path]) -> list[ResultSet]:
    return load_result_sets(
        [f"cold={run_dirs['cold']}", f"warm={run_dirs['warm']}", f"ladder={run_dirs['ladder']}"]
    )
