"""Load generator benchmarks: the replay user's cost and the open loop's precision (docs/benchmarks.md).

Everything runs against one trivial endpoint, a minimal asyncio HTTP server in its own process that
answers every POST with the same tiny OpenAI SSE body (one content chunk with usage, the final
usage chunk, ``[DONE]``), so the client, not the server, is what is measured:

1. Throughput, closed loop, saturated (same users, same duration, interleaved rounds in this run,
   medians): the replay user (``locustfiles/replay.py``, an unreachable arrival rate so that its users
   never wait for the pacer: they send back to back) ÷ a bare Locust ``FastHttpUser`` posting the
   same body and reading the response. Goal ≥ 1.0. Both counted by requests completed per second,
   and, because wall-clock throughput on a shared machine follows the other processes' load, also
   by the Locust process's CPU time per request (test start to stop, the same way on both sides):
   the throughput one core can give.
2. Open-loop precision at 200, 500 and 1000 requests/s in one process: p99 lateness (goal ≤ 1 ms)
   and achieved ÷ target rate (goal ≥ 99.5 %), from ``summary.json``.

Usage: ``python bench/load.py [--seconds 10] [--users 32] [--rounds 3] [--no-append]`` (about 2–3 min).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from _publish import add_publish_flag, publish  # noqa: E402  (bench/ is on sys.path)

sys.path.insert(0, str(ROOT))

from harness.common.stats import percentile  # noqa: E402
from harness.load.results import read_summary  # noqa: E402
from harness.load.runner import LoadSpec, free_port, run_locust  # noqa: E402

CHUNK = (
    b'data: {"id":"b","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":"hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,'
    b'"total_tokens":4}}\n\n'
    b'data: {"id":"b","object":"chat.completion.chunk","created":0,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n'
    b"data: [DONE]\n\n"
)
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nx-cache: MISS\r\nContent-Length: "
    + str(len(CHUNK)).encode()
    + b"\r\n\r\n"
    + CHUNK
)

BARE = """
import json, os
import psutil
from locust import FastHttpUser, constant, events, task
BODY = {body!r}
_proc = psutil.Process()
_cpu0 = [0.0]

@events.test_start.add_listener
def _start(environment, **kw):
    _cpu0[0] = sum(_proc.cpu_times()[:2])

@events.test_stop.add_listener
def _stop(environment, **kw):
    cpu = sum(_proc.cpu_times()[:2]) - _cpu0[0]
    with open(os.environ["BENCH_CPU_OUT"], "w") as fh:
        json.dump({{"cpu_s": cpu, "requests": environment.stats.total.num_requests}}, fh)

class Bare(FastHttpUser):
    wait_time = constant(0)

    @task
    def post(self):
        self.client.post("/v1/chat/completions", data=BODY,
                         headers={{"Content-Type": "application/json", "Accept-Encoding": "identity"}})
"""


class _Trivial(asyncio.Protocol):
    """Answers each request (headers + Content-Length body) with :data:`RESPONSE`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            i = head.find(b"content-length:")
            length = int(head[i + 15 :].split(b"\r\n", 1)[0]) if i >= 0 else 0
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            self.transport.write(RESPONSE)  # type: ignore[attr-defined]


def serve(port: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Trivial, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    asyncio.run(main())


def corpus(path: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "load"))
    from tests.load.helpers import make_corpus

    return make_corpus(path, 50)


def bare_rps(host: str, tmp: Path, users: int, seconds: int) -> tuple[float, float]:
    """Requests/s (Locust's count) and CPU µs per request of a bare FastHttpUser run."""
    body = json.dumps({"messages": [{"role": "user", "content": "question 0"}], "max_tokens": 16,
                       "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    lf = tmp / "bare.py"
    lf.write_text(BARE.format(body=body))
    prefix = tmp / "bare"
    cmd = [sys.executable, "-m", "locust", "-f", str(lf), "--headless", "--host", host, "-u", str(users),
           "-r", str(users), "-t", f"{seconds}s", "--csv", str(prefix), "--only-summary"]  # fmt: skip
    out = tmp / "bare_cpu.json"
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "BENCH_CPU_OUT": str(out)})
    with open(f"{prefix}_stats.csv", newline="") as fh:
        rows = {r["Name"]: r for r in csv.DictReader(fh)}
    cpu = json.loads(out.read_text())
    return float(rows["Aggregated"]["Requests/s"]), cpu["cpu_s"] / max(1, cpu["requests"]) * 1e6


