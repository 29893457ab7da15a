"""Real headless Locust runs of ``locustfiles/warmup.py``: stages change the arrival rate; rollback."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from tests.load.sse_server import Behaviour, SSEServer

pytestmark = pytest.mark.slow

PLAN = """
name: test
policy: {on_failure: stop, min_requests: 10, rollback_hold_s: 4}
stages:
  - {name: low, qps: 4, duration_s: 3, max_failure_rate: 0.2}
  - {name: high, qps: 30, duration_s: 4, max_failure_rate: 0.1}
"""


def test_a_server_failing_above_a_rate_triggers_rollback_to_the_previous_stage(
    tmp_path: Path, corpus: Path
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    behaviour = Behaviour(first_token_s=0.005, gap_s=0.002, tokens=3, fail_above_rps=12, metrics=True)
    with SSEServer(behaviour) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, locustfile="warmup", plan=plan,
                        results_dir=tmp_path / "r", start_delay=0.5, concurrency=16)  # fmt: skip
        code = run_locust(spec, timeout_s=180)
        stages_seen = {h.get("X-Traffic-Stage") for h in (x.headers for x in srv.requests)}
        served = len(srv.requests)
    assert code == 1  # the ladder stopped (policy: stop) after holding the safe stage
    s = read_summary(tmp_path / "r")
    assert [(o.name, o.verdict) for o in s.stages] == [
        ("low", "passed"), ("high", "rolled_back"), ("low:rollback", "passed")]  # fmt: skip
    _, high, hold = s.stages
    assert high.rolled_back_to == "low" and high.failure_rate > 0.1
    assert high.ended_s - high.started_s < 4.0  # cut short, not held to its end
    assert hold.started_s == pytest.approx(high.ended_s, abs=0.01) and hold.target_rate == 4
    assert stages_seen == {"low", "high", "low:rollback"}
    recs = list(read_records(tmp_path / "r"))
    by_stage = {name: [r for r in recs if r.stage == name] for name in stages_seen}
    # The pacer's rate followed the stages (open loop: arrivals, not users).
    assert len(by_stage["low"]) == pytest.approx(12, abs=1)
    # The high stage's arrivals are its 30/s schedule from its start, up to the cut: none after it
    # (the pacer releases at most its lead ahead), and at least the rollback rule's min_requests. How
    # many came before the cut is the machine's: a tick that runs late cuts the released ones short.
    high_times = sorted(r.intended_s for r in by_stage["high"])
    m = len(high_times)
    assert high_times == pytest.approx([high.started_s + k / 30 for k in range(m)], abs=1e-6)
    assert 10 <= m <= 30 * (high.ended_s - high.started_s) + 1
    assert len(by_stage["low:rollback"]) == pytest.approx(16, abs=1)
    assert s.plan is not None and s.plan.path == str(plan)
    # The target's counters (a vLLM-like /metrics: 5 tokens looked up per request) per stage.
    sm = s.server_metrics
    assert sm is not None and sm.kind == "vllm" and sm.failed == 0
    assert [p.name for p in sm.phases] == ["low", "high", "low:rollback"]
    assert sm.total.prefix_queries == 5 * served  # from the baseline before the epoch to the last answer
    low, _, hold = sm.phases  # "high" may be shorter than a scrape interval: it may have no delta
    assert low.prefix_queries and hold.prefix_queries and low.prefix_hits == 0 < hold.prefix_hits


def test_the_plans_preload_file_is_posted_first(tmp_path: Path, corpus: Path) -> None:
    (tmp_path / "plans").mkdir()
    preload = tmp_path / "plans" / "preload.jsonl"
    preload.write_text('{"prompt": "a", "max_tokens": 2}\n')
    plan = tmp_path / "plans" / "ladder.yaml"
    plan.write_text(
        "preload: preload.jsonl\nstages:\n  - {name: only, qps: 4, duration_s: 1, max_failure_rate: 0.5}\n"
    )
    with SSEServer(Behaviour(tokens=2)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, locustfile="warmup", plan=plan,
                        results_dir=tmp_path / "r", start_delay=0.5)  # fmt: skip
        assert run_locust(spec, timeout_s=180) == 0
        assert srv.preloads == [preload.read_bytes()]  # relative to the plan file, not the cwd
    assert read_summary(tmp_path / "r").preload == {"lines": 1, "stored": 1, "generated": 0, "failed": 0}
    preload.unlink()
    spec = LoadSpec(host="http://127.0.0.1:9", corpus=corpus, locustfile="warmup", plan=plan,
                    results_dir=tmp_path / "r2", start_delay=0.5)  # fmt: skip
    assert run_locust(spec, timeout_s=180) == 3  # named in the plan, missing: bad input, before any load
    assert "preload" in (tmp_path / "r2" / "locust.log").read_text()


def test_a_slow_preload_delays_the_ladder_and_it_still_runs_to_its_end(tmp_path: Path, corpus: Path) -> None:
    """Locust ticks the shape every second while test_start still posts the preload (here 2.5 s):
    those ticks must neither judge stages nor end the ladder (which then never finished)."""
    preload = tmp_path / "preload.jsonl"
    preload.write_text('{"prompt": "a", "max_tokens": 2}\n')
    plan = tmp_path / "ladder.yaml"
    plan.write_text(
        "preload: preload.jsonl\nstages:\n"
        "  - {name: one, qps: 4, duration_s: 1, max_failure_rate: 0.5}\n"
        "  - {name: two, qps: 4, duration_s: 1, max_failure_rate: 0.5}\n"
    )
    with SSEServer(Behaviour(tokens=2, preload_s=2.5)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, locustfile="warmup", plan=plan,
                        results_dir=tmp_path / "r", start_delay=0.5)  # fmt: skip
        # Without the guard the run waits for a ladder that ended before it began: a short timeout.
        assert run_locust(spec, timeout_s=60) == 0, (tmp_path / "r" / "locust.log").read_text()[-2000:]
    s = read_summary(tmp_path / "r")
    assert not s.interrupted and s.preload is not None and s.preload["stored"] == 1
    assert s.stages is not None and [(o.name, o.verdict) for o in s.stages] == [
        ("one", "passed"),
        ("two", "passed"),
    ]
    assert s.requests == 8
