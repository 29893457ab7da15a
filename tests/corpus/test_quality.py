"""Quality metrics catch planted defects; thresholds fail with CheckFailed (exit 1)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.common.errors import CheckFailed, ExitCode
from harness.corpus import quality
from harness.corpus.inputs import InputSampler
from harness.corpus.logs import read_log
from harness.corpus.model import CorpusRecord, Provenance

from .conftest import FIXTURES


def _sampler(seed: int) -> InputSampler:
    logs = read_log(FIXTURES / "clinc150_sample.json") + read_log(FIXTURES / "crosswoz_sample.json.zip")
    return InputSampler(seed, logs)


def _records(n: int) -> list[CorpusRecord]:
    s = _sampler(11)
    out = []
    for i in range(n):
        got = s.variables(i)
        assert got is not None
        v, _ = got
        out.append(
            CorpusRecord(
                id=f"r{i}",
                prompt=f"prompt {i}: {v.query}",
                max_tokens=10,
                expected_output_tokens=10,
                lang=v.profile.lang,
                domain=v.domain,
                intent=v.intent,
                variables=v,
                provenance=Provenance(seed=11, candidate=i, template="t", template_sha256="0" * 64),
            )
        )
    return out


def test_clean_records_are_complete_and_plausible() -> None:
    recs = _records(60)
    assert quality.completeness(recs) == 1.0
    assert quality.temporal_plausibility(recs) == 1.0


def test_planted_missing_fields_lower_completeness() -> None:
    recs = _records(40)
    cells_per_record = 5 + len(quality.REQUIRED_PROFILE) + 4
    for r in recs[:10]:  # blank two profile fields in a quarter of the records
        assert r.variables is not None
        r.variables.profile.email = ""
        r.variables.profile.city = ""
    expected = 1 - (10 * 2) / (40 * cells_per_record)
    assert quality.completeness(recs) == pytest.approx(expected)


def test_planted_timeline_defects_are_caught() -> None:
    recs = _records(50)
    bad = 0
    for r in recs[:20]:
        v = r.variables
        assert v is not None
        if len(v.session.events) >= 2:  # reverse the history: out of order
            v.session.events.reverse()
        else:  # an event after the request
            v.session.events[0].ts = v.session.end
        bad += 1
    recs[20].variables.profile.signup_at = "1900-01-01T00:00:00+00:00"  # type: ignore[union-attr]
    bad += 1
    assert quality.temporal_plausibility(recs) == pytest.approx((50 - bad) / 50)
    metrics = quality.compute(recs)
    with pytest.raises(CheckFailed, match="temporal_plausibility") as info:
        quality.check(metrics, quality.Thresholds())
    assert info.value.exit_code == ExitCode.CHECK_FAILED


def test_mean_pairwise_cosine_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sims = x.astype(np.float64) @ x.astype(np.float64).T
    expected = (sims.sum() - np.trace(sims)) / (50 * 49)
    assert quality.mean_pairwise_cosine(x) == pytest.approx(expected, abs=1e-9)


def test_distinct_n_and_ks() -> None:
    assert quality.distinct_n(["a b a b", "a b"], 1) == pytest.approx(2 / 6)
    assert quality.distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)
    assert quality.ks_statistic([1, 2, 3], [1, 2, 3]) == 0.0
    assert quality.ks_statistic([1, 2, 3], [10, 11, 12]) == 1.0


def test_duplicate_rate_threshold_fails() -> None:
    metrics = quality.compute(_records(5), dup_before=0.3, dup_after=0.1)
    assert quality.failures(metrics, quality.Thresholds()) == ["dup_rate_after = 0.1000, needs ≤ 0.0"]


def test_catalogue_share_and_region_agreement_catch_planted_defects() -> None:
    recs = _records(40)
    assert quality.catalog_share(recs) == 1.0
    assert quality.region_agreement(recs) == 1.0
    assert quality.query_in_prompt(recs) == 1.0
    events = sum(len(r.variables.session.events) for r in recs)  # type: ignore[union-attr]
    for r in recs[:5]:  # word salad in one event of five records
        r.variables.session.events[0].detail = "writer brother"  # type: ignore[union-attr]
    assert quality.catalog_share(recs) == pytest.approx(1 - 5 / events)
    zh = next(r for r in recs if r.lang == "zh")
    zh.variables.profile.region = "澳门特别行政区"  # type: ignore[union-attr]
    en = next(r for r in recs if r.lang == "en")
    en.variables.profile.city = "Lake Amandaville"  # type: ignore[union-attr]
    assert quality.region_agreement(recs) == pytest.approx(38 / 40)
    recs[7].prompt = "something else"
    assert quality.query_in_prompt(recs) == pytest.approx(39 / 40)
