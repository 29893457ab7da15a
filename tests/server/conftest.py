"""A real ``harness serve`` subprocess on a free port, for the HTTP tests.

The server binds port 0 itself (the OS picks a free port, no race with parallel test runs) and
announces ``serving MODEL at http://HOST:PORT`` on stdout; the fixture reads that line, then waits
for ``/health``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

_ANNOUNCE = re.compile(r"serving (\S+) at (http://\S+)")


@dataclass
class ServerProc:
    url: str
    model: str
    proc: subprocess.Popen[bytes]
    log_dir: Path

    def stderr(self) -> str:
        return (self.log_dir / "stderr.log").read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)


@contextmanager
def harness_server(
    log_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> Iterator[ServerProc]:
    log_dir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "HARNESS__RUN_DIR": str(log_dir / "run"), **(env or {})}
    cmd = [sys.executable, "-m", "harness.cli", "serve", "--preset", "tiny", "--port", "0", *args]
    with open(log_dir / "stdout.log", "wb") as out, open(log_dir / "stderr.log", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=full_env, cwd=log_dir)
    server: ServerProc | None = None
    try:
        deadline = time.monotonic() + timeout
        while server is None:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"harness serve exited with {proc.returncode}: {(log_dir / 'stderr.log').read_text()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError("harness serve did not announce its port in time")
            m = _ANNOUNCE.search((log_dir / "stdout.log").read_text(errors="replace"))
            if m:
                server = ServerProc(url=m.group(2), model=m.group(1), proc=proc, log_dir=log_dir)
            else:
                time.sleep(0.1)
        while True:
            try:
                if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"harness serve never became healthy: {server.stderr()}")
            time.sleep(0.1)
        yield server
    finally:
        if server is not None:
            server.stop()
        elif proc.poll() is None:
            proc.kill()
            proc.wait(10)
