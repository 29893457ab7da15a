"""Readers stream: reading a generated ~50 MB file grows the process's peak RSS far less than the file size.

Measured in a fresh subprocess: resident set size (``/proc/self/statm``) after imports vs its maximum
sampled while iterating the whole file (``ru_maxrss`` is useless here: imports set a higher mark). A reader
that loaded the file (or kept its traces) would grow by several times the file size, since the Python
objects for 50 MB of JSON take far more than 50 MB. (tracemalloc would do too, but slows reading ~5×.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

TARGET = 50 * 1024 * 1024


def jaeger_trace(i: int, n_spans: int = 20) -> bytes:
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
    procs = {f"p{k}": {"serviceName": f"svc-{k}", "tags": []} for k in range(3)}
    return json.dumps({"traceID": tid, "spans": spans, "processes": procs}).encode()


def write_file(
    path: Path, head: bytes, items: Iterable[bytes], sep: bytes, tail: bytes, *, target: int = TARGET
) -> int:
    """Write head, items joined by sep, then tail, stopping near ``target`` bytes; returns the item count."""
    n = 0
    with path.open("wb") as fh:
        fh.write(head)
        size = len(head)
        for item in items:
            if size >= target:
                break
            if n:
                fh.write(sep)
            fh.write(item)
            size += len(item) + len(sep)
            n += 1
        fh.write(tail)
    return n


PROBE = textwrap.dedent(
    """
    import os, sys
    import harness.traces as t

    fn = t.{func}  # harness.traces imports its readers on first use: before the baseline

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    base = peak = rss()
    kept, n = [], 0
    for item in {expr}:
        n += 1
        if {keep}:
            kept.append(item)
        if n % 50 == 0:
            peak = max(peak, rss())
    peak = max(peak, rss())
    print(n, peak - base)
    """
)


def rss_growth(func: str, path: Path) -> tuple[int, int]:
    """(items read, peak RSS growth in bytes) for ``harness.traces.<func>(path)`` in a fresh process."""
    code = PROBE.format(func=func, expr="fn(sys.argv[1])", keep="False")
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300, check=True
    )
    n, grown = out.stdout.split()
    return int(n), int(grown)


@pytest.mark.slow
def test_jaeger_envelope_streams(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    n = write_file(
        path, b'{"data": [\n', (jaeger_trace(i) for i in range(10**7)), b",\n", b'\n], "total": 0}'
    )
    count, grown = rss_growth("read_traces", path)
    size = path.stat().st_size
    assert count == n
    assert grown < size / 5, f"peak RSS grew {grown / 1e6:.1f} MB reading a {size / 1e6:.0f} MB file"


@pytest.mark.slow
def test_mooncake_jsonl_streams(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    row = '{"timestamp": %d, "input_length": 6955, "output_length": 52, "hash_ids": [%s]}'
    ids = ", ".join(str(k) for k in range(40))
    n = write_file(path, b"", ((row % (i, ids)).encode() for i in range(10**8)), b"\n", b"\n")
    count, grown = rss_growth("read_requests", path)
    size = path.stat().st_size
    assert count == n
    assert grown < size / 5, f"peak RSS grew {grown / 1e6:.1f} MB reading a {size / 1e6:.0f} MB file"


def test_rss_probe_detects_loading(tmp_path: Path) -> None:
    """The probe itself can fail: keeping every trace grows RSS by more than the file size."""
    path = tmp_path / "m.json"
    write_file(
        path, b'{"data": [', (jaeger_trace(i) for i in range(10**6)), b",", b"]}", target=4 * 1024 * 1024
    )
    code = PROBE.format(func="read_traces", expr="fn(sys.argv[1])", keep="True")
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120, check=True
    )
    grown = int(out.stdout.split()[1])
    assert grown > path.stat().st_size
