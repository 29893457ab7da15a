"""Engine placement: which CPUs the compute threads and the server's front end run on."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from harness.common.errors import ConfigError
from harness.target.engine.api import SamplingParams
from harness.target.engine.factory import create_engine
from harness.target.engine.placement import (
    SPIN_COUNT,
    SPIN_ENV,
    Placement,
    cpu_list,
    enter_front,
    parse_cpu_list,
    plan,
    spin_briefly,
)
from tests.engine.conftest import tiny_settings

FOUR = frozenset({0, 1, 2, 3})


def test_cpu_lists_read_and_write_like_taskset() -> None:
    assert parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    assert parse_cpu_list(" 3 ") == {3}
    assert cpu_list(frozenset({0, 1, 2, 5, 7, 8})) == "0-2,5,7-8"
    for bad in ("", "a", "1-", "3-1", "1,,2", "-1"):
        with pytest.raises(ConfigError) as info:
            parse_cpu_list(bad)
        assert info.value.field == "HARNESS__ENGINE__BIND_CORES"


def test_plans() -> None:
    assert plan("off", None, FOUR) == Placement()
    assert plan("off", 3, FOUR) == Placement(threads=3)
    # auto: one CPU kept for the front end, one compute thread per other CPU (vLLM's CPU default)
    assert plan("auto", None, FOUR) == Placement(
        compute=frozenset({0, 1, 2}), front=frozenset({3}), threads=3
    )
    assert plan("auto", 1, FOUR).threads == 1
    assert plan("auto", None, frozenset({5})) == Placement()  # nothing to split on one CPU
    # a list: compute there, the front end on the rest (or beside it when the list takes them all)
    assert plan("1-2", None, FOUR) == Placement(compute=frozenset({1, 2}), front=frozenset({0, 3}), threads=2)
    assert plan("0-3", None, FOUR).front == FOUR
    with pytest.raises(ConfigError, match="CPUs 6-7 of '2,6-7' are not available"):
        plan("2,6-7", None, FOUR)


def test_a_bad_setting_fails_before_the_model_loads() -> None:
    with pytest.raises(ConfigError) as info:
        tiny_settings(bind_cores="0-99999")
    assert info.value.field == "HARNESS__ENGINE__BIND_CORES"


def _allowed(tid: int) -> frozenset[int]:
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split()[1])
    raise AssertionError("no Cpus_allowed_list")


async def test_the_step_loop_computes_on_its_cpus_and_the_front_end_keeps_off_them() -> None:
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if len(cpus) < 2 or not Path("/proc/self/task").is_dir():
        pytest.skip(f"needs Linux thread affinity and 2 CPUs (this machine: {len(cpus)} usable)")
    import torch

    threads = torch.get_num_threads()  # process-wide: given back to the tests after this one
    engine = create_engine(tiny_settings(bind_cores="auto"))
    placement = engine.placement
    assert placement.compute is not None and placement.front is not None
    assert not placement.compute & placement.front
    seen: dict[str, frozenset[int]] = {}

    def front_thread() -> None:  # the server's main thread: everything it runs or starts after this
        enter_front(placement)
        seen["front"] = _allowed(threading.get_native_id())

    t = threading.Thread(target=front_thread)
    t.start()
    t.join()
    await engine.start()
    try:
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        async for _ in engine.generate("p", [5, 6, 7], params):  # the step loop has run torch
            pass
        assert engine._thread is not None and engine._thread.native_id is not None
        seen["compute"] = _allowed(engine._thread.native_id)
    finally:
        await engine.shutdown()
        torch.set_num_threads(threads)
    assert seen == {"front": placement.front, "compute": placement.compute}


def test_compute_threads_spin_briefly_unless_a_wait_policy_was_chosen() -> None:
    env: dict[str, str] = {}
    assert spin_briefly(env) and env == {SPIN_ENV: str(SPIN_COUNT)}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {SPIN_ENV: "300000"}):
        env = dict(chosen)
        assert not spin_briefly(env) and env == chosen  # the user's choice stands


async def test_the_engine_process_gets_the_short_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SPIN_ENV, raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    engine = create_engine(tiny_settings(step_loop="process"))
    try:
        environ = Path(f"/proc/{engine.pid}/environ").read_bytes().split(b"\0")
    finally:
        await engine.shutdown()
    assert f"{SPIN_ENV}={SPIN_COUNT}".encode() in environ
    assert SPIN_ENV not in os.environ  # the child's environment, not this process's
