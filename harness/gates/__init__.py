"""CI gates on P95 decode latency, TTFT and prefill memory against stored baselines: judging only.

Python API (what ``harness gate`` and ``harness run --gate FILE`` call)::

    from harness.gates import gate_runs

    report = gate_runs({"cold": "runs/x/cold", "warm": "runs/x/warm"}, "baseline.yaml",
                       junit="gate.junit.xml", json_path="gate.json")
    report.exit_code   # 0 pass, 1 a gate failed, 6 a run cannot be judged
    report.headline()  # "PASS: 14 passed, 0 failed, 0 cannot be judged"

Pieces: :mod:`~harness.gates.runs` (result sets as columns), :mod:`~harness.gates.metrics` (the
metric registry), :mod:`~harness.gates.measurement` (a number and its interval),
:mod:`~harness.gates.baseline` (the file, ``baseline update``), :mod:`~harness.gates.judge` (the
decision rule, the JSON verdict), :mod:`~harness.gates.output` (table, JUnit),
:mod:`~harness.gates.noise` (false-alarm estimate), :mod:`~harness.gates.compare` (cold vs warm),
:mod:`~harness.gates.calibration` (the baseline N runs support) and :mod:`~harness.gates.ab` (the
A/B ratio verdict of ``harness ab``; its statistics in :mod:`~harness.gates.ab_stats`). What runs a
target to produce the results judged here is :mod:`harness.experiments`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from harness.gates.baseline import Baseline, Gate, read_baseline
from harness.gates.judge import GateReport, GateResult, judge, read_report_json, write_report_json
from harness.gates.runs import ResultSet, load_result_set, load_result_sets

__all__ = [
    "Baseline",
    "Gate",
    "GateReport",
    "GateResult",
    "ResultSet",
    "gate_runs",
    "judge",
    "load_result_set",
    "load_result_sets",
    "read_baseline",
    "read_report_json",
    "write_report_json",
]


def gate_runs(
    runs: Mapping[str, str | Path],
    baseline: str | Path,
    *,
    junit: str | Path | None = None,
    json_path: str | Path | None = None,
) -> GateReport:
    """Judge labelled run directories against a baseline file; write JUnit/JSON where asked.

    ``runs`` maps labels to run directories (``{"cold": …, "warm": …}`` for a paired run; a gate with
    ``phase: cold`` — or a cold-phase metric such as ``cold_start_p99`` — is judged on ``cold``).
    Raises :class:`~harness.common.errors.HarnessError` for unreadable inputs; the verdict itself is
    in the returned report (``exit_code``), never raised.
    """
    from harness.gates.output import write_junit

    spec = read_baseline(baseline)
    sets = load_result_sets([(label, path) for label, path in runs.items()])
    report = judge(spec, sets, baseline_path=baseline)
    if junit is not None:
        write_junit(junit, report)
    if json_path is not None:
        write_report_json(json_path, report)
    return report
