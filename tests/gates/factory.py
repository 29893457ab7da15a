"""Result sets for the gate and report tests, generated with the load stage's own models.

Records are drawn from seeded distributions (lognormal latencies, a cache-tier mix, prompt lengths)
and written exactly as the load stage writes a run: ``records.jsonl`` with one
:class:`~harness.load.results.RequestRecord` per line and ``summary.json`` from
:func:`~harness.load.run_summary.summarize`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.io import write_json, write_jsonl
from harness.load.results import RequestRecord
from harness.load.run_summary import StageOutcome, TargetInfo, summarize

KV_BYTES_PER_TOKEN = 2 * 2 * 4 * 64 * 2  # 2 layers × (K, V) × 4 heads × 64 dims × fp16


@dataclass
class Shape:
    """The distribution a synthetic run draws from (medians in ms, lognormal sigma)."""

    ttft_ms: float = 50.0
    tpot_ms: float = 4.0
    sigma: float = 0.35
    rate: float = 20.0
    error_rate: float = 0.0
    hit_l1: float = 0.3
    hit_l2: float = 0.1
    hit_l3: float = 0.05
    prefix_hit: float = 0.5
    lateness_ms: float = 0.02
    """Mean of the exponential send lateness (no queue wait recorded: all of it the client's own): a
    quiet client (docs/benchmarks.md: p50 0.001–0.08 ms, p99 about 0.2 ms)."""
    peak_measured: bool | None = True
    scenarios: tuple[str, ...] = ("chat", "search")
    stages: tuple[str, ...] = ("replay",)


def make_records(n: int, seed: int = 0, shape: Shape | None = None, **overrides: Any) -> list[RequestRecord]:
    s = shape or Shape()
    for k, v in overrides.items():
        setattr(s, k, v)
    rng = np.random.default_rng(seed)
    out: list[RequestRecord] = []
    per_stage = max(1, n // len(s.stages))
    for i in range(n):
        intended = i / s.rate
        late = float(rng.exponential(s.lateness_ms))
        ttft = float(s.ttft_ms * rng.lognormal(0.0, s.sigma))
        completion = int(rng.integers(8, 33))
        tpot = float(s.tpot_ms * rng.lognormal(0.0, s.sigma / 3))
        itl = [round(tpot, 4)] * (completion - 1)
        prompt = int(rng.integers(40, 400))
        u = rng.random()
        cache = (
            "HIT-L1"
            if u < s.hit_l1
            else "HIT-L2"
            if u < s.hit_l1 + s.hit_l2
            else "HIT-L3"
            if u < s.hit_l1 + s.hit_l2 + s.hit_l3
            else "MISS"
        )
        failed = rng.random() < s.error_rate
        hit = cache.startswith("HIT")
        cached = int(prompt * 0.5) if (not hit and rng.random() < s.prefix_hit) else 0
        kv = 0 if hit else (prompt - cached) * KV_BYTES_PER_TOKEN
        rec: dict[str, Any] = {
            "id": f"r{i}",
            "scenario": s.scenarios[i % len(s.scenarios)],
            "stage": s.stages[min(i // per_stage, len(s.stages) - 1)],
            "intended_s": intended,
            "sent_s": intended + late / 1000,
            "lateness_ms": late,
            "status": 500 if failed else 200,
            "error": "HTTP 500" if failed else None,
            "cache": None if failed else cache,
        }
        if not failed:
            e2e = ttft + tpot * (completion - 1)
            rec.update(
                ttft_ms=ttft,
                ttft_from_intended_ms=ttft + late,
                itl_ms=itl,
                tpot_ms=tpot,
                e2e_ms=e2e,
                e2e_from_intended_ms=e2e + late,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
                prefill_kv_bytes=kv,
                prefill_peak_bytes=0 if hit else kv + 3 * prompt * 512,
                peak_measured=False if hit else s.peak_measured,
            )
        out.append(RequestRecord.parse(rec))
    return out


def write_run(
    run_dir: Path,
    records: list[RequestRecord],
    *,
    summary: bool = True,
    stages: list[StageOutcome] | None = None,
    target: TargetInfo | None = None,
    **summary_kw: Any,
) -> Path:
    """Write ``records.jsonl`` and (unless ``summary=False``) ``summary.json`` like the load stage."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(
        run_dir / "records.jsonl", [{k: v for k, v in r.to_dict().items() if v is not None} for r in records]
    )
    if summary:
        duration = max((r.sent_s for r in records), default=0.0)
        s = summarize(
            records,
            started_at="2026-12-01T00:00:00+00:00",
            duration_s=duration,
            target=target or TargetInfo(url="http://127.0.0.1:8000", model="tiny"),
            stages=stages,
            **summary_kw,
        )
        write_json(run_dir / "summary.json", s.model_dump(mode="json"))
    return run_dir


def make_run(run_dir: Path, n: int = 600, seed: int = 0, **kw: Any) -> Path:
    keys = ("interrupted", "client_cpu_pct", "workers", "environment", "recipe", "target", "interference")
    summary_kw = {k: kw.pop(k) for k in keys if k in kw}
    return write_run(run_dir, make_records(n, seed, **kw), **summary_kw)


ROOT = Path(__file__).resolve().parents[2]


def harness_cli(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Run the real ``harness`` console script (the venv's entry point) on this checkout."""
    script = Path(sys.executable).parent / "harness"
    cmd = [str(script), *args] if script.exists() else [sys.executable, "-m", "harness.cli", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=timeout)
