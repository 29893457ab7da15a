"""A real ``harness serve`` subprocess on a free port, for the HTTP tests.

Started with :func:`harness.target.server.launch.running_server`: the server binds port 0 itself (no race
with parallel test runs) and writes its ready file once it serves; its log is ``server.log`` in the
test's log directory, and the run directory (embedded Redis, cache state) lives beside it. Tests wait
for the server's background work through its API (the ready file, ``POST /cache/drain``), never by
sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.target.server.launch import ServerProcess, running_server

ServerProc = ServerProcess  # the name the tests use

PATIENT_CACHE_ENV = {
    "HARNESS__CACHE__L2_OP_TIMEOUT_S": "30",
    "HARNESS__CACHE__L2_BLOCKING_TIMEOUT_S": "10",
    "HARNESS__CACHE__REDIS_SOCKET_TIMEOUT_S": "10",
    "HARNESS__CACHE__REDIS_CONNECT_TIMEOUT_S": "10",
}
"""L2 budgets for servers whose tests are not about them (see tests/cache/conftest.py: the
defaults are latency limits a healthy Redis can miss on a busy CI machine, turning an expected
``HIT-L2`` into a ``MISS``). A test about the budgets passes its own in ``env``."""


@contextmanager
def harness_server(
    log_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> Iterator[ServerProcess]:
    full_env = {"HARNESS__RUN_DIR": str((log_dir / "run").resolve()), **PATIENT_CACHE_ENV, **(env or {})}
    with running_server(
        ["--preset", "tiny", *args], log_dir=log_dir, env=full_env, timeout_s=timeout
    ) as server:
        yield server
