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
   the throughput one core can give. The CPU is counted twice: over the whole test (start-up and
   drain included, as each process counts it itself) and over its steady state (from 2 s after the
   first response to 1 s before the last, sampled from outside both processes the same way:
   :class:`CpuSampler`, and responses completed in that window). Fixed start-up costs weigh more per
   request when a busy machine lets fewer requests through; the steady state is the cost per request.
2. Open-loop precision at 200, 500 and 1000 requests/s in one process: p99 lateness (goal ≤ 1 ms)
   and achieved ÷ target rate (goal ≥ 99.5 %), from ``summary.json``.

Usage: ``python bench/load.py [--seconds 10] [--users 32] [--rounds 3] [--no-append]`` (about 2–3 min).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent

from _publish import add_publish_flag, publish  # noqa: E402  (bench/ is on sys.path)

sys.path.insert(0, str(ROOT))

from harness.common.stats import percentile  # noqa: E402
from harness.load.results import read_records  # noqa: E402
from harness.load.run_summary import read_summary  # noqa: E402
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
import json, os, time
import gevent
import psutil
from locust import FastHttpUser, constant, events, task
BODY = {body!r}
_proc = psutil.Process()
_cpu0 = [0.0]
_counts = []

def _count(environment):
    # Completed requests over time (for the steady-state window); 4 wake-ups a second.
    while True:
        _counts.append((time.time(), environment.stats.total.num_requests))
        gevent.sleep(0.25)

@events.test_start.add_listener
def _start(environment, **kw):
    _cpu0[0] = sum(_proc.cpu_times()[:2])
    gevent.spawn(_count, environment)

@events.test_stop.add_listener
def _stop(environment, **kw):
    cpu = sum(_proc.cpu_times()[:2]) - _cpu0[0]
    with open(os.environ["BENCH_CPU_OUT"], "w") as fh:
        json.dump({{"cpu_s": cpu, "requests": environment.stats.total.num_requests, "counts": _counts}}, fh)

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


