"""The one percentile definition: nearest rank, exact, from all samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.common.stats import Distribution, percentile, percentile_interval


def test_nearest_rank_by_hand() -> None:
    xs = [15, 20, 35, 40, 50]  # the textbook example: P30 = 20, P40 = 20, P50 = 35, P100 = 50
    assert percentile(xs, 30) == 20
    assert percentile(xs, 40) == 20
    assert percentile(xs, 50) == 35
    assert percentile(xs, 100) == 50
    assert percentile(xs, 0) == 15
    # 95 % of 20 samples is exactly rank 19: no float error pushes it to 20.
    assert percentile(range(1, 21), 95) == 19


def test_never_interpolates_or_rounds() -> None:
    # Locust would print 150 for 147; numpy's default would print 147.5 for [147, 148].
    assert percentile([147.0], 95) == 147.0
    assert percentile([147.0, 148.0], 50) == 147.0


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=200))
def test_is_a_sample_and_matches_numpy_inverted_cdf(xs: list[float]) -> None:
    for q in (1, 50, 90, 95, 99):
        got = percentile(xs, q)
        assert got in xs
        assert got == float(np.percentile(np.asarray(xs), q, method="inverted_cdf"))


def test_nan_and_empty() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([math.nan, 3.0, math.nan], 50) == 3.0
    d = Distribution.of([])
    assert d.n == 0 and d.p95 is None and d.mean is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_fields_and_legacy_count() -> None:
    d = Distribution.of(range(1, 101))
    assert (d.n, d.min, d.p50, d.p90, d.p95, d.p99, d.max) == (100, 1, 50, 90, 95, 99, 100)
    assert d.mean == pytest.approx(50.5)
    assert d.percentile(95) == 95 and d.percentile(100) == 100
    assert Distribution.model_validate({"count": 3, "mean": 1.0, "p50": 1.0}).n == 3


def test_interval_covers_the_true_quantile_at_its_confidence() -> None:
    rng = np.random.default_rng(7)
    true_p95 = -math.log(0.05)  # exponential(1)
    covered = 0
    trials = 400
    for _ in range(trials):
        lo, hi = percentile_interval(rng.exponential(size=300), 95, confidence=0.9)
        covered += lo <= true_p95 <= hi
    # Order-statistic intervals are conservative: coverage ≥ nominal, minus sampling slack (3 σ).
    assert covered / trials >= 0.9 - 3 * math.sqrt(0.9 * 0.1 / trials)


def test_interval_is_open_ended_when_the_sample_is_too_small() -> None:
    lo, hi = percentile_interval(list(range(50)), 99, confidence=0.95)
    assert hi == math.inf and lo <= 49
    assert all(math.isnan(v) for v in percentile_interval([], 95))
