"""``harness capacity``'s logic without Locust: the SLO parser, a probe's judgement, the isotonic fit,
the search (with an injected probe function) and its edges. The real probes are in
``test_capacity_live.py``."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from harness.common.errors import ConfigError, ExitCode, UnavailableError
from harness.corpus.model import CorpusRecord
from harness.experiments import capacity
from harness.experiments.capacity import CapacityRunner, CapacitySpec
from harness.experiments.capacity_result import Calibration, CapacityResult, answer_line, read_capacity
from harness.experiments.capacity_search import crossing, isotonic_increasing, search, unprobed
from harness.experiments.recipe import Recipe
from harness.experiments.target import Target
from harness.gates.slo import (
    DEFAULT_SLO,
    ProbeSamples,
    check_probe_size,
    judge_probe,
    parse_slo,
    precision_on,
    probe_min_requests,
    resolve_limits,
)
from harness.load.arrivals import RequestSpec, prepare_requests
from harness.load.target import TargetClient
from tests.experiments.capacity_server import Capacity, CapacityServer
from tests.load.helpers import make_corpus

# ------------------------------------------------------------------------------------------ SLO

SLO95 = "ttft_from_intended_p95<=3x,error_rate<=0.05"
SLO95_ONLY = "ttft_from_intended_p95<=3x"
SLO50 = "ttft_from_intended_p50<=3x,error_rate<=0.1"


def test_parse_slo_absolute_relative_and_rate() -> None:
    terms = parse_slo(
        "ttft_from_intended_p95<=300, tpot_p95<=50ms,e2e_from_intended_p99<=2.5x ,itl_p50<=40,"
        "error_rate<=0.01"
    )
    assert [t.metric for t in terms] == [
        "ttft_from_intended_p95", "tpot_p95", "e2e_from_intended_p99", "itl_p50", "error_rate"
    ]  # fmt: skip
    ttft, tpot, e2e, itl, err = terms
    assert (ttft.column, ttft.q, ttft.limit, ttft.factor) == ("ttft_from_intended_ms", 95, 300.0, None)
    assert (tpot.column, tpot.limit) == ("tpot_ms", 50.0)
    assert (e2e.column, e2e.q, e2e.limit, e2e.factor) == ("e2e_from_intended_ms", 99, None, 2.5)
    assert itl.column == "itl_ms"
    assert (err.kind, err.limit) == ("rate", 0.01)


def test_an_slo_metric_means_what_the_gate_of_that_name_means() -> None:
    """One vocabulary: ``ttft_p95`` is the gates' ``ttft_p95`` (from send) in an SLO too, and every
    latency percentile a gate knows is an SLO term."""
    from harness.gates.metrics import METRICS
    from harness.gates.slo import slo_metrics

    for name, (column, q) in slo_metrics().items():
        assert (METRICS.get(name).column, METRICS.get(name).q) == (column, q)
    (ttft,) = parse_slo("ttft_p95<=3x")
    assert (ttft.column, ttft.q) == ("ttft_ms", 95)
    assert {"ttft_p95", "ttft_from_intended_p95", "tpot_p50", "itl_p95", "e2e_p99"} <= set(slo_metrics())
    assert "lateness_p99" not in slo_metrics()  # the client's health, not the service's


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("ttft_p95<300", "ttft_p95<300"),
        ("ttft_p97<=300", "unknown metric"),
        ("latency_p95<=300", "unknown metric"),
        ("ttft_p95<=fast", "'fast' is not a number"),
        ("ttft_p95<=0", "above 0 ms"),
        ("ttft_p95<=0.5x", "at least 1x"),
        ("error_rate<=2x", "absolute share"),
        ("error_rate<=1.5", "share in (0, 1)"),
        ("ttft_p95<=300,ttft_p95<=400", "given twice"),
        ("ttft_p95<=300,", "''"),
        ("", "empty"),
    ],
)
def test_bad_slo_is_a_config_error_naming_the_term(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_slo(text)
    assert needle in str(err.value)
    assert err.value.field == "--slo"
    assert err.value.exit_code == ExitCode.CONFIG


def test_an_slo_no_probe_could_pass_is_refused_with_the_size_it_needs() -> None:
    check_probe_size(parse_slo(DEFAULT_SLO), 100, 0.95)  # the default fits
    with pytest.raises(ConfigError, match="--probe-requests 368"):
        check_probe_size(parse_slo("error_rate<=0.01"), 100, 0.95)
    with pytest.raises(ConfigError, match="--probe-requests 72"):
        check_probe_size(parse_slo("ttft_from_intended_p95<=300"), 50, 0.95)


# ------------------------------------------------------------------------------------ judgement


def probe(rate: float, ttft: np.ndarray, *, failed: int = 0, cpu: float | None = None) -> ProbeSamples:
    """A probe of ``len(ttft) + failed`` requests; the failed ones have no TTFT."""
    n = ttft.size + failed
    col = np.concatenate([ttft, np.full(failed, np.nan)])
    ok = np.concatenate([np.ones(ttft.size, bool), np.zeros(failed, bool)])
    return ProbeSamples(
        rate=rate,
        columns={"ttft_from_intended_ms": col, "e2e_from_intended_ms": col + 10, "tpot_ms": np.full(n, 5.0)},
        ok=ok,
        itl=np.full(n * 3, 5.0),
        dir=f"p-{rate}",
        client_cpu_pct=cpu,
    )


def spread(centre: float, n: int = 100, width: float = 0.1) -> np.ndarray:
    """``n`` values evenly spread ±``width`` around ``centre`` (deterministic)."""
    return np.linspace(centre * (1 - width), centre * (1 + width), n)


def straddling(limit: float = 100.0) -> np.ndarray:
    """P95 of these is above ``limit`` but its interval (the 90th to the 100th of 100) holds it."""
    return np.linspace(1.0, limit * 1.05, 100)


def test_probe_verdicts_pass_fail_inconclusive_and_attainment() -> None:
    terms = parse_slo("ttft_from_intended_p95<=100,error_rate<=0.05")
    limits = resolve_limits(terms, probe(1, spread(50)))
    ok = judge_probe(1, terms, limits, probe(1, spread(50)), 0.95)
    assert ok.verdict == "pass" and [t.verdict for t in ok.terms] == ["pass", "pass"]
    assert ok.terms[0].attainment == 1.0 and ok.terms[0].attainment_lo is not None
    assert ok.terms[0].lo is not None and ok.terms[0].hi is not None
    assert ok.terms[0].lo <= ok.terms[0].value <= ok.terms[0].hi <= 100  # type: ignore[operator]

    slow = judge_probe(2, terms, limits, probe(2, spread(300)), 0.95)
    assert slow.verdict == "fail" and slow.terms[0].verdict == "fail"
    assert slow.terms[0].attainment == 0.0
    assert "ttft_from_intended_p95" in (slow.note or "")

    # Values straddling the limit: the interval holds it, the probe cannot be judged.
    edge = judge_probe(3, terms, limits, probe(3, straddling()), 0.95)
    assert edge.terms[0].verdict == "inconclusive" and edge.verdict == "inconclusive"

    # Failed requests count against attainment and the error rate.
    errs = judge_probe(4, terms, limits, probe(4, spread(50, 70), failed=30), 0.95)
    assert errs.terms[1].verdict == "fail" and errs.terms[1].value == pytest.approx(0.3)
    assert errs.terms[0].attainment == pytest.approx(0.7)


def test_every_request_failing_fails_the_latency_term_too() -> None:
    terms = parse_slo("ttft_from_intended_p95<=100")
    result = judge_probe(1, terms, [100.0], probe(1, np.empty(0), failed=50), 0.95)
    assert result.verdict == "fail" and result.terms[0].value is None and result.terms[0].attainment == 0.0


def test_a_failure_with_the_client_cpu_saturated_is_inconclusive() -> None:
    terms = parse_slo("ttft_from_intended_p95<=100")
    result = judge_probe(1, terms, [100.0], probe(1, spread(300), cpu=97.0), 0.95)
    assert result.verdict == "inconclusive" and "client-bound" in (result.note or "")


def test_relative_limit_is_the_reference_probes_value_times_the_factor() -> None:
    terms = parse_slo(SLO95)
    ref = probe(1, spread(40))
    limits = resolve_limits(terms, ref)
    assert limits[0] == pytest.approx(3 * float(np.sort(spread(40))[94]))
    assert limits[1] == 0.05


# ------------------------------------------------------------------------------------------ fit


def test_isotonic_pools_adjacent_violators() -> None:
    assert isotonic_increasing([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert isotonic_increasing([5, 4, 3]) == [4, 4, 4]
    assert isotonic_increasing([1, 2, 3]) == [1, 2, 3]
    assert isotonic_increasing([]) == []


def test_crossing_interpolates_inside_the_bracket() -> None:
    assert crossing([1, 2, 4], [10, 20, 60], 40, 2, 4) == pytest.approx(3.0)
    assert crossing([1, 2, 4], [10, 20, 30], 40, 2, 4) is None  # does not bind
    assert crossing([1, 2, 4], [10, 50, 60], 40, 2, 4) == 2  # already beyond at low
    # A noisy dip is pooled away before interpolating: (30, 20) → (25, 25).
    assert crossing([1, 2, 3, 4], [10, 30, 20, 60], 40, 3, 4) == pytest.approx(3 + 15 / 35)


# ------------------------------------------------------------------------------------------ search


def queue_model(capacity: float, *, base: float = 50.0, cliff_errors: bool = False):
    """A target of known capacity: flat TTFT below it; above it a queue grows (from-intended TTFT
    climbs with the excess), or (``cliff_errors``) it sheds half the requests with errors."""
    calls: list[float] = []

    def measure(rate: float) -> ProbeSamples:
        calls.append(rate)
        if rate <= capacity:
            return probe(rate, spread(base))
        if cliff_errors:
            return probe(rate, spread(base, 50), failed=50)
        return probe(rate, spread(base * (1 + 100 * (rate / capacity - 1))))

    return measure, calls


def test_search_brackets_then_bisects_and_finds_the_known_capacity() -> None:
    measure, calls = queue_model(8.0)
    result = search(measure, parse_slo(SLO95), start=1.0, resolution=0.1)
    assert calls[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]  # ×2 until a probe fails
    assert result.exit_code == 0 and result.bounded
    assert result.low <= 8.0 < result.high  # type: ignore[operator]
    assert result.high / result.low <= 1.1  # type: ignore[operator]
    assert result.low <= result.capacity_rps <= result.high  # type: ignore[operator]
    assert result.reference == "p-1.0"
    assert result.probes[0].terms[0].limit == pytest.approx(3 * float(np.sort(spread(50))[94]))
    CapacityResult.model_validate(result.model_dump(mode="json"))  # the JSON round-trips


def test_bracket_ends_are_the_probes_rounded_rates() -> None:
    """A start rate with more digits than a probe keeps (2.48712… → 2.487): the bracket's low end is
    the probe's own rate, so a cliff between it and the failing probe is found, not a crash."""
    # 2.487 and 4.974 pass, every bisection probe above 5 fails: the low end is a grown rate.
    measure, calls = queue_model(5.0, cliff_errors=True)
    result = search(measure, parse_slo(SLO95), start=2.4871234, resolution=0.1)
    assert calls[0] == 2.487 and result.low in [p.rate for p in result.probes]
    assert result.cliff and result.cliff_rates == [result.low, result.high]


