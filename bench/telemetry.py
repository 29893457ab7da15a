"""What one scrape of the target's ``/metrics`` costs the Locust process that paces the arrivals.

The load stage scrapes once a second inside the local / master Locust process
(:mod:`harness.load.telemetry`); whatever CPU a scrape takes there can delay an arrival. Side by
side in one run, on the exposition text of a real ``harness serve --preset tiny`` (served a few
requests, so its histograms have buckets):

- ours: :func:`harness.load.server_metrics.normalise` (only the wanted sample lines parsed);
- reference: ``prometheus_client``'s text parser over the whole text (what a straightforward
  scraper does), summing every sample by name.

Interleaved rounds, the median per-scrape time of each; the ratio reference ÷ ours.

Usage: ``python bench/telemetry.py [--rounds 5] [--reps 200] [--no-append]`` (about 30 s).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench._publish import add_publish_flag, publish
from harness.load.server_metrics import normalise
from harness.target.server.launch import running_server


def _full_parse(text: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    return sums


def _per_call_ms(fn: Callable[[str], object], text: str, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn(text)
    return (time.perf_counter() - t) / reps * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=200)
    add_publish_flag(ap)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    started = time.perf_counter()
    with running_server(["--preset", "tiny"], log_dir=Path("/tmp/bench-telemetry-server")) as server:
        for i in range(4):
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"q {i}"}], "max_tokens": 4}
            httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        text = httpx.get(server.url + "/metrics", timeout=30).text
    ours_runs, ref_runs = [], []
    for _ in range(args.rounds):
        ours_runs.append(_per_call_ms(lambda t: normalise(t, 0.0), text, args.reps))
        ref_runs.append(_per_call_ms(_full_parse, text, args.reps))
    ours, ref = statistics.median(ours_runs), statistics.median(ref_runs)
    load1 = os.getloadavg()[0]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = text.count("\n")
    ours_each = " / ".join(f"{x:.3f}" for x in ours_runs)
    ref_each = " / ".join(f"{x:.3f}" for x in ref_runs)
    section = "\n".join(
        [
            f"## telemetry — {stamp}",
            "",
            f"`python bench/telemetry.py` on {platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()} (shared machine, load average {load0:.1f} → {load1:.1f}; "
            f"{time.perf_counter() - started:.0f} s total). One scrape of `harness serve --preset tiny`'s "
            f"`/metrics` ({len(text):,} bytes, {lines} lines, mostly histogram buckets) parsed {args.reps} "
            f"times per round, {args.rounds} interleaved rounds, medians. This CPU is spent once per "
            "`--server-metrics-interval` in the Locust process that paces the arrivals.",
            "",
            "| measure | ours (`normalise`: wanted lines only) | reference (`prometheus_client` parser, "
            "whole text) | ratio |",
            "| --- | --- | --- | --- |",
            f"| ms per scrape (median of rounds) | {ours:.3f} | {ref:.3f} | {ref / ours:.1f}× less CPU |",
            f"| … each round: ours / reference | {ours_each} | {ref_each} | — |",
        ]
    )
    publish(section, args)


if __name__ == "__main__":
    main()
