"""The ``harness traces`` commands end to end, and every bad-input case: exit code, one line, no traceback."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.traces import load_scenarios, load_schedule


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["traces", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    (tmp / "empty.jsonl").write_bytes(b"")
    (tmp / "adir").mkdir()
    (tmp / "binary.bin").write_bytes(b"\x00\x01\x02\x03binary")
    (tmp / "latin1.csv").write_bytes(
        b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,4,1\n\xe9t\xe9,1,1\n"
    )
    (tmp / "notutf8.json").write_bytes(b"\xff\xfe\xfa{}")
    (tmp / "shape.json").write_text('{"hello": "world"}')
    (tmp / "nospans.json").write_text('{"data": [{"traceID": "1", "processes": {}}]}')
    (tmp / "badrow.jsonl").write_text(
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}\n'
        '{"timestamp": 1, "input_length": 1}\n'
    )
    (tmp / "badcell.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9,4,x")
    (tmp / "truncated.json").write_text('{"data": [{"traceID": "1", "spans": [')
    return {
        "missing": (tmp / "nope.json", "no such file"),
        "empty": (tmp / "empty.jsonl", "file is empty"),
        "directory": (tmp / "adir", "is a directory"),
        "binary": (tmp / "binary.bin", "looks binary"),
        "invalid utf-8 row": (tmp / "latin1.csv", ":2: invalid UTF-8"),
        "invalid utf-8 head": (tmp / "notutf8.json", "invalid UTF-8"),
        "wrong shape": (tmp / "shape.json", "unrecognised format"),
        "no spans": (tmp / "nospans.json", "field 'data[0].spans': no 'spans' list"),
        "bad row": (tmp / "badrow.jsonl", ":2: field 'output_length'"),
        "bad cell": (tmp / "badcell.csv", ":1: field 'generatedtokens': expected an integer"),
        "truncated": (tmp / "truncated.json", "invalid JSON"),
    }


CASES = [
    "missing",
    "empty",
    "directory",
    "binary",
    "invalid utf-8 row",
    "invalid utf-8 head",
    "wrong shape",
    "no spans",
    "bad row",
    "bad cell",
    "truncated",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_one_line_exit_3(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, needle = _bad_inputs(tmp_path)[case]
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 3
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("harness: error: ") and str(path.name) in lines[0]
    assert needle in lines[0]
    assert "Traceback" not in err + out


def test_json_error_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _bad_inputs(tmp_path)["bad row"]
    code, out, _ = run(capsys, "inspect", "--json", str(path))
    doc = json.loads(out)
    assert code == 3 and doc["error"] == "InputError" and doc["line"] == 2 and doc["exit_code"] == 3


def test_skip_invalid_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _bad_inputs(tmp_path)["invalid utf-8 row"]
    code, out, _ = run(capsys, "inspect", "--json", "--skip-invalid", str(path))
    doc = json.loads(out)
    assert code == 0 and doc["requests"] == 1 and doc["skipped"] == 1
    assert list(doc["skip_reasons"]) == ["invalid UTF-8, expected a UTF-8 text file"]


def test_unknown_format_is_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text("{}\n")
    code, _, err = run(capsys, "inspect", "--trace-format", "nope", str(p))
    assert code == 4 and "unknown trace format 'nope'" in err


def test_real_process_no_traceback(tmp_path: Path) -> None:
    """One case through the installed entry point in a fresh process, as a user runs it."""
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n[1, 2\n')
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "traces", "inspect", str(tmp_path / "bad.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "bad.jsonl:2" in proc.stderr


@pytest.mark.realdata
def test_pipeline_coldpaths_scenarios_schedule(realdata: Path, tmp_path: Path, capsys) -> None:
    cp = tmp_path / "cp.jsonl"
    code, _, err = run(
        capsys,
        "coldpaths",
        str(realdata / "jaeger-ui/genaiTestTrace.json"),
        "--hops",
        "all",
        "--cache-scope",
        "hop",
        "-o",
        str(cp),
    )
    assert code == 0 and "7 cold path(s)" in err
    assert len(cp.read_text().splitlines()) == 7
    sc = tmp_path / "scenarios.json"
    code, _, err = run(capsys, "scenarios", str(cp), "--k", "12", "-o", str(sc))
    assert code == 0 and "capped to 1" in err
    scen = load_scenarios(sc)
    assert scen.k == 1 and scen.classes[0].size == 7 and scen.classes[0].latency_ms.max == 3900.0
    sched = tmp_path / "s.jsonl"
    code, _, _ = run(
        capsys,
        "schedule",
        "--rate",
        "20",
        "--count",
        "50",
        "--scenarios",
        str(sc),
        "--seed",
        "3",
        "-o",
        str(sched),
    )
    entries = load_schedule(sched)
    assert code == 0 and len(entries) == 50
    assert {e.scenario for e in entries} == {scen.classes[0].name}


@pytest.mark.realdata
def test_schedule_replay_window_gap_speedup(realdata: Path, tmp_path: Path, capsys) -> None:
    src = realdata / "mooncake/synthetic_trace.jsonl"
    ts = [json.loads(line)["timestamp"] / 1000 for line in src.read_text().splitlines()]
    out = tmp_path / "s.jsonl"
    code, _, _ = run(
        capsys,
        "schedule",
        "--from",
        str(src),
        "--start",
        "100",
        "--end",
        "200",
        "--max-gap",
        "0.5",
        "--speedup",
        "4",
        "-o",
        str(out),
    )
    entries = load_schedule(out)
    window = [t - ts[0] for t in ts if 100 <= t - ts[0] < 200]
    expected, off = [0.0], 0.0
    for a, b in itertools.pairwise(window):
        off += min(b - a, 0.5) / 4
        expected.append(off)
    assert code == 0 and len(entries) == len(window)
    assert [e.offset_s for e in entries] == pytest.approx(expected)


def test_synthetic_poisson_rate(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.jsonl"
    code, _, _ = run(capsys, "schedule", "--rate", "50", "--duration", "200", "--seed", "1", "-o", str(out))
    entries = load_schedule(out)
    # a Poisson process at 50/s over 200 s: 10 000 ± 4σ (σ = 100)
    assert code == 0 and abs(len(entries) - 10_000) < 400
    offsets = [e.offset_s for e in entries]
    assert offsets == sorted(offsets) and offsets[-1] < 200


def test_load_scenarios_errors_name_field(tmp_path: Path) -> None:
    from harness.common.errors import InputError

    p = tmp_path / "s.json"
    p.write_text(json.dumps({"version": 1, "k": 1, "threshold_ms": 500, "classes": [{"id": 0, "name": "x"}]}))
    with pytest.raises(InputError) as exc:
        load_scenarios(p)
    assert exc.value.file == str(p) and exc.value.field == "classes.0.weight"
    p.write_text(json.dumps({"version": 1, "k": 1, "threshold_ms": 500, "classes": [], "extra": 1}))
    with pytest.raises(InputError) as exc:
        load_scenarios(p)
    assert exc.value.field == "extra"
