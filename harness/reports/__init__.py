"""Run reports with plots: one self-contained HTML file and a Markdown summary for CI comments.

Python API (what ``harness report`` calls; ``make demo`` runs that command)::

    from harness.gates import gate_runs, load_result_sets
    from harness.reports import write_report

    sets = load_result_sets([("cold", "runs/x/cold"), ("warm", "runs/x/warm")])
    verdict = gate_runs({"cold": "runs/x/cold", "warm": "runs/x/warm"}, "baseline.yaml")
    write_report(sets, "runs/x/report.html", markdown_path="runs/x/report.md", gate=verdict)

Plots are registered in :data:`harness.reports.plots.PLOTS`; tables in :mod:`harness.reports.tables`.
"""

from __future__ import annotations

from harness.reports.render import ReportFiles, render_html, render_markdown, write_report

__all__ = ["ReportFiles", "render_html", "render_markdown", "write_report"]