def replay(
    host: str, tmp: Path, name: str, *, rate: float, seconds: float, users: int, cap: bool = False
) -> dict[str, float]:
    results = tmp / name
    spec = LoadSpec(host=host, corpus=tmp / "corpus.jsonl", rate=rate, duration=seconds, results_dir=results,
                    concurrency=users, start_delay=2.0,
                    run_time=f"{seconds + 2:g}s" if cap else None)  # fmt: skip
    code = run_locust(spec, timeout_s=seconds + 120)
    s = read_summary(results)
    sent = s.metrics["lateness_ms"]
    return {
        "code": code,
        "requests": s.requests,
        "errors": s.errors,
        "achieved": s.achieved_rate,
        "window_rps": s.requests / max(s.duration_s, 1e-9),
        "lateness_p50": sent.p50 or 0.0,
        "lateness_p99": sent.p99 or 0.0,
        "lateness_max": sent.max or 0.0,
        "cpu": s.client_cpu_pct or 0.0,
        # CPU of the Locust process from test start to the end (the pacer's idle spin left out).
        "cpu_us_per_request": (s.client_cpu_pct or 0.0) / 100 * s.duration_s / max(1, s.requests) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved bare/replay throughput rounds")
    ap.add_argument("--rates", default="200,500,1000")
    add_publish_flag(ap)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    host = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    try:
        time.sleep(1.0)
        corpus(tmp / "corpus.jsonl")
        # Interleaved rounds (bare, ours, bare, ours …) and medians: the machine's load drifts.
        bares: list[float] = []
        ours_runs: list[float] = []
        bare_cpu: list[float] = []
        ours_cpu: list[float] = []
        for i in range(args.rounds):
            rps, cpu = bare_rps(host, tmp, args.users, args.seconds)
            bares.append(rps)
            bare_cpu.append(cpu)
            # An unreachable rate: the pacer always has an arrival due, so users send back to back.
            sat = replay(
                host, tmp, f"saturated{i}", rate=100_000, seconds=args.seconds, users=args.users, cap=True
            )
            ours_runs.append(sat["achieved"])  # requests sent per second of the send window
            ours_cpu.append(sat["cpu_us_per_request"])
        bare, ours = percentile(bares, 50), percentile(ours_runs, 50)
        bare_us, ours_us = percentile(bare_cpu, 50), percentile(ours_cpu, 50)
        precision = [
            (r, replay(host, tmp, f"rate{r}", rate=float(r), seconds=args.seconds, users=64))
            for r in map(int, args.rates.split(","))
        ]
    finally:
        server.terminate()
        server.wait(10)
    total = time.perf_counter() - t0
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "python bench/load.py" + (
        " " + " ".join(a for a in sys.argv[1:] if a != "--no-append") if len(sys.argv) > 1 else ""
    )
    rows = [
        ("replay user, saturated (requests/s, median of rounds)", f"{ours:,.0f}",
         f"{bare:,.0f} (bare FastHttpUser)", f"{ours / bare:.2f}× (goal ≥ 1.0)"),
        ("… each round: replay / bare", " / ".join(f"{x:,.0f}" for x in ours_runs),
         " / ".join(f"{x:,.0f}" for x in bares), "—"),
        ("client CPU per request (median: throughput per core)", f"{ours_us:.0f} µs",
         f"{bare_us:.0f} µs (bare FastHttpUser)", f"{bare_us / ours_us:.2f}× per core (goal ≥ 1.0)"),
    ]  # fmt: skip
    for r, m in precision:
        ok_late = "✓" if m["lateness_p99"] <= 1.0 else "✗"
        ok_rate = "✓" if m["achieved"] / r >= 0.995 else "✗"
        spread = f"p50 {m['lateness_p50']:.3f} ms, max {m['lateness_max']:.1f} ms"
        rows.append((f"open loop at {r}/s: p99 lateness", f"{m['lateness_p99']:.3f} ms", spread,
                     f"goal ≤ 1 ms {ok_late}"))  # fmt: skip
        rows.append((f"open loop at {r}/s: achieved ÷ target", f"{m['achieved']:.1f}/s",
                     f"{m['requests']} requests, {m['errors']} errors, client CPU {m['cpu']:.0f} %",
                     f"{m['achieved'] / r:.2%} (goal ≥ 99.5 %) {ok_rate}"))  # fmt: skip
    lines = [
        f"## load — {now}",
        "",
        f"`{cmd}` on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()} "
        f"(shared machine, load average {load_before:.1f} → {os.getloadavg()[0]:.1f}; {total:.0f} s total). "
        "One Locust process against a minimal asyncio SSE server in "
        f"another process; {args.users} users for the throughput pair (same endpoint, same body, "
        f"{args.seconds} s each, {args.rounds} interleaved rounds), "
        f"64 for the open-loop rates ({args.seconds} s each). "
        "Lateness = sent − intended, from records.jsonl. With a load average above the core count the "
        "process is descheduled for milliseconds at a time, which shows in the lateness tail.",
        "",
        "| measure | ours | reference | ratio |",
        "| --- | --- | --- | --- |",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
    ]
    text = "\n".join(lines) + "\n"
    publish(text, args)


if __name__ == "__main__":
    main()
