"""``make demo`` (``python -m harness.demo``): the harness end to end on this machine, in steps.

The steps, all on bundled fixtures and with the same commands a user would type:

1. ``harness traces inspect / coldpaths / scenarios`` on the bundled GenAI Jaeger trace and Mooncake
   sample: cold first hops grouped into scenario classes;
2. ``harness corpus build`` from the bundled template and few-shot log, weighted by those scenarios;
3. ``harness serve --preset tiny --cache`` on a free port (engine + cache stack with embedded Redis);
4. a few streamed chat and completion requests (TTFT and TPOT per request, then all at once);
5. the corpus replayed twice — cold (empty caches) then warm — to show what the cache stack changes;
6. the server stopped and a JSON report written atomically under ``<run_dir>/demo/``.

The server is stopped on every exit path (error, Ctrl-C). Each step is a :class:`Step` with a name
and ``run(ctx)``; they share a :class:`DemoContext` and add their results to ``ctx.report``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
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
from rich.markup import escape
from rich.table import Table

from harness.common.errors import HarnessError, InputError, UnavailableError
from harness.common.headers import CACHE_STATUS, DEFAULT_TENANT, STAGE, TENANT
from harness.common.io import write_json
from harness.common.settings import HarnessSettings
from harness.common.stats import percentile
from harness.corpus.model import read_corpus

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
        # A run directory of its own, emptied first: the cache persists its state on shutdown, and
        # the demo's cold pass must start with empty caches however often the demo is run.
        state = ctx.out_dir / "server-state"
        shutil.rmtree(state, ignore_errors=True)
        env = {**os.environ, "HARNESS__RUN_DIR": str(state)}
        with open(log_path, "wb") as log:
            ctx.server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
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
        cache = r.headers.get(CACHE_STATUS)
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
        "cache": cache,
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


# -------------------------------------------------------------------------------------- pipeline

ROOT = Path(__file__).resolve().parent.parent


def run_harness(ctx: DemoContext, *args: str) -> None:
    """Run one ``harness`` command as a user would; its output goes to the console as it comes."""
    cmd = [sys.executable, "-m", "harness.cli", *args]
    ctx.console.print(f"[dim]$ harness {' '.join(args)}[/]")
    proc = subprocess.run(cmd, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise HarnessError(f"`harness {' '.join(args)}` exited with {proc.returncode}")


@dataclass
class ExtractScenarios:
    """Cold paths from the bundled GenAI trace, grouped into scenario classes."""

    trace: Path = ROOT / "fixtures" / "traces" / "genaiTestTrace.json"
    requests: Path = ROOT / "fixtures" / "traces" / "mooncake_synthetic_head20.jsonl"
    name: str = "traces → cold paths → scenarios"

    def run(self, ctx: DemoContext) -> None:
        out = ctx.out_dir / "run"
        run_harness(ctx, "traces", "inspect", str(self.trace), str(self.requests))
        # The GenAI trace's entry hop is GraphQL (no http.* attributes), so every cross-service hop
        # of any protocol is considered, and a cache read counts only on the hop itself.
        cold = out / "coldpaths.jsonl"
        run_harness(
            ctx, "traces", "coldpaths", str(self.trace), "--hops", "all", "--protocol", "any",
            "--cache-scope", "hop", "-o", str(cold),
        )  # fmt: skip
        run_harness(ctx, "traces", "scenarios", str(cold), "--k", "12", "-o", str(out / "scenarios.json"))
        scen = orjson.loads((out / "scenarios.json").read_bytes())
        ctx.report["scenarios"] = [
            {"name": c["name"], "weight": c["weight"], "p95_ms": c["latency_ms"]["p95"]}
            for c in scen["classes"]
        ]


@dataclass
class BuildCorpus:
    """A request corpus from the bundled template and few-shot log, weighted by the scenarios."""

    n: int = 16
    max_input_tokens: int = 1536
    name: str = "corpus build"

    def run(self, ctx: DemoContext) -> None:
        run_dir = ctx.out_dir / "run"
        args = [
            "corpus", "build",
            "--template", str(ROOT / "templates" / "prompts" / "four_section.j2"),
            "--fewshot", str(ROOT / "fixtures" / "corpus" / "fewshot_log.jsonl"),
            "--scenarios", str(run_dir / "scenarios.json"),
            "--n", str(self.n), "--seed", "0", "--out", str(run_dir / "corpus"),
            # The trace's slowest hop carried 8k prompt tokens; the tiny preset's context is 2048.
            "--max-input-tokens", str(self.max_input_tokens),
        ]  # fmt: skip
        run_harness(ctx, *args)
        ctx.report["corpus"] = orjson.loads((run_dir / "corpus" / "quality.json").read_bytes())


async def replay_one(
    client: httpx.AsyncClient, record: dict[str, Any], stage: str, max_tokens: int
) -> dict[str, Any]:
    """Send one corpus record, streamed, and time its first and last content chunks."""
    body: dict[str, Any] = {
        "max_tokens": min(int(record["max_tokens"]), max_tokens),
        "temperature": record["sampling"]["temperature"],
        "top_p": record["sampling"]["top_p"],
        "stream": True,
    }
    if record["sampling"].get("seed") is not None:
        body["seed"] = record["sampling"]["seed"]
    if record.get("messages"):
        path, body["messages"] = "/v1/chat/completions", record["messages"]
    else:
        path, body["prompt"] = "/v1/completions", record["prompt"]
    headers = {STAGE: stage, TENANT: record.get("tenant") or DEFAULT_TENANT}
    t0 = time.perf_counter()
    arrivals: list[float] = []
    async with client.stream("POST", path, json=body, headers=headers) as r:
        cache = r.headers.get(CACHE_STATUS, "—")
        if r.status_code != 200:
            await r.aread()
            return {"id": record["id"], "status": r.status_code, "cache": cache, "error": r.text[:200]}
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            for choice in orjson.loads(line[5:]).get("choices", []):
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    arrivals.append(time.perf_counter())
    ttft = (arrivals[0] - t0) * 1000 if arrivals else None
    tpot = (arrivals[-1] - arrivals[0]) * 1000 / (len(arrivals) - 1) if len(arrivals) > 1 else None
    return {"id": record["id"], "status": 200, "cache": cache, "ttft_ms": ttft, "tpot_ms": tpot}


@dataclass
class ReplayColdWarm:
    """The corpus twice: cold (caches empty) then warm; TTFT and cache statuses side by side."""

    concurrency: int = 4
    max_tokens: int = 32
    name: str = "replay corpus: cold, then warm"

    def run(self, ctx: DemoContext) -> None:
        assert ctx.base_url is not None, "StartServer must run first"
        path = ctx.out_dir / "run" / "corpus" / "corpus.jsonl"
        if not path.is_file():
            raise InputError("no corpus to replay; BuildCorpus must run first", file=path)
        # Validated as the load stage would read it; the dicts are what was written to the file.
        records = [r.model_dump(mode="json", exclude_none=True) for r in read_corpus(path)]

        async def one_pass(stage: str) -> list[dict[str, Any]]:
            sem = asyncio.Semaphore(self.concurrency)

            async def guarded(rec: dict[str, Any]) -> dict[str, Any]:
                async with sem:
                    return await replay_one(client, rec, stage, self.max_tokens)

            async with httpx.AsyncClient(base_url=ctx.base_url or "", timeout=300) as client:
                return list(await asyncio.gather(*(guarded(r) for r in records)))

        passes: dict[str, list[dict[str, Any]]] = {}
        for stage in ("cold", "warm"):
            with ctx.console.status(f"{stage} pass: {len(records)} requests, {self.concurrency} at a time …"):
                passes[stage] = asyncio.run(one_pass(stage))
        summary = {stage: _summarize(rows) for stage, rows in passes.items()}
        ctx.report["replay"] = {"summary": summary, "requests": passes}
        t = Table(title="Corpus replay: cold vs warm", title_justify="left")
        for col in ("pass", "ok", "TTFT p50 ms", "TTFT p95 ms", "TPOT p50 ms", "x-cache"):
            t.add_column(col, justify="right" if col != "x-cache" else "left")
        for stage, s in summary.items():
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["cache"].items()))
            t.add_row(
                stage, f"{s['ok']}/{s['n']}", _fmt(s["ttft_p50_ms"]), _fmt(s["ttft_p95_ms"]),
                _fmt(s["tpot_p50_ms"]), statuses,
            )  # fmt: skip
        ctx.console.print(t)


def _summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == 200]
    ttft = [r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None]
    cache: dict[str, int] = {}
    for r in rows:
        cache[r["cache"]] = cache.get(r["cache"], 0) + 1

    def pct(values: list[float], q: float) -> float | None:
        return percentile(values, q) if values else None

    return {
        "n": len(rows),
        "ok": len(ok),
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p95_ms": pct(ttft, 95),
        "tpot_p50_ms": pct(tpot, 50),
        "cache": cache,
    }


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
    return [
        ExtractScenarios(),
        BuildCorpus(),
        StartServer(args=("--preset", "tiny", "--cache")),
        StreamRequests(),
        ReplayColdWarm(),
        StopServer(),
        WriteReport(),
    ]


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
        Console(stderr=True).print(f"[bold red]demo: error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        Console(stderr=True).print("demo: interrupted (server stopped)")
        sys.exit(130)


if __name__ == "__main__":
    main()
