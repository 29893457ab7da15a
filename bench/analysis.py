"""Benchmark of the warmup plan against the Belady ceiling, the cache simulators' speed, and index warmup.

On the Mooncake FAST'25 synthetic trace (``$HARNESS_REALDATA/mooncake/synthetic_trace.jsonl``,
KV blocks from ``hash_ids``) and any other request trace given with ``--trace``:

1. **Warmup plan, out of sample.** Rolling origins: the plan is built from the requests before
   50, 60, 70, 80 and 90 % of the trace (``recent`` predictor, τ = the window's span) and judged on
   the next 10 % of the requests, at capacities of 10 %, 25 %, 50 % and 100 % of each window's
   distinct keys, for KV blocks (``hash_ids``) and whole requests (entries). Hit counts are summed
   over the five windows. Side by side: Belady's ceiling (optimal preload + MIN: knows the window),
   the **history ceiling** (MIN from the best preload of keys the history has seen: the goal's
   denominator), plan + MIN (the plan's choice), plan + LRU (the server's eviction: the goal's
   numerator; goal ≥ 0.95 of the history ceiling), the plan protected until first hit
   (``lru-protect``: a tier honouring preload priorities), the history ceiling's own preload under
   LRU, and cold LRU. A second table measures what limits the rest (window references to keys the
   history never saw, one-off documents, the share of the preload the window uses, the share of
   the history ceiling's hits that need its preload and need it after a capacity of newcomers).
   A third table puts every online replacement policy of the simulators side by side (LRU,
   LRU-protect, LFU, S3-FIFO plain and seeded, W-TinyLFU) from the plan's preload, from the history
   ceiling's and cold; a fourth replays the same windows through the engine's own prefix cache
   (``BlockManager``) under ``lru`` and ``s3fifo``, warmed by the plan's covering prompts. The in-sample
   numbers (window = the first 10 %, ``replay`` plan from the whole trace) follow, labelled as the
   upper bound they are.
2. **Simulator throughput.** Requests/s of MIN, LRU and LFU over the whole trace at 10 000 blocks
   (median of 3), and MIN beside a direct O(n·capacity) MIN (scan the cache for the farthest next
   use on every eviction) on the whole trace at 1 000 blocks, same hits, for the speed ratio.
3. **Embedding-index warmup.** CLINC150's real requests (``$HARNESS_REALDATA/clinc150``) embedded
   with the shared MiniLM, FAISS Flat / IVF / HNSW at 1 000, 10 000 and 100 000 vectors (beyond the
   real ones: noisy copies): build, save, load (median of 3, and once in a fresh process with its
   RSS growth), reconstruction error against the originals (goal ≤ 1e-5), self-recall.

Results are printed and appended to docs/benchmarks.md.

Usage: ``python bench/analysis.py [--trace FILE …] [--index-sizes 1000,10000,100000] [--no-append]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from _publish import add_publish_flag, publish  # noqa: E402  (bench/ is on sys.path)

sys.path.insert(0, str(ROOT))

from harness.analysis.references import RefTrace, load_refs  # noqa: E402
from harness.analysis.sim import NEVER, SIMULATORS, history_preload, next_use, simulate  # noqa: E402
from harness.analysis.warmup import covering_requests, plan_warmup, rank_keys  # noqa: E402
from harness.common.stats import percentile  # noqa: E402
from harness.target.engine.kv_cache import BlockManager  # noqa: E402

REALDATA = Path(os.environ.get("HARNESS_REALDATA", ROOT.parent / "shared" / "realdata"))
FRACTIONS = (0.10, 0.25, 0.50, 1.00)
GOAL = 0.95


def naive_min_hits(keys: np.ndarray, capacity: int) -> int:
    """MIN the direct way: on each eviction, scan every cached key for the farthest next use."""
    nxt = next_use(keys).tolist()
    cache: dict[int, int] = {}
    hits = 0
    for i, k in enumerate(keys.tolist()):
        nu = nxt[i]
        if k in cache:
            hits += 1
            if nu == NEVER:
                del cache[k]
            else:
                cache[k] = nu
            continue
        if nu == NEVER:
            continue
        if len(cache) < capacity:
            cache[k] = nu
            continue
        victim = max(cache, key=cache.__getitem__)
        if cache[victim] > nu:
            del cache[victim]
            cache[k] = nu
    return hits


ORIGINS = (0.5, 0.6, 0.7, 0.8, 0.9)
WINDOW = 0.1
MEASURES = ("ceiling", "history_ceiling", "plan_min", "expected", "protected", "history_lru", "cold_lru")
ONLINE = tuple(p for p in SIMULATORS.names() if p != "min")
"""The online policies compared in the policy table (every simulator but MIN)."""
POLICY_KEYS = (
    *(f"plan+{p}" for p in ONLINE),
    *(f"history+{p}" for p in ONLINE),
    *(f"cold+{p}" for p in (*ONLINE, "min")),
)


def backtest(trace: RefTrace) -> dict[float, dict[str, float]]:
    """Hits summed over the rolling windows, per capacity fraction; plus the limits, ref-weighted."""
    n = trace.n_requests
    w = max(1, int(n * WINDOW))
    out: dict[float, dict[str, float]] = {f: dict.fromkeys((*MEASURES, "refs"), 0.0) for f in FRACTIONS}
    for f in FRACTIONS:
        for k in ("unseen", "one_off", "used", "overlap", "from_preload", "after_scan", *POLICY_KEYS):
            out[f][k] = 0.0
    for origin in ORIGINS:
        cut = int(n * origin)
        history, window = trace.window(0, cut), trace.window(cut, min(n, cut + w))
        for f in FRACTIONS:
            cap = max(1, int(window.distinct * f))
            rep, _, _ = plan_warmup(history, cap, window=window)
            refs = rep.window_refs
            row = out[f]
            row["refs"] += refs
            for key, rate in (
                ("ceiling", rep.ceiling),
                ("history_ceiling", rep.history_ceiling),
                ("plan_min", rep.plan_min_hit_rate),
                ("expected", rep.expected_hit_rate),
                ("protected", rep.protected_hit_rate),
                ("history_lru", rep.history_preload_hit_rate),
                ("cold_lru", rep.cold["lru"]),
                ("unseen", rep.limits.refs_unseen),
                ("one_off", rep.limits.refs_one_off),
                ("used", rep.limits.preload_used),
                ("overlap", rep.limits.preload_overlap),
                *((f"plan+{p}", rep.plan_by_policy[p]) for p in ONLINE),
                *((f"history+{p}", rep.history_by_policy[p]) for p in ONLINE),
                *((f"cold+{p}", rep.cold[p]) for p in (*ONLINE, "min")),
            ):
                row[key] += rate * refs
            # Shares of the ceiling's hits: weighted by those hits, not by references.
            ceiling_hits = rep.history_ceiling * refs
            row["from_preload"] += rep.limits.ceiling_from_preload * ceiling_hits
            row["after_scan"] += rep.limits.ceiling_after_scan * ceiling_hits
    for row in out.values():
        ceiling_hits = row["history_ceiling"]  # still a hit count here
        for key in row:
            if key in {"from_preload", "after_scan"}:
                row[key] /= ceiling_hits or 1.0
            elif key != "refs":
                row[key] /= row["refs"]
    return out


def plan_rows(
    name: str, trace: RefTrace
) -> tuple[list[list[str]], list[list[str]], list[list[str]], list[float]]:
    rows: list[list[str]] = []
    limit_rows: list[list[str]] = []
    policy_rows: list[list[str]] = []
    ratios: list[float] = []
    for f, r in backtest(trace).items():
        hc = r["history_ceiling"]
        ratio = r["expected"] / hc if hc else 1.0
        ratios.append(ratio)
        rows.append(
            [
                f"{name}, {trace.unit}",
                f"{f:.0%}",
                f"{r['ceiling']:.4f}",
                f"{hc:.4f}",
                f"{r['plan_min']:.4f}",
                f"{r['expected']:.4f}",
                f"{r['protected']:.4f}",
                f"{r['history_lru']:.4f}",
                f"{r['cold_lru']:.4f}",
                f"**{ratio:.3f}**" + (" ✓" if ratio >= GOAL else " ✗"),
                f"{r['protected'] / hc:.3f}" if hc else "—",
                f"{r['plan_min'] / hc:.3f}" if hc else "—",
            ]
        )
        limit_rows.append(
            [
                f"{name}, {trace.unit}",
                f"{f:.0%}",
                f"{r['unseen']:.3f}",
                f"{r['one_off']:.3f}",
                f"{r['used']:.3f}",
                f"{r['overlap']:.3f}",
                f"{r['history_lru'] / hc:.3f}" if hc else "—",
                f"{r['from_preload']:.3f}",
                f"{r['after_scan']:.3f}",
            ]
        )
        cold_min = r["cold+min"]
        policy_rows.append(
            [
                f"{name}, {trace.unit}",
                f"{f:.0%}",
                *(
                    f"{r[f'plan+{p}'] / hc:.3f} / {r[f'history+{p}'] / hc:.3f} / "
                    f"{r[f'cold+{p}'] / cold_min:.3f}"
                    if hc and cold_min
                    else "—"
                    for p in ONLINE
                ),
            ]
        )
    return rows, limit_rows, policy_rows, ratios


ENGINE_RUNS = (
    ("lru", 0, True),
    ("s3fifo", 1, True),
    ("s3fifo", 0, True),
    ("lru", 0, False),
    ("s3fifo", 0, False),
)
"""Engine replays: (eviction policy, warmup priority, warmed with the plan's prompts)."""


def prompts(trace: RefTrace) -> list[list[int]]:
    """Each request's KV-block key ids, in prompt order."""
    cuts = np.searchsorted(trace.req, np.arange(1, trace.n_requests))
    return [a.tolist() for a in np.split(trace.keys, cuts)]


def engine_replay(
    window: RefTrace, capacity: int, eviction: str, warm: list[list[int]], priority: int
) -> int:
    """Block hits of ``window`` replayed through the engine's own :class:`BlockManager`.

    A Mooncake hash id is a whole prefix block, so each becomes one KV block of two tokens (the id
    twice), and every prompt ends in one token no other prompt has: a partial block, never
    registered, so every real block can hit and nothing else is cached. The pool holds
    ``capacity`` blocks plus that partial one; one request at a time (allocate, write, free).
    ``warm``, the plan's covering prompts least valuable first, runs before with ``priority``.
    Unlike the simulators, a block hits only if its whole prefix does, as in the engine; prompts
    longer than the pool are cut to it.
    """
    bm = BlockManager(capacity + 1, 2, True, eviction)
    last = 0

    def one(seq_id: str, prompt: list[int], prio: int) -> int:
        nonlocal last
        last -= 1
        tokens = [t for k in prompt[:capacity] for t in (k, k)] + [last]
        cached = bm.allocate(seq_id, tokens, prio)
        bm.record_written(seq_id, tokens, len(tokens))
        bm.free(seq_id)
        return cached // 2

    for i, p in enumerate(warm):
        one(f"warm-{i}", p, priority)
    return sum(one(f"req-{i}", p, 0) for i, p in enumerate(prompts(window)))


def engine_rows(name: str, trace: RefTrace) -> list[list[str]]:
    """The backtest's windows replayed through the engine's prefix cache under each policy."""
    n = trace.n_requests
    w = max(1, int(n * WINDOW))
    rows: list[list[str]] = []
    for f in FRACTIONS:
        hits = dict.fromkeys(range(len(ENGINE_RUNS)), 0)
        ceiling = 0
        for origin in ORIGINS:
            cut = int(n * origin)
            past, window = trace.window(0, cut), trace.window(cut, min(n, cut + w))
            cap = max(1, int(window.distinct * f))
            tau = max(float(window.arrival_s[-1]), 1.0)  # plan_warmup's default out of sample
            chosen = rank_keys(past, "recent", tau)[:cap]
            history = prompts(past)
            warm = [history[r] for r in reversed(covering_requests(past, chosen.tolist()))]
            best = history_preload(window.keys, np.unique(past.keys), cap)
            ceiling += SIMULATORS.get("min")(window.keys, cap, best, False).hits
            for i, (policy, prio, warmed) in enumerate(ENGINE_RUNS):
                hits[i] += engine_replay(window, cap, policy, warm if warmed else [], prio)
        rows.append(
            [
                f"{name}, {trace.unit}",
                f"{f:.0%}",
                *(f"{hits[i] / ceiling:.3f}" for i in range(len(ENGINE_RUNS))),
            ]
        )
    return rows


def in_sample_rows(name: str, trace: RefTrace) -> list[list[str]]:
    window = trace.head(WINDOW)
    rows: list[list[str]] = []
    for f in FRACTIONS:
        cap = max(1, int(window.distinct * f))
        rep, _, _ = plan_warmup(trace, cap, window_fraction=WINDOW, in_sample=True, predictor="replay")
        rows.append(
            [
                f"{name}, {trace.unit}, in sample (upper bound)",
                f"{f:.0%}",
                f"{rep.expected_hit_rate:.4f}",
                f"{rep.ceiling:.4f}",
                f"{rep.ratio_belady:.3f}",
            ]
        )
    return rows


def speed_rows(name: str, trace: RefTrace) -> list[list[str]]:
    rows: list[list[str]] = []
    cap = 10_000 if trace.unit == "blocks" else 1_000
    for policy in ("min", "lru", "lfu", "s3fifo", "tinylfu"):
        runs = [simulate(trace, cap, policy) for _ in range(3)]
        rps = percentile([r.requests_per_s for r in runs], 50)
        secs = percentile([r.seconds for r in runs], 50)
        rows.append(
            [
                f"{name}: {policy.upper()}, {trace.n_requests:,} requests, {trace.n_refs:,} refs, "
                f"capacity {cap:,}",
                f"{rps:,.0f} req/s ({trace.n_refs / secs:,.0f} refs/s)",
                "—",
                "—",
            ]
        )
    cap = 1_000
    t0 = time.perf_counter()
    ours = simulate(trace, cap, "min")
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref_hits = naive_min_hits(trace.keys, cap)
    t_ref = time.perf_counter() - t0
    assert ref_hits == ours.hits, (ref_hits, ours.hits)
    rows.append(
        [
            f"{name}: MIN (heap + next-use array) vs direct O(n·capacity) MIN, whole trace, capacity {cap:,}",
            f"{t_ours * 1000:.1f} ms",
            f"{t_ref * 1000:.1f} ms (same {ref_hits:,} hits)",
            f"{t_ours / t_ref:.3f}×",
        ]
    )
    return rows


def index_rows(sizes: list[int], texts: int) -> tuple[list[list[str]], int]:
    import json
    import shutil
    import tempfile

    from harness.analysis.index_warmup import index_warmup
    from harness.common.embeddings import shared_embedder

    data = json.loads((REALDATA / "clinc150" / "data_full.json").read_text(encoding="utf-8"))
    queries = [q for split in ("train", "val", "test") for q, _ in data[split]][:texts]
    t0 = time.perf_counter()
    x = shared_embedder(device="cpu").encode(queries)
    embed_s = time.perf_counter() - t0
    tmp = Path(tempfile.mkdtemp(prefix="bench-index-"))
    rows: list[list[str]] = []
    try:
        for r in index_warmup(x, sizes, ["flat", "ivf", "hnsw"], tmp, repeats=3):
            err = "n/a" if r.reconstruct_max_err is None else f"{r.reconstruct_max_err:.1e}"
            rows.append(
                [
                    f"{r.kind}, {r.n:,} × {r.dim}"
                    + (f" ({r.synthetic:,} noisy copies)" if r.synthetic else ""),
                    f"{r.build_s:.2f} s",
                    f"{r.load_s * 1000:.1f} ms",
                    f"{r.fresh_load_s * 1000:.1f} ms",
                    f"{r.file_bytes / 2**20:.1f} MiB",
                    f"{r.rss_growth_bytes / 2**20:.1f} MiB",
                    err + (" ✓" if r.reconstruct_ok else " ✗"),
                    f"{r.self_recall:.3f}",
                ]
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows.append([f"(MiniLM embedding of {len(queries):,} CLINC150 requests: {embed_s:.1f} s)", *[""] * 7])
    return rows, len(queries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", default=[], help="another request trace with hash_ids")
    ap.add_argument("--index-sizes", default="1000,10000,100000", help="FAISS index sizes ('' to skip)")
    ap.add_argument("--index-texts", type=int, default=10_000, help="real CLINC150 requests to embed")
    add_publish_flag(ap)
    args = ap.parse_args()
    traces = [REALDATA / "mooncake" / "synthetic_trace.jsonl", *map(Path, args.trace)]
    started = time.perf_counter()
    plan_table: list[list[str]] = []
    limit_table: list[list[str]] = []
    policy_table: list[list[str]] = []
    engine_table: list[list[str]] = []
    upper_table: list[list[str]] = []
    speed_table: list[list[str]] = []
    ratios: dict[str, list[float]] = {}
    for path in traces:
        if not path.is_file():
            sys.exit(f"missing trace {path} (set HARNESS_REALDATA)")
        name = path.name
        blocks = load_refs(path, "blocks")
        entries = load_refs(path, "entries")
        for refs in (blocks, entries):
            rows, lrows, prows, r = plan_rows(name, refs)
            plan_table += rows
            limit_table += lrows
            policy_table += prows
            ratios.setdefault(refs.unit, []).extend(r)
            upper_table += in_sample_rows(name, refs)
        speed_table += speed_rows(name, blocks)
        engine_table += engine_rows(name, blocks)
    sizes = [int(v) for v in args.index_sizes.split(",") if v.strip()]
    t3 = ""
    if sizes:
        irows, _ = index_rows(sizes, args.index_texts)
        t3 = (
            "| index | build | load (median of 3) | load in a fresh process | file | RSS growth of that load "
            "| max reconstruct error (goal ≤ 1e-5) | self-recall |\n"
            + "| --- " * 8
            + "|\n"
            + "\n".join(f"| {' | '.join(r)} |" for r in irows)
        )
    total = time.perf_counter() - started
    head1 = (
        "| trace, unit | capacity (of window distinct) | Belady | history ceiling | plan + MIN | "
        "**plan + LRU** | plan protected, then LRU | best history preload + LRU | cold LRU | "
        "plan + LRU ÷ history ceiling (goal ≥ 0.95) | protected ÷ history ceiling | plan + MIN ÷ history "
        "ceiling |\n" + "| --- " * 12 + "|"
    )
    t1 = head1 + "\n" + "\n".join(f"| {' | '.join(r)} |" for r in plan_table)
    head_l = (
        "| trace, unit | capacity | window refs to keys the history never saw | of them one-off "
        "documents | plan's preload used in the window | history ceiling's preload the plan chose | "
        "best history preload + LRU ÷ history ceiling | history ceiling's hits that are first uses of "
        "its preload | of its hits, preload first uses after a capacity of newcomers (out of LRU's "
        "reach) |\n" + "| --- " * 9 + "|"
    )
    tl = head_l + "\n" + "\n".join(f"| {' | '.join(r)} |" for r in limit_table)
    head_p = (
        "| trace, unit | capacity | "
        + " | ".join(f"{p}: plan / history preload ÷ history ceiling; cold ÷ cold MIN" for p in ONLINE)
        + " |\n"
        + "| --- " * (2 + len(ONLINE))
        + "|"
    )
    tp = head_p + "\n" + "\n".join(f"| {' | '.join(r)} |" for r in policy_table)
    head_e = (
        "| trace, unit | capacity | plan's prompts + engine LRU | plan's prompts (priority 1) + engine "
        "S3-FIFO | plan's prompts + engine S3-FIFO, no priority | cold engine LRU | cold engine S3-FIFO |\n"
        + "| --- " * 7
        + "|"
    )
    te = head_e + "\n" + "\n".join(f"| {' | '.join(r)} |" for r in engine_table)
    head_u = "| trace, unit | capacity | replay plan + LRU | Belady | ÷ Belady |\n" + "| --- " * 5 + "|"
    tu = head_u + "\n" + "\n".join(f"| {' | '.join(r)} |" for r in upper_table)
    head2 = "| measure | ours | reference | ratio |\n| --- | --- | --- | --- |"
    t2 = head2 + "\n" + "\n".join(f"| {' | '.join(r)} |" for r in speed_table)
    summary = " ".join(
        f"Goal ({unit}, out of sample, plan + LRU ≥ 0.95 of the history ceiling) met at "
        f"{sum(x >= GOAL for x in rs)} of {len(rs)} capacities (lowest {min(rs):.3f})."
        for unit, rs in ratios.items()
    )
    load = os.getloadavg()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"## analysis — {stamp}\n\n"
        f"`python bench/analysis.py` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()} (shared machine, load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; {total:.0f} s total). Out of sample: plans from "
        "the requests before 50/60/70/80/90 % of the trace (`recent`), each judged on the next 10 %; "
        "hits summed over the five windows, per reference (KV block for `blocks`, request for "
        "`entries`).\n\n" + t1 + "\n\n" + summary + "\n\nWhat limits the rest (reference-weighted over the "
        "windows; the last two columns weighted by the ceiling's hits):\n\n" + tl + "\n\nOnline "
        "replacement policies side by side (each cell: from the plan's preload ÷ history ceiling / from "
        "the history ceiling's own preload ÷ history ceiling / cold start ÷ cold MIN):\n\n"
        + tp
        + "\n\nThe same windows through the engine's own prefix cache (`BlockManager`, one KV block per "
        "Mooncake block, a block hits only with its whole prefix; warmed by replaying the plan's covering "
        "prompts, least valuable first), ÷ the history ceiling:\n\n"
        + te
        + "\n\nIn sample (window = the first 10 %, plan from the whole trace, which "
        "contains the window: an upper bound, not a prediction):\n\n"
        + tu
        + "\n\n"
        + t2
        + "\n"
        + ("\n" + t3 + "\n" if t3 else "")
    )
    publish(section, args)


if __name__ == "__main__":
    main()
