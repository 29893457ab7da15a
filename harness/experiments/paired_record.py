"""``OUT/run.json`` of a paired run (:mod:`harness.experiments.paired`): the layout of ``OUT``, the record
rewritten after every step, and the exit code it ends with.

What a CI job and ``harness report`` read back; it changes when what a run reports changes, not when
its steps or its checks do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from rich.console import Console

from harness.common.errors import ExitCode
from harness.common.model import StrictModel
from harness.experiments.capacity_result import ErrorCount
from harness.experiments.recipe import RECIPE_FILE
from harness.experiments.target import FlushOutcome
from harness.experiments.warmcheck import WarmCheck
from harness.gates.judge import GateReport
from harness.load.run_summary import InputRef

PHASES = ("cold", "ladder", "warm")
"""Result directories under ``OUT``, in the order they are written."""
RUN_FILE = "run.json"
WARM_CHECK_FILE = "warm-check.json"
COMPARISON_FILE = "comparison.json"
JUNIT_FILE = "gate.junit.xml"
VERDICT_FILE = "gate.json"
SERVER_DIR = "server"
CAPACITY_DIR = "capacity"
"""Where ``--rate N%`` (or a plan in shares of capacity) measures the capacity first."""
OUTPUTS = (
    *PHASES,
    SERVER_DIR,
    RUN_FILE,
    WARM_CHECK_FILE,
    COMPARISON_FILE,
    JUNIT_FILE,
    VERDICT_FILE,
    CAPACITY_DIR,
    RECIPE_FILE,
)
"""Everything ``harness run`` writes under ``OUT`` (``--force`` removes exactly these)."""


class TargetRecord(StrictModel):
    url: str
    model: str | None = None
    started: bool
    """Whether this run started the server (``harness serve``) or used ``--url``."""
    serve_args: list[str] | None = None
    log: str | None = None


class PhaseRecord(StrictModel):
    """One load run of the paired run."""

    dir: str
    exit_code: int
    """The load run's exit code (docs/exit-codes.md: 1 requests failed or the ladder stopped)."""
    seconds: float
    requests: int | None = None
    errors: int | None = None
    interrupted: bool | None = None
    client_bound: bool | None = None
    stop_reason: str | None = None
    """Why the phase stopped sending (``--until-precision`` / ``--max-duration`` runs)."""


class FlushRecord(StrictModel):
    level: str
    status: str
    detail: str
    answer: dict[str, Any] | None = None

    @classmethod
    def of(cls, f: FlushOutcome) -> FlushRecord:
        return cls(level=f.level, status=f.status, detail=f.detail, answer=f.answer)


class GateRecord(StrictModel):
    verdict: str
    exit_code: int
    headline: str
    junit: str
    verdict_json: str


class CapacityRecord(StrictModel):
    """The capacity a run's load was set relative to (``--rate 50%``, plan stages in shares)."""

    capacity_rps: float
    source: Literal["measured", "given"]
    """Measured first by this run (``OUT/capacity``) or given with ``--capacity``."""
    low: float | None = None
    high: float | None = None
    bounded: bool | None = None
    """``false``: every probe passed, the capacity is at least ``capacity_rps``."""
    file: str | None = None
    """The measurement's ``capacity.json``."""
    rate_share: float | None = None
    rate_rps: float | None = None
    """The absolute constant rate both phases used (``rate_share × capacity_rps``)."""
    plan_shares: bool = False
    """Whether the ladder plan's shares were resolved with it (``--capacity`` to the ladder)."""
    errors: ErrorCount | None = None
    """The target's error rate as the measurement saw it where the target was not overloaded
    (:attr:`harness.experiments.capacity_result.CapacityResult.errors`); judged by the gate's
    ``error_rate`` limits before any phase."""
    limited_by_errors: bool = False
    """The target's errors alone kept the measurement from finding a capacity."""


class PairedRun(StrictModel):
    """``OUT/run.json``: what the paired run did, rewritten after every step."""

    schema_version: int = 1
    started_at: str
    finished_at: str | None = None
    out: str
    inputs: dict[str, InputRef] = Field(default_factory=dict)
    load: dict[str, Any] = Field(default_factory=dict)
    """The load options both phases used (as ``locust`` arguments)."""
    target: TargetRecord | None = None
    flush: list[FlushRecord] = Field(default_factory=list)
    preload: dict[str, Any] | None = None
    """The target's answer to ``POST /cache/preload`` (or why it was skipped)."""
    phases: dict[str, PhaseRecord] = Field(default_factory=dict)
    warm_check: WarmCheck | None = None
    comparison: str | None = None
    gate: GateRecord | None = None
    exit_code: int | None = None
    message: str | None = None
    """Why the run ended with its exit code."""
    interrupted: bool = False
    skipped_levels: list[str] = Field(default_factory=list)
    """Cache levels the target does not expose (404), so this run could neither flush nor check them."""
    capacity: CapacityRecord | None = None
    """The capacity the load was relative to (only with ``--rate N%`` or a plan in shares)."""


def exit_code_of(warm: WarmCheck | None, gate: GateReport | None) -> tuple[ExitCode, str]:
    """The run's exit code and why: a proven regression (1) outranks cannot-judge (6: the warm phase
    was not warm, or a gate could not judge), which outranks pass (0)."""
    if gate is not None and gate.exit_code == int(ExitCode.CHECK_FAILED):
        return ExitCode.CHECK_FAILED, f"gate: {gate.headline()}"
    reasons = []
    if warm is not None and not warm.warm:
        reasons.append(f"the warm phase cannot be called warm ({warm.reason})")
    if gate is not None and gate.exit_code == int(ExitCode.UNJUDGEABLE):
        reasons.append(f"gate: {gate.headline()}")
    if reasons:
        return ExitCode.UNJUDGEABLE, "; ".join(reasons)
    return (
        ExitCode.OK,
        f"gate: {gate.headline()}" if gate is not None else "both phases measured, target warm",
    )


def conclude(record: PairedRun, out: Path, console: Console) -> None:
    """End a command that ran a :class:`PairedRun` by its exit code: a proven regression raises
    :class:`~harness.common.errors.CheckFailed` (exit 1), cannot-judge
    :class:`~harness.common.errors.CannotJudge` (exit 6), both naming ``OUT/run.json``; a pass prints
    its message."""
    from harness.common.errors import CannotJudge, CheckFailed

    code, message = record.exit_code or 0, record.message or ""
    if code == int(ExitCode.CHECK_FAILED):
        raise CheckFailed(message, file=out / RUN_FILE)
    if code == int(ExitCode.UNJUDGEABLE):
        raise CannotJudge(message, file=out / RUN_FILE)
    console.print(f"[green]✓[/] {message}", highlight=False)