def test_every_probe_passing_up_to_max_rate_is_a_lower_bound() -> None:
    measure, calls = queue_model(100.0)
    result = search(measure, parse_slo("ttft_from_intended_p95<=3x"), start=2.0, max_rate=10.0)
    assert calls == [2.0, 4.0, 8.0, 10.0]
    assert (result.capacity_rps, result.low, result.high, result.bounded) == (10.0, 10.0, None, False)
    assert result.exit_code == 0 and "at least" in result.reason


def test_max_probes_spent_while_growing_is_a_lower_bound_too() -> None:
    measure, calls = queue_model(100.0)
    result = search(measure, parse_slo("ttft_from_intended_p95<=3x"), start=1.0, max_probes=3)
    assert calls == [1.0, 2.0, 4.0] and not result.bounded and result.low == 4.0
    assert "--max-probes 3" in result.reason


def test_no_rate_meets_an_absolute_slo() -> None:
    measure, calls = queue_model(1.0)
    result = search(measure, parse_slo("ttft_from_intended_p95<=100"), start=4.0)
    assert calls == [4.0]
    assert (result.capacity_rps, result.low, result.high, result.bounded) == (0.0, 0.0, 4.0, True)
    assert result.exit_code == int(ExitCode.CHECK_FAILED) and "no rate meets the SLO" in result.reason


