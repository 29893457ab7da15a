"""Readers stream: the Python heap peak while reading a generated ~50 MB file stays far below its size."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterable
from pathlib import Path

import pytest

from harness.traces import read_requests, read_traces

TARGET = 50 * 1024 * 1024


def _jaeger_trace(i: int, n_spans: int = 20) -> bytes:
    tid = f"{i:032x}"
    spans = []
    for j in range(n_spans):
        refs = [] if j == 0 else [{"refType": "CHILD_OF", "traceID": tid, "spanID": f"{i:08x}{j - 1:08x}"}]
        spans.append({
            "traceID": tid, "spanID": f"{i:08x}{j:08x}", "operationName": f"GET /api/{j}", "references": refs,
            "startTime": 1_700_000_000_000_000 + i * 1000 + j, "duration": 1000 - j, "processID": f"p{j % 3}",
            "tags": [{"key": "span.kind", "type": "string", "value": "server"},
                     {"key": "http.response.status_code", "type": "int64", "value": 200}],
            "logs": [],
        })
    procs = {f"p{k}": {"serviceName": f"svc-{k}", "tags": []} for k in range(3)}
    return json.dumps({"traceID": tid, "spans": spans, "processes": procs}).encode()


def _write(path: Path, head: bytes, items: Iterable[bytes], sep: bytes, tail: bytes) -> int:
    n = 0
    with path.open("wb") as fh:
        fh.write(head)
        size = len(head)
        for item in items:
            if size >= TARGET:
                break
            if n:
                fh.write(sep)
            fh.write(item)
            size += len(item) + len(sep)
            n += 1
        fh.write(tail)
    return n


def _peak(it: Iterable[object]) -> tuple[int, int]:
    tracemalloc.start()
    try:
        count = sum(1 for _ in it)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return count, peak


@pytest.mark.slow
def test_jaeger_envelope_streams(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    n = _write(path, b'{"data": [\n', (_jaeger_trace(i) for i in range(10**7)), b",\n", b'\n], "total": 0}')
    size = path.stat().st_size
    count, peak = _peak(read_traces(path))
    assert count == n
    assert peak < size / 20, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB file"


@pytest.mark.slow
def test_mooncake_jsonl_streams(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    row = '{"timestamp": %d, "input_length": 6955, "output_length": 52, "hash_ids": [%s]}'
    ids = ", ".join(str(k) for k in range(40))
    n = _write(path, b"", ((row % (i, ids)).encode() for i in range(10**8)), b"\n", b"\n")
    size = path.stat().st_size
    count, peak = _peak(read_requests(path))
    assert count == n
    assert peak < size / 20, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB file"
