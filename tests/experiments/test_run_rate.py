"""``harness run --rate``: requests/s or a share of capacity, checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.errors import ConfigError
from harness.experiments.paired_spec import PairedSpec, prepare
from harness.experiments.run_cli import parse_rate
from harness.load.runner import LoadSpec
from tests.load.helpers import make_corpus

ROOT = Path(__file__).resolve().parents[2]


def test_parse_rate_numbers_and_shares() -> None:
    assert parse_rate(None) == (None, None)
    assert parse_rate("4") == (4.0, None)
    assert parse_rate("2.5") == (2.5, None)
    assert parse_rate("50%") == (None, 0.5)
    assert parse_rate("150 %".replace(" ", "")) == (None, 1.5)
    for bad in ("fast", "x%", "0%", "-10%"):
        with pytest.raises(ConfigError) as err:
            parse_rate(bad)
        assert err.value.field == "--rate"


def test_a_share_of_capacity_is_checked_with_a_stand_in_rate(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "c.jsonl", 4)
    load = LoadSpec(host="", results_dir=tmp_path, corpus=corpus, duration=3.0)
    spec = PairedSpec(out=tmp_path / "out", load=load, url="http://127.0.0.1:9", rate_share=0.5)
    assert spec.needs_capacity()
    prep = prepare(spec)
    assert prep.planned  # checked as if at some rate; the real one comes once capacity is known
    plan = ROOT / "fixtures" / "plans" / "relative.yaml"
    with_plan = PairedSpec(out=tmp_path / "o2", load=load, url="http://x", rate_share=0.5, plan=plan)
    assert with_plan.plan_shares() and prepare(with_plan).ladder_requests is not None
    absolute = PairedSpec(
        out=tmp_path / "o3",
        load=LoadSpec(host="", results_dir=tmp_path, corpus=corpus, rate=2.0, duration=3.0),
        url="http://x",
        plan=ROOT / "fixtures" / "plans" / "tiny.yaml",
    )
    assert not absolute.needs_capacity()
    both = PairedSpec(
        out=tmp_path / "o4",
        load=LoadSpec(host="", results_dir=tmp_path, corpus=corpus, rate=2.0, duration=3.0),
        url="http://x",
        rate_share=0.5,
    )
    with pytest.raises(ConfigError, match="not both"):
        prepare(both)
