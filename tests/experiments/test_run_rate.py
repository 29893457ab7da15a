"""``harness run --rate``: requests/s or a share of capacity, checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.errors import ConfigError
from harness.experiments.paired_spec import PairedSpec, prepare
from harness.experiments.recipe import Recipe
from harness.load.options import LoadOptions, Share
from tests.load.helpers import make_corpus

ROOT = Path(__file__).resolve().parents[2]


def test_a_rate_is_requests_per_second_or_a_share_of_capacity() -> None:
    assert LoadOptions.validated({"rate": "4"}).rate == 4.0
    assert LoadOptions.validated({"rate": 2.5}).rate == 2.5
    assert LoadOptions.validated({"rate": "50%"}).rate == Share(0.5)
    assert LoadOptions.validated({"rate": "150%"}).rate == Share(1.5)
    assert LoadOptions.validated({"rate": "50%", "capacity": 8}).rate_rps() == 4.0
    assert LoadOptions.validated({"rate": "50%"}).to_args() == ["--rate", "50%"]  # round-trips
    for bad in ("fast", "x%", "0%", "-10%", "0", "-1"):
        with pytest.raises(ConfigError) as err:
            LoadOptions.validated({"rate": bad})
        assert err.value.field == "--rate"
    with pytest.raises(ConfigError, match="share of the target's capacity: give --capacity"):
        LoadOptions.validated({"rate": "50%"}).rate_rps()


def _spec(tmp_path: Path, name: str, **load: object) -> PairedSpec:
    recipe = Recipe.model_validate({"target": {"url": "http://127.0.0.1:9"}, "load": load})
    return PairedSpec(recipe, out=tmp_path / name)


def test_a_share_of_capacity_is_checked_with_a_stand_in_capacity(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "c.jsonl", 4)
    spec = _spec(tmp_path, "out", corpus=corpus, duration=3.0, rate="50%")
    assert spec.needs_capacity() and spec.rate_share == 0.5
    prep = prepare(spec)
    assert prep.planned  # checked as if at some rate; the real one comes once capacity is known
    plan = ROOT / "fixtures" / "plans" / "relative.yaml"
    with_plan = _spec(tmp_path, "o2", corpus=corpus, duration=3.0, rate="50%", plan=plan)
    assert with_plan.plan_shares() and prepare(with_plan).ladder_requests is not None
    absolute = _spec(
        tmp_path, "o3", corpus=corpus, rate=2.0, duration=3.0, plan=ROOT / "fixtures" / "plans" / "tiny.yaml"
    )
    assert not absolute.needs_capacity()
    # The phases replay; the warm-up (plan, preload) is the run's to post between them.
    assert absolute.load.options.plan is None and absolute.load.options.capacity is None
    given = _spec(tmp_path, "o4", corpus=corpus, duration=3.0, rate="50%", capacity=8.0)
    assert given.load.options.rate_rps() == 4.0 and given.load.options.capacity == 8.0
