"""The ``--until-precision`` stopping rule, on synthetic samples, and its options."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from harness.common.errors import ConfigError
from harness.common.stats import (
    min_samples_for_interval,
    percentile,
    percentile_interval,
    relative_half_width,
)
from harness.load.inputs import Inputs
from harness.load.options import LoadOptions, add_arguments
from harness.load.precision import PrecisionTarget, PrecisionTracker, describe, parse_precision_on
from harness.load.results import RequestRecord
from harness.load.runner import LoadSpec


def _row(**values: object) -> RequestRecord:
    """A finished request's record with these values (status 200 unless given)."""
    base: dict[str, object] = {
        "id": "r",
        "stage": "replay",
        "intended_s": 0.0,
        "sent_s": 0.0,
        "lateness_ms": 0.0,
    }
    return RequestRecord.parse({"status": 200, **base, **values})


def _first_met(samples: np.ndarray, q: float, target: float) -> int:
    """Feed ``samples`` one by one; the ``n`` at which the tracker first says met (0: never)."""
    tracker = PrecisionTracker([PrecisionTarget("ttft_ms", q)], target)
    for i, x in enumerate(samples, start=1):
        tracker.add(_row(ttft_ms=float(x)))
        if tracker.met():
            return i
    return 0


def test_stops_when_the_interval_is_within_the_target_and_not_before() -> None:
    xs = np.random.default_rng(7).lognormal(mean=4.0, sigma=0.4, size=3000)
    n = _first_met(xs, 95, 0.05)
    assert n > 0
    # The decision is exactly the one implementation's interval, over the samples so far.
    lo, hi = percentile_interval(xs[:n], 95)
    assert relative_half_width(percentile(xs[:n], 95), lo, hi) <= 0.05
    lo, hi = percentile_interval(xs[: n - 1], 95)
    assert not relative_half_width(percentile(xs[: n - 1], 95), lo, hi) <= 0.05


def test_p99_needs_more_samples_than_p95() -> None:
    xs = np.random.default_rng(3).lognormal(mean=4.0, sigma=0.4, size=5000)
    n95, n99 = _first_met(xs, 95, 0.1), _first_met(xs, 99, 0.1)
    assert 0 < n95 < n99
    assert n95 >= min_samples_for_interval(95) == 72
    assert n99 >= min_samples_for_interval(99) == 368


def test_identical_samples_are_judged_as_soon_as_the_interval_exists() -> None:
    # Every sample 50 ms: any interval is [50, 50], so the only wait is for its ends to exist.
    assert _first_met(np.full(1000, 50.0), 95, 0.01) == min_samples_for_interval(95)
    assert _first_met(np.full(1000, 50.0), 99, 0.01) == min_samples_for_interval(99)


def test_failed_requests_and_missing_values_do_not_count() -> None:
    tracker = PrecisionTracker(parse_precision_on("ttft_ms:95,itl_ms:50"), 0.5)
    tracker.add(_row(status=503, error="HTTP 503", ttft_ms=1.0, itl_ms=[1.0]))
    tracker.add(_row(status=0, error="timeout", ttft_ms=None, itl_ms=[]))
    tracker.add(_row(ttft_ms=None, itl_ms=[2.0, 3.0, float("nan")]))
    states = tracker.states()
    assert states["ttft_ms:95"].n == 0 and not states["ttft_ms:95"].met
    assert states["itl_ms:50"].n == 2  # itl_ms pools every gap; NaN is not a sample
    assert not tracker.met()


def test_min_samples_holds_the_stop_back() -> None:
    tracker = PrecisionTracker(parse_precision_on("ttft_ms:50"), 0.5, min_samples=100)
    for _ in range(99):
        tracker.add(_row(ttft_ms=10.0))
    state = tracker.states()["ttft_ms:50"]
    assert state.rel_half_width == 0.0 and state.min_n == 100 and not state.met
    tracker.add(_row(ttft_ms=10.0))
    assert tracker.met()


def test_describe_says_what_fell_short_and_by_how_much() -> None:
    tracker = PrecisionTracker(parse_precision_on("ttft_ms:95,ttft_ms:99"), 0.1)
    xs = np.random.default_rng(1).lognormal(mean=4.0, sigma=0.4, size=200)
    tracker.add_many(_row(ttft_ms=float(x)) for x in xs)
    text = describe(tracker.states())
    assert "ttft_ms P99 not judgeable yet: 200 of ≥ 368 samples" in text
    p95 = tracker.states()["ttft_ms:95"]
    assert p95.rel_half_width is not None and p95.lo is not None and p95.hi is not None
    assert f"ttft_ms P95 ±{100 * p95.rel_half_width:.1f} %" in text


def test_relative_half_width_definition() -> None:
    assert relative_half_width(100.0, 90.0, 105.0) == pytest.approx(0.1)
    assert relative_half_width(100.0, -math.inf, 105.0) == math.inf
    assert relative_half_width(100.0, 95.0, math.inf) == math.inf
    assert relative_half_width(0.0, 0.0, 0.0) == 0.0
    assert math.isnan(relative_half_width(math.nan, math.nan, math.nan))


