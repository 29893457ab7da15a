"""Cache stack benchmarks, each beside its reference in the same run; appends to docs/benchmarks.md.

1. L1 hit: ``L1Cache.get`` (goal ≤ 10 µs), and the whole ``begin()`` / ``begin_nowait()`` (the
   server's hit path) of an L1 hit (key normalization + SHA-256 + Bloom + L1) for context.
2. Bloom check: the guard's check on a key (goal ≤ 0.3 µs; the seed quotes 30 µs), beside rbloom
   with a Python blake2b hash function (the usual "stable hash" approach) as the reference.
3. L2 hit: ``RedisTier.get`` + decode/verify of a stored value ÷ a raw redis-py GET of the same
   bytes from the same Redis (goal ≤ 1.2); the raw redis.asyncio GET and the L2 hit through the
   asyncio client (``l2_blocking_get=false``) are shown too.
4. L3 lookup split into embedding (MiniLM, one sentence) and FAISS search (flat at 1 k entries,
   HNSW at 50 k), plus the whole L3 ``lookup``.
5. HTTP: a cache hit (``POST /v1/completions``, x-cache HIT-L1) ÷ the same body sent to the
   server's bare ``POST /echo`` (JSON in, the same JSON out: what any request costs that server
   before model or cache work) on the same keep-alive connection of a real
   ``harness serve --preset tiny --cache`` (goal ≤ 1.2): means of back-to-back loops (the goal's
   measure), and the medians of interleaved single requests; a streamed hit and ``GET /health``
   beside them for context.
6. HTTP hit while the engine decodes: the same hit loop while 8 streams decode on the same server
   (``--busy-streams``, driven from a process of its own), ÷ the hit on the idle engine, in three
   alternating blocks each (medians; goal ≤ 1.2), for each
   place of the engine's step loop (``--step-loops process,thread``: its own process, the default,
   and a thread of the server's), one server after the other in the same run.

Usage: ``python bench/cache.py [--quick] [--no-http | --http-only] [--step-loops process,thread]``
(about 2–3 min on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from _publish import add_publish_flag, publish  # noqa: E402  (bench/ is on sys.path)

sys.path.insert(0, str(ROOT))

from harness.common.stats import percentile  # noqa: E402  (after the path is set)


def per_call_us(fn: Callable[[], object], n: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean time of ``n`` calls, in µs."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        out.append((time.perf_counter_ns() - t0) / n / 1000)
    return percentile(out, 50)


async def per_call_us_async(fn: Callable[[], Awaitable[object]], n: int, repeats: int = 5) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            await fn()
        out.append((time.perf_counter_ns() - t0) / n / 1000)
    return percentile(out, 50)


async def bench_stack(quick: bool) -> dict[str, Any]:
    import redis
    import redis.asyncio as aredis
    from rbloom import Bloom

    from harness.target.cache.api import CachedCompletion
    from harness.target.cache.bloom import key_item
    from harness.target.cache.factory import build_stack
    from harness.target.cache.settings import CacheSettings

    n = 2000 if quick else 20000
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    s = CacheSettings(run_dir=tmp, state_dir=tmp / "state", persist=False, redis_url=None, embed_device="cpu")
    stack = build_stack(s)
    res: dict[str, Any] = {}
    try:
        comp = CachedCompletion(
            text="The capital of France is Paris. " * 8, finish_reason="stop", model="tiny",
            prompt_tokens=12, completion_tokens=64, created=int(time.time()),
        )  # fmt: skip
        body = {"model": "tiny", "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "temperature": 0, "max_tokens": 64}  # fmt: skip
        key = await stack.put("chat.completions", body, "default", comp)

        # 1. L1
        res["l1_get_us"] = per_call_us(lambda: stack.l1.get(key), n)
        res["l1_begin_us"] = await per_call_us_async(
            lambda: stack.begin("chat.completions", body, "default"), n // 4
        )
        res["l1_nowait_us"] = per_call_us(
            lambda: stack.begin_nowait("chat.completions", body, "default"), n // 4
        )

        # 2. Bloom
        assert stack.bloom is not None
        guard = stack.bloom
        item = key_item(key)
        res["loop_us"] = per_call_us(lambda: None, n * 10)  # the measuring loop's own cost
        res["bloom_item_us"] = per_call_us(lambda: guard.check_item(item), n * 10)
        res["bloom_raw_us"] = per_call_us(lambda: item in guard.bloom, n * 10)
        res["bloom_check_us"] = per_call_us(lambda: key in guard, n * 10)

        def blake(o: object) -> int:
            d = hashlib.blake2b(str(o).encode(), digest_size=16).digest()
            return int.from_bytes(d, "big", signed=True)

        ref = Bloom(s.bloom_capacity, s.bloom_fp_rate, blake)
        ref.add(key)
        res["bloom_ref_us"] = per_call_us(lambda: key in ref, n * 10)
        # The previous design: a 128-bit item through a Python-callable identity hash.
        import operator

        prev = Bloom(s.bloom_capacity, s.bloom_fp_rate, operator.index)
        item128 = int(key.rsplit(":", 1)[1], 16) - (1 << 127)
        prev.add(item128)
        res["bloom_prev_us"] = per_call_us(lambda: item128 in prev, n * 10)

        # 3. L2 vs raw redis-py on the same server and bytes
        assert stack.l2 is not None and stack.embedded is not None
        rkey = stack.l2.rkey(key)
        raw_sync = redis.Redis(unix_socket_path=stack.embedded.socket_path)
        raw_async = aredis.Redis(unix_socket_path=stack.embedded.socket_path)
        assert raw_sync.get(rkey) is not None
        await raw_async.get(rkey)

        l2_tier = stack.tier("l2")
        req = stack.keys.normalize("chat.completions", body, "default")
        assert l2_tier is not None and req.key == key

        async def l2_hit() -> None:  # the tier's lookup: GET, checksum, decode
            got = await l2_tier.get(req, {})
            assert got is not None

        m = n // 4
        assert stack.l2.blocking  # the embedded Redis is on a unix socket
        for _ in range(2):  # interleave, so drift on a shared machine hits both sides
            res["redis_sync_get_us"] = per_call_us(lambda: raw_sync.get(rkey), m)
            res["redis_async_get_us"] = await per_call_us_async(lambda: raw_async.get(rkey), m)
            res["l2_hit_us"] = await per_call_us_async(l2_hit, m)
            stack.l2.blocking = False  # the same tier through redis.asyncio, for comparison
            res["l2_hit_async_us"] = await per_call_us_async(l2_hit, m)
            stack.l2.blocking = True
        await raw_async.aclose()  # type: ignore[attr-defined]
        raw_sync.close()

        # 4. L3: embedding vs search
        assert stack.l3 is not None
        l3 = stack.l3
        emb = l3.embedder
        texts = [f"user: question {i} about the history of topic {i % 97}" for i in range(32)]
        t0 = time.perf_counter()
        for t in texts:
            emb.encode([t])
        res["l3_embed_ms"] = (time.perf_counter() - t0) / len(texts) * 1000
        import faiss

        rng = np.random.default_rng(0)
        q = rng.standard_normal((1, 384)).astype(np.float32)
        q /= np.linalg.norm(q)
        for size, kind in ((1000, "flat"), (50_000 if not quick else 10_000, "hnsw")):
            x = rng.standard_normal((size, 384)).astype(np.float32)
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            idx: Any
            if kind == "flat":
                idx = faiss.IndexFlatIP(384)
            else:
                idx = faiss.IndexHNSWFlat(384, s.l3_hnsw_m, faiss.METRIC_INNER_PRODUCT)
                idx.hnsw.efSearch = 64
            idx.add(x)

            def search(idx: Any = idx) -> object:
                return idx.search(q, 8)

            res[f"l3_search_{kind}_{size}_us"] = per_call_us(search, 500)
        req = stack.keys.normalize("chat.completions", body, "default")
        res["l3_lookup_ms"] = await per_call_us_async(lambda: l3.lookup(req), 30, repeats=3) / 1000
    finally:
        await stack.close()
    return res


def decode_main(url: str, streams: int) -> None:
    """``--decode URL N`` (a child of :class:`Decoding`): ``N`` threads, each streaming long
    completions (distinct prompts: never a cache hit) back to back on its own connection, until
    stdin closes; then prints the SSE chunks received per second since ``go`` arrived on stdin."""
    import threading

    import httpx

    stop = threading.Event()
    tokens = [0] * streams

    def run(i: int) -> None:
        n = 0
        with httpx.Client(base_url=url, timeout=300) as client:
            while not stop.is_set():
                n += 1
                body = {
                    "prompt": f"stream {i} request {n}: tell a long story",
                    "max_tokens": 1500, "temperature": 0, "ignore_eos": True, "stream": True,
                }  # fmt: skip
                with client.stream("POST", "/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            tokens[i] += 1
                        if stop.is_set():
                            break

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    sys.stdin.readline()  # "go": the parent starts measuring
    t0, n0 = time.perf_counter(), sum(tokens)
    sys.stdin.read()  # until the parent closes stdin
    rate = (sum(tokens) - n0) / (time.perf_counter() - t0)
    stop.set()
    print(f"{rate:.3f}", flush=True)


class Decoding:
    """An engine decoding ``streams`` requests, driven from a process of its own (:func:`decode_main`),
    so that its client threads take no time from the measuring loop's interpreter."""

    def __init__(self, url: str, streams: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--decode", url, str(streams)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> float:
        """Stop it; the SSE chunks per second it received since :meth:`go`."""
        out, _ = self.proc.communicate(timeout=120)
        return float(out.strip() or "nan")


def bench_http(quick: bool, step_loop: str = "process", busy_streams: int = 8) -> dict[str, Any]:
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-http-"))
    env = {**os.environ, "HARNESS__RUN_DIR": str(tmp / "run"), "HARNESS__CACHE__L3_ENABLED": "false"}
    cmd = [sys.executable, "-m", "harness.cli", "serve", "--preset", "tiny", "--port", "0", "--cache"]
    cmd += ["--step-loop", step_loop]
    out = (tmp / "stdout.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=tmp)
    try:
        deadline = time.monotonic() + 180
        url = None
        while url is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("harness serve did not start")
            m = re.search(r"serving \S+ at (http://\S+)", (tmp / "stdout.log").read_text(errors="replace"))
            url = m.group(1) if m else None
            time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=30) as client:
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            body = {"prompt": "benchmark the cache hit path", "max_tokens": 16, "temperature": 0}
            first = client.post("/v1/completions", json=body)
            assert first.headers["x-cache"] == "MISS", first.headers
            hit = client.post("/v1/completions", json=body)
            assert hit.headers["x-cache"] == "HIT-L1", hit.headers
            n = 100 if quick else 500
            stream_body = {**body, "stream": True}
            calls: dict[str, Callable[[], object]] = {
                "echo": lambda: client.post("/echo", json=body),
                "hit": lambda: client.post("/v1/completions", json=body),
                "stream": lambda: client.post("/v1/completions", json=stream_body).read(),
                "health": lambda: client.get("/health"),
            }
            res: dict[str, Any] = {}
            for _ in range(2):  # the second round counts: the first warms both paths up
                for name, call in calls.items():
                    res[f"{name}_ms"] = per_call_us(call, n, repeats=3) / 1000
            # Interleaved single requests, medians: less sensitive to other load on a shared machine.
            times: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(n * 2):
                for name, call in calls.items():
                    t0 = time.perf_counter()
                    call()
                    times[name].append(time.perf_counter() - t0)
            for name, ts in times.items():
                res[f"{name}_med_ms"] = percentile(ts, 50) * 1000
            # The same hit, idle engine and decoding, in alternating blocks (tachometer's round
            # robin): a drift of the machine over the run hits both sides alike.
            hit = calls["hit"]
            idle, busy, rates = [], [], []
            for _ in range(3):
                idle.append(per_call_us(hit, n, repeats=1) / 1000)
                decoding = Decoding(url, busy_streams)
                try:
                    while client.get("/health").json()["running"] < busy_streams:  # every stream decoding
                        time.sleep(0.05)
                    decoding.go()
                    busy.append(per_call_us(hit, n, repeats=1) / 1000)
                finally:
                    rates.append(decoding.stop())
                while client.get("/health").json()["running"] > 0:  # the aborted streams are gone
                    time.sleep(0.05)
            res["idle_hit_ms"] = percentile(idle, 50)
            res["busy_hit_ms"] = percentile(busy, 50)
            res["busy_tok_s"] = percentile(rates, 50)
            res["step_loop"] = step_loop
            res["busy_streams"] = busy_streams
            return res
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()


def report(
    res: dict[str, Any] | None,
    http: dict[str, Any] | None,
    args: argparse.Namespace,
    total_s: float,
    busy: list[dict[str, Any]] | None = None,
) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    flags = [
        f
        for f, on in (("--quick", args.quick), ("--no-http", args.no_http), ("--http-only", args.http_only))
        if on
    ]
    if getattr(args, "step_loops", "process,thread") != "process,thread":
        flags.append(f"--step-loops {args.step_loops}")
    cmd = " ".join(["python bench/cache.py", *flags])
    rows = ([] if res is None else stack_rows(res)) + ([] if http is None else http_rows(http))
    rows += busy_rows(busy or [])
    lines = [
        f"## cache — {now}",
        "",
        f"`{cmd}` on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()} "
        f"(shared machine; {total_s:.0f} s total). Medians of repeated loops; the reference ran in the same "
        "process against the same data (and the same embedded redis-server on a unix socket).",
        "",
        "| measure | ours | reference | ratio |",
        "| --- | --- | --- | --- |",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
    ]
    if not http:
        lines += ["", "HTTP hit ÷ /echo: not measured in this run (`--no-http`)."]
    return "\n".join(lines) + "\n"


def stack_rows(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = [
        ("L1 hit (`L1Cache.get`)", f"{res['l1_get_us']:.2f} µs", "goal 10 µs",
         f"{res['l1_get_us'] / 10:.2f}× goal"),
        ("L1 hit, whole `begin()` (normalize + SHA-256 + Bloom + L1)",
         f"{res['l1_begin_us']:.1f} µs", "—", "—"),
        ("L1 hit, `begin_nowait()` (the server's hit path: no task, no await)",
         f"{res['l1_nowait_us']:.1f} µs", "—", "—"),
        ("Bloom check as on the request path (`check_item`, with counters)", f"{res['bloom_item_us']:.3f} µs",
         "goal 0.3 µs (seed: 30 µs)", f"{res['bloom_item_us'] / 0.3:.2f}× goal"),
        ("… the same net of the measuring loop (a no-op lambda call)",
         f"{res['bloom_item_us'] - res['loop_us']:.3f} µs", f"loop {res['loop_us']:.3f} µs",
         f"{(res['bloom_item_us'] - res['loop_us']) / 0.3:.2f}× goal"),
        ("Bloom membership alone (`item in rbloom`)", f"{res['bloom_raw_us']:.3f} µs",
         f"{res['bloom_ref_us']:.3f} µs (rbloom + Python blake2b hash)",
         f"{res['bloom_raw_us'] / res['bloom_ref_us']:.2f}×"),
        ("Bloom membership, previous design (128-bit item, `operator.index` hash)",
         f"{res['bloom_prev_us']:.3f} µs", "—", "—"),
        ("Bloom check re-parsing the key string (`key in guard`, not on the request path)",
         f"{res['bloom_check_us']:.3f} µs", "—", "—"),
        ("L2 hit (`RedisTier.get` + verify + decode)", f"{res['l2_hit_us']:.1f} µs",
         f"{res['redis_sync_get_us']:.1f} µs (raw redis-py GET)",
         f"{res['l2_hit_us'] / res['redis_sync_get_us']:.2f}× (goal ≤ 1.2)"),
        ("L2 hit through redis.asyncio (`l2_blocking_get=false`)", f"{res['l2_hit_async_us']:.1f} µs",
         f"{res['redis_sync_get_us']:.1f} µs (raw redis-py GET)",
         f"{res['l2_hit_async_us'] / res['redis_sync_get_us']:.2f}×"),
        ("raw redis.asyncio GET (context)", f"{res['redis_async_get_us']:.1f} µs",
         f"{res['redis_sync_get_us']:.1f} µs (raw redis-py GET)",
         f"{res['redis_async_get_us'] / res['redis_sync_get_us']:.2f}×"),
        ("L3 embedding (MiniLM, 1 sentence, CPU)", f"{res['l3_embed_ms']:.2f} ms", "—", "—"),
    ]  # fmt: skip
    for k, v in res.items():
        if k.startswith("l3_search_"):
            _, _, kind, size, _ = k.split("_")
            rows.append((f"L3 FAISS search, {kind}, {int(size):,} vectors, k=8", f"{v:.1f} µs", "—", "—"))
    rows.append(
        ("L3 whole lookup (embed + search + verify, thread pool)", f"{res['l3_lookup_ms']:.2f} ms", "—", "—")
    )
    return rows


def http_rows(http: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    echo, echo_med = http["echo_ms"], http["echo_med_ms"]
    return [
        ("HTTP cache hit (POST /v1/completions, HIT-L1)", f"{http['hit_ms']:.3f} ms",
         f"{echo:.3f} ms (POST /echo, same body)", f"{http['hit_ms'] / echo:.2f}× (goal ≤ 1.2)"),
        ("… medians of interleaved single requests", f"{http['hit_med_ms']:.3f} ms",
         f"{echo_med:.3f} ms (POST /echo)", f"{http['hit_med_ms'] / echo_med:.2f}×"),
        ("HTTP cache hit streamed (16 tokens as SSE chunks)", f"{http['stream_ms']:.3f} ms",
         f"{echo:.3f} ms (POST /echo)", f"{http['stream_ms'] / echo:.2f}×"),
        ("GET /health (context)", f"{http['health_ms']:.3f} ms",
         f"{echo:.3f} ms (POST /echo)", f"{http['health_ms'] / echo:.2f}×"),
    ]  # fmt: skip


def busy_rows(busy: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    return [
        (f"HTTP cache hit while {b['busy_streams']} streams decode (step loop: {b['step_loop']}; "
         f"{b['busy_tok_s']:.0f} SSE chunks/s streamed meanwhile)", f"{b['busy_hit_ms']:.3f} ms",
         f"{b['idle_hit_ms']:.3f} ms (the same hit, idle engine, blocks alternating)",
         f"{b['busy_hit_ms'] / b['idle_hit_ms']:.2f}× (goal ≤ 1.2)")
        for b in busy
    ]  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--decode"]:  # the decoding client of bench_http, in its own process
        decode_main(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-http", action="store_true", help="skip the HTTP measurement (no server)")
    mode.add_argument("--http-only", action="store_true", help="only the HTTP measurement (hit ÷ echo)")
    ap.add_argument(
        "--step-loops",
        default="process,thread",
        help="where the engine's step loop runs, one server each, for the hit-while-decoding measure",
    )
    ap.add_argument("--busy-streams", type=int, default=8, help="streams decoding during the busy hit loop")
    add_publish_flag(ap)
    args = ap.parse_args()
    t0 = time.perf_counter()
    res = None if args.http_only else asyncio.run(bench_stack(args.quick))
    http: dict[str, Any] | None = None
    busy: list[dict[str, Any]] = []
    if not args.no_http:
        for loop in args.step_loops.split(","):
            one = bench_http(args.quick, loop, args.busy_streams)
            http = http or one  # the first server's (the default's) rows are the hit ÷ echo table
            busy.append(one)
    text = report(res, http, args, time.perf_counter() - t0, busy)
    publish(text, args)


if __name__ == "__main__":
    main()
