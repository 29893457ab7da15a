"""What a capacity search answers (``OUT/capacity.json``): a small model that reports and the demo
read without the runner that made it.

**Errors are judged, never hidden.** A request the target answered with an error (or, while others
were answered, did not answer) is counted, not taken for an unreachable target: the calibration and
every probe record their errors, and :attr:`CapacityResult.errors` is the target's error rate with its
exact interval (:class:`ErrorCount`, shared with the warm check), which ``harness run`` judges against
its baseline's ``error_rate`` gates before it sends a phase.
"""

from __future__ import annotations

from pathlib import Path

from harness.common.model import StrictModel
from harness.gates.slo import ProbeResult, SloTerm, Verdict

CAPACITY_FILE = "capacity.json"


class ErrorCount(StrictModel):
    """Failed requests among those sent, and their share with its exact (Clopper–Pearson) interval at
    ``confidence``, as the gates' ``error_rate`` computes it
    (:func:`harness.gates.measurement.rate_interval`)."""

    errors: int
    requests: int
    rate: float | None
    """``errors / requests`` (``None``: nothing was sent)."""
    lo: float | None
    hi: float | None
    confidence: float

    @classmethod
    def of(cls, errors: int, requests: int, confidence: float) -> ErrorCount:
        from harness.gates.measurement import rate_interval

        if requests <= 0:
            return cls(errors=0, requests=0, rate=None, lo=None, hi=None, confidence=confidence)
        lo, hi = rate_interval(errors, requests, confidence)
        return cls(
            errors=errors, requests=requests, rate=errors / requests, lo=lo, hi=hi, confidence=confidence
        )

    def text(self) -> str:
        """``3 of 40 requests failed: error rate 7.50 % [1.57 %, 20.39 %] (95 %)``."""
        from harness.gates.metrics import format_interval, format_value

        if self.rate is None:
            return "no request was sent"
        share = f"{format_value(self.rate, 'ratio')} {format_interval(self.lo, self.hi, 'ratio')}"
        return f"{self.errors} of {self.requests} requests failed: error rate {share} ({self.confidence:.0%})"


class Calibration(StrictModel):
    """The sequential calibration that picked the start rate."""

    requests: int
    errors: int = 0
    """Requests that failed: the target answered an error (or did not answer, while others were
    answered). They are the target's error rate one request at a time, not a reason to stop."""
    first_error: str | None = None
    service_ms: float | None
    """Median time of one successful request sent alone (``None``: none succeeded)."""
    start_rate: float | None
    """``None``: every request failed, so no rate was probed
    (:func:`harness.experiments.capacity_search.unprobed`)."""


class CapacityResult(StrictModel):
    """``OUT/capacity.json`` (and ``--json``): the answer, its interval and every probe."""

    schema_version: int = 1
    capacity_rps: float
    """The highest rate that meets every SLO term: the fitted crossing clamped into ``[low, high]``,
    ``low`` when no fit binds there, 0 when not even the lowest rate does."""
    low: float
    """Highest rate whose probe passed (0 when none did)."""
    high: float | None
    """Lowest rate whose probe did not pass (``null``: every probe passed, up to ``--max-rate``)."""
    high_verdict: Verdict | None = None
    """Whether ``high``'s probe failed or was inconclusive."""
    bounded: bool
    """Whether a probe failed above ``low``: ``false`` means capacity is *at least* ``low``."""
    cliff: bool = False
    cliff_rates: list[float] | None = None
    """``[low, high]`` across which a term jumped from within half its limit to 3× beyond it."""
    cliff_term: str | None = None
    errors: ErrorCount | None = None
    """The target's error rate where it was not overloaded: the calibration's requests (one at a
    time) and those of the probes at rates up to ``low`` (the lowest probe when none passed). Errors
    of the probes above are the overload's as much as the target's, and stay in their rows."""
    limited_by_errors: bool = False
    """No rate could be shown to meet the SLO because of the target's errors: the lowest probe's
    ``error_rate`` term alone gives its verdict (or every request failed), or every calibration
    request failed. ``reason`` then names the error rate and its interval."""
    slo: str
    terms: list[SloTerm]
    limits: list[float | None]
    """Each term's absolute limit (relative terms resolved on the reference probe)."""
    confidence: float
    resolution: float
    probes: list[ProbeResult]
    reference: str | None
    """The reference probe's run directory (the first, lowest-rate probe)."""
    calibration: Calibration | None = None
    reason: str
    exit_code: int
    target: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    interrupted: bool = False


def answer_line(result: CapacityResult) -> str:
    """One line: the capacity, its interval, and why."""
    if result.capacity_rps <= 0:
        return f"capacity: none — {result.reason}"
    if not result.bounded:
        return f"capacity: at least {result.low:.4g} req/s — {result.reason}"
    cliff = f", a cliff in {result.cliff_term}" if result.cliff else ""
    return (
        f"capacity: {result.capacity_rps:.4g} req/s (passes at {result.low:.4g}, not at {result.high:.4g}"
        f"{cliff}) under SLO {result.slo}"
    )


def read_capacity(path: str | Path) -> CapacityResult:
    """A ``capacity.json`` written by ``harness capacity`` (a partial one, of an interrupted search, is
    refused: it holds no answer)."""
    from harness.common.io import read_json

    return read_json(path, CapacityResult, expected="a capacity result (harness capacity)")
