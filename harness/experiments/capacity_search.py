"""The capacity search: bracket the knee, bisect it, and fit where each SLO term crosses its limit.

:func:`search` takes the probe as a function (``rate → ProbeSamples``), so it is tested without Locust:
from the start rate the rate grows ×``growth`` until a probe does not pass, which brackets the knee;
then bisection (geometric mean) between the highest passing and the lowest not-passing rate until
``high / low ≤ 1 + resolution`` or ``max_probes`` is spent. A monotone (isotonic) fit of each term
against the offered rate gives the interpolated crossing inside the bracket. **A cliff**: between the
last passing and the first failing rate some term jumps from comfortably within (≤ half its limit) to
far beyond (≥ 3× its limit; an error rate ≥ max(3× the limit, 10 %)).

**Errors.** A probe whose requests got error answers measured an error rate: its ``error_rate`` term
is judged like any other. The answer also pools the errors where the target was not overloaded (the
calibration and the probes up to ``low``, or the lowest probe when none passed) into
:attr:`~harness.experiments.capacity_result.CapacityResult.errors`, names them in its reason, and
says when they alone kept every rate from passing (``limited_by_errors``). A calibration whose every
request failed while the target answered (:func:`unprobed`) is judged against the SLO like a probe:
the error rate is the answer, not "unreachable".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from harness.common.errors import ConfigError, ExitCode
from harness.experiments.capacity_result import Calibration, CapacityResult, ErrorCount
from harness.gates.slo import ProbeResult, ProbeSamples, SloTerm, judge_probe, resolve_limits

CLIFF_FACTOR = 3.0
"""A failing probe this many times beyond a limit, next to a passing one within half of it: a cliff."""
CLIFF_MIN_ERROR_RATE = 0.10


def isotonic_increasing(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool adjacent
    violators): latency and errors do not fall when the offered rate rises, so a dip is noise."""
    w = [1.0] * len(values) if weights is None else [float(x) for x in weights]
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, wt in zip(values, w, strict=True):
        blocks.append([float(v), wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            b = blocks.pop()
            a = blocks[-1]
            total = a[1] + b[1]
            a[0] = (a[0] * a[1] + b[0] * b[1]) / total
            a[1] = total
            a[2] += b[2]
    out: list[float] = []
    for mean, _, count in blocks:
        out += [mean] * int(count)
    return out


def crossing(
    rates: Sequence[float], values: Sequence[float], limit: float, low: float, high: float
) -> float | None:
    """Where the isotonic fit of ``values`` against ``rates`` crosses ``limit`` inside ``[low, high]``
    (linear between the fitted values at ``low`` and ``high``); ``None`` when it does not cross there
    (the term does not bind in the bracket)."""
    pts = sorted((r, v) for r, v in zip(rates, values, strict=True) if math.isfinite(v))
    if not pts:
        return None
    fitted = isotonic_increasing([v for _, v in pts])
    at = dict(zip([r for r, _ in pts], fitted, strict=True))
    if low not in at or high not in at:
        return None
    f_lo, f_hi = at[low], at[high]
    if f_hi <= limit:
        return None
    if f_lo >= limit:
        return low
    return low + (limit - f_lo) / (f_hi - f_lo) * (high - low)


def search(
    measure: Callable[[float], ProbeSamples],
    terms: Sequence[SloTerm],
    *,
    start: float,
    max_rate: float | None = None,
    growth: float = 2.0,
    resolution: float = 0.10,
    max_probes: int = 12,
    confidence: float = 0.95,
    on_probe: Callable[[ProbeResult, list[ProbeResult]], None] | None = None,
    slo_text: str = "",
    calibration: Calibration | None = None,
) -> CapacityResult:
    """Bracket the knee by growing the rate ×``growth``, then bisect it (see the module docstring).

    ``measure(rate)`` runs one probe; ``on_probe(result, so_far)`` is called after each (progress,
    ``capacity.json`` rewritten); ``calibration``: the one that picked ``start``, whose errors count
    with the probes'.
    """
    if start <= 0 or (max_rate is not None and start > max_rate):
        raise ConfigError(f"the start rate {start:g} must be in (0, --max-rate]", field="--min-rate")
    if growth <= 1:
        raise ConfigError("must be above 1", field="--growth")
    if resolution <= 0:
        raise ConfigError("must be above 0", field="--resolution")
    if max_probes < 1:
        raise ConfigError("at least one probe", field="--max-probes")
    probes: list[ProbeResult] = []
    limits: list[float | None] = []

    def run(rate: float) -> ProbeResult:
        nonlocal limits
        rate = float(f"{rate:.4g}")  # a rate a person can type again (and a probe directory's name)
        samples = measure(rate)
        if not probes:
            limits = resolve_limits(terms, samples)
        result = judge_probe(len(probes) + 1, terms, limits, samples, confidence)
        probes.append(result)
        if on_probe is not None:
            on_probe(result, probes)
        return result

    first = run(start)
    # Rates as the probes report them (rounded), so that a bracket end always names a probe.
    low: float | None = first.rate if first.verdict == "pass" else None
    high: ProbeResult | None = None if low is not None else first
    while low is not None and high is None and len(probes) < max_probes:
        if max_rate is not None and low >= max_rate:
            break
        rate = low * growth if max_rate is None else min(low * growth, max_rate)
        p = run(rate)
        if p.verdict == "pass":
            low = p.rate
        else:
            high = p
    while (
        low is not None and high is not None and high.rate / low > 1 + resolution and len(probes) < max_probes
    ):
        p = run(math.sqrt(low * high.rate))
        if p.verdict == "pass":
            low = p.rate
        else:
            high = p
    return _answer(
        terms,
        limits,
        probes,
        low,
        high,
        max_rate=max_rate,
        max_probes=max_probes,
        confidence=confidence,
        resolution=resolution,
        slo_text=slo_text,
        calibration=calibration,
    )


def sustained_errors(
    probes: Sequence[ProbeResult], low: float | None, calibration: Calibration | None, confidence: float
) -> ErrorCount:
    """The errors of the requests sent where the target was not overloaded: the calibration's (one at
    a time) and the probes' at rates up to ``low``, or the lowest probe's when none passed (the start
    rate is half of what one stream sustains). A probe above ``low`` may have been refused for the
    overload itself (a server shedding load answers 503): its errors stay in its row, since they may be
    the overload's rather than the target's own."""
    upto = low if low is not None else min((p.rate for p in probes), default=0.0)
    counted = [p for p in probes if p.rate <= upto]
    errors = sum(p.errors for p in counted) + (calibration.errors if calibration else 0)
    requests = sum(p.requests for p in counted) + (calibration.requests if calibration else 0)
    return ErrorCount.of(errors, requests, confidence)


def _errors_alone(probe: ProbeResult) -> bool:
    """Whether the errors alone would give the probe its verdict: the ``error_rate`` term's verdict is
    the probe's (the worst of its terms), or every request failed (no latency sample at all)."""
    if probe.requests > 0 and probe.errors == probe.requests:
        return True
    return any(t.metric == "error_rate" and t.verdict == probe.verdict for t in probe.terms)


def _answer(
    terms: Sequence[SloTerm],
    limits: Sequence[float | None],
    probes: list[ProbeResult],
    low: float | None,
    high: ProbeResult | None,
    *,
    max_rate: float | None,
    max_probes: int,
    confidence: float,
    resolution: float,
    slo_text: str,
    calibration: Calibration | None = None,
) -> CapacityResult:
    errors = sustained_errors(probes, low, calibration, confidence)
    common = {
        "slo": slo_text or ",".join(t.text for t in terms),
        "terms": list(terms),
        "limits": list(limits),
        "confidence": confidence,
        "resolution": resolution,
        "probes": probes,
        "reference": probes[0].dir if probes else None,
        "calibration": calibration,
        "errors": errors,
    }
    # Errors where the target was not overloaded are named in every answer, with their interval.
    seen = f"; the target answered errors: {errors.text()}" if errors.errors else ""
    if low is None:
        assert high is not None
        code = ExitCode.CHECK_FAILED if high.verdict == "fail" else ExitCode.UNJUDGEABLE
        what = "no rate meets the SLO" if high.verdict == "fail" else "the lowest rate cannot be judged"
        by_errors = high.verdict != "pass" and _errors_alone(high)
        if by_errors:
            what += " because of the target's errors"
        return CapacityResult(
            capacity_rps=0.0,
            low=0.0,
            high=high.rate,
            high_verdict=high.verdict,
            bounded=True,
            limited_by_errors=by_errors,
            reason=f"{what}: at {high.rate:.4g} req/s (the lowest probed), {high.note}{seen}",
            exit_code=int(code),
            **common,
        )
    if high is None:
        why = (
            f"--max-rate {max_rate:.4g} req/s reached"
            if max_rate is not None and low >= max_rate
            else f"--max-probes {max_probes} spent"
        )
        return CapacityResult(
            capacity_rps=low,
            low=low,
            high=None,
            bounded=False,
            reason=f"every probe passed up to {low:.4g} req/s ({why}): capacity is at least that{seen}",
            exit_code=0,
            **common,
        )
    # The fitted crossing: the lowest of each term's, among those that bind inside the bracket.
    rates = [p.rate for p in probes]
    crossings: list[float] = []
    for i, lim in enumerate(limits):
        if lim is None:
            continue
        vals = [math.nan if (v := p.terms[i].value) is None else v for p in probes]
        c = crossing(rates, vals, lim, low, high.rate)
        if c is not None:
            crossings.append(c)
    capacity = min(max(min(crossings), low), high.rate) if crossings else low
    cliff_term = _cliff(probes, limits, low, high)
    narrow = high.rate / low <= 1 + resolution
    reason = (
        f"{low:.4g} req/s passes and {high.rate:.4g} req/s "
        + ("fails" if high.verdict == "fail" else "is inconclusive (counted as not passing)")
        + f" ({high.note})"
        + (
            ""
            if narrow
            else f"; --max-probes {max_probes} spent before the bracket narrowed to {resolution:.0%}"
        )
    )
    if cliff_term is not None:
        reason += f"; a cliff in {cliff_term} between them"
    reason += seen
    return CapacityResult(
        capacity_rps=capacity,
        low=low,
        high=high.rate,
        high_verdict=high.verdict,
        bounded=True,
        cliff=cliff_term is not None,
        cliff_rates=[low, high.rate] if cliff_term is not None else None,
        cliff_term=cliff_term,
        reason=reason,
        exit_code=0,
        **common,
    )


def unprobed(
    terms: Sequence[SloTerm],
    calibration: Calibration,
    *,
    confidence: float,
    resolution: float,
    slo_text: str = "",
) -> CapacityResult:
    """The answer when every calibration request failed though the target answered them: there is no
    service time to start from, and the calibration is the measurement. Its requests are judged
    against the SLO as a probe's would be (the error rate with its interval; a latency term has no
    sample, so an absolute one fails and a relative one cannot be judged): exit 1 when a term fails,
    6 otherwise, the reason naming the error rate either way."""
    n = calibration.requests
    columns = {t.column: np.full(n, np.nan) for t in terms if t.column is not None and t.column != "itl_ms"}
    samples = ProbeSamples(rate=0.0, columns=columns, ok=np.zeros(n, dtype=bool), itl=np.empty(0))
    judged = judge_probe(0, terms, resolve_limits(terms, samples), samples, confidence)
    failed = judged.verdict == "fail"
    errors = ErrorCount.of(calibration.errors, n, confidence)
    what = "no rate meets the SLO" if failed else "the SLO cannot be judged"
    first = f" (first: {calibration.first_error})" if calibration.first_error else ""
    return CapacityResult(
        capacity_rps=0.0,
        low=0.0,
        high=None,
        bounded=True,
        limited_by_errors=True,
        slo=slo_text or ",".join(t.text for t in terms),
        terms=list(terms),
        limits=[t.limit for t in terms],
        confidence=confidence,
        resolution=resolution,
        probes=[],
        reference=None,
        calibration=calibration,
        errors=errors,
        reason=(
            f"{what} because of the target's errors: every one of the {n} calibration requests sent one "
            f"at a time failed{first}, so no rate was probed; {judged.note}; {errors.text()}"
        ),
        exit_code=int(ExitCode.CHECK_FAILED if failed else ExitCode.UNJUDGEABLE),
    )


def _cliff(
    probes: list[ProbeResult], limits: Sequence[float | None], low: float, high: ProbeResult
) -> str | None:
    """The term that jumps from within half its limit at ``low`` to far beyond it at ``high``."""
    if high.verdict != "fail":
        return None
    below = min(probes, key=lambda p: abs(p.rate - low))  # the passing probe at the bracket's low end
    for i, lim in enumerate(limits):
        if lim is None:
            continue
        a, b = below.terms[i], high.terms[i]
        far = (
            max(CLIFF_FACTOR * lim, CLIFF_MIN_ERROR_RATE) if b.metric == "error_rate" else CLIFF_FACTOR * lim
        )
        # No sample at all on the failing side (every request failed) is as far beyond as it gets.
        beyond = (b.value is None and b.verdict == "fail") or (b.value is not None and b.value >= far)
        if a.value is not None and a.value <= lim / 2 and beyond:
            return b.metric
    return None