def test_a_target_failing_everything_meets_no_slo_and_says_why() -> None:
    def measure(rate: float) -> ProbeSamples:
        return probe(rate, np.empty(0), failed=100)

    result = search(measure, parse_slo(SLO95), start=1.0)
    assert result.capacity_rps == 0 and result.exit_code == 1
    assert "error_rate 100.00 %" in result.reason


def test_an_inconclusive_lowest_rate_cannot_be_judged() -> None:
    def measure(rate: float) -> ProbeSamples:
        return probe(rate, straddling())

    result = search(measure, parse_slo("ttft_from_intended_p95<=100"), start=1.0)
    assert result.exit_code == int(ExitCode.UNJUDGEABLE) and result.high_verdict == "inconclusive"


def test_errors_jumping_from_none_to_many_are_a_cliff() -> None:
    measure, _ = queue_model(8.0, cliff_errors=True)
    result = search(measure, parse_slo(SLO95), start=1.0)
    assert result.cliff and result.cliff_term == "error_rate"
    assert result.cliff_rates == [result.low, result.high]
    assert result.low <= 8.0 < result.high  # type: ignore[operator]


def test_a_gradual_knee_is_not_a_cliff() -> None:
    # Latency rises steadily with load: within half the limit nowhere near the knee.
    def measure(rate: float) -> ProbeSamples:
        return probe(rate, spread(40 * rate))

    result = search(measure, parse_slo("ttft_from_intended_p95<=400"), start=1.0, resolution=0.05)
    assert result.bounded and not result.cliff
    assert 8.0 <= result.capacity_rps <= 10.0
    # The fitted crossing lies inside the bracket and near where 40·r·1.1-ish reaches 400.
    assert result.low <= result.capacity_rps <= result.high  # type: ignore[operator]


