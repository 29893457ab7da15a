"""docs/gates.md and docs/exit-codes.md describe what the code does: every metric, plot and exit code."""

from __future__ import annotations

from pathlib import Path

from harness.common.errors import ExitCode
from harness.gates.metrics import METRICS
from harness.reports.plots import PLOTS


def test_gates_doc_names_every_metric_and_plot(repo_root: Path) -> None:
    doc = (repo_root / "docs" / "gates.md").read_text(encoding="utf-8")
    missing = [name for name in METRICS.names() if f"`{name}`" not in doc]
    assert not missing, f"docs/gates.md does not document {missing}"
    assert not [p for p in PLOTS.names() if f"`{p}`" not in doc]
    for code in (0, 1, 2, 3, 4, 6):
        assert f"| {code} |" in doc
    assert "harness gate" in doc and "junit" in doc.lower() and "(ci.md)" in doc


def test_ci_doc_has_the_job_and_the_exit_codes(repo_root: Path) -> None:
    doc = (repo_root / "docs" / "ci.md").read_text(encoding="utf-8")
    assert "harness ab --recipe fixtures/recipes/ci.yaml" in doc and "harness run" in doc
    assert "upload-artifact" in doc and "gate.junit.xml" in doc and "report.html" in doc
    assert "family-wise" in doc and "power" in doc
    for code in (0, 1, 2, 3, 4, 5, 6, 130):
        assert f"| {code} |" in doc


def test_exit_codes_doc_has_the_unjudgeable_code(repo_root: Path) -> None:
    doc = (repo_root / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    assert f"| {int(ExitCode.UNJUDGEABLE)} |" in doc and "CannotJudge" in doc
