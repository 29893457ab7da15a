"""Gate noise: how often does the decision rule fail or refuse (inconclusive) an unchanged system?

Two sub-commands:

``record --out DIR``
    Records a real paired run against ``harness serve --preset tiny --cache`` on this machine: a cold
    pass (fresh server, every cache empty, each prompt new) then a warm pass replaying the same
    requests, each as ``DIR/cold`` and ``DIR/warm`` (``records.jsonl`` + ``summary.json`` through the
    load stage's own models). It is a small open-loop asyncio client (constant arrival rate, streamed
    chat completions, usage from the final chunk), standing in until the Locust load stage lands;
    ``fixtures/runs/tiny-cpu/`` was written by it.

``false-alarm``
    Measures, with the same code ``harness gate`` runs (:func:`harness.gates.judge.judge`):

    1. synthetic runs from one lognormal latency distribution (σ = 0.5) at several sizes: a fixed
       baseline at the true value + 10 %, and baselines written by ``baseline update --headroom 10%``
       from one run, each judged on many reruns from the same distribution;
    2. the worst case, a true P95 exactly at the limit: the interval rule vs the bare point estimate;
    3. the power: a true regression of +20 % and +30 %;
    4. real recorded records (``fixtures/runs/tiny-cpu``): bootstrap reruns against a baseline written
       from the recording, and a split-half check (baseline from the first half of each phase, judged
       on the second half: real drift within a session included).

    Prints the tables and appends them to docs/benchmarks.md (``--no-append`` to skip).

``travel``
    Whether a verdict holds on a machine it was not calibrated on, with real paired runs against the
    tiny target and the demo's recipe (:mod:`harness.demo`: a share of the capacity measured on the
    machine, a baseline from ``harness baseline calibrate --runs 3`` there). "Machines" are this one
    with 0, 1, … busy loops beside the runs (``--machines 0,1``). On each: the capacity, a
    calibration, then ``--unchanged`` gated reruns of the unchanged target; on the first, also
    ``--regressed`` runs per injected slowdown (``harness serve --inject-slowdown F``, every engine
    step F times as long) for the detection power; and every other machine's unchanged runs gated
    against the first machine's baseline too (a baseline carried to a slower machine of the same
    model). Tabulates pass / fail / cannot-be-judged per case.

``power``
    The power of every mode, measured with real gated runs of the tiny target on this machine: a
    recipe (the demo's corpus and share of capacity, ``--requests`` a phase), a stored baseline from
    ``harness baseline calibrate --runs 3``, a **history** baseline from ``--history`` earlier
    unchanged runs (``calibrate --from-runs``), and ``harness ab`` beside the unchanged target.
    Then ``--unchanged`` gated runs of the unchanged target (the false alarms), and ``--repeats``
    runs of each regression injected with ``harness serve``'s fault injection: slowdowns, error rates,
    warm cache-miss rates. Every run is judged by the stored and the history baseline (the history
    runs themselves are not judged by the baseline made from them); slowdowns also by ``harness ab``.
    Prints detection and false-alarm rates with exact 95 % intervals, the gates that caught each
    regression, and the requests each needed; appends the table to docs/benchmarks.md.

``job``
    The CI job as docs/ci.md writes it (``harness ab --recipe fixtures/recipes/ci.yaml``), run
    ``--repeats`` times per condition, round-robin: the candidate unchanged, 1.1×, 1.2× and 1.5× slower,
    5 % errors, 30 % of warm hits lost, 20 % more KV blocks (``harness serve --inject-*``). Tabulates
    exit 1 / 0 / 6 per condition with exact intervals and what failed; appends to docs/benchmarks.md.

``rejudge``
    The runs a ``power`` bench kept, judged again by the current rules without running anything:
    the stored and history baselines recalibrated from the bench's own runs, once with the runs'
    spread alone (``--no-drift-room``) and once with drift room, side by side on the same records.

Usage: ``python bench/gates.py record --out fixtures/runs/tiny-cpu`` (about 4 min on 2 cores);
``python bench/gates.py false-alarm`` (about 2 min); ``python bench/gates.py travel`` (about 25 min
with the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import resource
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from _publish import add_publish_flag, publish  # noqa: E402  (bench/ is on sys.path)

sys.path.insert(0, str(ROOT))

from harness.common.stats import percentile  # noqa: E402  (after the path is set)
from harness.gates.baseline import Baseline, Gate  # noqa: E402
from harness.gates.judge import judge  # noqa: E402
from harness.gates.noise import rerun_verdicts  # noqa: E402
from harness.gates.runs import ResultSet, RunFrame, load_result_set  # noqa: E402
from harness.gates.update import baseline_from_results  # noqa: E402

SIGMA = 0.5
TPOT_MEDIAN = 4.0
TTFT_MEDIAN = 60.0
Z95 = 1.6448536269514722
SYNTH: dict[str, float] = {"client_lateness_ms": 0.02}
"""``client_lateness_ms``: mean of the synthetic runs' exponential send lateness, all of it the
client's own (no queue wait): a quiet client (docs/benchmarks.md, open loop on 2 cores: p50
0.001–0.08 ms). Client-timed latency intervals are widened by its quantile (docs/gates.md);
``--client-lateness-ms`` measures a noisier client."""


# ------------------------------------------------------------------------------------ synthetic


def synthetic(rng: np.random.Generator, n: int, shift: float = 1.0) -> ResultSet:
    """A run of ``n`` requests: lognormal TTFT/TPOT (σ = 0.5), 0.5 % errors, 60 % response-cache hits."""
    tpot = TPOT_MEDIAN * shift * rng.lognormal(0.0, SIGMA, n)
    ttft = TTFT_MEDIAN * shift * rng.lognormal(0.0, SIGMA, n)
    e2e = ttft + 20 * tpot
    ok = rng.random(n) >= 0.005
    cache = np.where(rng.random(n) < 0.6, "HIT-L1", "MISS").tolist()
    frame = RunFrame.from_columns(
        n,
        floats={
            "tpot_ms": tpot,
            "ttft_ms": ttft,
            "e2e_ms": e2e,
            "lateness_ms": rng.exponential(SYNTH["client_lateness_ms"], n),
        },
        text={"cache": cache},
        ok=ok,
    )
    return ResultSet(label="run", path=Path("synthetic"), summary=None, frame=frame)


def true_p95(median: float) -> float:
    return median * math.exp(SIGMA * Z95)


SYNTH_GATES = ("tpot_p95", "ttft_p95", "ttft_p99", "e2e_p95", "error_rate", "hit_rate_any", "lateness_p99")


def _count(reports: list[Any]) -> dict[str, float]:
    c: Counter[str] = Counter(r.verdict for r in reports)
    n = len(reports)
    return {k: c[k] / n for k in ("pass", "fail", "unjudgeable")}


def fixed_baseline(rng: np.random.Generator, n: int, reps: int) -> dict[str, float]:
    """Threshold = the true P95 of TPOT and TTFT, +10 %: how often is an unchanged rerun not passed?"""
    b = Baseline(
        schema_version=1,
        gates=[
            Gate(metric="tpot_p95", threshold=true_p95(TPOT_MEDIAN), rel_tolerance=0.1),
            Gate(metric="ttft_p95", threshold=true_p95(TTFT_MEDIAN), rel_tolerance=0.1),
        ],
    )
    return _count([judge(b, [synthetic(rng, n)]) for _ in range(reps)])


def updated_baselines(
    rng: np.random.Generator, n: int, baselines: int, reps: int
) -> tuple[dict[str, float], int, float]:
    """``baseline update --headroom 10%`` from one run, judged on ``reps`` fresh reruns; repeated.

    Returns the verdict rates, the number of gates per baseline and the mean relative tolerance the
    TPOT P95 gate got (the price of the run's noise).
    """
    reports = []
    gates = 0
    tolerances = []
    for _ in range(baselines):
        b, _, _ = baseline_from_results([synthetic(rng, n)], headroom=0.1)
        b = b.model_copy(update={"gates": [g for g in b.gates if g.metric in SYNTH_GATES]})
        gates = len(b.gates)
        tpot = next(g for g in b.gates if g.metric == "tpot_p95")
        tolerances.append(tpot.tolerance / tpot.threshold)
        reports += [judge(b, [synthetic(rng, n)]) for _ in range(reps)]
    return _count(reports), gates, float(np.mean(tolerances))


def at_the_limit(rng: np.random.Generator, n: int, reps: int) -> tuple[float, float, float]:
    """True TPOT P95 exactly at the limit: fail rate of the interval rule, of the point estimate, and
    the interval rule's inconclusive rate."""
    limit = true_p95(TPOT_MEDIAN)
    b = Baseline(schema_version=1, gates=[Gate(metric="tpot_p95", threshold=limit)])
    interval_fail = point_fail = inconclusive = 0
    for _ in range(reps):
        rs = synthetic(rng, n)
        g = judge(b, [rs]).gates[0]
        interval_fail += g.verdict == "fail"
        inconclusive += g.verdict == "inconclusive"
        point_fail += percentile(rs.frame.col("tpot_ms"), 95) > limit
    return interval_fail / reps, point_fail / reps, inconclusive / reps


def power(rng: np.random.Generator, n: int, shift: float, reps: int) -> dict[str, float]:
    """A baseline at the true value +10 %; the system regressed by ``shift``: how often is it caught?"""
    b = Baseline(
        schema_version=1, gates=[Gate(metric="tpot_p95", threshold=true_p95(TPOT_MEDIAN), rel_tolerance=0.1)]
    )
    return _count([judge(b, [synthetic(rng, n, shift)]) for _ in range(reps)])


# ------------------------------------------------------------------------------------- recorded


def _recorded_sets(dirs: dict[str, Path]) -> list[ResultSet]:
    """The recorded runs, their client-bound flag set aside: the recording machine was shared (the gate
    rightly refuses to judge them), and here only their latencies' noise is measured."""
    return [replace(load_result_set(p, label), problems=()) for label, p in dirs.items()]


def recorded(dirs: dict[str, Path], reps: int) -> tuple[dict[str, float], dict[str, Counter[str]], int]:
    sets = _recorded_sets(dirs)
    b, _, _ = baseline_from_results(sets, headroom=0.1)
    est = rerun_verdicts(b, sets, reps=reps, seed=11)
    rates = {k: est.rate(k) for k in ("pass", "fail", "unjudgeable")}
    return rates, est.per_gate, len(b.gates)


def split_half(dirs: dict[str, Path]) -> tuple[str, int, list[str]]:
    """Baseline from the first half of each phase (in send order), judged on the second half."""
    first, second = [], []
    for rs in _recorded_sets(dirs):
        order = np.argsort(rs.frame.col("sent_s"), kind="stable")
        half = rs.frame.n // 2
        first.append(replace(rs, frame=rs.frame.take(order[:half])))
        second.append(replace(rs, frame=rs.frame.take(order[half:])))
    b, _, _ = baseline_from_results(first, headroom=0.1)
    report = judge(b, second)
    not_passed = [f"{g.id}@{g.label}: {g.verdict}" for g in report.gates if g.verdict != "pass"]
    return report.verdict, len(report.gates), not_passed


def false_alarm(args: argparse.Namespace) -> None:
    SYNTH["client_lateness_ms"] = args.client_lateness_ms
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    reps = args.reps
    sizes = (300, 1000, 3000)
    rows: list[tuple[str, ...]] = []
    for n in sizes:
        r = fixed_baseline(rng, n, reps)
        rows.append(
            (
                f"synthetic, n={n}",
                "true P95 of TPOT and TTFT, +10 %",
                "10 %",
                f"{reps}",
                f"{r['fail']:.2%}",
                f"{r['unjudgeable']:.2%}",
            )
        )
    per = reps // args.baselines
    for n in sizes:
        r, gates, tol = updated_baselines(rng, n, args.baselines, per)
        rows.append(
            (
                f"synthetic, n={n}",
                f"`baseline update --headroom 10%` of one run ({gates} gates)",
                f"{tol:.0%}",
                f"{args.baselines}×{per}",
                f"{r['fail']:.2%}",
                f"{r['unjudgeable']:.2%}",
            )
        )
    limit_rows = [(n, *at_the_limit(rng, n, reps)) for n in sizes]
    power_rows = []
    for n in sizes:
        for shift in (1.2, 1.3):
            p = power(rng, n, shift, reps)
            power_rows.append((n, shift, p["fail"], p["unjudgeable"]))
    real = ROOT / "fixtures" / "runs" / "tiny-cpu"
    real_rows: list[tuple[str, ...]] = []
    if (real / "cold" / "records.jsonl").exists():
        dirs = {"cold": real / "cold", "warm": real / "warm"}
        rates, per_gate, gates = recorded(dirs, reps)
        worst = sorted(per_gate.items(), key=lambda kv: -(kv[1]["inconclusive"] + kv[1]["fail"]))[:3]
        detail = ", ".join(f"{k} {(c['inconclusive'] + c['fail']) / reps:.1%}" for k, c in worst)
        real_rows.append(
            (
                f"tiny-cpu cold + warm, bootstrap ({gates} gates)",
                f"{reps}",
                f"{rates['fail']:.2%}",
                f"{rates['unjudgeable']:.2%}",
                detail,
            )
        )
        verdict, n_gates, not_passed = split_half(dirs)
        real_rows.append(
            (
                f"tiny-cpu, first half → second half ({n_gates} gates)",
                "1",
                "—",
                verdict,
                "; ".join(not_passed) or "all passed",
            )
        )
    took = time.perf_counter() - t0

    def table(head: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
        return [
            "| " + " | ".join(head) + " |",
            "|" + " --- |" * len(head),
            *("| " + " | ".join(r) + " |" for r in body),
        ]

    lines = [
        f"## gates — {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"`python bench/gates.py false-alarm` on {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()} ({took:.0f} s). The decision rule of docs/gates.md (95 % intervals) "
        f"through `harness.gates.judge`; synthetic runs draw TTFT and TPOT from lognormals (σ = {SIGMA}), "
        "0.5 % errors, 60 % cache hits, the client's own send lateness exponential with mean "
        f"{SYNTH['client_lateness_ms']:g} ms; every rerun comes from the unchanged system unless a "
        "shift is given.",
        "",
        *table(("runs", "baseline", "TPOT tolerance", "reruns", "fail (false alarm)", "cannot judge"), rows),
        "",
        *table(
            (
                "true TPOT P95 exactly at the limit",
                "fail: interval rule",
                "fail: point estimate",
                "inconclusive",
            ),
            [(f"n={n}", f"{a:.2%}", f"{b:.2%}", f"{c:.2%}") for n, a, b, c in limit_rows],
        ),
        "",
        *table(
            ("regressed system, baseline = true P95 +10 %", "caught (fail)", "cannot judge"),
            [(f"n={n}, TPOT ×{sh:g}", f"{f:.2%}", f"{u:.2%}") for n, sh, f, u in power_rows],
        ),
    ]
    if real_rows:
        lines += [
            "",
            *table(("recorded run", "reruns", "fail (false alarm)", "cannot judge", "detail"), real_rows),
        ]
    text = "\n".join(lines) + "\n"
    publish(text, args)


# -------------------------------------------------------------------------------------- record


async def _stream(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat completion: arrival time of every content chunk, usage, x-cache."""
    import orjson

    from harness.common.headers import CACHE_STATUS

    t0 = time.perf_counter()
    arrivals: list[float] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        cache = r.headers.get(CACHE_STATUS)
        if r.status_code != 200:
            await r.aread()
            return {"status": r.status_code, "error": r.text[:200], "t0": t0, "cache": cache}
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = orjson.loads(line[5:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    arrivals.append(time.perf_counter())
    return {
        "status": 200,
        "t0": t0,
        "arrivals": arrivals,
        "usage": usage,
        "cache": cache,
        "end": time.perf_counter(),
    }


async def _phase(
    base_url: str, model: str, prompts: list[tuple[str, str]], stage: str, rate: float
) -> list[Any]:
    """Send every prompt at a constant rate (open loop: a slow response never delays the next send)."""
    import httpx

    from harness.load.results import RequestRecord

    system = (
        "You are the travel and payments assistant of a booking site. Answer in one short sentence, "
        "quote prices in the customer's currency, and never invent a booking reference."
    )
    records: list[RequestRecord] = []
    async with httpx.AsyncClient(
        base_url=base_url, timeout=120, limits=httpx.Limits(max_connections=256)
    ) as client:
        epoch = time.perf_counter()

        async def one(i: int, domain: str, text: str) -> None:
            intended = i / rate
            delay = epoch + intended - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {
                "model": model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
                "max_tokens": 16,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            res = await _stream(client, body)
            sent = res["t0"] - epoch
            late = max(0.0, (sent - intended) * 1000)
            rec: dict[str, Any] = {
                "id": f"p{i:04d}",
                "scenario": domain,
                "stage": stage,
                "intended_s": round(intended, 6),
                "sent_s": round(sent, 6),
                "lateness_ms": round(late, 4),
                "status": res["status"],
                "cache": res.get("cache"),
                "error": res.get("error"),
            }
            arr = res.get("arrivals") or []
            if arr:
                ttft = (arr[0] - res["t0"]) * 1000
                e2e = (res["end"] - res["t0"]) * 1000
                usage = res.get("usage") or {}
                extra = usage.get("harness") or {}
                rec.update(
                    ttft_ms=round(ttft, 4),
                    ttft_from_intended_ms=round(ttft + late, 4),
                    itl_ms=[round((b - a) * 1000, 4) for a, b in itertools.pairwise(arr)],
                    tpot_ms=round((arr[-1] - arr[0]) * 1000 / (len(arr) - 1), 4) if len(arr) > 1 else None,
                    e2e_ms=round(e2e, 4),
                    e2e_from_intended_ms=round(e2e + late, 4),
                    prompt_tokens=usage.get("prompt_tokens"),
                    completion_tokens=usage.get("completion_tokens", len(arr)),
                    cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                    prefill_kv_bytes=extra.get("prefill_kv_bytes"),
                    prefill_peak_bytes=extra.get("prefill_peak_bytes"),
                    peak_measured=extra.get("peak_measured"),
                    prefill_kv_measured=extra.get("prefill_kv_measured"),
                )
            records.append(RequestRecord.parse(rec))

        await asyncio.gather(*(one(i, d, t) for i, (d, t) in enumerate(prompts)))
    return sorted(records, key=lambda r: r.intended_s)


def record(args: argparse.Namespace) -> None:
    import orjson

    from harness.common.io import write_json, write_jsonl
    from harness.load.results import TargetInfo, summarize
    from harness.server.launch import running_server

    log = [
        orjson.loads(line)
        for line in (ROOT / "fixtures/corpus/fewshot_log.jsonl").read_bytes().splitlines()
        if line.strip()
    ]
    texts = [(row["domain"], row["text"]) for row in log]
    prompts = []
    for i in range(args.requests):
        domain, text = texts[i % len(texts)]
        # Every prompt of the cold pass is new (a repeat would be a response-cache hit already).
        prompts.append((domain, text if i < len(texts) else f"{text} (request {i})"))
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="bench-gates-") as tmp:
        env = {"HARNESS__RUN_DIR": str(Path(tmp) / "state")}
        with running_server(["--preset", "tiny", "--cache"], log_dir=Path(tmp), env=env) as server:
            for stage in ("cold", "warm"):
                started = datetime.now(UTC).isoformat(timespec="seconds")
                cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                records = asyncio.run(_phase(server.url, server.model, prompts, stage, args.rate))
                cpu1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
                cpu_pct = 100 * ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) / wall
                summary = summarize(
                    records,
                    started_at=started,
                    duration_s=round(wall, 3),
                    target=TargetInfo(url=server.url, model=server.model),
                    target_rate=args.rate,
                    client_cpu_pct=round(cpu_pct, 1),
                )
                d = out / stage
                write_jsonl(d / "records.jsonl", [r.to_dict() for r in records])
                write_json(d / "summary.json", summary.model_dump(mode="json"))
                ttft = summary.metrics["ttft_ms"]
                print(
                    f"{stage}: {summary.requests} requests, {summary.errors} errors, TTFT p50 {ttft.p50} "
                    f"p95 {ttft.p95} ms, hit rate {summary.hit_rate.get('any')}, "
                    f"client-bound {summary.client_bound}"
                )


# ------------------------------------------------------------------------------------ travel


def _busy_loops(n: int) -> list[Any]:
    """``n`` processes spinning a core each (a noisy neighbour), at the caller's priority."""
    import subprocess

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _verdict(path: Path) -> str:
    import json

    return str(json.loads(path.read_text())["verdict"]) if path.exists() else "broken"


def travel(args: argparse.Namespace) -> None:
    """Real paired runs gated on calibrated baselines, per simulated machine (see the module doc)."""
    import shutil

    from rich.console import Console

    from harness.common.fingerprint import describe
    from harness.demo import (
        VERDICT_CODES,
        Calibrate,
        Capacity,
        Corpus,
        DemoConfig,
        DemoContext,
        Scenarios,
        demo_target,
        harness,
    )

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    base = DemoContext(DemoConfig(out_dir=out), console)
    Scenarios().run(base)
    Corpus().run(base)
    machines = [int(m) for m in args.machines.split(",")]
    slowdowns = [float(f) for f in args.slowdowns.split(",")] if args.slowdowns else []
    table: dict[str, Counter[str]] = {}
    capacity: dict[str, float] = {}
    started = time.perf_counter()
    first: DemoContext | None = None
    for loops in machines:
        mdir = out / f"machine-{loops}"
        shutil.rmtree(mdir, ignore_errors=True)
        shutil.copytree(out / "corpus", mdir / "corpus")
        ctx = DemoContext(DemoConfig(out_dir=mdir), console)
        hogs = _busy_loops(loops)
        name = f"{loops} busy loop(s)"
        try:
            with demo_target(ctx):
                Capacity().run(ctx)
                Calibrate().run(ctx)
                capacity[name] = ctx.capacity_rps or math.nan
                assert ctx.url is not None
                for i in range(args.unchanged):
                    run = mdir / f"unchanged-{i}"
                    harness(ctx, "run", "--url", ctx.url, *ctx.recipe(), "--gate", str(ctx.baseline),
                            "--out", str(run), "--force", ok=VERDICT_CODES)  # fmt: skip
                    table.setdefault(f"unchanged, calibrated on the same machine ({name})", Counter())[
                        _verdict(run / "gate.json")
                    ] += 1
                    if first is not None:  # the first machine's baseline, carried here
                        verdict = run / "gate-carried.json"
                        harness(ctx, "gate", "--baseline", str(first.baseline), f"cold={run / 'cold'}",
                                f"warm={run / 'warm'}", "--json-out", str(verdict),
                                ok=VERDICT_CODES)  # fmt: skip
                        table.setdefault(
                            f"unchanged ({name}), baseline from {machines[0]} loop(s)", Counter()
                        )[_verdict(verdict)] += 1
            if first is None:
                first = ctx
                for f in slowdowns:
                    for j in range(args.regressed):
                        run = mdir / f"slow-{f:g}x-{j}"
                        serve = shlex.join([*ctx.config.serve_args, "--inject-slowdown", f"{f:g}"])
                        harness(ctx, "run", "--serve-args", serve, *ctx.recipe(), "--gate", str(ctx.baseline),
                                "--out", str(run), "--force", ok=VERDICT_CODES)  # fmt: skip
                        table.setdefault(f"{f:g}x slower engine ({name})", Counter())[
                            _verdict(run / "gate.json")
                        ] += 1
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    minutes = (time.perf_counter() - started) / 60
    lines = [
        f"## Gates across machines: real paired runs ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"`python bench/gates.py travel --machines {args.machines} --unchanged {args.unchanged} "
        f"--slowdowns {args.slowdowns} --regressed {args.regressed}` on {describe()} "
        f"({platform.python_version()}), {minutes:.0f} min. The demo's recipe (harness.demo): "
        "capacity measured on each machine, paired runs at 70 % of it, 40 requests a phase, baseline "
        "from `harness baseline calibrate --runs 3` on that machine. A machine is this one with N busy "
        "loops beside every run. Capacity: "
        + ", ".join(f"{k} {v:.2f} req/s" for k, v in capacity.items())
        + ".",
        "",
        "| case | runs | pass | fail | cannot be judged |",
        "|---|---|---|---|---|",
    ]
    for case, c in table.items():
        n = sum(c.values())
        lines.append(f"| {case} | {n} | {c['pass']} | {c['fail']} | {c['unjudgeable'] + c['broken']} |")
    publish("\n".join(lines), args)


def _judge(ctx: Any, baseline: Path, run: Path, name: str) -> dict[str, Any]:
    """``harness gate`` of a paired run's phases against ``baseline``; the verdict file as a dict."""
    import json

    from harness.demo import VERDICT_CODES, harness

    out = run / f"gate-{name}.json"
    junit = run / f"gate-{name}.junit.xml"
    harness(ctx, "gate", "--baseline", str(baseline), f"cold={run / 'cold'}", f"warm={run / 'warm'}",
            "--json-out", str(out), "--junit", str(junit), ok=VERDICT_CODES)  # fmt: skip
    return dict(json.loads(out.read_text())) if out.exists() else {"verdict": "broken", "gates": []}


def _caught_by(report: dict[str, Any]) -> list[str]:
    return sorted(
        {f"{g['id']}@{g.get('label') or '—'}" for g in report.get("gates", []) if g["verdict"] == "fail"}
    )


def _rate_text(k: int, n: int) -> str:
    from harness.gates.metrics import rate_interval

    if n == 0:
        return "—"
    lo, hi = rate_interval(k, n, 0.95)
    return f"{k}/{n} = {k / n:.0%} [{lo:.0%}, {hi:.0%}]"


def power_bench(args: argparse.Namespace) -> None:
    """Real gated runs: false alarms and detection per mode (see the module doc)."""
    import json
    import shutil

    import yaml
    from rich.console import Console

    from harness.common.fingerprint import describe
    from harness.demo import (
        VERDICT_CODES,
        Calibrate,
        Capacity,
        Corpus,
        DemoConfig,
        DemoContext,
        Scenarios,
        demo_target,
        harness,
    )

    out = Path(args.out).resolve()
    # --resume: an earlier attempt's corpus, capacity, calibrated baseline and finished history runs
    # are kept (they take half an hour); everything judged is measured again.
    resume = (
        args.resume and (out / "baseline.yaml").is_file() and (out / "capacity" / "capacity.json").is_file()
    )
    if not resume:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    # The CI recipe's policy (5 % errors must be caught at power 0.95: 181 requests a phase), not the
    # demo's 20 % (sized for its 40 requests).
    config = DemoConfig(out_dir=out, corpus_n=args.requests, requests=args.requests, detect_errors="5%")
    ctx = DemoContext(config, console)
    started = time.perf_counter()
    if not resume:
        Scenarios().run(ctx)
        Corpus().run(ctx)
    modes = set(args.modes.split(","))
    conditions: list[tuple[str, tuple[str, ...]]] = [("unchanged", ())]
    conditions += [
        (f"{f:g}x slower engine", ("--inject-slowdown", f"{f:g}")) for f in _floats(args.slowdowns)
    ]
    conditions += [(f"{p:.0%} errors", ("--inject-error-rate", f"{p:g}")) for p in _floats(args.error_rates)]
    conditions += [
        (f"{p:.0%} warm cache misses", ("--inject-cache-miss-rate", f"{p:g}"))
        for p in _floats(args.miss_rates)
    ]
    # (mode, condition) → verdict counts, and which gates caught it.
    table: dict[tuple[str, str], Counter[str]] = {}
    caught: dict[tuple[str, str], Counter[str]] = {}
    seconds: dict[str, list[float]] = {}

    def note(mode: str, cond: str, report: dict[str, Any]) -> None:
        verdict = str(report.get("verdict") or report.get("judgement", {}).get("verdict", "broken"))
        table.setdefault((mode, cond), Counter())[verdict] += 1
        if verdict == "fail":
            caught.setdefault((mode, cond), Counter()).update(_caught_by(report))

    stored = ctx.baseline  # the stored baseline: calibrated here, as a CI user's would be
    history_base = out / "history-baseline.yaml"
    with demo_target(ctx):
        assert ctx.url is not None
        if resume:
            from harness.demo import demo_capacity
            from harness.experiments.capacity_result import read_capacity

            ctx.capacity_rps, _ = demo_capacity(read_capacity(out / "capacity" / "capacity.json"))
        else:
            Capacity().run(ctx)
        recipe = ctx.recipe()
        if not resume:
            Calibrate().run(ctx)
        history = out / "history"
        for i in range(args.history):
            if resume and (history / f"run-{i:02d}" / "comparison.json").is_file():
                continue  # an earlier attempt's finished run: history is history
            t0 = time.perf_counter()
            harness(ctx, "run", "--url", ctx.url, *recipe, "--out", str(history / f"run-{i:02d}"), "--force",
                    ok=VERDICT_CODES)  # fmt: skip
            seconds.setdefault("paired run", []).append(time.perf_counter() - t0)
        if "history" in modes:
            harness(ctx, "baseline", "calibrate", "--from-runs", str(history),
                    "--max-runs", str(args.history), "--out", str(history_base), "--name", "history",
                    "--detect-errors", config.detect_errors, *recipe, ok=VERDICT_CODES)  # fmt: skip
        for i in range(args.unchanged):
            run = out / "unchanged" / f"run-{i:02d}"
            t0 = time.perf_counter()
            harness(ctx, "run", "--url", ctx.url, *recipe, "--out", str(run), "--force", ok=VERDICT_CODES)
            seconds.setdefault("paired run", []).append(time.perf_counter() - t0)
            if "stored" in modes:
                note("stored", "unchanged", _judge(ctx, stored, run, "stored"))
            if "history" in modes:
                note("history", "unchanged", _judge(ctx, history_base, run, "history"))
        if "ab" in modes:
            for i in range(args.unchanged):
                ab = out / "ab-unchanged" / f"run-{i:02d}"
                t0 = time.perf_counter()
                harness(ctx, "ab", "--base-url", ctx.url, "--candidate-serve-args",
                        shlex.join(config.serve_args), *recipe, "--blocks", str(args.ab_blocks),
                        "--block-requests", str(args.ab_block_requests), "--out", str(ab), "--force",
                        ok=VERDICT_CODES)  # fmt: skip
                seconds.setdefault("A/B run", []).append(time.perf_counter() - t0)
                note("ab", "unchanged", json.loads((ab / "ab.json").read_text()))
            for cond, inject in conditions:
                if not inject or inject[0] != "--inject-slowdown":
                    continue
                for i in range(args.repeats):
                    ab = out / "ab" / cond.replace(" ", "-") / f"run-{i:02d}"
                    serve = shlex.join([*config.serve_args, *inject])
                    harness(ctx, "ab", "--base-url", ctx.url, "--candidate-serve-args", serve, *recipe,
                            "--blocks", str(args.ab_blocks), "--block-requests", str(args.ab_block_requests),
                            "--out", str(ab), "--force", ok=VERDICT_CODES)  # fmt: skip
                    note("ab", cond, json.loads((ab / "ab.json").read_text()))
    for cond, inject in conditions:
        if not inject:
            continue
        for i in range(args.repeats):
            run = out / "regressed" / cond.replace(" ", "-") / f"run-{i:02d}"
            serve = shlex.join([*config.serve_args, *inject])
            harness(
                ctx, "run", "--serve-args", serve, *recipe, "--out", str(run), "--force", ok=VERDICT_CODES
            )
            if "stored" in modes:
                note("stored", cond, _judge(ctx, stored, run, "stored"))
            if "history" in modes:
                note("history", cond, _judge(ctx, history_base, run, "history"))
    minutes = (time.perf_counter() - started) / 60
    recipe_doc = yaml.safe_load((out / "recipe.yaml").read_text())
    mean = {k: sum(v) / len(v) for k, v in seconds.items() if v}
    lines = [
        f"## Gate power, measured: real gated runs ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"`python bench/gates.py power --requests {args.requests} --unchanged {args.unchanged} --history "
        f"{args.history} --repeats {args.repeats} --slowdowns {args.slowdowns} --error-rates "
        f"{args.error_rates} --miss-rates {args.miss_rates} --modes {args.modes}` on {describe()} (Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f} at the end), "
        f"{minutes:.0f} min. "
        f"Recipe: {args.requests} requests a phase at {recipe_doc['load']['rate']} of the capacity "
        f"({ctx.capacity_rps:.3g} req/s), max_tokens {config.max_tokens_cap}; a paired run took "
        f"{mean.get('paired run', math.nan):.0f} s, an A/B run ({args.ab_blocks} block pairs of "
        f"{args.ab_block_requests}) {mean.get('A/B run', math.nan):.0f} s. Stored: `harness baseline "
        f"calibrate --runs 3 --max-runs 5`; history: `--from-runs` over {args.history} earlier unchanged "
        f"runs; both with the default policy (at most 1 % errors, catch {config.detect_errors}; hit rates "
        "5 points down at most, catch a 30 % loss; catch a 2x slowdown; power 0.95). A/B: "
        "`harness ab` beside the unchanged target (limit 1.10×, must rule out 1.3×). Error and miss rates "
        "are not the A/B's to judge (it compares latencies).",
        "",
        "| mode | condition | runs | fail (caught / false alarm) | pass | cannot be judged | caught by |",
        "|---|---|---|---|---|---|---|",
    ]
    for (mode, cond), c in table.items():
        n = sum(c.values())
        by = ", ".join(f"{g} ×{k}" for g, k in caught.get((mode, cond), Counter()).most_common(3))
        lines.append(
            f"| {mode} | {cond} | {n} | {_rate_text(c['fail'], n)} | {c['pass']} | "
            f"{c['unjudgeable'] + c['broken']} | {by or '—'} |"
        )
    publish("\n".join(lines), args)


def rejudge(args: argparse.Namespace) -> None:
    """Every run a power bench kept, judged again by the current rules, side by side: the stored and the
    history baselines recalibrated from the bench's own runs (``--from-runs``: no target, no load),
    once with the runs' spread alone (``--no-drift-room``) and once with drift room. The A/B verdicts
    are the bench's own (no baseline in them)."""
    import json

    from rich.console import Console

    from harness.demo import VERDICT_CODES, DemoConfig, DemoContext, harness
    from harness.gates.ab import DEFAULT_METRICS, judge_ab, parse_ab_metrics, reachable
    from harness.gates.runs import load_result_set

    out = Path(args.out).resolve()
    if not (out / "recipe.yaml").is_file():
        raise SystemExit(f"{out}: no power bench here (run `python bench/gates.py power` first)")
    ctx = DemoContext(DemoConfig(out_dir=out), Console())
    recipe = ("--recipe", str(out / "recipe.yaml"))
    runs = sorted((out / "unchanged").glob("run-*")) + sorted((out / "regressed").glob("*/run-*"))
    table: dict[tuple[str, str, str], Counter[str]] = {}
    caught: dict[tuple[str, str, str], Counter[str]] = {}
    for rule, flags in (("spread only", ("--no-drift-room",)), ("drift room", ())):
        where = out / "rejudge" / rule.replace(" ", "-")
        where.mkdir(parents=True, exist_ok=True)
        bases = {}
        for mode, past in (("stored", out / "calibration"), ("history", out / "history")):
            base = where / f"{mode}.yaml"
            most = len([d for d in past.iterdir() if d.is_dir()])
            harness(ctx, "baseline", "calibrate", "--from-runs", str(past), "--max-runs", str(most),
                    "--out", str(base), "--name", mode, "--detect-errors", "5%", *recipe, *flags,
                    ok=VERDICT_CODES)  # fmt: skip
            bases[mode] = base
        for run in runs:
            cond = "unchanged" if run.parent.name == "unchanged" else run.parent.name.replace("-", " ")
            for mode, base in bases.items():
                report = _judge(ctx, base, run, f"{mode}-{rule.replace(' ', '-')}")
                verdict = str(report.get("verdict", "broken"))
                table.setdefault((rule, mode, cond), Counter())[verdict] += 1
                if verdict == "fail":
                    caught.setdefault((rule, mode, cond), Counter()).update(_caught_by(report))
    for ab in sorted((out / "ab-unchanged").glob("run-*")) + sorted((out / "ab").glob("*/run-*")):
        cond = "unchanged" if ab.parent.name == "ab-unchanged" else ab.parent.name.replace("-", " ")
        judgement = json.loads((ab / "ab.json").read_text()).get("judgement") or {}
        table.setdefault(("as run", "ab", cond), Counter())[str(judgement.get("verdict", "unjudgeable"))] += 1
        # … and as `harness ab` judges now: a default metric the design cannot reach left out.
        pairs = [
            (load_result_set(b, b.name), load_result_set(ab / "candidate" / b.name, b.name))
            for b in sorted((ab / "base").iterdir())
            if b.is_dir()
        ]
        metrics, left_out = reachable(parse_ab_metrics(DEFAULT_METRICS), sum(p[0].frame.n for p in pairs))
        now = judge_ab(pairs, metrics=metrics, left_out=left_out)
        rule = "design's metrics"
        table.setdefault((rule, "ab", cond), Counter())[now.verdict] += 1
        if now.verdict == "fail":
            caught.setdefault((rule, "ab", cond), Counter()).update(
                m.metric for m in now.metrics if m.verdict == "fail"
            )
    lines = [
        "## Gate power, judged again: spread-only limits vs drift room "
        f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"`python bench/gates.py rejudge --out {out.name}`: the runs `bench/gates.py power` kept (above), "
        "the stored baseline recalibrated from its calibration runs and the history baseline from its "
        "history runs (`harness baseline calibrate --from-runs`), once with `--no-drift-room` and once "
        "with drift room (docs/gates.md, *Drift room*); every gated run judged by both. The A/B runs as "
        "they were judged, and as `harness ab` judges now (a default metric the design cannot reach "
        "left out). No run was made again: the same records, two rules.",
        "",
        "| rule | mode | condition | runs | fail (caught / false alarm) | pass | cannot be judged "
        "| caught by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (rule, mode, cond), c in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        n = sum(c.values())
        by = ", ".join(f"{g} ×{k}" for g, k in caught.get((rule, mode, cond), Counter()).most_common(3))
        lines.append(
            f"| {rule} | {mode} | {cond} | {n} | {_rate_text(c['fail'], n)} | {c['pass']} | "
            f"{c['unjudgeable'] + c['broken'] + c['inconclusive']} | {by or '—'} |"
        )
    publish("\n".join(lines), args)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


# ---- job: the documented CI job, run again and again with faults in the candidate -------------------

JOB_RECIPE = ROOT / "fixtures" / "recipes" / "ci.yaml"
JOB_CONDITIONS: dict[str, tuple[str, ...]] = {
    "unchanged": (),
    "slower_1.1x": ("--inject-slowdown", "1.1"),
    "slower_1.2x": ("--inject-slowdown", "1.2"),
    "slower_1.5x": ("--inject-slowdown", "1.5"),
    "errors_5pct": ("--inject-error-rate", "0.05"),
    "warm_miss_30pct": ("--inject-cache-miss-rate", "0.3"),
    "kv_bytes_20pct": ("--inject-kv-overalloc", "0.2"),
}
"""Each condition's candidate: ``harness serve --preset tiny --cache`` with these faults injected."""


def job_bench(args: argparse.Namespace) -> None:
    """Run the documented CI job (docs/ci.md: the corpus step, then ``harness ab --recipe
    fixtures/recipes/ci.yaml``) ``--repeats`` times per condition, the candidate with each fault
    injected, conditions interleaved round-robin (so drift over the bench hits every condition alike);
    tabulate the verdicts with exact 95 % intervals and append the table to docs/benchmarks.md."""
    from harness.demo import corpus_build_args
    from harness.gates.metrics import rate_interval

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    harness = [sys.executable, "-m", "harness"]
    if not (out / "corpus" / "corpus.jsonl").exists():
        trace = ROOT / "fixtures" / "traces" / "genaiTestTrace.json"
        cold = out / "coldpaths.jsonl"
        for cmd in (
            ["traces", "coldpaths", str(trace), "--hops", "all", "--protocol", "any", "--cache-scope", "hop",
             "-o", str(cold)],
            ["traces", "scenarios", str(cold), "--k", "12", "-o", str(out / "scenarios.json")],
            corpus_build_args(out, 240),
        ):  # fmt: skip
            subprocess_run([*harness, *cmd])
    names = [c for c in args.conditions.split(",") if c]
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    for rep, name in itertools.product(range(args.repeats), names):
        run_dir = out / name / f"{rep + 1:02d}"
        serve = shlex.join(["--preset", "tiny", "--cache", *JOB_CONDITIONS[name]])
        started = time.monotonic()
        code = subprocess_run(
            [*harness, "ab", "--recipe", str(JOB_RECIPE), "--corpus", str(out / "corpus"),
             "--candidate-serve-args", serve, "-o", str(run_dir), "--force"],
            check=False,
        )  # fmt: skip
        seconds = time.monotonic() - started
        doc = json.loads((run_dir / "ab.json").read_text()) if (run_dir / "ab.json").exists() else {}
        j = doc.get("judgement") or {}
        failed = [m["metric"] for m in j.get("metrics", []) if m["verdict"] == "fail"]
        if (j.get("error_rate") or {}).get("verdict") == "fail":
            failed.append("error_rate")
        gate = doc.get("gate") or {}
        if gate.get("verdict") == "fail":
            failed.append("gate:" + ",".join(
                g["id"] for g in json.loads(Path(gate["file"]).read_text())["gates"] if g["verdict"] == "fail"
            ))  # fmt: skip
        rows[name].append(
            {"code": code, "seconds": seconds, "failed": failed, "looks": len(doc.get("looks", []))}
        )
        print(
            f"{name} #{rep + 1}: exit {code} in {seconds:.0f} s; failed: {', '.join(failed) or '—'}",
            flush=True,
        )
    lines = [
        f"## The CI job, measured — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"`python bench/gates.py job --repeats {args.repeats} --conditions {args.conditions}`: the job as "
        "docs/ci.md writes it (`harness ab --recipe fixtures/recipes/ci.yaml`, the base the unchanged tiny "
        f"preset), the candidate with each fault injected; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs. Exit 1 = fail, 0 = pass, 6 = cannot be judged; the fail rate with its exact "
        "(Clopper–Pearson) 95 % interval.",
        "",
        "| candidate | runs | fail (1) | pass (0) | cannot be judged (6) | other | fail rate [95 %] | "
        "median s | what failed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in names:
        r = rows[name]
        codes = Counter(x["code"] for x in r)
        other = sum(v for k, v in codes.items() if k not in (0, 1, 6))
        lo, hi = rate_interval(codes[1], len(r), 0.95)
        what = Counter(f for x in r for f in x["failed"])
        med = percentile([x["seconds"] for x in r], 50)
        lines.append(
            f"| {name} | {len(r)} | {codes[1]} | {codes[0]} | {codes[6]} | {other} | "
            f"{codes[1] / len(r):.0%} [{lo:.0%}, {hi:.0%}] | {med:.0f} | "
            + (", ".join(f"{k} ×{v}" for k, v in what.most_common(4)) or "—")
            + " |"
        )
    publish("\n".join(lines), args)


def subprocess_run(cmd: list[str], *, check: bool = True) -> int:
    import subprocess

    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} exited {proc.returncode}")
    return proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record a real paired run against the tiny CPU target")
    rec.add_argument("--out", required=True)
    rec.add_argument("--requests", type=int, default=400)
    rec.add_argument("--rate", type=float, default=5.0, help="arrivals per second")
    fa = sub.add_parser("false-alarm", help="measure the decision rule's false-alarm and inconclusive rates")
    fa.add_argument("--reps", type=int, default=1000)
    fa.add_argument("--baselines", type=int, default=20)
    fa.add_argument("--seed", type=int, default=2026)
    fa.add_argument(
        "--client-lateness-ms",
        type=float,
        default=SYNTH["client_lateness_ms"],
        help="mean of the synthetic runs' exponential client lateness (widens their latency intervals)",
    )
    add_publish_flag(fa)
    tr = sub.add_parser("travel", help="real paired runs gated on calibrated baselines, across machines")
    tr.add_argument("--out", default=str(ROOT / ".harness" / "bench-travel"))
    tr.add_argument("--machines", default="0,1", help="busy loops beside the runs, one 'machine' each")
    tr.add_argument("--unchanged", type=int, default=10, help="gated unchanged runs per machine")
    tr.add_argument("--slowdowns", default="1.3,1.5,2", help="injected engine slowdowns (first machine)")
    tr.add_argument("--regressed", type=int, default=3, help="gated runs per slowdown")
    add_publish_flag(tr)
    pw = sub.add_parser("power", help="real gated runs: false alarms and detection per mode")
    pw.add_argument("--out", default=str(ROOT / ".harness" / "bench-power"))
    pw.add_argument("--requests", type=int, default=200, help="requests a phase (and prompts in the corpus)")
    pw.add_argument("--unchanged", type=int, default=20, help="gated unchanged runs per mode")
    pw.add_argument(
        "--history", type=int, default=8, help="earlier unchanged runs the history baseline is made of"
    )
    pw.add_argument("--repeats", type=int, default=10, help="gated runs per regression")
    pw.add_argument("--slowdowns", default="1.2,1.3,1.5,2")
    pw.add_argument("--error-rates", default="0.01,0.05,0.2")
    pw.add_argument("--miss-rates", default="0.1,0.3,0.5")
    pw.add_argument("--modes", default="stored,history,ab")
    pw.add_argument("--ab-blocks", type=int, default=4)
    pw.add_argument("--ab-block-requests", type=int, default=25)
    pw.add_argument(
        "--resume",
        action="store_true",
        help="keep an earlier attempt's corpus, capacity, baseline and finished history runs",
    )
    add_publish_flag(pw)
    rj = sub.add_parser(
        "rejudge", help="a power bench's kept runs judged again: spread-only limits vs drift room"
    )
    rj.add_argument("--out", default=str(ROOT / ".harness" / "bench-power"))
    add_publish_flag(rj)
    jb = sub.add_parser("job", help="the documented CI job, run again and again with faults in the candidate")
    jb.add_argument("--out", default=str(ROOT / ".harness" / "bench-job"))
    jb.add_argument("--repeats", type=int, default=20, help="runs of the job per condition")
    jb.add_argument("--conditions", default=",".join(JOB_CONDITIONS), help=f"of {', '.join(JOB_CONDITIONS)}")
    add_publish_flag(jb)
    args = ap.parse_args()
    commands: dict[str, Callable[[argparse.Namespace], None]] = {
        "job": job_bench,
        "record": record,
        "false-alarm": false_alarm,
        "travel": travel,
        "power": power_bench,
        "rejudge": rejudge,
    }
    commands[args.cmd](args)


if __name__ == "__main__":
    main()
