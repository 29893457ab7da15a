"""``make demo`` end to end on the bundled fixtures, shortened: every command a user types, for real.

Traces → scenarios → corpus → ``harness run`` (the tiny target with its cache, a warmup ladder, the
warm check, cold and warm replays) → ``harness gate`` against ``fixtures/baselines/tiny-cpu.yaml`` →
``harness report``. The schedule and the ladder are shorter than ``make demo``'s so the test stays
around a minute; what is asserted are outcomes (cold misses, warm hits, the verdict file, the
report and its plots, the server gone), never timings.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.common.errors import ExitCode
from harness.demo import BASELINE, DemoConfig, DemoContext, StepFailed, corpus_build_args, harness, run_demo
from harness.gates import read_report_json
from harness.reports.plots import PLOTS
from tests.reports.test_report import _parse

SHORT_PLAN = """\
name: demo-test
policy: {on_failure: stop, min_requests: 4}
stages:
  - {name: s1-2qps, qps: 2, duration_s: 3, max_failure_rate: 0.5}
  - {name: s2-4qps, qps: 4, duration_s: 3, max_failure_rate: 0.5}
"""


@pytest.mark.slow
def test_demo_runs_the_whole_path_and_explains_the_verdict(tmp_path: Path, capsys) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(SHORT_PLAN)
    out = tmp_path / "demo"
    ctx = run_demo(DemoConfig(out_dir=out, corpus_n=12, duration_s=6.0, plan=plan))
    paired = out / "paired"
    printed = capsys.readouterr().out

    # traces → scenarios → corpus
    scenarios = json.loads((out / "scenarios.json").read_text())
    assert scenarios["classes"] and abs(sum(c["weight"] for c in scenarios["classes"]) - 1) < 1e-6
    assert len((out / "corpus" / "corpus.jsonl").read_text().splitlines()) == 12

    # harness run: every level flushed, cold misses, a warm target, warm hits, the server stopped
    run = json.loads((paired / "run.json").read_text())
    assert run["exit_code"] in (0, 6) and ctx.outcome["run_exit_code"] == run["exit_code"]
    assert [f["status"] for f in run["flush"]] == ["flushed", "flushed"]
    assert run["warm_check"]["warm"] is True, run["warm_check"]["reason"]
    cold = [json.loads(line) for line in (paired / "cold" / "records.jsonl").read_text().splitlines()]
    warm = [json.loads(line) for line in (paired / "warm" / "records.jsonl").read_text().splitlines()]
    assert len(cold) == len(warm) == 24
    first: dict[str, str] = {}
    for r in sorted(cold, key=lambda r: r["sent_s"]):
        first.setdefault(r["id"], r["cache"])
    assert set(first.values()) == {"MISS"} and len(first) == 12
    assert all(r["status"] == 200 and r["cache"].startswith("HIT") for r in warm)
    server_pid = json.loads((paired / "server" / "ready.json").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)

    # harness gate: a verdict (whatever it is), in JSON and JUnit, explained on the console
    verdict = read_report_json(paired / "gate.json")
    assert verdict.verdict == ctx.outcome["verdict"] and verdict.baseline.path == str(BASELINE)
    assert {g.label for g in verdict.gates} == {"cold", "warm"}
    assert ET.parse(paired / "gate.junit.xml").getroot().iter("testcase")
    assert f"gate verdict: {verdict.verdict.upper()}" in printed
    if verdict.verdict != "pass":
        assert any(g.why and g.why in printed for g in verdict.gates if g.verdict != "pass")

    # harness report: one HTML file with every plot, a Markdown summary, and where it is
    page = _parse(paired / "report.html")
    assert set(PLOTS.names()) <= set(page.figures)
    assert any(f["src"].startswith("data:image/png;base64,") for f in page.figures.values())
    assert (paired / "report.md").read_text().startswith("## ")
    assert str(paired / "report.html") in printed.replace("\n", "")


def test_corpus_recipe_is_spelled_once(repo_root: Path) -> None:
    """docs/ci.md builds the CI corpus with the demo's recipe (calibrated baseline: same workload)."""
    args = corpus_build_args(Path("runs"), 60)
    doc = (repo_root / "docs" / "ci.md").read_text()
    assert "--fewshot" not in args  # the default request logs: real users' requests
    for flag in ("--template", "--scenarios", "--max-input-tokens"):
        value = Path(args[args.index(flag) + 1])
        shown = value.relative_to(repo_root) if value.is_absolute() else value
        assert f"{flag} {shown}" in doc, flag
    assert "--n 60" in doc


def test_a_command_that_breaks_stops_the_demo_with_its_own_exit_code(tmp_path: Path) -> None:
    from rich.console import Console

    ctx = DemoContext(DemoConfig(out_dir=tmp_path), Console())
    with pytest.raises(StepFailed) as exc:
        harness(ctx, "traces", "coldpaths", str(tmp_path / "missing.json"), "-o", str(tmp_path / "c.jsonl"))
    assert exc.value.exit_code == ExitCode.INPUT  # the command's code, from the table
    # A verdict is not a breakage: `harness gate` exiting 1 or 6 is allowed where the demo says so.
    assert harness(ctx, "baseline", "check", str(tmp_path / "nope.yaml"), ok=(0, 3)) == 3
