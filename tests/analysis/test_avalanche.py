"""Avalanche probability and RTO against worked examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.analysis.avalanche import (
    KeyClass,
    RtoCase,
    RtoCoefficients,
    assess,
    avalanche_probability,
    calibrate,
    classes_from_server,
    measure_rto,
    measure_rto_run,
    p_measured,
    p_modelled,
    per_class_target,
    predict_rto,
    risks_from_classes,
    risks_from_state,
)
from harness.common.errors import InputError
from harness.common.io import write_json

from .conftest import record, write_run


def test_worked_example_three_classes() -> None:
    """Hot: 1 000 keys written over 600 s, no jitter → p = 60/600 = 0.1. Warm: 500 keys over 300 s
    → p = 0.2. Cold: 200 keys written at once → p = 1 (they all go together).
    P = 1 − (0.9 · 0.8 · 0) = 1. Give cold 60 s of write span → p = 1 (span ≤ Δ still means one
    wave); give it 120 s of jitter → p = 0.5 and P = 1 − 0.9 · 0.8 · 0.5 = 0.64."""
    classes = [
        KeyClass(name="hot", keys=1000, ttl_s=3600, write_span_s=600),
        KeyClass(name="warm", keys=500, ttl_s=1200, write_span_s=300),
        KeyClass(name="cold", keys=200, ttl_s=300),
    ]
    risks = risks_from_classes(classes, window_s=60)
    assert [r.p for r in risks] == [0.1, 0.2, 1.0]
    assert [r.together for r in risks] == [100.0, 100.0, 200.0]
    assert assess(risks, 60).probability == 1.0
    classes[2] = KeyClass(name="cold", keys=200, ttl_s=300, write_span_s=0, jitter_s=120)
    assert assess(risks_from_classes(classes, 60), 60).probability == pytest.approx(0.64)
    assert p_modelled(60, 0, 60) == 1.0


def test_jitter_advice_reaches_the_target() -> None:
    # Target P = 0.1 over 2 classes → p* = 1 − 0.9^(1/2) ≈ 0.05132; a class written at once
    # needs its expiries spread over Δ/p* = 60/0.05132 ≈ 1169 s of jitter.
    classes = [
        KeyClass(name="a", keys=10, ttl_s=600),
        KeyClass(name="b", keys=10, ttl_s=600, write_span_s=6000),
    ]
    rep = assess(risks_from_classes(classes, 60), 60, target=0.1, spans={"a": 0.0, "b": 6000.0})
    pstar = per_class_target(0.1, 2)
    assert pstar == pytest.approx(1 - 0.9**0.5)
    a, b = rep.classes
    assert a.jitter_s == pytest.approx(60 / pstar)
    assert b.jitter_s == 0.0  # already spread thinner than p*
    fixed = [KeyClass(name="a", keys=10, ttl_s=600, jitter_s=a.jitter_s or 0), classes[1]]
    assert assess(risks_from_classes(fixed, 60), 60).probability <= 0.1 + 1e-9


def test_measured_expiry_share() -> None:
    # 10 expiries: 6 within 5 s of each other, the rest far apart.
    e = [100, 101, 102, 103, 104, 105, 200, 300, 400, 500]
    assert p_measured(e, 5.0) == 0.6
    assert p_measured(e, 1000.0) == 1.0
    assert p_measured([], 5.0) == 0.0
    assert avalanche_probability([0.6, 0.5]) == pytest.approx(0.8)


def test_risks_from_saved_cache_state(tmp_path: Path) -> None:
    def entry(tier: str, created: float, ttl: float) -> dict[str, object]:
        return {"value_tier": tier, "expires_at": created + ttl, "completion": {"created": created}}

    # 4 hot entries written at 0, 10, 20, 30 (TTL 3600); 2 cold ones written together (TTL 300).
    write_json(
        tmp_path / "l3" / "acme" / "meta.json",
        {
            "tenant": "acme",
            "entries": [entry("hot", t, 3600) for t in (0, 10, 20, 30)] + [entry("cold", 5, 300)] * 2,
        },
    )
    risks = {r.name: r for r in risks_from_state(tmp_path, window_s=15)}
    assert risks["hot"].p == 0.5 and risks["hot"].ttl_s == 3600 and risks["hot"].spread_s == 30
    assert risks["cold"].p == 1.0 and risks["cold"].keys == 2
    assert {r.name for r in risks_from_state(tmp_path, 15, by="tenant-tier")} == {"acme/hot", "acme/cold"}
    with pytest.raises(InputError, match="no saved cache state"):
        risks_from_state(tmp_path / "none", 15)


def test_classes_from_server_stats_and_metrics() -> None:
    metrics = (
        "# HELP cache_writebacks_total x\n# TYPE cache_writebacks_total counter\n"
        'cache_writebacks_total{value_tier="hot"} 40.0\ncache_writebacks_total{value_tier="cold"} 10.0\n'
    )
    classes = classes_from_server({"ttl_s": {"hot": 3600, "warm": 1200, "cold": 300}}, metrics, 100.0)
    assert [(c.name, c.keys, c.ttl_s) for c in classes] == [
        ("hot", 40, 3600),
        ("warm", 0, 1200),
        ("cold", 10, 300),
    ]


def test_rto_worked_example_and_calibration() -> None:
    """1 000 keys, 2 s per generation, 8 slots, half busy: W = 1000·2/(8·0.5) = 500 s.
    With c0 = 5 s and c1 = 1.2: RTO = 5 + 1.2·500 = 605 s."""
    case = RtoCase(expired_keys=1000, gen_s=2.0, slots=8, utilization=0.5)
    assert case.work_s == 500.0
    assert predict_rto(case, RtoCoefficients(c0=5, c1=1.2)) == pytest.approx(605.0)
    assert predict_rto(case, RtoCoefficients()) == 500.0
    measured = [
        RtoCase(expired_keys=n, gen_s=2.0, slots=8, utilization=0.5, rto_s=5 + 1.2 * n * 2 / 4)
        for n in (100, 400, 1000)
    ]
    coef = calibrate(measured)
    assert coef.c0 == pytest.approx(5.0) and coef.c1 == pytest.approx(1.2)
    assert coef.calibrated_on == 3 and coef.rmse_s == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(InputError, match="two measured runs"):
        calibrate(measured[:1])


def test_measured_rto_from_hits() -> None:
    # Hit rate 1.0 before t=10; all misses 10–20; hits again from 20 on. Window 2 s, recover 0.95.
    t = [i * 0.5 for i in range(80)]
    hit = [not (10 <= x < 20) for x in t]
    rto = measure_rto(t, hit, 10.0, window_s=2.0)
    assert rto == pytest.approx(11.5)  # first time the trailing 2 s are all hits: t = 21.5
    assert measure_rto(t, [False] * 80, 10.0) is None


def test_measured_rto_from_a_run(tmp_path: Path) -> None:
    recs = [record(i, sent_s=i * 0.5, cache="MISS" if 10 <= i * 0.5 < 20 else "HIT-L2") for i in range(80)]
    run = write_run(tmp_path / "run", recs)
    assert measure_rto_run(run, 10.0, window_s=2.0) == pytest.approx(11.5)
