"""``harness serve`` with its engine in a process of its own (the default), through HTTP: a client
that leaves frees its KV blocks in the engine process (reliability case R6 is in test_http), and an
engine process that dies fails the requests in flight by name, turns ``/health`` to 503 saying why,
and stops the server with exit 7."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import httpx
import orjson
import pytest

from harness.target.engine.process import ProcessAsyncEngine
from harness.target.engine.settings import EngineSettings
from harness.target.server.app import create_app
from harness.target.server.settings import ServerSettings

from .conftest import harness_server

pytestmark = pytest.mark.slow

LONG = {"prompt": "a story that never ends", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}


def engine_pid(server_pid: int) -> int:
    """The server's one child: its engine process (Linux lists a task's children in /proc)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children")
    if not children.is_file():
        pytest.skip("needs Linux's /proc/PID/task/PID/children to find the engine process")
    (pid,) = [int(p) for p in children.read_text().split()]
    return pid


def sse_events(lines: list[str]) -> list[dict[str, object]]:
    return [orjson.loads(line[6:]) for line in lines if line.startswith("data: {")]


async def test_health_and_new_requests_name_a_dead_engine() -> None:
    """In-process app (its lifespan run here) over a real engine process. httpx's ASGI transport
    hands a response over only once it is complete, so a stream cut mid-way is the next test's."""
    died = threading.Event()
    engine = ProcessAsyncEngine(EngineSettings(preset="tiny", device="cpu"), on_death=lambda _: died.set())
    app = create_app(engine, settings=ServerSettings(warmup=False))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as c,
    ):
        assert (await c.get("/health")).json()["status"] == "ok"
        ok = await c.post("/v1/completions", json={**LONG, "max_tokens": 2})
        assert ok.status_code == 200, ok.text
        os.kill(engine.pid, signal.SIGKILL)
        assert await asyncio.get_running_loop().run_in_executor(None, died.wait, 60.0)
        health = await c.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "engine failed"
        assert f"the engine process (pid {engine.pid}) was killed by signal 9" in health.json()["failure"]
        refused = await c.post("/v1/completions", json={**LONG, "max_tokens": 2})
        assert refused.status_code == 503
        assert "killed by signal 9" in refused.json()["error"]["message"]


def test_harness_serve_exits_7_naming_its_dead_engine(tmp_path: Path) -> None:
    with harness_server(tmp_path) as server:
        pid = engine_pid(server.proc.pid)
        with httpx.Client(timeout=120) as c:
            assert c.get(f"{server.url}/health").json()["status"] == "ok"
            lines: list[str] = []
            with c.stream("POST", f"{server.url}/v1/completions", json={**LONG, "stream": True}) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    if len(sse_events(lines)) == 2:
                        os.kill(pid, signal.SIGKILL)
        assert "killed by signal 9" in str(sse_events(lines)[-1]["error"])
        assert server.proc.wait(120) == 7
        log = (server.log_dir / "server.log").read_text()
        assert (
            f"the engine process (pid {pid}) was killed by signal 9 while serving; the server stopped" in log
        )
