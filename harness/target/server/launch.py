"""Start ``harness serve`` as a child process and know when it serves (tests, demo, ``harness run``).

The child gets ``--port 0`` (the OS picks a free port, so parallel runs never race for one) and
``--ready-file``; the parent waits until that file appears, which the server writes only after its
startup completed, so no log line is parsed and no ``/health`` loop is needed. While waiting it checks
that the child is still alive, so a server that fails to start is reported at once with the end of its
log, not after a timeout. :meth:`ServerProcess.stop` sends SIGTERM (graceful: in-flight requests
finish, the cache persists) and kills only if that takes too long; it is safe to call twice. Once
ready, the child runs at a lower CPU priority (:data:`NICE`) than the load generator beside it.

Secrets (API keys, the admin token) go to the child through ``env`` —
``HARNESS__SERVER__API_KEY``, ``HARNESS__SERVER__ADMIN_TOKEN`` — or a file it reads
(``--api-keys FILE``, ``--admin-token-file FILE``), never through ``args``: a command line is
readable by every user of the machine (``ps``) and ends up in logs and ``run.json``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.common.errors import UnavailableError
from harness.target.server.cli import ReadyInfo, read_ready_file

POLL_S = 0.05
NICE = 10
"""CPU priority of a server started here. It shares the machine with the load generator that
measures it (``harness run``, the demo, the tests), and a target whose torch threads take every core
would starve the generator: requests would leave late and the run would measure the client (client
jitter widening every latency gate, or ``client_bound`` at a saturated CPU). At a lower priority
the target still gets every cycle the generator leaves. The server starts at the parent's priority
and is lowered only once ready: startup (importing torch, building the model, starting Redis)
measures nothing, and at nice 10 beside another busy process it would get a tenth of a core and
take minutes."""


@dataclass
class ServerProcess:
    """A running ``harness serve`` child."""

    info: ReadyInfo
    proc: subprocess.Popen[bytes]
    log_dir: Path
    nice: int = 0
    """The niceness it was given once ready (0: left at the parent's)."""

    @property
    def url(self) -> str:
        return self.info.url

    @property
    def model(self) -> str:
        return self.info.model

    def log_tail(self, lines: int = 20) -> str:
        text = (self.log_dir / "server.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit code.

        Shutdown measures nothing and persists the cache, so the server first gets the parent's
        priority back where this user may restore it: a SIGKILL after a slow, starved shutdown
        would lose what it was writing.
        """
        if self.proc.poll() is None:
            if self.nice:
                renice_tree(self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0))
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc)
        return int(self.proc.returncode)


def start_server(
    args: Sequence[str],
    *,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 180.0,
    nice: int = NICE,
) -> ServerProcess:
    """Start ``harness serve ARGS --port 0`` and return once it serves requests.

    ``env`` is added to this process's environment for the child: the way to hand it secrets
    (``{"HARNESS__SERVER__API_KEY": key, "HARNESS__SERVER__ADMIN_TOKEN": token}``); ``args`` are
    visible in the process table, so never put a key there.

    Its stdout and stderr go to ``log_dir/server.log``. Raises :class:`UnavailableError` (naming the
    log) when the child exits or is not ready within ``timeout_s``; the child is killed then. The
    child runs at CPU priority ``nice`` (see :data:`NICE`; 0 to keep this process's).
    """
    return spawn_server(args, log_dir=log_dir, env=env, nice=nice).wait(timeout_s)


@dataclass
class StartingServer:
    """A ``harness serve`` child started but not yet known to serve (:func:`spawn_server`)."""

    proc: subprocess.Popen[bytes]
    log_dir: Path
    nice: int

    def wait(self, timeout_s: float = 180.0) -> ServerProcess:
        """Return once it serves (see :func:`start_server`); kill it on any error, Ctrl-C included."""
        ready_file, log_path = self.log_dir / "ready.json", self.log_dir / "server.log"
        deadline = time.monotonic() + timeout_s
        try:
            while (info := read_ready_file(ready_file)) is None:
                if self.proc.poll() is not None:
                    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-5:])
                    raise UnavailableError(
                        f"harness serve exited with {self.proc.returncode}: {tail}", file=log_path
                    )
                if time.monotonic() > deadline:
                    late = f"harness serve was not ready within {timeout_s:g} s"
                    raise UnavailableError(late, file=log_path)
                time.sleep(POLL_S)
        except BaseException:
            self.kill()
            raise
        if self.nice:
            renice_tree(self.proc.pid, self.nice)
        return ServerProcess(info=info, proc=self.proc, log_dir=self.log_dir, nice=self.nice)

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc)


def spawn_server(
    args: Sequence[str], *, log_dir: Path, env: Mapping[str, str] | None = None, nice: int = NICE
) -> StartingServer:
    """Start ``harness serve ARGS --port 0`` and return at once: several servers' start-ups (torch, the
    model, Redis: seconds each) overlap when each is spawned before any is waited for."""
    # Absolute: the child runs in log_dir, where a relative ready-file path would point elsewhere.
    log_dir = log_dir.resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    ready_file = log_dir / "ready.json"
    ready_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "harness.cli", "serve", *args]
    cmd += ["--port", "0", "--ready-file", str(ready_file)]
    with open(log_dir / "server.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=log_dir
        )
    return StartingServer(proc=proc, log_dir=log_dir, nice=nice)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and every descendant of it, then reap it.

    A server killed mid-startup or mid-shutdown cannot stop its embedded Redis itself, which would
    live on as an orphan holding its socket and memory.
    """
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    proc.kill()
    for d in descendants:
        with contextlib.suppress(psutil.Error):
            d.kill()
    proc.wait(10)


def renice_tree(pid: int, nice: int) -> None:
    """Set the niceness of process ``pid``, every thread of it and every descendant (Redis, the
    engine process) to ``nice``. The engine process's own offset (``--engine-nice``) is not kept: a
    launched server shares the machine with the load generator that measures it, and an engine
    another 5 below would get a third of the little it gets beside a busy neighbour at ``NICE``.

    On Linux niceness belongs to each thread: ``setpriority`` on the pid would change only the main
    thread and leave torch's worker threads where they were, so each thread id is set. Threads started
    later inherit the value of the thread that starts them. A pass that finds a thread it has not seen
    (one started meanwhile) is repeated. Processes that are gone, and changes this user may not make
    (raising priority needs privileges on most systems), are skipped: this is best effort.
    """
    seen: set[int] = set()
    for _ in range(5):
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        fresh = False
        for p in procs:
            try:
                if sys.platform != "linux":  # elsewhere niceness is per process
                    if p.pid not in seen:
                        seen.add(p.pid)
                        fresh = True
                        p.nice(nice)
                    continue
                for t in p.threads():
                    if t.id not in seen:
                        seen.add(t.id)
                        fresh = True
                        os.setpriority(os.PRIO_PROCESS, t.id, nice)
            except (psutil.Error, OSError):
                continue  # exited meanwhile, or not ours to change
        if not fresh:
            return


@contextmanager
def running_server(
    args: Sequence[str],
    *,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 180.0,
    nice: int = NICE,
) -> Iterator[ServerProcess]:
    """:func:`start_server` as a context manager that stops the server on every exit path."""
    server = start_server(args, log_dir=log_dir, env=env, timeout_s=timeout_s, nice=nice)
    try:
        yield server
    finally:
        server.stop()
