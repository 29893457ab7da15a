"""``make demo`` (``python -m harness.demo``): the harness end to end on this machine, in steps.

Today the steps are: start ``harness serve --preset tiny`` on a free port, wait for ``/health``,
stream a few chat and completion requests (timing every SSE line on arrival), print TTFT and TPOT
per request, write a JSON report atomically under ``<run_dir>/demo/`` and stop the server. The
server is stopped on every exit path (error, Ctrl-C).

Each step is a :class:`Step` with a name and ``run(ctx)``; they share a :class:`DemoContext` and
add their results to ``ctx.report``. Extending the demo to the whole pipeline (traces → corpus →
load → gates) means appending steps to :func:`default_steps`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from harness.common.errors import HarnessError, UnavailableError
from harness.common.io import write_json
from harness.common.settings import HarnessSettings

_ANNOUNCE = re.compile(r"serving (\S+) at (http://\S+)")


@dataclass
class DemoContext:
    """State the steps share."""

    out_dir: Path
    console: Console
    base_url: str | None = None
    model: str | None = None
    server: subprocess.Popen[bytes] | None = None
    report: dict[str, Any] = field(default_factory=dict)


class Step(Protocol):
    name: str

    def run(self, ctx: DemoContext) -> None: ...


# -------------------------------------------------------------------------------------- server


@dataclass
class StartServer:
    """``harness serve`` in the background; its output goes to ``server.log`` beside the report."""

    args: Sequence[str] = ("--preset", "tiny")
    timeout_s: float = 180.0
    name: str = "start server"

    def run(self, ctx: DemoContext) -> None:
        log_path = ctx.out_dir / "server.log"
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "harness.cli", "serve", *self.args, "--port", "0"]
        with open(log_path, "wb") as log:
            ctx.server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        started = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        with ctx.console.status(f"starting {' '.join(cmd[3:])} …"):
            while ctx.base_url is None:
                if ctx.server.poll() is not None:
                    raise UnavailableError(
                        f"harness serve exited with {ctx.server.returncode}; see its log", file=log_path
                    )
                if time.monotonic() > deadline:
                    raise UnavailableError("harness serve did not start in time; see its log", file=log_path)
                m = _ANNOUNCE.search(log_path.read_text(errors="replace"))
                if m:
                    ctx.model, ctx.base_url = m.group(1), m.group(2)
                else:
                    time.sleep(0.1)
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(ctx.base_url + "/health", timeout=2).status_code == 200:
                        break
                if ctx.server.poll() is not None or time.monotonic() > deadline:
                    raise UnavailableError("harness serve never became healthy; see its log", file=log_path)
                time.sleep(0.1)
        ctx.report["server"] = {
            "url": ctx.base_url,
            "model": ctx.model,
            "args": list(self.args),
            "startup_s": round(time.perf_counter() - started, 3),
            "log": str(log_path),
        }
        ctx.console.print(f"[green]✓[/] server up at {ctx.base_url} ({ctx.model})")


def stop_server(ctx: DemoContext, timeout_s: float = 30.0) -> int | None:
    """SIGTERM, then wait; kill only if it does not stop in time. Safe to call twice."""
    proc = ctx.server
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    ctx.server = None
    return proc.returncode


@dataclass
class StopServer:
    name: str = "stop server"

    def run(self, ctx: DemoContext) -> None:
        rc = stop_server(ctx)
        ctx.report.setdefault("server", {})["exit_code"] = rc
        ctx.console.print(f"[green]✓[/] server stopped (exit {rc})")


# -------------------------------------------------------------------------------------- requests


@dataclass
class DemoRequest:
    label: str
    endpoint: str  # "chat" or "completions"
    body: dict[str, Any]


DEFAULT_REQUESTS: tuple[DemoRequest, ...] = (
    DemoRequest(
        "chat: greeting",
        "chat",
        {
            "messages": [{"role": "user", "content": "Hello! Who are you?"}],
            "max_tokens": 24,
            "temperature": 0,
        },
    ),
    DemoRequest(
        "chat: system + user",
        "chat",
        {
            "messages": [
                {"role": "system", "content": "You answer in one sentence."},
                {"role": "user", "content": "Why do caches need an expiry time?"},
            ],
            "max_tokens": 32,
            "temperature": 0.7,
            "seed": 1,
        },
    ),
    DemoRequest("completion: story", "completions", {"prompt": "Once upon a time", "max_tokens": 32}),
    DemoRequest(
        "completion: code",
        "completions",
        {"prompt": "def fibonacci(n):\n    ", "max_tokens": 24, "temperature": 0, "stop": ["\n\n"]},
    ),
)


async def stream_one(client: httpx.AsyncClient, req: DemoRequest) -> dict[str, Any]:
    """Stream one request, timestamping each SSE line as it arrives."""
    path = "/v1/chat/completions" if req.endpoint == "chat" else "/v1/completions"
    body = {**req.body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    arrivals: list[float] = []
    text: list[str] = []
    usage: dict[str, Any] = {}
    finish = None
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"label": req.label, "status": r.status_code, "error": r.text}
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = orjson.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = (
                    choice.get("text") if req.endpoint == "completions" else choice["delta"].get("content")
                )
                if piece:
                    arrivals.append(time.perf_counter())
                    text.append(piece)
                finish = choice.get("finish_reason") or finish
    end = time.perf_counter()
    ttft_ms = (arrivals[0] - t0) * 1000 if arrivals else None
    tpot_ms = (arrivals[-1] - arrivals[0]) * 1000 / (len(arrivals) - 1) if len(arrivals) > 1 else None
    return {
        "label": req.label,
        "endpoint": path,
        "status": 200,
        "ttft_ms": ttft_ms,
        "tpot_ms": tpot_ms,
        "e2e_ms": (end - t0) * 1000,
        "chunks": len(arrivals),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "finish_reason": finish,
        "server": usage.get("harness", {}),
        "text": "".join(text),
    }


@dataclass
class StreamRequests:
    """The requests one after another, then all at once (to show continuous batching)."""

    requests: Sequence[DemoRequest] = DEFAULT_REQUESTS
    name: str = "stream requests"

    def run(self, ctx: DemoContext) -> None:
        assert ctx.base_url is not None, "StartServer must run first"

        async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            async with httpx.AsyncClient(base_url=ctx.base_url or "", timeout=120) as client:
                sequential = [await stream_one(client, r) for r in self.requests]
                concurrent = await asyncio.gather(*(stream_one(client, r) for r in self.requests))
            return sequential, list(concurrent)

        with ctx.console.status("streaming requests …"):
            sequential, concurrent = asyncio.run(go())
        ctx.report["requests"] = {"sequential": sequential, "concurrent": concurrent}
        for title, rows in (("one at a time", sequential), (f"{len(concurrent)} at once", concurrent)):
            ctx.console.print(_table(f"Requests, {title}", rows))


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def _table(title: str, rows: list[dict[str, Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("request", no_wrap=True, max_width=22)
    for col in ("TTFT ms", "TPOT ms", "e2e ms", "in/out", "prefill ms"):
        t.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    t.add_column("finish", no_wrap=True, min_width=6)
    t.add_column("text", no_wrap=True, overflow="ellipsis", max_width=18)
    for r in rows:
        if r.get("status") != 200:
            t.add_row(r["label"], "", "", "", "", "", f"HTTP {r.get('status')}", str(r.get("error", ""))[:40])
            continue
        text = r["text"].replace("\n", "⏎")
        t.add_row(
            r["label"],
            _fmt(r["ttft_ms"]),
            _fmt(r["tpot_ms"]),
            _fmt(r["e2e_ms"]),
            f"{r['prompt_tokens']}/{r['completion_tokens']}",
            _fmt(r["server"].get("prefill_ms")),
            str(r["finish_reason"]),
            text,
        )
    return t


# -------------------------------------------------------------------------------------- report


@dataclass
class WriteReport:
    name: str = "write report"

    def run(self, ctx: DemoContext) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        ctx.report["finished_at"] = stamp
        path = ctx.out_dir / f"demo-{stamp}.json"
        write_json(path, ctx.report)
        write_json(ctx.out_dir / "latest.json", ctx.report)
        ctx.console.print(f"[green]✓[/] report written to [bold]{path}[/]")


def default_steps() -> list[Step]:
    return [StartServer(), StreamRequests(), StopServer(), WriteReport()]


def run_demo(steps: Sequence[Step] | None = None, out_dir: Path | None = None) -> DemoContext:
    """Run ``steps`` in order; the server (if one was started) is stopped on every exit path."""
    console = Console()
    ctx = DemoContext(out_dir=out_dir or HarnessSettings().run_dir / "demo", console=console)
    ctx.report["started_at"] = datetime.now(UTC).isoformat()
    ctx.report["steps"] = []
    try:
        for step in steps if steps is not None else default_steps():
            console.rule(f"[bold]{step.name}")
            t = time.perf_counter()
            step.run(ctx)
            ctx.report["steps"].append({"name": step.name, "seconds": round(time.perf_counter() - t, 3)})
    finally:
        stop_server(ctx)
    return ctx


def main() -> None:
    try:
        run_demo()
    except HarnessError as exc:
        Console(stderr=True).print(f"[bold red]demo: error:[/] {exc}", highlight=False)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        Console(stderr=True).print("demo: interrupted (server stopped)")
        sys.exit(130)


if __name__ == "__main__":
    main()
