"""What a capacity search answers (``OUT/capacity.json``): a small model that reports and the demo
read without the runner that made it."""

from __future__ import annotations

from pathlib import Path

from harness.common.model import StrictModel
from harness.experiments.slo import ProbeResult, SloTerm, Verdict

CAPACITY_FILE = "capacity.json"


class Calibration(StrictModel):
    """The sequential calibration that picked the start rate."""

    requests: int
    service_ms: float
    """Median time of one request sent alone."""
    start_rate: float


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
