"""What the gates print and write besides their JSON: rich tables (a verdict, a baseline, a cold vs
warm comparison) and JUnit XML.

JUnit: one ``<testsuite>`` per result set (``gate.<label>``), one ``<testcase>`` per gate judged on it
(``name`` = the gate id, ``classname`` = ``gate.<label>``). A failed gate carries ``<failure
type="regression">``, a gate that cannot be judged ``<error type="unjudgeable">`` or ``<error
type="inconclusive">`` (JUnit's "could not run" — CI shows both red, and tells them apart), a skipped
gate (a latency gate on a run measured elsewhere than the baseline) ``<skipped>`` (counted in the
suite's ``skipped``, not red), each with a ``message`` holding the numbers. The format is the one
Jenkins, GitLab and the common GitHub Actions reporters read (``testsuites/testsuite/testcase`` with
``failure``/``error``/``skipped`` children).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from harness.common.console import table
from harness.common.io import atomic_write
from harness.gates.baseline import Baseline
from harness.gates.compare import Comparison, Side
from harness.gates.judge import GateReport, GateResult
from harness.gates.metrics import format_interval, format_value

VERDICT_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "inconclusive": "yellow",
    "unjudgeable": "yellow",
    "skipped": "dim",
}


def _delta_text(g: GateResult) -> str:
    if g.delta is None:
        return "—"
    sign = "+" if g.delta >= 0 else "−"
    text = f"{sign}{format_value(abs(g.delta), g.unit)}"
    if g.delta_pct is not None and g.unit != "ratio":
        text += f" ({'+' if g.delta_pct >= 0 else '−'}{abs(g.delta_pct):.1f} %)"
    return text


def gate_table(report: GateReport) -> Table:
    """Metric, baseline, limit, measured, delta, interval, n and verdict for every judged gate."""
    caption = (
        f"intervals at {report.confidence:.0%} confidence; pass only when the interval is within the limit"
    )
    skipped = list(dict.fromkeys(g.why for g in report.gates if g.verdict == "skipped"))
    if skipped:
        caption += "; skipped: " + " / ".join(skipped)
    t = table(
        escape(f"gate: {report.baseline.name} — {report.headline()}"),
        ("run", "metric", "baseline", "limit", "measured", "delta", "interval", "n", "verdict"),
        left={"run", "metric", "verdict"},
        title_justify="left",
        caption=escape(caption),
        caption_justify="left",
    )
    for g in report.gates:
        sign = "≤" if g.direction == "at_most" else "≥"
        t.add_row(
            escape(g.label or "—"),
            escape(g.id),
            format_value(g.baseline, g.unit),
            f"{sign} {format_value(g.limit, g.unit)}",
            format_value(g.measured, g.unit),
            _delta_text(g),
            g.interval_text(),
            str(g.n),
            f"[{VERDICT_STYLE[g.verdict]}]{g.verdict}[/]",
        )
    return t


def comparison_table(cmp: Comparison) -> Table:
    """The comparison as a rich table: value [interval] per phase, the difference, the verdict."""
    t = table(
        f"cold vs warm ({cmp.confidence:.0%} intervals)",
        ("metric", "cold", "warm", "warm − cold", "change", "n cold/warm", "verdict"),
        left={"metric", "verdict"},
        title_justify="left",
    )
    for r in cmp.rows:

        def cell(s: Side, unit: str = r.unit) -> str:
            value = format_value(s.value, unit)
            if s.value is None or s.lo is None or s.hi is None or s.lo == s.hi:
                return value
            return f"{value} {format_interval(s.lo, s.hi, unit)}"

        rel = "—" if r.relative is None else f"{r.relative:+.0%}"
        t.add_row(
            r.metric, cell(r.cold), cell(r.warm), _signed(r.difference, r.unit), rel,
            f"{r.cold.n}/{r.warm.n}", r.verdict,
        )  # fmt: skip
    return t


def _signed(s: Side, unit: str) -> str:
    if s.value is None:
        return "—"
    sign = "+" if s.value > 0 else "−" if s.value < 0 else "±"
    text = f"{sign}{format_value(abs(s.value), unit)}"
    if s.lo is not None and s.hi is not None:
        text += f" [{format_value(s.lo, unit)}, {format_value(s.hi, unit)}]"
    return text


def junit_xml(report: GateReport) -> ET.Element:
    """The JUnit XML document of a verdict (its root, ``<testsuites>``)."""
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    root = ET.Element("testsuites", name=f"harness gate: {report.baseline.name}")
    labels: list[str] = []
    for g in report.gates:
        if g.label not in labels:
            labels.append(g.label)
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for label in labels:
        cases = [g for g in report.gates if g.label == label]
        suite_name = f"gate.{label}" if label else "gate.missing"
        failures = sum(g.verdict == "fail" for g in cases)
        errors = sum(g.verdict in ("inconclusive", "unjudgeable") for g in cases)
        skipped = sum(g.verdict == "skipped" for g in cases)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=suite_name,
            tests=str(len(cases)),
            failures=str(failures),
            errors=str(errors),
            skipped=str(skipped),
            time="0",
            timestamp=stamp,
        )
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="baseline", value=report.baseline.path or report.baseline.name)
        ref = next((r for r in report.results if r.label == label), None)
        if ref is not None:
            ET.SubElement(props, "property", name="results", value=ref.path)
            for problem in ref.problems:
                ET.SubElement(props, "property", name="problem", value=problem)
        for g in cases:
            case = ET.SubElement(suite, "testcase", name=g.id, classname=suite_name, time="0")
            if g.verdict == "fail":
                child = ET.SubElement(case, "failure", message=g.reason, type="regression")
                child.text = _details(g)
            elif g.verdict in ("inconclusive", "unjudgeable"):
                child = ET.SubElement(case, "error", message=g.reason, type=g.verdict)
                child.text = _details(g)
            elif g.verdict == "skipped":
                child = ET.SubElement(case, "skipped", message=g.reason)
                child.text = _details(g)
            else:
                out = ET.SubElement(case, "system-out")
                out.text = g.reason
        totals["tests"] += len(cases)
        totals["failures"] += failures
        totals["errors"] += errors
        totals["skipped"] += skipped
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return root


def _details(g: GateResult) -> str:
    lines = [
        f"metric: {g.metric}"
        + (f" (scenario={g.scenario})" if g.scenario else "")
        + (f" (stage={g.stage})" if g.stage else ""),
        f"baseline: {format_value(g.baseline, g.unit)}",
        f"limit: {'≤' if g.direction == 'at_most' else '≥'} {format_value(g.limit, g.unit)}",
        f"measured: {format_value(g.measured, g.unit)}",
        f"interval ({g.confidence:.0%}): {g.interval_text()}",
        f"samples: {g.n} (min {g.min_samples})",
    ]
    return "\n".join(lines)


def write_junit(path: str | Path, report: GateReport) -> None:
    """Write the JUnit XML atomically."""
    tree = ET.ElementTree(junit_xml(report))
    with atomic_write(path, "wb", encoding=None) as fh:
        tree.write(fh, encoding="utf-8", xml_declaration=True)


def baseline_table(spec: Baseline, comments: dict[int, str]) -> Table:
    """A baseline's gates: threshold, limit, the fewest samples, and each gate's comment."""
    t = table(
        escape(f"baseline {spec.name}: {len(spec.gates)} gates"),
        ("gate", "phase", "threshold", "limit", "min n", "note"),
        title_justify="left",
    )
    for i, g in enumerate(spec.gates):
        sign = "≤" if g.effective_direction == "at_most" else "≥"
        t.add_row(
            escape(g.id), escape(g.effective_phase or "any"), format_value(g.threshold, g.spec.unit),
            f"{sign} {format_value(g.limit, g.spec.unit)}", str(g.min_samples), escape(comments.get(i, "")),
        )  # fmt: skip
    return t
