"""``harness baseline calibrate``'s runs: one recipe run N times on this machine, in this process.

:func:`run_recipe` runs the :class:`~harness.experiments.recipe.Recipe` as ``harness run`` would (a
paired cold / warm run, :class:`~harness.experiments.paired.PairedRunner`) into ``WORKDIR/cal-K``,
K = 1 … N, replacing what an earlier calibration left there. Exit 0 and 6 are measured runs (6: the
warm check could not decide; the results are still written); any other outcome aborts calibration
with that code. The rule that turns the runs into a baseline is :mod:`harness.gates.calibration`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.common import console as cons
from harness.common.errors import ConfigError, ExitCode, HarnessError
from harness.experiments.recipe import Recipe

RunOnce = Callable[[Recipe, Path, Path | None], int]
"""Run the recipe into a directory (its file, for the record); the exit code (0 or 6: measured)."""


class RunFailed(HarnessError):
    """A calibration run ended with a code other than 0 or 6: calibration stops with that code."""

    def __init__(self, message: str, code: int, *, file: Path | None = None) -> None:
        super().__init__(message, file=file)
        known = {int(c) for c in ExitCode}
        self.exit_code = ExitCode(code) if code in known else ExitCode.UNAVAILABLE


def paired_run(recipe: Recipe, out: Path, source: Path | None) -> int:
    """One paired run of ``recipe`` into ``out`` (an earlier one there replaced); its exit code."""
    from harness.experiments.paired import PairedRunner
    from harness.experiments.paired_spec import PairedSpec

    spec = PairedSpec(recipe, out=out, force=True, source=source)
    record = PairedRunner(spec, cons.err()).run()
    return record.exit_code or 0


def run_recipe(
    recipe: Recipe,
    *,
    runs: int,
    workdir: Path,
    source: Path | None = None,
    say: Callable[[str], None] = print,
    first: int = 1,
    of: int | None = None,
    run_once: RunOnce | None = None,
) -> list[Path]:
    """Run ``recipe`` into ``workdir/cal-K`` for K = ``first`` … ``first + runs − 1``; the output
    directories (``of``: the total the progress lines name, default the last K). ``run_once``
    replaces :func:`paired_run` (a stand-in run in tests).

    Exit 0 or 6: measured. Any other code, or an error, raises :class:`RunFailed` with that code."""
    if recipe.gate.baseline is not None:
        raise ConfigError(
            "calibration writes the baseline: its runs are not gated", field="--gate", hint="leave --gate out"
        )
    once = run_once or paired_run
    workdir.mkdir(parents=True, exist_ok=True)
    last = first + runs - 1
    total = of if of is not None else last
    outs: list[Path] = []
    for k in range(first, last + 1):
        out = workdir / f"cal-{k}"
        say(f"calibration run {k}/{total} → {out}")
        try:
            rc = once(recipe, out, source)
        except HarnessError as exc:
            raise RunFailed(
                f"calibration run {k} of {total} exited {int(exc.exit_code)}: {exc}; nothing was written",
                code=int(exc.exit_code),
                file=out,
            ) from None
        if rc not in (int(ExitCode.OK), int(ExitCode.UNJUDGEABLE)):
            raise RunFailed(
                f"calibration run {k} of {total} exited {rc}; nothing was written", code=rc, file=out
            )
        outs.append(out)
    return outs


def history_runs(folder: Path, *, most: int | None = None, say: Callable[[str], None] = print) -> list[Path]:
    """The earlier runs of a recipe kept in ``folder`` (``--from-runs``): every directory under it, at
    any depth, that is a ``harness run`` output (a measured ``cold`` phase), oldest first by the time
    it started (``run.json``), the newest ``most`` of those measured on the newest run's machine,
    target and recipe. A CI job keeps such a folder by saving each run of main as an artifact
    (docs/ci.md); a run of another machine, target or recipe among them is set aside, and ``say``
    names it with why (a baseline from two machines at once would allow both machines' latencies).
    Fewer than 3 runs: a :class:`ConfigError` (a spread needs them)."""
    from harness.common.io import read_json
    from harness.experiments.paired_record import RUN_FILE, PairedRun
    from harness.gates.calibration import MIN_RUNS
    from harness.gates.fingerprints import summary_differences
    from harness.load.results import RECORDS_FILE
    from harness.load.run_summary import SUMMARY_FILE, read_summary

    if not folder.is_dir():
        raise ConfigError("no such directory", file=folder, field="--from-runs")
    found: list[tuple[str, Path]] = []
    for records in sorted(folder.rglob(f"cold/{RECORDS_FILE}")):
        d = records.parent.parent
        if not (d / "cold" / SUMMARY_FILE).is_file():
            continue  # a phase that never finished: nothing to calibrate from
        started = ""
        if (d / RUN_FILE).is_file():
            started = read_json(d / RUN_FILE, PairedRun, expected="a harness run record").started_at or ""
        found.append((started, d))
    found.sort(key=lambda item: (item[0], str(item[1])))
    dirs = [d for _, d in found]
    if dirs:
        newest = read_summary(dirs[-1] / "cold")
        kept: list[Path] = []
        for d in dirs:
            if diff := summary_differences(newest, read_summary(d / "cold")):
                say(f"set aside {d}: not the newest run's ({dirs[-1]}) {'; '.join(diff[:3])}")
            else:
                kept.append(d)
        dirs = kept[-most:] if most else kept
    if len(dirs) < MIN_RUNS:
        raise ConfigError(
            f"{len(dirs)} runs of the newest run's recipe, target and machine here (directories with "
            f"cold/records.jsonl and cold/summary.json): at least {MIN_RUNS} are needed",
            file=folder,
            field="--from-runs",
        )
    return dirs
