"""How much of the machine other work took while a run measured: CPU used by processes that are
neither the run's client nor its local target, and CPU the hypervisor stole.

An absolute latency is the latency of a machine *as loaded then*. Calibrating a baseline on a
machine and gating a run on it later compares two loads as well as two targets: a neighbour that
starts between them (a second CI job, another test worker, a busy loop) slows the target as surely
as a regression does, and near saturation a 20 % loss of CPU becomes a many-fold loss in latency.
:class:`HostSampler` measures that interference over a phase so that the gates can tell the two
apart (:func:`harness.gates.fingerprints.compare`): a run measured on a machine clearly busier than
any calibration run cannot be judged on absolute latencies, instead of failing for its neighbour.

What is measured, from Linux's ``/proc/stat`` (all CPUs) and each process's own CPU time (psutil):

    taken = (busy jiffies of the machine − CPU of the run's own processes) / wall + steal / wall

in cores, where the run's own processes are this process and its descendants (the Locust workers)
and, for a target on a loopback address, the process listening on its port with its descendants.
A target on another host uses no CPU here. Where a loopback target's process cannot be found (owned
by another user, or behind a proxy), nothing is recorded: its own CPU would count as interference,
and a regressed target that works harder would read as a busier machine.

Limits: ``/proc/stat`` counts the CPUs Linux shows; in a container that shows the host's, the
figure is the host's other tenants over all its CPUs. A process that starts and exits inside the
phase is not seen as the run's own. Elsewhere than Linux nothing is recorded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from harness.common.model import StrictModel

PROC_STAT = Path("/proc/stat")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"})


class HostLoad(StrictModel):
    """Interference over one phase (``summary.json``: ``interference``)."""

    cpus: int
    """CPUs ``/proc/stat`` counts (the capacity the figures below are shares of)."""
    others_cores: float
    """Mean cores busy with processes other than the client's and the local target's."""
    steal_cores: float
    """Mean cores the hypervisor gave to other guests while this one wanted them (``steal``)."""
    wall_s: float
    """How long the phase was measured over."""

    @property
    def taken_cores(self) -> float:
        """Cores other work took: other processes and steal."""
        return self.others_cores + self.steal_cores

    def describe(self) -> str:
        """``other work took 1.20 of 2 cores``."""
        steal = f", {self.steal_cores:.2f} of it stolen by the hypervisor" if self.steal_cores >= 0.01 else ""
        return f"other work took {self.taken_cores:.2f} of {self.cpus} cores{steal}"


@dataclass(frozen=True)
class _Snapshot:
    busy_s: float
    steal_s: float
    own_s: dict[int, float]
    """CPU seconds of each of the run's own processes, by pid."""
    wall: float


def _machine_cpu_s() -> tuple[float, float, int] | None:
    """(busy, steal) CPU seconds of the whole machine since boot, and its CPU count; ``None`` off Linux."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    fields = lines[0].split() if lines else []
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already in user.
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return (user + nice + system + irq + softirq) / tick, steal / tick, cpus or (os.cpu_count() or 1)


def _tree_cpu_s(roots: list[psutil.Process]) -> dict[int, float]:
    out: dict[int, float] = {}
    for root in roots:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:  # exited meanwhile
                continue
            out[p.pid] = float(t.user + t.system)
    return out


def listening_process(port: int) -> psutil.Process | None:
    """The process listening on TCP ``port`` on this machine, if this user may see it."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            try:
                return psutil.Process(c.pid)
            except psutil.Error:
                return None
    return None


class HostSampler:
    """Measures :class:`HostLoad` between :meth:`start` and :meth:`stop` for a run against ``target_url``."""

    def __init__(self, target_url: str | None) -> None:
        self.target_url = target_url
        self._roots: list[psutil.Process] = []
        self._start: _Snapshot | None = None
        self._cpus = 1
        self.why_not: str | None = None
        """Why nothing is measured (``None`` while it is)."""
        self.hidden_target = False
        """The target is on this machine but its process is not visible (the case worth a warning)."""

    def _locate(self) -> bool:
        self._roots = [psutil.Process()]
        parts = urlsplit(self.target_url or "")
        if parts.hostname is None or parts.hostname not in LOOPBACK:
            return True  # no target, or one on another host: its CPU is not this machine's
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # not a port number: nothing to look for
            self.why_not = f"the target URL {self.target_url!r} has no valid port"
            return False
        target = listening_process(port)
        if target is None:
            self.why_not = f"the target's process (listening on port {port}) cannot be seen from here"
            self.hidden_target = True
            return False
        if target.pid != self._roots[0].pid:
            self._roots.append(target)
        return True

    def _snapshot(self) -> _Snapshot | None:
        machine = _machine_cpu_s()
        if machine is None:
            self.why_not = "no /proc/stat (not Linux)"
            return None
        busy, steal, self._cpus = machine
        return _Snapshot(busy, steal, _tree_cpu_s(self._roots), time.perf_counter())

    def start(self) -> None:
        """Take the starting snapshot (and find the local target's process)."""
        try:
            self._start = self._snapshot() if self._locate() else None
        except psutil.Error as exc:
            self.why_not, self._start = f"{type(exc).__name__}: {exc}", None

    def stop(self) -> HostLoad | None:
        """Interference since :meth:`start`; ``None`` where it could not be measured (:attr:`why_not`)."""
        a = self._start
        if a is None:
            return None
        b = self._snapshot()
        if b is None:
            return None
        wall = b.wall - a.wall
        if wall <= 0:
            return None
        # A process seen only at the end started inside the phase: all its CPU is the phase's.
        own = sum(max(0.0, s - a.own_s.get(pid, 0.0)) for pid, s in b.own_s.items())
        others = max(0.0, (b.busy_s - a.busy_s) - own) / wall
        return HostLoad(
            cpus=self._cpus,
            others_cores=round(min(others, float(self._cpus)), 3),
            steal_cores=round(max(0.0, b.steal_s - a.steal_s) / wall, 3),
            wall_s=round(wall, 3),
        )
