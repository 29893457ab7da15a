"""Corpus benchmarks, each measured against its reference in the same run; appends to docs/benchmarks.md.

1. Dedup of 100 k unit vectors at cosine 0.82: the ``faiss`` path (IVF partition from FAISS
   spherical k-means, BLAS scoring per list, exact re-check) against plain blockwise numpy
   (``exact``). Goal: ≤ 0.4 × the numpy time with every pair ≥ 0.82 still found (verified by
   comparing pair sets). Vectors are embedding-like — 2 000 topic directions with spread, plus
   planted near-duplicates — and a second, isotropic random set shows the worst case for IVF.
2. End-to-end prompts/s of ``build_corpus`` (generate, embed, dedup, render, fit, quality, write)
   against the raw encoder's sentences/s on the same texts. Goal: ≥ 0.9.

Usage: ``python bench/corpus.py [--n-vectors 100000] [--n-prompts 400]`` (about 4–5 min on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def embedding_like(
    n: int, d: int = 384, topics: int = 2000, dup_share: float = 0.03, seed: int = 0
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((topics, d)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    x = (
        centers[rng.integers(0, topics, n)]
        + rng.standard_normal((n, d)).astype(np.float32) * (1.0 / np.sqrt(d)) * 1.2
    )
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return plant(x, int(n * dup_share), rng)


def isotropic(n: int, d: int = 384, dup_share: float = 0.03, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return plant(x, int(n * dup_share), rng)


def plant(x: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    n, d = x.shape
    src = rng.integers(0, n, m)
    dst = rng.choice(n, m, replace=False)
    for s, t in zip(src, dst, strict=True):
        if s == t:
            continue
        c = rng.uniform(0.80, 0.99)
        z = rng.standard_normal(d).astype(np.float32)
        z -= (z @ x[s]) * x[s]
        z /= np.linalg.norm(z)
        x[t] = c * x[s] + np.sqrt(1 - c * c) * z
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


def bench_dedup(x: np.ndarray, label: str) -> dict[str, object]:
    from harness.corpus.dedup import greedy_keep, pairs_exact, pairs_faiss

    t = time.perf_counter()
    fp = pairs_faiss(x, 0.82)
    fk, _ = greedy_keep(len(x), fp)
    t_faiss = time.perf_counter() - t
    t = time.perf_counter()
    ep = pairs_exact(x, 0.82)
    ek, _ = greedy_keep(len(x), ep)
    t_exact = time.perf_counter() - t
    truth = set(zip(ep[0].tolist(), ep[1].tolist(), strict=True))
    found = set(zip(fp[0].tolist(), fp[1].tolist(), strict=True))
    row = {
        "data": label,
        "n": len(x),
        "exact_s": t_exact,
        "faiss_s": t_faiss,
        "ratio": t_faiss / t_exact,
        "pairs": len(truth),
        "missed": len(truth - found),
        "false": len(found - truth),
        "same_keep": bool(np.array_equal(ek, fk)),
    }
    print(
        f"dedup {label} n={len(x)}: numpy {t_exact:.1f} s, faiss {t_faiss:.1f} s, ratio {row['ratio']:.3f}; "
        f"pairs {len(truth)}, missed {row['missed']}, same kept set {row['same_keep']}",
        flush=True,
    )
    return row


def bench_e2e(n: int) -> dict[str, object]:
    from harness.common.embeddings import Embedder
    from harness.corpus.build import BuildInputs, build_corpus, dedup_text
    from harness.corpus.inputs import InputSampler
    from harness.corpus.settings import CorpusSettings

    settings = CorpusSettings(seed=0, embed_cache=False)
    template = ROOT / "templates" / "prompts" / "four_section.j2"
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up: load the model and tokenizer once so neither side pays for it.
        build_corpus(BuildInputs(template=template, out=Path(tmp) / "w", n=4), settings)
        t = time.perf_counter()
        res = build_corpus(BuildInputs(template=template, out=Path(tmp) / "c", n=n), settings)
        t_e2e = time.perf_counter() - t
    sampler = InputSampler(0)
    texts = [dedup_text(sampler.variables(i)[0]) for i in range(n)]
    raw = Embedder(device="auto")
    raw.encode(texts[:8])
    t = time.perf_counter()
    raw.encode(texts)
    t_raw = time.perf_counter() - t
    pps = n / t_e2e
    sps = n / t_raw
    row = {
        "n": n,
        "candidates": res.candidates,
        "e2e_s": t_e2e,
        "prompts_per_s": pps,
        "encoder_sentences_per_s": sps,
        "ratio": pps / sps,
        "device": raw.device,
    }
    print(
        f"e2e n={n}: {pps:.1f} prompts/s ({res.candidates} candidates embedded) "
        f"vs encoder {sps:.1f} sentences/s "
        f"→ ratio {row['ratio']:.3f}",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-vectors", type=int, default=100_000)
    ap.add_argument("--n-isotropic", type=int, default=20_000)
    ap.add_argument("--n-prompts", type=int, default=400)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("HARNESS__RUN_DIR", tempfile.mkdtemp(prefix="bench-corpus-"))
    started = time.perf_counter()
    rows = [bench_dedup(embedding_like(args.n_vectors), "embedding-like")]
    rows.append(bench_dedup(isotropic(args.n_isotropic), "isotropic"))
    e2e = bench_e2e(args.n_prompts)
    total = time.perf_counter() - started
    lines = [
        f"\n## corpus — {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}\n",
        f"`python bench/corpus.py` on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"encoder on {e2e['device']}; "
        f"whole run {total:.0f} s.\n",
        "| dedup data | n | numpy blockwise s | faiss s | ratio (goal ≤ 0.4) | pairs ≥ 0.82 | missed "
        "| same kept set |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['data']} | {r['n']} | {r['exact_s']:.1f} | {r['faiss_s']:.1f} | {r['ratio']:.3f} | "
            f"{r['pairs']} | {r['missed']} | {r['same_keep']} |"
        )
    lines += [
        "",
        "| end-to-end | prompts | candidates | prompts/s | encoder sentences/s | ratio (goal ≥ 0.9) |",
        "|---|---|---|---|---|---|",
        f"| build_corpus | {e2e['n']} | {e2e['candidates']} | {e2e['prompts_per_s']:.1f} | "
        f"{e2e['encoder_sentences_per_s']:.1f} | {e2e['ratio']:.3f} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_append:
        with (ROOT / "docs" / "benchmarks.md").open("a", encoding="utf-8") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