def test_min_samples_for_interval_is_the_first_n_with_both_ends() -> None:
    rng = np.random.default_rng(0)
    for q, conf in ((50, 0.95), (90, 0.95), (95, 0.99), (99, 0.95), (10, 0.95)):
        n = min_samples_for_interval(q, conf)
        lo, hi = percentile_interval(rng.random(n), q, conf)
        assert math.isfinite(lo) and math.isfinite(hi)
        lo, hi = percentile_interval(rng.random(n - 1), q, conf)
        assert not (math.isfinite(lo) and math.isfinite(hi))
    with pytest.raises(ValueError):
        min_samples_for_interval(100)


# ------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize(("text", "value"), [("10%", 0.1), ("0.1", 0.1), (" 2.5 % ", 0.025), (1, 1.0)])
def test_until_precision_takes_a_percentage_or_a_fraction(text: object, value: float) -> None:
    assert LoadOptions.model_validate({"until_precision": text}).until_precision == pytest.approx(value)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("until_precision", "10", "in (0, 1]"),
        ("until_precision", "ten", "not a percentage like 10% or a fraction like 0.1"),
        ("until_precision", "0%", "in (0, 1]"),
        ("precision_on", "ttft:95", "not a latency field"),
        ("precision_on", "ttft_ms", "not FIELD:Q"),
        ("precision_on", "ttft_ms:100", "strictly between 0 and 100"),
        ("precision_on", "ttft_ms:x", "not a percentile"),
        ("precision_on", " , ", "names no percentile"),
        ("max_duration", "0", "greater than 0"),
        ("precision_confidence", "1.0", "less than 1"),
    ],
)
def test_bad_values_name_the_option(field: str, value: str, needle: str) -> None:
    class Ns:
        pass

    ns = Ns()
    setattr(ns, field, value)
    with pytest.raises(ConfigError) as err:
        LoadOptions.from_namespace(ns)
    assert err.value.field == f"--{field.replace('_', '-')}"
    assert needle in str(err.value)


def test_locust_parser_takes_a_percentage() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(
        ["--until-precision", "10%", "--max-duration", "30", "--precision-on", "tpot_ms:99"]
    )
    opts = LoadOptions.from_namespace(ns)
    assert (opts.until_precision, opts.max_duration, opts.precision_on) == (0.1, 30.0, "tpot_ms:99")
    assert opts.to_args()[-6:] == [
        "--until-precision",
        "0.1",
        "--max-duration",
        "30.0",
        "--precision-on",
        "tpot_ms:99",
    ]
    parser.format_help()  # the help text formats (a bare % in it would raise)


def test_rate_with_until_precision_needs_a_bound(corpus: object) -> None:
    base = {"corpus": corpus, "rate": 10.0, "until_precision": "10%"}
    with pytest.raises(ConfigError) as err:
        Inputs.load(LoadOptions.model_validate(base), ladder=False)
    assert err.value.field == "--max-duration"
    inputs = Inputs.load(LoadOptions.model_validate({**base, "max_duration": 3}), ladder=False)
    assert len(inputs.planned() or []) == 30  # the rate runs until --max-duration, no longer
    assert inputs.ends_by_max_duration()
    inputs = Inputs.load(LoadOptions.model_validate({**base, "max_duration": 3, "duration": 2}), ladder=False)
    assert len(inputs.planned() or []) == 20 and not inputs.ends_by_max_duration()


def test_the_ladder_refuses_a_run_wide_stop(corpus: object) -> None:
    opts = LoadOptions.model_validate({"corpus": corpus, "plan": "x.yaml", "until_precision": 0.1})
    with pytest.raises(ConfigError) as err:
        Inputs.load(opts, ladder=True)
    assert err.value.field == "--until-precision"


def test_load_spec_passes_the_options_on() -> None:
    spec = LoadSpec(host="http://x", results_dir="r", corpus="c", rate=5, until_precision="5%",
                    max_duration=60, precision_on="tpot_ms:95", precision_min_samples=200)  # fmt: skip
    cmd = spec.command()
    handed = json.loads(cmd[cmd.index("--options-json") + 1])
    want = {"results_dir": "r", "corpus": "c", "rate": 5.0, "until_precision": 0.05}
    want |= {"max_duration": 60.0, "precision_on": "tpot_ms:95", "precision_min_samples": 200}
    assert handed == want
    assert not any(a.startswith("--until") or a.startswith("--precision") for a in cmd)  # no flag re-parsed


@pytest.mark.parametrize("q", [5, 50, 95, 99])
@pytest.mark.parametrize("n", [1, 10, 500, 20_000])
def test_the_tracker_ranks_exactly_as_the_one_interval(q: float, n: int) -> None:
    xs = np.random.default_rng(n).normal(100.0, 10.0, n)
    tracker = PrecisionTracker([PrecisionTarget("e2e_ms", q)], 0.1)
    tracker.add_many(_row(e2e_ms=float(x)) for x in xs)
    state = tracker.states()[f"e2e_ms:{q:g}"]
    lo, hi = percentile_interval(xs, q)
    assert state.value == percentile(xs, q)
    assert state.lo == (lo if math.isfinite(lo) else None) and state.hi == (hi if math.isfinite(hi) else None)


