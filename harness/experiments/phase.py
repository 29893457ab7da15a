"""One load phase, the one way every experiment runs one: a :class:`~harness.load.runner.LoadSpec`
launched as a headless Locust child, its progress shown, its exit code turned into one error or
none, and what it recorded read back::

    result = run_phase(load, "the cold phase", ui=ui, timeout_s=600, note=record_it)
    result.summary.requests

``harness run``'s phases, ``harness capacity``'s probes, ``harness ab``'s blocks and the decay sweep's
stages are each a plan and a judgement around this call, not a copy of its plumbing.

What an exit code means (``docs/exit-codes.md``): 0, and 1 (some requests failed or a ladder stage
failed: the gates judge errors), are results; 3, 4, 5 and 7 are the errors they name (a dead target
as its summary describes it); 130 is a phase stopped at its timeout; any phase that wrote no summary
(an option Locust refused, exit 2) is an :class:`UnavailableError` with the log's last lines.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from harness.common.errors import ExitCode, TargetDied, UnavailableError
from harness.experiments.driver import ERRORS_BY_CODE, Ui, log_tail
from harness.load.results import RECORDS_FILE
from harness.load.run_summary import SUMMARY_FILE, RunSummary, read_summary
from harness.load.runner import LoadSpec, run_locust


@dataclass(frozen=True)
class PhaseResult:
    """A finished (or interrupted) phase: where its results are, its exit code, how long it took, and
    its summary (``None`` when it wrote none)."""

    results: Path
    exit_code: int
    seconds: float
    summary: RunSummary | None

    @classmethod
    def read(cls, results: Path, exit_code: int, started: float) -> PhaseResult:
        summary = read_summary(results) if (results / SUMMARY_FILE).exists() else None
        return cls(results, exit_code, round(time.monotonic() - started, 3), summary)

    def line(self, name: str) -> str:
        """``✓ name: N requests, E errors → dir`` (``!`` where the exit code was not 0)."""
        s = self.summary
        assert s is not None
        mark = "[green]✓[/]" if self.exit_code == 0 else "[yellow]![/]"
        extra = f" (exit {self.exit_code}: see {self.results / 'locust.log'})" if self.exit_code else ""
        return (
            f"{mark} {name}: {s.requests} requests, {s.errors} errors{extra}"
            + (", client-bound" if s.client_bound else "")
            + f" → {self.results}"
        )


def run_phase(
    load: LoadSpec,
    name: str,
    *,
    ui: Ui | None = None,
    label: str | None = None,
    total: int | None = None,
    timeout_s: float | None = None,
    hint: str | None = None,
    note: Callable[[PhaseResult], None] | None = None,
) -> PhaseResult:
    """Run ``load`` (its results in its ``results_dir``) as the phase called ``name`` in messages ("the
    cold phase", "probe 3"); raise the error its exit code means, or return what it recorded.

    ``ui`` prints the command line and a progress bar (``label``, ``total`` requests); ``timeout_s``
    stops the child (SIGINT, then a kill) and is an :class:`UnavailableError` with ``hint``; ``note``
    is called with the result before any error is raised, and on Ctrl-C before it propagates, so the
    caller's record of the run holds every phase that ran."""
    results = load.options.results_dir
    if ui is not None:
        ui.say(f"[dim]$ locust {escape(shlex.join(load.command()[3:]))}[/]")
    started = time.monotonic()
    try:
        if ui is not None:
            with ui.phase(label or name, results / RECORDS_FILE, total):
                code = run_locust(load, timeout_s=timeout_s)
        else:
            code = run_locust(load, timeout_s=timeout_s)
    except KeyboardInterrupt:  # run_locust let the child finalize its results first
        if note is not None:
            note(PhaseResult.read(results, int(ExitCode.INTERRUPTED), started))
        raise
    result = PhaseResult.read(results, code, started)
    if note is not None:
        note(result)
    check_phase(result, name, timeout_s=timeout_s, hint=hint)
    return result


def check_phase(
    result: PhaseResult, name: str, *, timeout_s: float | None = None, hint: str | None = None
) -> None:
    """The error ``result``'s exit code means, raised; nothing for a phase that recorded its results."""
    code, log = result.exit_code, result.results / "locust.log"
    if code == int(ExitCode.TARGET_DIED) and result.summary is not None and result.summary.target_died:
        # The summary says what died and when; the log's tail may not.
        raise TargetDied(
            f"{name}: {result.summary.target_died.describe()}", file=result.results / SUMMARY_FILE
        )
    if code in ERRORS_BY_CODE:
        raise ERRORS_BY_CODE[code](f"{name} exited with {code}: {log_tail(log)}", file=log)
    if code == int(ExitCode.INTERRUPTED):
        within = f" within {timeout_s:g} s" if timeout_s is not None else ""
        raise UnavailableError(f"{name} did not end{within} and was stopped", file=log, hint=hint)
    if result.summary is None:
        raise UnavailableError(f"{name} wrote no summary (exit {code}): {log_tail(log)}", file=log)
