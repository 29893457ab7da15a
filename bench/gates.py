"""Gate noise: how often does the decision rule fail or refuse (inconclusive) an unchanged system?

Three sub-commands:

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

``job``
    The CI job as docs/ci.md writes it (``harness ab --recipe fixtures/recipes/ci.yaml``), run
    ``--repeats`` times per condition, round-robin: the candidate unchanged, 1.1×, 1.2× and 1.5× slower,
    5 % errors, 30 % of warm hits lost, 20 % more KV blocks (``harness serve --inject-*``). Tabulates
    exit 1 / 0 / 6 per condition with exact intervals and what failed; appends to docs/benchmarks.md.

Usage: ``python bench/gates.py record --out fixtures/runs/tiny-cpu`` (about 4 min on 2 cores);
``python bench/gates.py false-alarm`` (about 2 min); ``python bench/gates.py job`` (about 7 min a run of
the job, 20 runs a condition by default).
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
    from harness.load.run_summary import TargetInfo, summarize
    from harness.target.server.launch import running_server

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


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


# ---- job: the documented CI job, run again and again with faults in the candidate -------------------

JOB_RECIPE = ROOT / "fixtures" / "recipes" / "ci.yaml"
JOB_CONDITIONS: dict[str, tuple[str, ...]] = {
    "unchanged": (),
    "slower_1.1x": ("--inject-slowdown", "1.1"),
    "slower_1.2x": ("--inject-slowdown", "1.2"),
    "slower_1.3x": ("--inject-slowdown", "1.3"),
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
    tabulate the verdicts with exact 95 % intervals and append the table to docs/benchmarks.md. A run
    an earlier attempt finished (``OUT/<condition>/NN/ab.json``) is counted, not run again."""
    from harness.demo import corpus_build_args
    from harness.gates.measurement import rate_interval

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    harness = [sys.executable, "-m", "harness.cli"]
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
        done = run_dir / "ab.json"
        if done.exists() and json.loads(done.read_text()).get("finished_at"):
            # An earlier attempt's finished run counts (a bench of 20 a condition outlasts a session).
            doc = json.loads(done.read_text())
            took = datetime.fromisoformat(doc["finished_at"]) - datetime.fromisoformat(doc["started_at"])
            code, seconds = int(doc.get("exit_code") or 0), took.total_seconds()
        else:
            serve = shlex.join(["--preset", "tiny", "--cache", *JOB_CONDITIONS[name]])
            started = time.monotonic()
            code = subprocess_run(
                [*harness, "ab", "--recipe", str(JOB_RECIPE), "--corpus", str(out / "corpus"),
                 "--candidate-serve-args", serve, *shlex.split(args.extra), "-o", str(run_dir), "--force"],
                check=False,
            )  # fmt: skip
            seconds = time.monotonic() - started
            doc = json.loads(done.read_text()) if done.exists() else {}
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
        f"`python bench/gates.py job --repeats {args.repeats} --conditions {args.conditions}"
        + (f" --extra {shlex.quote(args.extra)}" if args.extra else "")
        + "`: the job as "
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
    jb = sub.add_parser("job", help="the documented CI job, run again and again with faults in the candidate")
    jb.add_argument("--out", default=str(ROOT / ".harness" / "bench-job"))
    jb.add_argument("--repeats", type=int, default=20, help="runs of the job per condition")
    jb.add_argument("--conditions", default=",".join(JOB_CONDITIONS), help=f"of {', '.join(JOB_CONDITIONS)}")
    jb.add_argument("--extra", default="", help="flags added to every job's harness ab (e.g. --gate FILE)")
    add_publish_flag(jb)
    args = ap.parse_args()
    commands: dict[str, Callable[[argparse.Namespace], None]] = {
        "job": job_bench,
        "record": record,
        "false-alarm": false_alarm,
    }
    commands[args.cmd](args)


if __name__ == "__main__":
    main()
