"""Bloom guard: no false negatives, false-positive rate near its target, stable across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.common.errors import InputError
from harness.target.cache.bloom import BloomGuard


def keys(prefix: str, n: int) -> list[str]:
    # Same shape as real keys: tenant, colon, 32 hex digits (random bytes, not our hash).
    return [f"{prefix}:{os.urandom(16).hex()}" for _ in range(n)]


def test_no_false_negatives_and_fp_rate_near_target() -> None:
    guard = BloomGuard(capacity=20_000, fp_rate=0.01)
    added = keys("t", 20_000)
    for k in added:
        guard.add(k)
    assert all(k in guard for k in added)
    probes = keys("t", 50_000)
    fp = sum(k in guard for k in probes) / len(probes)  # brute force: none of these was added
    assert fp <= 0.02, fp
    assert abs(guard.measured_fp_rate() - fp) < 0.01
    assert 0.0 < guard.theoretical_fp_rate() <= 0.02


def test_check_counts_intercepts_and_passes() -> None:
    guard = BloomGuard(capacity=1000, fp_rate=0.001)
    seen = keys("a", 10)
    for k in seen:
        guard.add(k)
    for k in seen:
        assert guard.check(k)
    fresh = keys("a", 10)
    outcomes = [guard.check(k) for k in fresh]
    assert guard.passed == 10 + sum(outcomes)
    assert guard.intercepted == 10 - sum(outcomes)
    assert guard.clear() >= 9 and not any(k in guard for k in seen)


CHILD = """
import json, sys
from pathlib import Path
from harness.target.cache.bloom import BloomGuard
added = json.loads(Path(sys.argv[1]).read_text())
probes = json.loads(Path(sys.argv[2]).read_text())
out = sys.argv[3]
g = BloomGuard(capacity=5000, fp_rate=0.01)
for k in added:
    g.add(k)
g.save(Path(out))
print(json.dumps([k in g for k in probes]))
"""


def test_save_and_load_across_processes_give_the_same_answers(tmp_path: Path) -> None:
    added, probes = keys("t", 3000), keys("t", 3000)
    (tmp_path / "a.json").write_text(json.dumps(added))
    (tmp_path / "p.json").write_text(json.dumps(added[:500] + probes))
    answers = []
    for seed in ("1", "2"):  # different hash salts: the filter must not depend on Python's hash()
        env = {**os.environ, "PYTHONHASHSEED": seed}
        args = [str(tmp_path / "a.json"), str(tmp_path / "p.json"), str(tmp_path / f"b{seed}")]
        run = subprocess.run(
            [sys.executable, "-c", CHILD, *args],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=60,
        )
        answers.append(json.loads(run.stdout))
    assert answers[0] == answers[1]
    assert (tmp_path / "b1").read_bytes() == (tmp_path / "b2").read_bytes()
    here = BloomGuard(capacity=5000, fp_rate=0.01)
    here.load(tmp_path / "b1")
    assert [k in here for k in added[:500] + probes] == answers[0]
    assert all(answers[0][:500])


def test_load_merges_and_rejects_other_geometry(tmp_path: Path) -> None:
    a, b = BloomGuard(5000, 0.01), BloomGuard(5000, 0.01)
    ka, kb = keys("x", 100), keys("x", 100)
    for k in ka:
        a.add(k)
    for k in kb:
        b.add(k)
    b.save(tmp_path / "b.bin")
    a.load(tmp_path / "b.bin")
    assert all(k in a for k in ka + kb)
    with pytest.raises(InputError):
        BloomGuard(50_000, 0.01).load(tmp_path / "b.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a bloom filter")
    with pytest.raises(InputError):
        BloomGuard(5000, 0.01).load(tmp_path / "junk.bin")
