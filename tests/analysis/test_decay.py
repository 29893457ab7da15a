"""QPS decay: the Levenberg–Marquardt fit recovers a known k from noisy data; inputs from runs and files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.analysis.decay import DecayPoint, fit_decay, plot_decay, points_from_run, read_points
from harness.common.errors import InputError
from harness.load.results import StageOutcome

from .conftest import record, write_run


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fit_recovers_a_known_k(seed: int) -> None:
    qps0, k = 120.0, 2.5
    rng = np.random.default_rng(seed)
    x = np.repeat(np.linspace(0.0, 1.0, 11), 2)
    y = qps0 * np.exp(-k * x**2) * (1.0 + rng.normal(0.0, 0.03, x.size))
    fit = fit_decay([DecayPoint(cmr=float(a), qps=float(b)) for a, b in zip(x, y, strict=True)])
    lo, hi = fit.k_interval
    assert lo < k < hi  # the 95 % interval covers the truth
    assert abs(fit.k - k) < 0.15 and abs(fit.qps0 - qps0) < 4.0
    assert hi - lo < 0.5  # and is informative
    assert fit.r2 > 0.99 and len(fit.residuals) == x.size
    assert sum(fit.residuals) == pytest.approx(float(np.sum(y - fit.predict(x))))


def test_noiseless_data_gives_the_exact_k() -> None:
    pts = [DecayPoint(cmr=c, qps=50.0 * float(np.exp(-0.8 * c * c))) for c in (0.0, 0.3, 0.6, 0.9)]
    fit = fit_decay(pts)
    assert fit.k == pytest.approx(0.8, rel=1e-6) and fit.qps0 == pytest.approx(50.0, rel=1e-6)


def test_too_few_or_degenerate_points_are_refused() -> None:
    with pytest.raises(InputError, match="at least 3"):
        fit_decay([DecayPoint(cmr=0, qps=1), DecayPoint(cmr=1, qps=0.5)])
    with pytest.raises(InputError, match="same cache-miss rate"):
        fit_decay([DecayPoint(cmr=0.5, qps=q) for q in (1.0, 2.0, 3.0)])


def test_points_from_a_staged_run(tmp_path: Path) -> None:
    """Three stages of 10 s; stage i bypasses i/2 of its requests and completes (20 − 5i) of them."""
    recs = []
    stages = []
    for i in range(3):
        n_ok = 20 - 5 * i
        for j in range(20):
            recs.append(
                record(
                    len(recs),
                    stage=f"s{i}",
                    sent_s=10.0 * i + j * 0.5,
                    cache="BYPASS" if j < 10 * i else "HIT-L1",
                    status=200 if j < n_ok else 503,
                    error=None if j < n_ok else "busy",
                )
            )
        stages.append(
            StageOutcome(name=f"s{i}", target_rate=2.0, started_s=10.0 * i, ended_s=10.0 * i + 10.0)
        )
    pts = points_from_run(write_run(tmp_path / "run", recs, stages=stages, duration_s=30.0))
    assert [(p.stage, p.cmr, p.qps) for p in pts] == [("s0", 0.0, 2.0), ("s1", 0.5, 1.5), ("s2", 1.0, 1.0)]
    # Without stages: one point over the run.
    one = points_from_run(write_run(tmp_path / "flat", [record(i, cache="MISS") for i in range(10)]))
    assert len(one) == 1 and one[0].cmr == 1.0 and one[0].qps == pytest.approx(1.0)
    with pytest.raises(InputError, match="x-cache"):
        points_from_run(write_run(tmp_path / "nocache", [record(i, cache=None) for i in range(3)]))


def test_points_files_and_plot(tmp_path: Path) -> None:
    (tmp_path / "p.csv").write_text("cmr,qps,stage\n0,10,a\n0.5,8,b\n1,4,c\n")
    pts = read_points(tmp_path / "p.csv")
    assert [p.stage for p in pts] == ["a", "b", "c"]
    (tmp_path / "bad.csv").write_text("cmr,qps\n0,10\n1.5,3\n")
    with pytest.raises(InputError) as exc:
        read_points(tmp_path / "bad.csv")
    assert exc.value.line == 2 and exc.value.field == "cmr"
    (tmp_path / "p.jsonl").write_text('{"cmr": 0, "qps": 10}\n{"cmr": 1, "qps": 5, "extra": 1}\n')
    with pytest.raises(InputError, match="extra"):
        read_points(tmp_path / "p.jsonl")
    plot_decay(fit_decay(pts), tmp_path / "decay.png")
    assert (tmp_path / "decay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