def test_summarize_keeps_and_prints_the_stop_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import main
    from harness.load.results import RecordWriter
    from harness.load.run_summary import TargetInfo, read_summary, summarize, write_summary

    rows = [_row(id=f"r{i}", intended_s=i * 0.1, sent_s=i * 0.1, lateness_ms=0.1, ttft_ms=float(i + 1))
            for i in range(100)]  # fmt: skip
    w = RecordWriter(tmp_path / "records.jsonl")
    w.write_many(rows)
    w.close()
    tracker = PrecisionTracker(parse_precision_on("ttft_ms:50"), 0.25)
    tracker.add_many(rows)
    reason = f"precision reached: {describe(tracker.states())} after 9.9 s"
    write_summary(tmp_path, summarize([], started_at="x", duration_s=9.0, target=TargetInfo(url="http://t"),
                                      stop_reason=reason, precision=tracker.states()))  # fmt: skip
    with pytest.raises(SystemExit) as ex:
        main(["load", "summarize", str(tmp_path), "--write"])
    assert ex.value.code == 0
    assert f"stopped: {reason}" in capsys.readouterr().out.replace("\n", " ")
    s = read_summary(tmp_path)
    assert s.stop_reason == reason and s.precision is not None and s.precision["ttft_ms:50"].met
    assert reason == "precision reached: ttft_ms P50 ±22.0 % (n=100) after 9.9 s"


def test_arrivals_end_is_known_ahead(corpus: Path, tmp_path: Path) -> None:
    from tests.load.helpers import make_schedule

    def end(**o: object) -> float:
        return Inputs.load(LoadOptions.model_validate({"corpus": corpus, **o}), ladder=False).arrivals_end_s()

    assert end(rate=10, max_duration=3) == 3.0
    assert end(rate=10, duration=5, max_duration=3) == 3.0
    assert end(rate=10, max_requests=5) == pytest.approx(0.4)
    assert end(rate=10, max_requests=5, arrival="poisson") == math.inf
    sched = make_schedule(tmp_path / "s.jsonl", [0.0, 1.0, 7.5])
    assert end(schedule=sched) == 7.5 and end(schedule=sched, max_duration=5) == 1.0


def test_load_spec_validates_once_and_its_variants_evolve_the_options() -> None:
    spec = LoadSpec(host="http://x", results_dir="r", corpus="c", rate=5, duration=10, concurrency=8)
    assert spec.options.is_set("concurrency") and not spec.options.is_set("start_delay")
    with pytest.raises(ConfigError) as err:  # a bad value is refused when the spec is made
        LoadSpec(host="http://x", corpus="c", rate=-1)
    assert err.value.field == "--rate"
    variant = spec.replace(host="http://y", stage="cold", concurrency=None, processes=2)
    assert (variant.host, variant.processes, variant.options.stage) == ("http://y", 2, "cold")
    assert variant.options.concurrency == 64 and not variant.options.is_set("concurrency")  # None: default
    assert spec.options.concurrency == 8  # the original is untouched
    assert spec.replace(processes=3).options is spec.options  # launcher fields only: no new options
    assert spec.options.evolve(rate=5) is spec.options  # nothing changes: nothing to validate
    with pytest.raises(ConfigError) as err:
        spec.replace(until_precision="150%")
    assert err.value.field == "--until-precision"


def test_locusts_options_are_validated_once_per_process_until_they_change() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(["--corpus", "c", "--rate", "5", "--duration", "1"])
    first = LoadOptions.from_namespace(ns)
    assert LoadOptions.from_namespace(ns) is first  # Locust's init, then the test start
    ns.rate = 7.0  # the web UI's start form changed it
    assert LoadOptions.from_namespace(ns).rate == 7.0


def test_the_locust_side_takes_the_handed_over_object_and_refuses_a_flag_beside_it() -> None:
    import argparse

    from harness.common.errors import ConfigError
    from harness.load.options import add_arguments

    spec = LoadSpec(host="http://x", results_dir="r", corpus="c", rate="50%", capacity=8,
                    max_tokens_cap=12, header=("X-A: b",))  # fmt: skip
    cmd = spec.command()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(cmd[cmd.index("--only-summary") + 1 :])
    back = LoadOptions.from_namespace(ns)
    assert back == spec.options.evolve(header=None)  # the same model; the secret comes by environment
    assert back.max_tokens_cap == 12 and back.rate_rps() == 4.0
    ns = parser.parse_args([*cmd[cmd.index("--only-summary") + 1 :], "--max-tokens-cap", "64"])
    with pytest.raises(ConfigError) as err:
        LoadOptions.from_namespace(ns)
    assert err.value.field == "--max-tokens-cap" and "--options-json" in str(err.value)
