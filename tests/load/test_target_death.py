"""A target that dies mid-run is named as such (summary, exit 7), not counted as N failed requests.

The live test kills a real ``harness serve --preset tiny`` process while a replay runs against it;
the unit tests drive :class:`~harness.load.liveness.TargetWatch` with records and health answers.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from harness.common.errors import ExitCode
from harness.load.liveness import Health, TargetWatch, unanswered
from harness.load.results import RECORDS_FILE, RequestRecord, read_records
from harness.load.run_summary import TargetDeath, read_summary
from harness.load.runner import LoadSpec, run_locust
from harness.target.server.launch import running_server
from tests.load.helpers import make_corpus


def _rec(i: int, status: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        id=f"r{i}",
        stage="replay",
        intended_s=float(i),
        sent_s=float(i),
        lateness_ms=0.0,
        status=status,
        error=error,
    )


def _watch(answers: list[Health]) -> tuple[TargetWatch, list[TargetDeath]]:
    died: list[TargetDeath] = []
    return TargetWatch(probe=lambda: answers.pop(0), on_death=died.append), died


def test_a_refused_health_check_after_successes_is_a_death() -> None:
    watch, died = _watch([Health(False, "GET /health: ConnectionRefusedError: refused")])
    watch.add([_rec(0, 200), _rec(1, 200), _rec(2, 0, "ConnectionResetError"), _rec(3, 0, "refused")])
    assert not watch.due()  # two in a row: not yet asked
    assert watch.check(4.0) is None
    watch.add([_rec(4, 500, "HTTP 500: EngineDeadError")])
    death = watch.check(5.0)
    assert death is not None and died == [death]
    assert (death.failed_in_a_row, death.failing_since_s, death.last_ok_s) == (3, 2.0, 1.0)
    assert death.last_error == "HTTP 500: EngineDeadError" and "ConnectionRefusedError" in death.evidence
    assert "3 requests in a row failed on its side from 2.0 s on" in death.describe()
    assert watch.check(6.0) is None  # once


def test_what_is_not_a_death() -> None:
    # 4xx: the target answered (it refused the request); they never start a streak.
    assert not unanswered(_rec(0, 400, "HTTP 400: bad")) and unanswered(_rec(0, 503, "HTTP 503"))
    # vLLM's dead engine: 200, then the error in the stream; a stream cut short counts too. A forced
    # token counting mode the stream cannot serve is the client's choice, not the target's failure.
    assert unanswered(_rec(0, 200, "in-stream error: EngineCore encountered an issue."))
    assert unanswered(_rec(0, 200, "stream ended without [DONE]"))
    assert not unanswered(_rec(0, 200, "--token-counting usage: the stream carries no per-chunk usage"))
    watch, died = _watch([])
    watch.add([_rec(0, 200)] + [_rec(i, 400, "HTTP 400") for i in range(1, 10)])
    assert not watch.due(final=True)
    # A slow health check proves nothing; a success ends the streak.
    watch, died = _watch([Health(None, "GET /health: no answer within 5 s")])
    watch.add([_rec(0, 200)] + [_rec(i, 0, "timed out") for i in range(1, 4)])
    assert watch.check(4.0) is None and not died
    watch.add([_rec(4, 200)])
    assert watch.streak == 0 and not watch.due(final=True)
    # Never alive (the start's health check failed too, nothing succeeded): unreachable, not dead.
    watch, died = _watch([Health(False, "GET /health: refused"), Health(False, "GET /health: refused")])
    watch.note_start(watch.probe())
    watch.add([_rec(i, 0, "refused") for i in range(3)])
    assert watch.check(3.0) is None and not died
    # Alive at the start (health 200), then every request unanswered: that is a death.
    watch, died = _watch(
        [Health(True, "GET /health answered 200"), Health(False, "GET /health answered 503")]
    )
    watch.note_start(watch.probe())
    watch.add([_rec(0, 500, "HTTP 500: EngineDeadError")])
    assert not watch.due() and watch.due(final=True)
    assert watch.check(1.0, final=True) is not None and died[0].last_ok_s is None


def _wait_for_ok_records(run_dir: Path, n: int, done: threading.Event, deadline_s: float = 240.0) -> None:
    """Until ``records.jsonl`` (flushed every second) holds ``n`` successful requests."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not done.is_set():
        if (run_dir / RECORDS_FILE).exists():
            ok = sum(r.ok for r in read_records(run_dir))
            if ok >= n:
                return
        done.wait(0.2)
    raise AssertionError(f"fewer than {n} successful requests in {run_dir} within {deadline_s} s")


@pytest.mark.slow
def test_a_server_killed_mid_run_is_named_dead_and_the_run_stops(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "chat.jsonl", 20)
    results = tmp_path / "run"
    n = 200  # far more than the run sends: it must stop at the death, not at the schedule's end
    spec = LoadSpec(host="", corpus=corpus, rate=4, duration=n / 4, results_dir=results, max_tokens_cap=4,
                    start_delay=0.5)  # fmt: skip
    codes: list[int] = []
    done = threading.Event()
    with running_server(["--preset", "tiny"], log_dir=tmp_path / "server") as server:
        spec = spec.replace(host=server.url)

        def replay() -> None:
            codes.append(run_locust(spec, timeout_s=600))
            done.set()

        thread = threading.Thread(target=replay, daemon=True)
        thread.start()
        _wait_for_ok_records(results, 3, done)
        server.proc.send_signal(signal.SIGKILL)  # a crash: no graceful shutdown
        server.proc.wait(30)
        thread.join(300)
    assert codes == [int(ExitCode.TARGET_DIED)], codes
    s = read_summary(results)
    died = s.target_died
    assert died is not None and not s.interrupted
    assert died.last_ok_s is not None and died.failing_since_s is not None
    assert died.failing_since_s >= died.last_ok_s and died.failed_in_a_row >= 1
    assert died.evidence.startswith("GET /health: ") and "Refused" in died.evidence, died.evidence
    assert s.stop_reason is not None and s.stop_reason.startswith("target died")
    assert 3 <= s.requests < n, s.requests  # sending stopped at the death
    # The gates call it unjudgeable, naming the death, rather than judging its errors.
    from harness.gates.runs import load_result_set

    (problem,) = load_result_set(results).problems
    assert "the target died during the run" in problem
