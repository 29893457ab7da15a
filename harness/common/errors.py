"""The harness's one domain error type and its documented exit codes.

Every user mistake (a bad file, a bad setting, an unreachable target) is raised as a
:class:`HarnessError` that names where the problem is (file, line or row, field) and what was
expected. The CLI prints it as one line and exits with :attr:`HarnessError.exit_code`; it never
shows a traceback for these. Bugs in the harness itself still surface as tracebacks.

Exit codes (also in ``docs/exit-codes.md``):

====  ===================================================================
0     success
1     a check failed: a CI gate, a quality threshold, a validation
2     bad command line (unknown option, missing argument)
3     bad input data: a file that is missing, empty, binary or malformed
4     bad configuration: settings, environment variables, model directory
5     a dependency is unavailable: the target server, Redis, a port
6     a run cannot be judged: too few samples, NaN, client-bound, interrupted
7     the target died during the run (it answered, then stopped answering)
130   interrupted (Ctrl-C)
====  ===================================================================
"""

from __future__ import annotations

from enum import IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    """Process exit codes of the ``harness`` CLI."""

    OK = 0
    CHECK_FAILED = 1
    USAGE = 2
    INPUT = 3
    CONFIG = 4
    UNAVAILABLE = 5
    UNJUDGEABLE = 6
    TARGET_DIED = 7
    INTERRUPTED = 130


class HarnessError(Exception):
    """A problem the user can fix, located as precisely as we know.

    Args:
        message: what is wrong and, where useful, what was expected.
        file: the file the problem is in.
        line: 1-based line (JSONL, text) or row (CSV, data rows counted from 1) number.
        field: the field, column or JSON path at fault (``resourceSpans[0].scopeSpans``).
        hint: one short suggestion for the fix.
    """

    exit_code: ExitCode = ExitCode.INPUT

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.field = field
        self.hint = hint

    @property
    def location(self) -> str:
        """``file:line: field`` with whatever parts are known, or an empty string."""
        where = ""
        if self.file is not None:
            where = self.file
            if self.line is not None:
                where += f":{self.line}"
        elif self.line is not None:
            where = f"line {self.line}"
        if self.field:
            where = f"{where}: field '{self.field}'" if where else f"field '{self.field}'"
        return where

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.hint:
            text += f" (hint: {self.hint})"
        return text

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form, for ``--json`` outputs and skip reports."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "field": self.field,
            "hint": self.hint,
            "exit_code": int(self.exit_code),
        }


class InputError(HarnessError):
    """Input data is missing, unreadable or not of the expected shape (exit 3)."""

    exit_code = ExitCode.INPUT


class ConfigError(HarnessError):
    """A setting, environment variable or model directory is wrong (exit 4)."""

    exit_code = ExitCode.CONFIG


class UnavailableError(HarnessError):
    """A dependency (target server, Redis, port) cannot be reached (exit 5)."""

    exit_code = ExitCode.UNAVAILABLE


class CheckFailed(HarnessError):
    """A gate, threshold or validation did not pass (exit 1)."""

    exit_code = ExitCode.CHECK_FAILED


class CannotJudge(HarnessError):
    """A run cannot be judged against a gate: too few samples, NaN, client-bound, interrupted (exit 6).

    Distinct from :class:`CheckFailed` (a gate proved a regression) and from a usage error (exit 2),
    so a CI job can tell "slower" from "not measured well enough" from "called wrongly".
    """

    exit_code = ExitCode.UNJUDGEABLE


class TargetDied(HarnessError):
    """The target answered, then died during a run: its requests stopped being answered and its health
    check proved it gone (exit 7).

    Distinct from :class:`UnavailableError` (never reachable, exit 5) and from failed requests (a gate
    judges those): what the run measured ends where the target did (``summary.json``: ``target_died``)."""

    exit_code = ExitCode.TARGET_DIED
