"""A warmup's realized effect through the engine beside the simulator's prediction (docs/benchmarks.md).

For each request trace with ``hash_ids`` (Mooncake's format): its first ``--seconds`` become a corpus
(``harness corpus build --trace … --block-tokens 16``: each 512-token block becomes 16 tokens, input
lengths ÷ 32, output lengths as traced and capped at ``--max-tokens-cap``), which ``harness analysis
effect`` splits at ``--split`` of its time span and replays three times against a fresh ``harness serve
--preset PRESET`` per eviction policy: cold, after the plan's preload, after the oracle's. The table:
first-10 % and whole-window TTFT P95 per pass, the realized gain ``1 − planned ÷ cold`` with its paired
interval beside the oracle's, and the shared-block hit rate measured on the engine beside the
simulator's prediction for the same preload, capacity and policy.

Usage::

    python bench/warmup.py                                   # Mooncake synthetic from $HARNESS_REALDATA
    python bench/warmup.py --trace conversation=PATH/conversation_trace.jsonl --eviction lru,s3fifo

Each run takes about 5 minutes a trace and policy on 2 cores (three passes of the window at trace
time, plus the preloads); nothing else may run beside it (a busier machine moves every TTFT).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from _publish import add_publish_flag, publish  # noqa: E402  (bench/ is on sys.path)

HARNESS = [str(Path(sys.executable).parent / "harness")]
TEMPLATE = "templates/prompts/four_section.j2"
PREDICT = {"lru": "lru", "s3fifo": "s3fifo-seeded"}
"""The simulator that predicts each engine eviction policy (``s3fifo``: preloaded blocks start in main)."""


def _head(trace: Path, seconds: float, out: Path) -> int:
    """The trace's requests in its first ``seconds`` (Mooncake timestamps are ms), written to ``out``."""
    n = 0
    with trace.open() as src, out.open("w") as dst:
        for line in src:
            if line.strip() and json.loads(line)["timestamp"] < seconds * 1000:
                dst.write(line)
                n += 1
    return n


def _run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    with log.open("w") as fh:
        return subprocess.run(
            cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False
        ).returncode


def _pct(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x if abs(x) >= 0.005 else 0.0:.0%}"  # never "-0%"


def _gain(g: dict[str, Any] | None) -> str:
    if not g or g.get("value") is None:
        return "–"
    return f"{_pct(g['value'])} [{_pct(g['lo'])}, {_pct(g['hi'])}]"


def _ms(p: dict[str, Any]) -> str:
    v = p["ttft_p95"]["value"]
    return f"{v:,.0f}" if v is not None else "–"


