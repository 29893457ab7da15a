"""Benchmark of the trace readers: throughput against a plain-parser reference, and memory on a 1 GB file.

Measures, on generated files in a temporary folder (deleted afterwards):

* Jaeger JSON envelope: spans/s of ``read_traces`` vs ``orjson.loads`` of the whole file + span count;
* OTLP JSON Lines: spans/s of ``read_traces`` vs ``orjson.loads`` per line + span count;
* Mooncake JSONL: rows/s of ``read_requests`` vs ``orjson.loads`` per line;
* Azure CSV (the real file, repeated): rows/s of ``read_requests`` vs ``csv.reader``;
* a generated 1 GB Mooncake JSONL: peak RSS growth of ``read_requests`` (sampled in a child process)
  vs the file size, and the rows/s at that size.

The references only parse; the readers also validate, normalize and build the span tree, so the
ratio is the cost of that work. Results are printed and appended to docs/benchmarks.md.

Usage: ``python bench/traces.py [--mb 50] [--big-gb 1.0] [--no-append]``
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent

from _publish import add_publish_flag, publish  # noqa: E402  (bench/ is on sys.path)

sys.path.insert(0, str(ROOT))

from harness.traces import read_requests, read_traces  # noqa: E402

REALDATA = Path(os.environ.get("HARNESS_REALDATA", ROOT.parent / "shared" / "realdata"))


def jaeger_trace(i: int, n_spans: int = 20) -> dict[str, object]:
    tid = f"{i:032x}"
    spans = []
    for j in range(n_spans):
        refs = [] if j == 0 else [{"refType": "CHILD_OF", "traceID": tid, "spanID": f"{i:08x}{j - 1:08x}"}]
        spans.append(
            {
                "traceID": tid,
                "spanID": f"{i:08x}{j:08x}",
                "operationName": f"GET /api/{j}",
                "references": refs,
                "startTime": 1_700_000_000_000_000 + i * 1000 + j,
                "duration": 1000 - j,
                "processID": f"p{j % 3}",
                "tags": [
                    {"key": "span.kind", "type": "string", "value": "server"},
                    {"key": "http.response.status_code", "type": "int64", "value": 200},
                ],
                "logs": [],
            }
        )
    return {
        "traceID": tid,
        "spans": spans,
        "processes": {f"p{k}": {"serviceName": f"svc-{k}"} for k in range(3)},
    }


def otlp_line(i: int, n_spans: int = 20) -> dict[str, object]:
    tid = f"{i:032X}"
    spans = [
        {
            "traceId": tid,
            "spanId": f"{i:08X}{j:08X}",
            "parentSpanId": "" if j == 0 else f"{i:08X}{j - 1:08X}",
            "name": f"GET /api/{j}",
            "kind": 2,
            "startTimeUnixNano": str(1_700_000_000_000_000_000 + i * 10**6 + j),
            "endTimeUnixNano": str(1_700_000_000_000_000_000 + i * 10**6 + j + 10**6),
            "attributes": [{"key": "http.response.status_code", "value": {"intValue": "200"}}],
            "status": {},
        }
        for j in range(n_spans)
    ]
    res = {"attributes": [{"key": "service.name", "value": {"stringValue": f"svc-{i % 5}"}}]}
    return {"resourceSpans": [{"resource": res, "scopeSpans": [{"scope": {"name": "b"}, "spans": spans}]}]}


def mooncake_row(i: int) -> bytes:
    ids = ", ".join(str(i * 7 + k) for k in range(30))
    return (
        f'{{"timestamp": {i * 3}, "input_length": 15000, "output_length": 150, "hash_ids": [{ids}]}}'.encode()
    )


def write_until(
    path: Path, target: int, rows: object, *, head: bytes = b"", sep: bytes = b"\n", tail: bytes = b"\n"
) -> int:
    n = 0
    size = len(head)
    with path.open("wb") as fh:
        fh.write(head)
        for row in rows:  # type: ignore[attr-defined]
            if size >= target:
                break
            if n:
                fh.write(sep)
            fh.write(row)
            size += len(row) + len(sep)
            n += 1
        fh.write(tail)
    return n


def timed(fn: object) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = fn()  # type: ignore[operator]
    return int(n), time.perf_counter() - t0


PROBE = textwrap.dedent(
    """
    import os, sys, time
    import harness.traces as t

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    base = peak = rss()
    n = 0
    t0 = time.perf_counter()
    for _ in t.read_requests(sys.argv[1]):
        n += 1
        if n % 1000 == 0:
            peak = max(peak, rss())
    print(n, max(peak, rss()) - base, base, time.perf_counter() - t0)
    """
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="size of each throughput file (MB)")
    ap.add_argument("--big-gb", type=float, default=1.0, help="size of the memory-test file (GB)")
    add_publish_flag(ap)
    args = ap.parse_args()
    target = int(args.mb * 1e6)
    tmp = Path(tempfile.mkdtemp(prefix="bench-traces-", dir="/tmp"))
    rows: list[tuple[str, str, str, str, str]] = []
    started = time.perf_counter()
    try:
        # Jaeger envelope
        jp = tmp / "jaeger.json"
        write_until(
            jp,
            target,
            (orjson.dumps(jaeger_trace(i)) for i in range(10**9)),
            head=b'{"data": [',
            sep=b",",
            tail=b"]}",
        )
        n_ref, t_ref = timed(lambda: sum(len(t["spans"]) for t in orjson.loads(jp.read_bytes())["data"]))
        n_ours, t_ours = timed(lambda: sum(len(t.spans) for t in read_traces(jp)))
        assert n_ref == n_ours
        rows.append(
            (
                "Jaeger JSON envelope",
                f"{jp.stat().st_size / 1e6:.0f} MB",
                f"{n_ours / t_ours:,.0f} spans/s",
                f"{n_ref / t_ref:,.0f} spans/s (orjson, whole file)",
                f"{t_ours / t_ref:.1f}×",
            )
        )
        jp.unlink()

        # OTLP JSON Lines
        op = tmp / "otlp.jsonl"
        write_until(op, target, (orjson.dumps(otlp_line(i)) for i in range(10**9)))

        def otlp_ref() -> int:
            n = 0
            with op.open("rb") as fh:
                for line in fh:
                    doc = orjson.loads(line)
                    n += sum(len(ss["spans"]) for rs in doc["resourceSpans"] for ss in rs["scopeSpans"])
            return n

        n_ref, t_ref = timed(otlp_ref)
        n_ours, t_ours = timed(lambda: sum(len(t.spans) for t in read_traces(op)))
        assert n_ref == n_ours
        rows.append(
            (
                "OTLP JSON Lines",
                f"{op.stat().st_size / 1e6:.0f} MB",
                f"{n_ours / t_ours:,.0f} spans/s",
                f"{n_ref / t_ref:,.0f} spans/s (orjson per line)",
                f"{t_ours / t_ref:.1f}×",
            )
        )
        op.unlink()

        # Mooncake JSONL
        mp = tmp / "mooncake.jsonl"
        write_until(mp, target, (mooncake_row(i) for i in range(10**9)))

        def mooncake_ref() -> int:
            with mp.open("rb") as fh:
                return sum(1 for line in fh if orjson.loads(line)["input_length"] >= 0)

        n_ref, t_ref = timed(mooncake_ref)
        n_ours, t_ours = timed(lambda: sum(1 for _ in read_requests(mp)))
        assert n_ref == n_ours
        rows.append(
            (
                "Mooncake JSONL",
                f"{mp.stat().st_size / 1e6:.0f} MB",
                f"{n_ours / t_ours:,.0f} rows/s",
                f"{n_ref / t_ref:,.0f} rows/s (orjson per line)",
                f"{t_ours / t_ref:.1f}×",
            )
        )
        mp.unlink()

        # Azure CSV: the real 2023 code trace, data rows repeated
        az_src = REALDATA / "azure/AzureLLMInferenceTrace_code.csv"
        if az_src.is_file():
            lines = az_src.read_bytes().split(b"\r\n")
            header, body = lines[0], [ln for ln in lines[1:] if ln]
            ap_ = tmp / "azure.csv"
            write_until(
                ap_,
                target,
                (body[i % len(body)] for i in range(10**9)),
                head=header + b"\r\n",
                sep=b"\r\n",
                tail=b"",
            )

            # each copy's rows are later than the first row, so the reader's order check passes
            def azure_ref() -> int:
                with ap_.open(newline="") as fh:
                    r = csv.reader(fh)
                    next(r)
                    return sum(1 for row in r if int(row[1]) >= 0)

            n_ref, t_ref = timed(azure_ref)
            n_ours, t_ours = timed(lambda: sum(1 for _ in read_requests(ap_)))
            assert n_ref == n_ours
            rows.append(
                (
                    "Azure CSV (real rows, repeated)",
                    f"{ap_.stat().st_size / 1e6:.0f} MB",
                    f"{n_ours / t_ours:,.0f} rows/s",
                    f"{n_ref / t_ref:,.0f} rows/s (csv.reader)",
                    f"{t_ours / t_ref:.1f}×",
                )
            )
            ap_.unlink()

        # 1 GB memory test
        bp = tmp / "big.jsonl"
        write_until(bp, int(args.big_gb * 1e9), (mooncake_row(i) for i in range(10**10)))
        size = bp.stat().st_size
        out = subprocess.run(
            [sys.executable, "-c", PROBE, str(bp)], capture_output=True, text=True, check=True, cwd=ROOT
        )
        n, grown, base, secs = out.stdout.split()
        rows.append(
            (
                "Mooncake JSONL, peak memory",
                f"{size / 1e9:.2f} GB",
                f"RSS +{int(grown) / 1e6:.1f} MB over {int(base) / 1e6:.0f} MB after imports",
                f"file size {size / 1e6:,.0f} MB",
                f"{int(grown) / size:.4f}× file size; {int(n) / float(secs):,.0f} rows/s",
            )
        )
        bp.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.perf_counter() - started

    table = ["| input | size | ours | reference | ours ÷ reference |", "| --- | --- | --- | --- | --- |"]
    table += [f"| {' | '.join(r)} |" for r in rows]
    text = "\n".join(table)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"## traces — {stamp}\n\n"
        f"`python bench/traces.py --mb {args.mb:g} --big-gb {args.big_gb:g}` on "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()} (shared machine; {total:.0f} s total). "
        "Time ratio: reader time ÷ reference time (the reference only parses; the reader validates, "
        "normalizes IDs/tags and builds span trees).\n\n" + text + "\n"
    )
    publish(section, args)


if __name__ == "__main__":
    main()