class CpuSampler:
    """A child process's CPU seconds (user + system, its own children included), sampled every
    50 ms from this process: both sides of the throughput pair are measured the same way, from
    outside, without adding work to either."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.samples: list[tuple[float, float]] = []
        self._proc = psutil.Process(popen.pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self._proc, *self._proc.children(recursive=True)]
                cpu = sum(sum(p.cpu_times()[:2]) for p in procs)
            except psutil.Error:
                return
            self.samples.append((time.time(), cpu))
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> float:
        """CPU seconds at wall time ``t`` (linear between the samples around it)."""
        for (t0, c0), (t1, c1) in itertools.pairwise(self.samples):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
        raise ValueError(f"no CPU sample around {t}")


def steady_us(cpu: CpuSampler, done_at: list[float]) -> float:
    """CPU µs per response over the steady state: 2 s after the first response to 1 s before the
    last (responses completed at ``done_at``, wall times)."""
    a, b = min(done_at) + 2.0, max(done_at) - 1.0
    n = sum(1 for t in done_at if a <= t <= b)
    return (cpu.at(b) - cpu.at(a)) / max(1, n) * 1e6


def _run_sampled(cmd: list[str], env: dict[str, str] | None = None) -> CpuSampler:
    popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    sampler = CpuSampler(popen)
    _, err = popen.communicate()
    sampler.stop()
    if popen.returncode not in (0, 1):  # 1: Locust's "some requests failed"
        raise SystemExit(f"{cmd[:4]} exited {popen.returncode}: {err.decode(errors='replace')[-2000:]}")
    return sampler


def bare_rps(host: str, tmp: Path, users: int, seconds: int) -> tuple[float, float, float]:
    """Requests/s (Locust's count), CPU µs per request over the whole test and over the steady state
    of a bare FastHttpUser run."""
    body = json.dumps({"messages": [{"role": "user", "content": "question 0"}], "max_tokens": 16,
                       "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    lf = tmp / "bare.py"
    lf.write_text(BARE.format(body=body))
    prefix = tmp / "bare"
    cmd = [sys.executable, "-m", "locust", "-f", str(lf), "--headless", "--host", host, "-u", str(users),
           "-r", str(users), "-t", f"{seconds}s", "--csv", str(prefix), "--only-summary"]  # fmt: skip
    out = tmp / "bare_cpu.json"
    sampler = _run_sampled(cmd, env={**os.environ, "BENCH_CPU_OUT": str(out)})
    with open(f"{prefix}_stats.csv", newline="") as fh:
        rows = {r["Name"]: r for r in csv.DictReader(fh)}
    cpu = json.loads(out.read_text())
    # Locust counts requests, not completion times: a response time is spread over each 250 ms
    # count step (at most 4 per second of error on a window of several seconds' thousands).
    done_at: list[float] = []
    for (t0, n0), (t1, n1) in itertools.pairwise(cpu["counts"]):
        done_at.extend(t0 + (t1 - t0) * (i + 1) / (n1 - n0) for i in range(n1 - n0))
    return (
        float(rows["Aggregated"]["Requests/s"]),
        cpu["cpu_s"] / max(1, cpu["requests"]) * 1e6,
        steady_us(sampler, done_at),
    )


def replay(
    host: str, tmp: Path, name: str, *, rate: float, seconds: float, users: int, cap: bool = False
) -> dict[str, float]:
    results = tmp / name
    spec = LoadSpec(host=host, corpus=tmp / "corpus.jsonl", rate=rate, duration=seconds, results_dir=results,
                    concurrency=users, start_delay=2.0,
                    run_time=f"{seconds + 2:g}s" if cap else None)  # fmt: skip
    sampler = None
    if cap:  # the throughput pair: sample the Locust process from outside, as the bare one
        sampler = _run_sampled(spec.command(), env={**os.environ, **spec.options.credentials().to_env()})
        code = 0
    else:
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
        "steady_us_per_request": steady_us(sampler, _done_at(results, s.started_at)) if sampler else 0.0,
    }


def _done_at(results: Path, started_at: str) -> list[float]:
    """Wall times at which the run's responses completed (its epoch + sent + E2E)."""
    epoch = datetime.fromisoformat(started_at).timestamp()
    return [epoch + r.sent_s + (r.e2e_ms or 0.0) / 1000 for r in read_records(results)]


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
        bare_steady: list[float] = []
        ours_steady: list[float] = []
        for i in range(args.rounds):
            rps, cpu, steady = bare_rps(host, tmp, args.users, args.seconds)
            bares.append(rps)
            bare_cpu.append(cpu)
            bare_steady.append(steady)
            # An unreachable rate: the pacer always has an arrival due, so users send back to back.
            sat = replay(
                host, tmp, f"saturated{i}", rate=100_000, seconds=args.seconds, users=args.users, cap=True
            )
            ours_runs.append(sat["achieved"])  # requests sent per second of the send window
            ours_cpu.append(sat["cpu_us_per_request"])
            ours_steady.append(sat["steady_us_per_request"])
        bare, ours = percentile(bares, 50), percentile(ours_runs, 50)
        bare_us, ours_us = percentile(bare_cpu, 50), percentile(ours_cpu, 50)
        bare_st, ours_st = percentile(bare_steady, 50), percentile(ours_steady, 50)
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
         f"{bare_us:.0f} µs (bare FastHttpUser)", f"{bare_us / ours_us:.2f}× (whole test)"),
        ("client CPU per request, steady state (median: throughput per core)", f"{ours_st:.0f} µs",
         f"{bare_st:.0f} µs (bare FastHttpUser)", f"{bare_st / ours_st:.2f}× per core (goal ≥ 1.0)"),
        ("… each round, steady state: replay / bare", " / ".join(f"{x:.0f}" for x in ours_steady),
         " / ".join(f"{x:.0f}" for x in bare_steady), "—"),
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