def measure(args: argparse.Namespace, name: str, trace: Path, work: Path) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    head = work / "trace.jsonl"
    n = _head(trace, args.seconds, head)
    corpus = work / "corpus"
    if not (args.reuse and (corpus / "corpus.jsonl").exists()):
        code = _run(
            [*HARNESS, "corpus", "build", "--trace", str(head), "--block-tokens", str(args.block_tokens),
             "--max-input-tokens", str(args.max_input_tokens), "--template", TEMPLATE, "--no-check",
             "-o", str(corpus)],
            work / "build.log",
        )  # fmt: skip
        if code:
            raise SystemExit(f"corpus build failed ({code}): {work / 'build.log'}")
    rows = []
    for eviction in args.eviction.split(","):
        out = work / eviction
        env = {**os.environ, "HARNESS__ENGINE__PREFIX_EVICTION": eviction, "HF_HUB_OFFLINE": "1"}
        if not (args.reuse and (out / "effect.json").exists()):
            code = _run(
                [*HARNESS, "analysis", "effect", "--corpus", str(corpus), "--split", str(args.split),
                 "--serve-args", f"--preset {args.preset}", "--max-tokens-cap", str(args.max_tokens_cap),
                 "--policy", PREDICT[eviction], "-o", str(out), "--force"],
                work / f"{eviction}.log", env,
            )  # fmt: skip
            if code:
                raise SystemExit(f"harness analysis effect failed ({code}): {work / f'{eviction}.log'}")
        report = json.loads((out / "effect.json").read_text())
        run = json.loads((out / "run.json").read_text())
        span = (run.get("started_at", "?")[:16].replace("T", " "), run.get("finished_at", "?")[11:16])
        first, whole = report["heads"][0], report["heads"][-1]
        pred = report["predicted_block_hit_rate"]
        share = None
        g, o = first["gain_p95"]["planned"]["value"], first["gain_p95"]["oracle"]["value"]
        if g is not None and o is not None and o > 0:
            share = g / o
        rows.append(
            {
                "trace": name, "requests": n, "eviction": eviction, "report": report, "span": span,
                "cells": [
                    name, eviction, str(report["window_requests"]), str(report["capacity_blocks"]),
                    " / ".join(_ms(first["passes"][p]) for p in ("cold", "planned", "oracle")),
                    _gain(first["gain_p95"].get("planned")), _gain(first["gain_p95"].get("oracle")),
                    _pct(share),
                    " / ".join(_ms(whole["passes"][p]) for p in ("cold", "planned", "oracle")),
                    " / ".join(
                        f"{_pct(whole['passes'][p]['block_hit_rate'])} ({_pct(pred[p])})"
                        for p in ("cold", "planned", "oracle")
                    ),
                ],
            }
        )  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--trace", action="append", default=[], help="NAME=PATH of a Mooncake-format trace (repeatable)"
    )
    ap.add_argument(
        "--seconds", type=float, default=400.0, help="the trace's first seconds replayed (default 400)"
    )
    ap.add_argument("--split", type=float, default=0.75, help="history share of the span (default 0.75)")
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--max-input-tokens", type=int, default=1536)
    ap.add_argument("--max-tokens-cap", type=int, default=4)
    ap.add_argument("--eviction", default="lru,s3fifo", help="engine eviction policies (default lru,s3fifo)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--workdir", type=Path, default=ROOT / ".harness" / "bench-warmup")
    ap.add_argument("--reuse", action="store_true", help="reuse corpora and runs already in --workdir")
    add_publish_flag(ap)
    args = ap.parse_args()
    traces = [tuple(t.split("=", 1)) for t in args.trace]
    if not traces:
        realdata = os.environ.get("HARNESS_REALDATA")
        if not realdata:
            raise SystemExit(
                "no --trace and no HARNESS_REALDATA (its mooncake/synthetic_trace.jsonl is the default)"
            )
        traces = [("mooncake-synthetic", str(Path(realdata) / "mooncake" / "synthetic_trace.jsonl"))]
    load0 = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    for name, path in traces:
        rows += measure(args, name, Path(path), args.workdir / name)
    header = (
        "| trace | engine eviction | window requests | capacity (blocks) "
        "| first 10 %: TTFT P95 cold / planned / oracle (ms) | planned gain (P95) | oracle gain (P95) "
        "| planned ÷ oracle | whole window: TTFT P95 (ms) "
        "| shared-block hits measured (simulated): cold / planned / oracle |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [f"| {' | '.join(r['cells'])} |" for r in rows]
    when = "; ".join(f"{r['trace']} {r['eviction']} {r['span'][0]}–{r['span'][1]}" for r in rows)
    section = (
        f"\n## Warmup effect through the engine ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)\n\n"
        f"`python bench/warmup.py {' '.join(sys.argv[1:])}`: the first {args.seconds:g} s of each trace, "
        f"blocks at {args.block_tokens} tokens (Mooncake's 512 ÷ {512 // args.block_tokens}), prompts "
        f"capped at {args.max_input_tokens} tokens, answers at {args.max_tokens_cap}; history = the first "
        f"{args.split:.0%} of the span, the window the rest, replayed at trace time against `harness serve "
        f"--preset {args.preset}` ({platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end). Gains are `1 − P95(pass) ÷ P95(cold)` over the same "
        f"requests, 95 % paired bootstrap intervals. Runs (UTC): {when}"
        + (f" (reused from {args.workdir}; load averages of this invocation)" if args.reuse else "")
        + ".\n\n"
        + header
        + "\n"
        + "\n".join(lines)
        + "\n"
    )
    publish(section, args)


if __name__ == "__main__":
    main()
