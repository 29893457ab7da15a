"""``harness.common.host``: what other work took of the machine, measured on real processes.

Other tests may run beside these (a second test worker): every assertion on a measured figure is a
lower bound that such neighbours can only raise, or an accounting identity that holds whatever they do.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from harness.common import host
from harness.common.host import HostLoad, HostSampler, listening_process

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc/stat")

BURN_S = 0.6
BURN = f"""
import sys, time
while time.process_time() < {BURN_S}:  # this much CPU, however long the machine takes to give it
    pass
sys.stdout.write("done")
"""


def _burn_detached() -> None:
    """Burn ``BURN_S`` CPU seconds in a process that is *not* a descendant of this one (its parent
    exits at once, so it is re-parented), and return once it has finished burning."""
    launcher = (
        "import subprocess, sys; "
        f"subprocess.Popen([sys.executable, '-c', {BURN!r}], stdout=sys.stdout, start_new_session=True)"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.read() == b"done"  # EOF only when the burner, which holds the pipe, exits
    proc.wait(timeout=60)


def test_cpu_of_a_process_outside_the_run_is_other_work() -> None:
    sampler = HostSampler(None)
    sampler.start()
    _burn_detached()
    load = sampler.stop()
    assert load is not None and sampler.why_not is None
    assert load.cpus == psutil.cpu_count()
    # The burner's CPU is in it (one tick of rounding either side); neighbours only add to it.
    assert load.others_cores * load.wall_s >= BURN_S - 0.05, load


def test_cpu_of_the_run_and_its_children_is_its_own() -> None:
    # The accounting the sampler subtracts: this process and its descendants, each by pid.
    before = host._tree_cpu_s([psutil.Process()])
    child = subprocess.run([sys.executable, "-c", BURN], capture_output=True, check=True)
    assert child.stdout == b"done"
    # A child that has exited is gone from the tree; one still running is in it with its CPU.
    proc = subprocess.Popen([sys.executable, "-c", BURN + "\nsys.stdout.flush()\nsys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.read(4) == b"done"
        after = host._tree_cpu_s([psutil.Process()])
    finally:
        proc.communicate(b"", timeout=60)
    assert proc.pid not in before and after[proc.pid] >= BURN_S - 0.02


def test_the_arithmetic_subtracts_the_runs_own_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # Machine: 10 CPU-s busy and 1 stolen over 5 s of 4 CPUs; the run's processes used 4 of them
    # (one that lived throughout, one that started inside the phase).
    machine = iter([(100.0, 2.0, 4), (110.0, 3.0, 4)])
    own = iter([{1: 5.0}, {1: 7.0, 2: 2.0}])
    clock = iter([50.0, 55.0])
    monkeypatch.setattr(host, "_machine_cpu_s", lambda: next(machine))
    monkeypatch.setattr(host, "_tree_cpu_s", lambda roots: next(own))
    monkeypatch.setattr(host.time, "perf_counter", lambda: next(clock))
    sampler = HostSampler(None)
    sampler.start()
    load = sampler.stop()
    assert load == HostLoad(cpus=4, others_cores=1.2, steal_cores=0.2, wall_s=5.0)
    assert load.taken_cores == pytest.approx(1.4) and load.describe() == (
        "other work took 1.40 of 4 cores, 0.20 of it stolen by the hypervisor"
    )


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_local_targets_process_is_found_by_its_port_and_a_hidden_one_is_not_guessed() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        found = listening_process(port)
        assert found is not None and found.pid == psutil.Process().pid
        sampler = HostSampler(f"http://127.0.0.1:{port}/v1")
        sampler.start()
        assert sampler.stop() is not None
    finally:
        server.shutdown()
        server.server_close()
    # Nobody listens there now: its CPU cannot be told from a neighbour's, so nothing is recorded.
    gone = HostSampler(f"http://localhost:{port}")
    gone.start()
    assert gone.stop() is None and gone.why_not is not None and str(port) in gone.why_not
    assert gone.hidden_target  # the run warns: its latency fails cannot tell a neighbour from a regression
    # A target on another host uses none of this machine's CPU: measured without looking for it.
    remote = HostSampler("http://inference.example:8000")
    remote.start()
    assert remote.stop() is not None and not remote.hidden_target
    bad = HostSampler("http://127.0.0.1:port")
    bad.start()
    assert bad.stop() is None and bad.why_not is not None and "no valid port" in bad.why_not