def test_bisection_stops_at_max_probes_and_says_so() -> None:
    measure, calls = queue_model(8.0)
    result = search(
        measure, parse_slo("ttft_from_intended_p95<=3x"), start=1.0, max_probes=6, resolution=0.01
    )
    assert len(calls) == 6 and result.bounded
    assert "--max-probes 6 spent" in result.reason
    assert math.isfinite(result.capacity_rps)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"start": 0.0}, "--min-rate"),
        ({"start": 5.0, "max_rate": 2.0}, "--min-rate"),
        ({"growth": 1.0}, "--growth"),
    ],
)
def test_bad_search_options_are_config_errors(kwargs: dict, field: str) -> None:
    measure, _ = queue_model(8.0)
    args = {"start": 1.0, **kwargs}
    with pytest.raises(ConfigError) as err:
        search(measure, parse_slo("ttft_from_intended_p95<=3x"), **args)
    assert err.value.field == field


def test_until_precision_watches_the_slo_percentiles_and_never_stops_below_what_can_pass() -> None:
    """``harness capacity --until-precision``: a probe watches its SLO's percentile terms (TTFT and E2E
    from intended send, as judged) and may not stop before the fewest requests every term can pass
    with; an SLO without a percentile term watches nothing."""
    terms = parse_slo("ttft_from_intended_p50<=3x,tpot_p90<=40,error_rate<=0.1")
    assert precision_on(terms) == "ttft_from_intended_ms:50,tpot_ms:90"
    need = probe_min_requests(terms, 0.95)
    check_probe_size(terms, need, 0.95)  # that many can pass every term …
    with pytest.raises(ConfigError):
        check_probe_size(terms, need - 1, 0.95)  # … one fewer cannot
    assert precision_on(parse_slo("error_rate<=0.1")) is None


