"""Real headless Locust runs with ``--until-precision``: they stop when the percentiles are known.

Assertions are on what the run did (its stop reason, how many requests it sent, the precision its
summary reports), never on wall time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from tests.load.helpers import decided_precision
from tests.load.sse_server import Behaviour, SSEServer

pytestmark = pytest.mark.slow
TIMEOUT_S = 240
RATE = 40.0
MAX_DURATION = 60.0


@pytest.mark.parametrize("processes", [None, 2])
def test_a_run_stops_once_the_watched_percentiles_are_precise(
    tmp_path: Path, corpus: Path, processes: int | None
) -> None:
    # Gaps of 20 ms, not 5: a busy machine's wake-up delays of a few ms are then a small share of
    # TPOT, so its P95 interval closes on a loaded CI runner too.
    with SSEServer(Behaviour(first_token_s=0.05, gap_s=0.02, tokens=4)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=RATE, max_duration=MAX_DURATION,
                        until_precision="50%", results_dir=tmp_path / "r", start_delay=1.0,
                        concurrency=16, processes=processes)  # fmt: skip
        assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
        served = len(srv.requests)
    s = read_summary(tmp_path / "r")
    assert s.stop_reason is not None and s.stop_reason.startswith("precision reached: ttft_ms P95 ±"), s
    assert not s.interrupted and s.errors == 0
    # It stopped early: fewer than the --max-duration × --rate the run was allowed.
    assert s.requests == served == len(list(read_records(tmp_path / "r")))
    assert s.requests < MAX_DURATION * RATE
    assert s.precision is not None and set(s.precision) == {"ttft_ms:95", "tpot_ms:95"}
    decided = decided_precision(s.stop_reason)
    for state in s.precision.values():
        rel, n = decided[f"{state.field} P{state.q:g}"]
        assert rel <= 0.5 and n >= state.min_n == 72, s.stop_reason  # what the stopping rule saw
        # The summary's state adds the requests that drained after the decision: never fewer samples,
        # and "met" says truly whether the interval still holds the target (a busy machine may widen it).
        assert state.n >= n and state.target == 0.5 and state.rel_half_width is not None
        assert state.met == (state.rel_half_width <= 0.5)
    # The precision's percentile is the summary's: one definition, the same records.
    assert s.precision["ttft_ms:95"].value == s.metrics["ttft_ms"].p95
    if processes:
        assert [w.missing for w in s.workers] == [False, False] and all(w.recorded for w in s.workers)


def test_max_duration_ends_a_run_that_cannot_reach_its_precision(tmp_path: Path, corpus: Path) -> None:
    with SSEServer(Behaviour(first_token_s=0.01, gap_s=0.002, tokens=3)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=20, max_duration=3, until_precision=0.1,
                        precision_on="ttft_ms:99.9", results_dir=tmp_path / "r", start_delay=1.0,
                        concurrency=8)  # fmt: skip
        assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
    s = read_summary(tmp_path / "r")
    assert s.requests == 60 and not s.interrupted
    assert s.stop_reason == (
        "max duration 3 s reached before precision: ttft_ms P99.9 not judgeable yet: 60 of ≥ 3688 samples"
    )
    assert s.precision is not None and not s.precision["ttft_ms:99.9"].met


def test_a_schedule_that_ends_first_says_so(tmp_path: Path, corpus: Path) -> None:
    with SSEServer(Behaviour(first_token_s=0.01, gap_s=0.002, tokens=3)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=20, duration=2, max_duration=30,
                        until_precision=0.1, results_dir=tmp_path / "r", start_delay=1.0,
                        concurrency=8)  # fmt: skip
        assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
    s = read_summary(tmp_path / "r")
    assert s.requests == 40
    assert s.stop_reason == (
        "schedule ended before precision: ttft_ms P95 not judgeable yet: 40 of ≥ 72 samples, "
        "tpot_ms P95 not judgeable yet: 40 of ≥ 72 samples"
    )


def test_a_run_time_cap_is_the_stop_reason(tmp_path: Path, corpus: Path) -> None:
    with SSEServer(Behaviour(first_token_s=0.01, gap_s=0.002, tokens=3)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=20, max_duration=60, until_precision=0.1,
                        precision_on="ttft_ms:99.9", results_dir=tmp_path / "r", start_delay=1.0,
                        concurrency=8, run_time="3s")  # fmt: skip
        run_locust(spec, timeout_s=TIMEOUT_S)
    s = read_summary(tmp_path / "r")
    assert s.stop_reason is not None and s.stop_reason.startswith(
        "--run-time reached before precision: ttft_ms P99.9 not judgeable yet: "
    ), s.stop_reason
    assert s.requests < 60 * 20
