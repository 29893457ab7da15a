"""A real ``harness serve`` subprocess on a free port, for the HTTP tests.

Started with :func:`harness.server.launch.running_server`: the server binds port 0 itself (no race
with parallel test runs) and writes its ready file once it serves; its log is ``server.log`` in the
test's log directory, and the run directory (embedded Redis, cache state) lives beside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.server.launch import ServerProcess, running_server

ServerProc = ServerProcess  # the name the tests use


@contextmanager
def harness_server(
    log_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> Iterator[ServerProcess]:
    full_env = {"HARNESS__RUN_DIR": str(log_dir / "run"), **(env or {})}
    with running_server(
        ["--preset", "tiny", *args], log_dir=log_dir, env=full_env, timeout_s=timeout
    ) as server:
        yield server
