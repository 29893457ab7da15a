"""Distributed runs: one master, two workers, one epoch, one results directory; a lost worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, free_port, run_locust
from tests.load.helpers import make_corpus
from tests.load.sse_server import Behaviour, SSEServer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_master_and_two_workers_each_send_half_into_one_results_dir(tmp_path: Path, corpus: Path) -> None:
    with SSEServer(Behaviour(first_token_s=0.01, gap_s=0.005, tokens=4)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=20, duration=3, results_dir=tmp_path / "r",
                        start_delay=2.0, concurrency=8, processes=2)  # fmt: skip
        assert run_locust(spec, timeout_s=180) == 0
        served = srv.requests
    recs = list(read_records(tmp_path / "r"))
    assert len(recs) == 60 == len(served)
    assert Counter(r.worker for r in recs) == {0: 30, 1: 30}
    # The workers' records reach the master whole: the queue wait the pacer stamped included.
    assert all(r.queue_wait_ms is not None and 0.0 <= r.queue_wait_ms <= r.lateness_ms for r in recs)
    # One epoch for both: the interleaved arrivals of the two workers form the one 20/s schedule.
    intended = sorted(r.intended_s for r in recs)
    assert intended == pytest.approx([i / 20 for i in range(60)], abs=1e-9)
    warmup_ids = {x.headers["X-Warmup-ID"] for x in served}
    assert len(warmup_ids) == 1
    s = read_summary(tmp_path / "r")
    assert s.requests == 60 and not s.interrupted and s.warmup_id in warmup_ids
    assert [(w.worker, w.recorded, w.missing) for w in s.workers] == [(0, 30, False), (1, 30, False)]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "locust.log",
        "records.jsonl",
        "server_metrics.jsonl",  # the master's scrapes (the stub has no /metrics: one error line)
        "summary.json",
    ]


@pytest.mark.parametrize("killed", [1, 2])
def test_a_lost_worker_is_reported_and_makes_the_run_incomplete(tmp_path: Path, killed: int) -> None:
    """One of two lost: the other sends its whole share, the run exits 6 (incomplete). Both lost:
    the run ends by itself, its results finalized, with 6 too."""
    corpus = make_corpus(tmp_path / "c.jsonl", 40)
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "replay.py")]
    results = tmp_path / "r"
    with SSEServer(Behaviour(first_token_s=0.01, gap_s=0.005, tokens=4)) as srv:
        master = subprocess.Popen(
            [*base, "--master", "--headless", "--expect-workers", "2", "--master-bind-port", port,
             "--host", srv.url, "--corpus", str(corpus), "--rate", "10", "--duration", "12",
             "--out", str(results), "--start-delay", "1", "--concurrency", "4"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        workers = [
            subprocess.Popen(
                [*base, "--worker", "--master-port", port],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(2)
        ]
        try:
            deadline = time.monotonic() + 120
            # Wait until both workers sent requests, then kill one without a goodbye.
            while len(srv.requests) < 20:
                assert master.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            for w in workers[2 - killed :]:
                w.send_signal(signal.SIGKILL)
            _, err = master.communicate(timeout=120)
        finally:
            for p in [master, *workers]:
                if p.poll() is None:
                    p.kill()
    assert master.returncode == 6, err.decode()[-3000:]
    s = read_summary(results)
    lost = [w for w in s.workers if w.missing]
    assert len(s.workers) == 2 and len(lost) == killed and not s.interrupted
    assert sum("was lost" in w for w in s.warnings) == killed
    if killed == 1:
        alive = next(w for w in s.workers if not w.missing)
        assert alive.recorded == alive.scheduled == 60  # its whole share, after the other one died
    assert s.requests == len(list(read_records(results))) < 120