def test_capacity_refuses_a_bad_until_precision_before_starting_anything(tmp_path) -> None:
    from tests.gates.factory import harness_cli

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("")
    res = harness_cli(
        "capacity", "--url", "http://127.0.0.1:9", "--corpus", str(corpus), "--until-precision", "abc",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert res.returncode == int(ExitCode.CONFIG), res.stderr
    assert "--until-precision" in res.stderr and not (tmp_path / "out").exists()


def test_the_default_slo_is_said_as_the_code_has_it(repo_root: Path) -> None:
    """Both commands show DEFAULT_SLO as --slo's default (the recipe field's, declared once); the docs
    that repeat it must agree."""
    import typer

    from harness.cli import build_app

    commands = typer.main.get_command(build_app()).commands  # type: ignore[attr-defined]
    for name in ("run", "capacity"):
        (slo,) = [p for p in commands[name].params if p.name == "slo"]
        assert slo.show_default == DEFAULT_SLO, name
    for doc in ("docs/capacity.md",):
        assert f"`{DEFAULT_SLO}`" in (repo_root / doc).read_text(encoding="utf-8"), doc


# ------------------------------------------------------------------------------------------ errors
# Errors are judged, never hidden: a target that answers errors has an error rate (count, share,
# interval) in the answer, not an "unreachable" (exit 5) or a bare "cannot be judged" (exit 6).


def test_errors_at_the_lowest_rate_are_the_answer_with_their_interval() -> None:
    """5 of 40 failed: the error term straddles 10 % and alone keeps the lowest rate from passing."""

    def measure(rate: float) -> ProbeSamples:
        return probe(rate, spread(50, 35), failed=5)

    cal = Calibration(requests=4, errors=1, first_error="HTTP 500", service_ms=10.0, start_rate=1.0)
    result = search(measure, parse_slo(SLO50), start=1.0, calibration=cal)
    assert result.exit_code == int(ExitCode.UNJUDGEABLE) and result.capacity_rps == 0
    assert result.limited_by_errors and result.high_verdict == "inconclusive"
    errors = result.errors
    assert errors is not None and (errors.errors, errors.requests) == (6, 44)  # calibration + the probe
    assert errors.lo is not None and errors.hi is not None and errors.lo < 6 / 44 < errors.hi
    assert "because of the target's errors" in result.reason
    assert "6 of 44 requests failed: error rate 13.64 % [" in result.reason
    assert result.calibration == cal and result.probes[0].errors == 5
    CapacityResult.model_validate(result.model_dump(mode="json"))


def test_a_latency_failure_is_not_laid_on_errors() -> None:
    def measure(rate: float) -> ProbeSamples:
        return probe(rate, spread(300, 35), failed=5)

    result = search(measure, parse_slo("ttft_from_intended_p50<=100,error_rate<=0.1"), start=1.0)
    assert result.exit_code == int(ExitCode.CHECK_FAILED) and not result.limited_by_errors
    assert "5 of 40 requests failed" in result.reason  # still named


def test_errors_count_where_the_target_was_not_overloaded() -> None:
    """A server that sheds half its load past capacity: those errors are the overload's and stay in
    the failing probes' rows; the calibration's error (one at a time) is the target's own."""
    measure, _ = queue_model(8.0, cliff_errors=True)
    cal = Calibration(requests=4, errors=1, service_ms=10.0, start_rate=1.0)
    result = search(
        measure,
        parse_slo(SLO95),
        start=1.0,
        calibration=cal,
        resolution=0.5,
    )
    assert result.exit_code == 0 and result.capacity_rps > 0 and not result.limited_by_errors
    sustained = [p for p in result.probes if p.rate <= result.low]
    assert all(p.errors == 0 for p in sustained) and any(p.errors for p in result.probes)
    assert result.errors is not None
    assert (result.errors.errors, result.errors.requests) == (1, 4 + sum(p.requests for p in sustained))
    assert "the target answered errors: 1 of" in result.reason


def test_no_errors_no_error_clause() -> None:
    measure, _ = queue_model(8.0)
    result = search(measure, parse_slo("ttft_from_intended_p95<=3x"), start=1.0)
    assert result.errors is not None and result.errors.errors == 0 and "errors" not in result.reason


@pytest.mark.parametrize(
    ("slo", "code"),
    [
        ("ttft_from_intended_p50<=3x,error_rate<=0.1", ExitCode.CHECK_FAILED),
        ("ttft_from_intended_p50<=3x", ExitCode.UNJUDGEABLE),
    ],
)
def test_every_calibration_request_failing_is_judged_like_a_probe(slo: str, code: ExitCode) -> None:
    """4 of 4 answered 500: [39.8 %, 100 %] is beyond a 10 % error term (exit 1); with no error term
    and only a relative latency one nothing can be judged (exit 6). Either way the reason is the error
    rate, and no rate was probed."""
    cal = Calibration(
        requests=4, errors=4, first_error="HTTP 500: injected", service_ms=None, start_rate=None
    )
    result = unprobed(parse_slo(slo), cal, confidence=0.95, resolution=0.1, slo_text=slo)
    assert result.exit_code == int(code) and result.limited_by_errors and result.probes == []
    assert result.capacity_rps == 0 and result.errors is not None and result.errors.errors == 4
    assert (
        "every one of the 4 calibration requests" in result.reason and "HTTP 500: injected" in result.reason
    )
    assert "4 of 4 requests failed: error rate 100.00 % [" in result.reason
    assert answer_line(result).startswith("capacity: none")
    CapacityResult.model_validate(result.model_dump(mode="json"))


# ---- the runner's calibration against a target that answers errors (the probes faked)


def _runner(
    tmp_path: Path, url: str, slo: str = "ttft_from_intended_p50<=3x,error_rate<=0.1"
) -> CapacityRunner:
    recipe = Recipe.model_validate({
        "target": {"url": url},
        "capacity": {"slo": slo, "probe_requests": 40, "calibration_requests": 4, "flush": False},
    })  # fmt: skip
    return CapacityRunner(CapacitySpec(recipe, out=tmp_path / "cap"), Console(file=io.StringIO()))


def _requests(tmp_path: Path) -> list[RequestSpec]:
    corpus = make_corpus(tmp_path / "corpus.jsonl", 4)
    return prepare_requests(CorpusRecord.model_validate_json(x) for x in corpus.read_text().splitlines())


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The rates the probes were asked for; each probe (Locust faked) sends 40 requests, 5 failed."""
    rates: list[float] = []

    class FakeProber:
        def __init__(self, runner: object, target: object) -> None:
            pass

        def __call__(self, rate: float) -> ProbeSamples:
            rates.append(rate)
            return probe(rate, spread(50, 35), failed=5)

    monkeypatch.setattr(capacity, "_LocustProber", FakeProber)
    return rates


def test_a_failed_calibration_request_is_counted_not_unreachable(tmp_path, probed) -> None:
    """Every 4th request answered 500 (the 4th of the calibration): the calibration goes on, starts
    from the others' service time, and its error is pooled with the probe's in capacity.json."""
    with CapacityServer(Capacity(slots=4, hold_s=0.05, first_token_s=0.01, error_share=0.25)) as srv:
        runner = _runner(tmp_path, srv.url)
        result = runner.measure(Target(TargetClient(srv.url)), requests=_requests(tmp_path))
        errored = srv.errored
    assert errored == 1
    cal = result.calibration
    assert cal is not None and (cal.requests, cal.errors) == (4, 1) and "HTTP 500" in (cal.first_error or "")
    assert cal.start_rate is not None and probed == [float(f"{cal.start_rate:.4g}")]
    assert result.exit_code == int(ExitCode.UNJUDGEABLE) and result.limited_by_errors
    assert result.errors is not None and (result.errors.errors, result.errors.requests) == (6, 44)
    written = read_capacity(tmp_path / "cap" / "capacity.json")
    assert written.errors == result.errors and written.calibration == cal
    assert "6 of 44 requests failed" in written.reason


def test_a_target_answering_only_errors_gets_its_error_rate_not_exit_5(tmp_path, probed) -> None:
    with CapacityServer(Capacity(error_share=1.0)) as srv:
        runner = _runner(tmp_path, srv.url)
        result = runner.measure(Target(TargetClient(srv.url)), requests=_requests(tmp_path))
    assert probed == []  # nothing to start from: no probe
    assert result.exit_code == int(ExitCode.CHECK_FAILED) and result.limited_by_errors
    assert result.calibration is not None and result.calibration.start_rate is None
    assert "4 of 4 requests failed: error rate 100.00 %" in result.reason
    assert read_capacity(tmp_path / "cap" / "capacity.json").exit_code == int(ExitCode.CHECK_FAILED)


def test_a_target_that_answers_nothing_is_unreachable(tmp_path) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: every connection refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    runner = _runner(tmp_path, url)
    with pytest.raises(UnavailableError, match="none of the 4 calibration requests was answered"):
        runner.measure(Target(TargetClient(url)), requests=_requests(tmp_path))
