"""Every request-trace format shares one arrival rule: offsets from the first row, rows in time order.

Each file is written here from offsets we choose (0, 2, -1, 3 seconds from the first row), so the
expected arrivals, the line of the out-of-order row and its field come from the test's own numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from harness.common.errors import InputError
from harness.traces import detect_format, read_requests
from harness.traces._base import SkipLog

OFFSETS = [0.0, 2.0, -1.0, 3.0]
"""Seconds from the first row; the third row (line/row 3) is out of order."""
BASE_S = 100.0


def _mooncake(tmp: Path) -> Path:
    p = tmp / "mc.jsonl"
    rows = [
        {"timestamp": (BASE_S + o) * 1000, "input_length": 10 + i, "output_length": 2, "hash_ids": [i]}
        for i, o in enumerate(OFFSETS)
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _coldpaths(tmp: Path) -> Path:
    p = tmp / "cp.jsonl"
    rows = [
        {
            "kind": "coldpath",
            "trace_id": f"{i:032x}",
            "entry_span_id": f"{i:016x}",
            "hop_span_id": f"{i + 100:016x}",
            "start_us": int((BASE_S + o) * 1e6),
            "latency_ms": 600.0,
            "service_path": ["gw", "svc"],
            "service": "svc",
            "operation": "GET /x",
            "protocol": "http",
            "input_tokens": 10 + i,
            "output_tokens": 2,
        }
        for i, o in enumerate(OFFSETS)
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _csv(path: Path, header: str, row: Callable[[int, float], str], newline: str = "\n") -> Path:
    """A CSV with one data row per offset: ``row(index, offset)``."""
    path.write_text(newline.join([header] + [row(i, o) for i, o in enumerate(OFFSETS)]) + newline)
    return path


def _azure(tmp: Path) -> Path:
    first = datetime(2023, 11, 16, 18, 17, 3)
    # Azure 2023 writes 7 fractional digits and no zone.
    return _csv(
        tmp / "az.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        lambda i, o: f"{first + timedelta(seconds=o):%Y-%m-%d %H:%M:%S}.0000000,{10 + i},2",
    )


def _burstgpt(tmp: Path) -> Path:
    return _csv(
        tmp / "burst.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
        lambda i, o: f"{BASE_S + o},GPT-4,{10 + i},2,{12 + i},API log",
        newline="\r\n",
    )


def _splitwise(tmp: Path) -> Path:
    return _csv(
        tmp / "sw.csv",
        "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size",
        lambda i, o: f"r{i},2,app{i % 2},{BASE_S + o},1,{10 + i},2",
    )


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "mooncake": (_mooncake, "timestamp"),
    "coldpaths": (_coldpaths, "start_us"),
    "azure": (_azure, "TIMESTAMP"),
    "burstgpt": (_burstgpt, "Timestamp"),
    "splitwise": (_splitwise, "arrival_timestamp"),
}


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_out_of_order_row_names_line_and_field(tmp_path: Path, fmt: str) -> None:
    make, field = CASES[fmt]
    p = make(tmp_path)
    assert detect_format(p) == fmt
    with pytest.raises(InputError) as info:
        list(read_requests(p))
    err = info.value
    assert (err.file, err.line, err.field) == (str(p), 3, field)
    assert "before the first row's" in err.message
    # The message says by how much: row 3 is 1 s before the first.
    assert " 1 s before" in err.message


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_skip_invalid_drops_only_the_early_row(tmp_path: Path, fmt: str) -> None:
    make, _ = CASES[fmt]
    p = make(tmp_path)
    log = SkipLog()
    evs = list(read_requests(p, skip_invalid=True, on_skip=log))
    kept = [i for i, o in enumerate(OFFSETS) if o >= 0]
    assert [e.line for e in evs] == [i + 1 for i in kept]
    assert [e.arrival_s for e in evs] == pytest.approx([OFFSETS[i] for i in kept], abs=1e-9)
    assert [e.input_tokens for e in evs] == [10 + i for i in kept]
    assert [e.output_tokens for e in evs] == [2] * len(kept)
    assert all(e.source == f"{fmt}:{p}" for e in evs)
    assert log.count == 1


def test_csv_formats_keep_their_own_columns(tmp_path: Path) -> None:
    """What each CSV format adds beyond time and tokens, checked against the cells written above."""
    sw = list(read_requests(_splitwise(tmp_path), skip_invalid=True, on_skip=SkipLog()))
    assert [(e.tenant, e.tags["request_id"], e.tags["request_type"], e.tags["batch_size"]) for e in sw] == [
        ("app0", "r0", "2", "1"),
        ("app1", "r1", "2", "1"),
        ("app1", "r3", "2", "1"),
    ]
    bg = list(read_requests(_burstgpt(tmp_path), skip_invalid=True, on_skip=SkipLog()))
    assert {(e.operation, e.tags["gen_ai.request.model"], e.failed) for e in bg} == {
        ("API log", "GPT-4", False)
    }
    az = list(read_requests(_azure(tmp_path), skip_invalid=True, on_skip=SkipLog()))
    assert all(e.tags == {} and e.tenant is None and not e.failed for e in az)


def test_bad_cell_reports_its_column(tmp_path: Path) -> None:
    p = tmp_path / "sw.csv"
    p.write_text("arrival_timestamp,prompt_size,token_size\n1.0,10,2\n2.0,ten,2\n")
    with pytest.raises(InputError) as info:
        list(read_requests(p))
    assert (info.value.line, info.value.field) == (2, "prompt_size")
