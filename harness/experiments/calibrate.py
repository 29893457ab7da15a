"""``harness baseline calibrate``: run a recipe N times on this machine and write the baseline it passes.

:func:`run_recipe` runs ``harness run <args> --out WORKDIR/cal-K --force`` K = 1 … N times, exactly as
a user would type it (output streamed). Exit 0 and 6 are measured runs (6: the warm check or a
gate could not decide, the results are still written); any other code aborts calibration with
that code. The rule that turns the runs into a baseline is :mod:`harness.gates.calibration`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.common.auth import redact_args
from harness.common.errors import ConfigError, ExitCode, HarnessError

DEFAULT_RUN_COMMAND: tuple[str, ...] = (sys.executable, "-m", "harness.cli", "run")
"""How calibration starts ``harness run`` (this interpreter, so this installation)."""
OWN_OPTIONS = ("--out", "-o", "--force", "--gate")
"""Options calibration sets itself (``--out``, ``--force``) or that make no sense for it (``--gate``)."""


class RunFailed(HarnessError):
    """A calibration run ended with a code other than 0 or 6: calibration stops with that code."""

    def __init__(self, message: str, code: int, *, file: Path | None = None) -> None:
        super().__init__(message, file=file)
        known = {int(c) for c in ExitCode}
        self.exit_code = ExitCode(code) if code in known else ExitCode.UNAVAILABLE


def check_run_args(args: Sequence[str]) -> None:
    """Refuse the options calibration sets itself (:data:`OWN_OPTIONS`)."""
    for a in args:
        name = a.split("=", 1)[0]
        if name in OWN_OPTIONS:
            raise ConfigError(
                f"{name} is set by calibrate itself (each run goes to WORKDIR/cal-K with --force; no gate)",
                field=name,
                hint="give only the recipe after --: "
                "harness baseline calibrate --runs 3 --out FILE -- --corpus …",
            )


def run_recipe(
    args: Sequence[str],
    *,
    runs: int,
    workdir: Path,
    command: Sequence[str] = DEFAULT_RUN_COMMAND,
    say: Callable[[str], None] = print,
    first: int = 1,
    of: int | None = None,
) -> list[Path]:
    """Run ``command args --out workdir/cal-K --force`` for K = ``first`` … ``first + runs − 1``; the
    output directories (``of``: the total the progress lines name, default the last K).

    Exit 0 or 6: measured. Any other exit code raises :class:`RunFailed` with that code."""
    check_run_args(args)
    workdir.mkdir(parents=True, exist_ok=True)
    last = first + runs - 1
    total = of if of is not None else last
    outs: list[Path] = []
    for k in range(first, last + 1):
        out = workdir / f"cal-{k}"
        cmd = [*command, *args, "--out", str(out), "--force"]
        say(f"calibration run {k}/{total}: $ {shlex.join(redact_args(cmd))}")
        rc = subprocess.run(cmd, check=False).returncode  # output streams to ours
        if rc not in (int(ExitCode.OK), int(ExitCode.UNJUDGEABLE)):
            raise RunFailed(
                f"calibration run {k} of {total} exited {rc}; nothing was written", code=rc, file=out
            )
        outs.append(out)
    return outs
