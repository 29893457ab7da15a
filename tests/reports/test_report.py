"""The HTML report holds every plot (each with a title, units and a legend), opens offline, and the
Markdown summary names the gate verdict."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from harness.gates import Baseline, Gate, ResultSet, judge, load_result_sets
from harness.reports import render_markdown, write_report
from harness.reports.plots import PLOTS
from tests.gates.factory import harness_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Page(HTMLParser):
    """Collects figures (id → img alt/src or the reason text), scripts and external references."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, dict[str, str]] = {}
        self._in: str | None = None
        self.scripts = 0
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "figure":
            self._in = a.get("id", "")
            self.figures[self._in] = {"class": a.get("class", ""), "text": ""}
        elif tag == "img" and self._in is not None:
            self.figures[self._in].update(alt=a.get("alt", ""), src=a.get("src", ""))
        if tag in ("script", "link", "iframe"):
            self.scripts += 1
        for key in ("src", "href"):
            v = a.get(key, "")
            if v and not v.startswith(("data:", "#")):
                self.external.append(v)

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            self.figures[self._in]["text"] += data


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


GATES = Baseline(
    schema_version=1,
    name="t",
    gates=[
        Gate(metric="tpot_p95", threshold=4.6, rel_tolerance=0.15, phase="warm"),
        Gate(metric="cold_start_p99", threshold=850),
        Gate(metric="warm_rate", threshold=0.6, abs_tolerance=0.05),
    ],
)


def test_report_holds_every_plot(paired: list[ResultSet], tmp_path: Path) -> None:
    gate = judge(GATES, paired)
    files = write_report(paired, tmp_path / "r.html", markdown_path=tmp_path / "r.md", gate=gate)
    page = _parse(files.html)
    assert set(PLOTS.names()) <= set(page.figures), set(PLOTS.names()) - set(page.figures)
    assert len(PLOTS.names()) >= 6
    for plot_id, fig in page.figures.items():
        plot = PLOTS.get(plot_id)
        assert fig["alt"] == plot.alt and len(fig["alt"]) > 40, plot_id
        assert fig["src"].startswith("data:image/png;base64,"), plot_id
        assert base64.b64decode(fig["src"].split(",", 1)[1])[:8] == PNG_MAGIC, plot_id
        assert plot.title in fig["text"], plot_id
    html = files.html.read_text()
    for section in ('id="runs"', 'id="scenarios"', 'id="gate"', 'id="verdict"'):
        assert section in html
    assert page.scripts == 0 and page.external == [], page.external


def test_every_figure_has_title_units_and_legend(paired: list[ResultSet]) -> None:
    for name, plot in PLOTS.items():
        fig = plot.draw(paired)
        assert isinstance(fig, Figure), name
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert axes, name
        for ax in axes:
            assert ax.get_title(), f"{name}: an axes without a title"
            xl, yl = ax.get_xlabel(), ax.get_ylabel()
            assert xl and yl, f"{name}: {ax.get_title()} lacks an axis label"
            assert "(" in xl + yl, f"{name}: {ax.get_title()}: no unit in {xl!r} / {yl!r}"
        has_legend = bool(fig.legends) or all(ax.get_legend() is not None for ax in axes)
        assert has_legend, f"{name}: no legend"


def test_stage_boundaries_and_rollbacks_are_marked(paired: list[ResultSet]) -> None:
    fig = PLOTS.get("fig-latency-time").draw(paired)
    assert isinstance(fig, Figure)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert {"stage-1", "stage-2", "stage-3"} <= set(texts)
    assert any("rollback stage-2 → stage-1" in t for t in texts)
    labels = {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    assert {"stage start", "rolled-back stage"} <= labels


def test_server_metrics_share_the_requests_time_axis(paired: list[ResultSet]) -> None:
    fig = PLOTS.get("fig-server-metrics").draw(paired)
    assert isinstance(fig, Figure)
    rows = [fig.axes[i : i + 3] for i in range(0, len(fig.axes), 3)]
    assert len(rows) == 3
    for ttft, _running, cache in rows:
        assert ttft.get_shared_x_axes().joined(ttft, cache)  # one time axis per run
        (hit,) = [ln for ln in cache.get_lines() if ln.get_label() == "server prefix hit rate"]
        assert len(hit.get_xdata()) == 30  # one rate per scrape interval
    warm_rates = next(ln for ln in rows[1][2].get_lines() if ln.get_label() == "server prefix hit rate")
    assert list(warm_rates.get_ydata()) == pytest.approx([80.0] * 30)
    texts = {t.get_text() for ax in rows[2] for t in ax.texts}
    assert {"stage-1", "stage-2", "stage-3"} <= texts  # the ladder's stages on every panel


def test_unpaired_and_dataless_plots_say_why(run_dirs: dict[str, Path], tmp_path: Path) -> None:
    from harness.load.results import RequestRecord
    from tests.gates.factory import make_records, write_run

    recs = [
        RequestRecord.parse(
            {**r.to_dict(), "prefill_kv_bytes": None, "prefill_peak_bytes": None, "peak_measured": None}
        )
        for r in make_records(300, 9)
    ]
    ext = write_run(tmp_path / "vllm", recs)
    sets = load_result_sets([str(ext)])
    files = write_report(sets, tmp_path / "r.html")
    page = _parse(files.html)
    cw = page.figures["fig-cold-warm"]
    assert "empty" in cw["class"] and "cold=DIR warm=DIR" in cw["text"] and "src" not in cw
    kv = page.figures["fig-kv-bytes"]
    assert "empty" in kv["class"] and "prefill_kv_bytes" in kv["text"]
    server = page.figures["fig-server-metrics"]
    assert "empty" in server["class"] and "server_metrics.jsonl" in server["text"]
    assert "Gate: not run" in files.html.read_text()


def test_markdown_names_the_verdict(paired: list[ResultSet]) -> None:
    passing = judge(GATES, paired)
    assert passing.verdict == "pass", passing.headline()
    md = render_markdown(paired, passing, html_name="report.html")
    assert md.startswith("## ✅ Gate t: PASS")
    assert "| cold |" in md and "| warm |" in md and "report.html" in md
    failing = judge(
        GATES.model_copy(
            update={"gates": [Gate(metric="tpot_p95", threshold=2.0, phase="warm"), *GATES.gates]}
        ),
        paired,
    )
    md = render_markdown(paired, failing)
    assert md.startswith("## ❌ Gate t: FAIL") and "`tpot_p95@warm`" in md and "required ≤" in md
    assert render_markdown(paired, None).startswith("## ℹ️ Gate: not run")
    cannot = judge(
        Baseline(
            schema_version=1, name="t", gates=[Gate(metric="ttft_p99", threshold=1e6, min_samples=10**6)]
        ),
        paired,
    )
    assert "CANNOT BE JUDGED" in render_markdown(paired, cannot)


def test_skipped_latency_gates_are_counted_and_shown(paired: list[ResultSet], tmp_path: Path) -> None:
    """A baseline calibrated on another machine: its latency gates are skipped (grey, with the cause),
    the rest decide; every gate skipped is a pass with its own icon and a grey banner."""
    from harness.common.fingerprint import Environment, Hardware, Software
    from harness.gates.fingerprints import BaselineFingerprint

    elsewhere = BaselineFingerprint(
        environment=Environment(hardware=Hardware(cpu_model="Other CPU", cpu_count=64), software=Software())
    )
    mixed = judge(GATES.model_copy(update={"fingerprint": elsewhere}), paired)
    assert [g.verdict for g in mixed.gates] == ["skipped", "skipped", "pass"], mixed.headline()
    assert mixed.verdict == "pass" and mixed.exit_code == 0
    md = render_markdown(paired, mixed)
    assert md.startswith("## ✅ Gate t: PASS — 1 passed, 0 failed, 0 cannot be judged, 2 skipped (")
    assert "| skipped |" in md and "- skipped on `warm` (1 gate): calibrated on Other CPU ×64 CPUs" in md
    files = write_report(paired, tmp_path / "mixed.html", gate=mixed)
    html = files.html.read_text()
    assert 'class="verdict verdict-pass"' in html and '<tr class="skipped">' in html

    latency_only = GATES.model_copy(update={"fingerprint": elsewhere, "gates": GATES.gates[:2]})
    nothing = judge(latency_only, paired)
    assert nothing.verdict == "pass" and nothing.all_skipped
    md = render_markdown(paired, nothing)
    assert md.startswith("## ⏭️ Gate t: PASS — 0 passed, 0 failed, 0 cannot be judged, 2 skipped (every gate")
    html = write_report(paired, tmp_path / "none.html", gate=nothing).html.read_text()
    assert 'class="verdict verdict-skipped"' in html


def test_report_cli(run_dirs: dict[str, Path], tmp_path: Path) -> None:
    base = tmp_path / "b.yaml"
    base.write_text(
        "schema_version: 1\nname: cli\ngates:\n  - {metric: tpot_p95, threshold: 1.0, phase: warm}\n"
    )
    out = tmp_path / "out" / "report.html"
    res = harness_cli(
        "report",
        f"cold={run_dirs['cold']}",
        f"warm={run_dirs['warm']}",
        "-o",
        str(out),
        "--baseline",
        str(base),
    )
    assert res.returncode == 0, res.stderr  # a report reports; `harness gate` is what gates
    assert out.is_file() and out.with_suffix(".md").is_file()
    assert "FAIL" in out.with_suffix(".md").read_text() and "FAIL" in res.stderr
    verdict = tmp_path / "v.json"
    gate = harness_cli(
        "gate",
        "--baseline",
        str(base),
        f"warm={run_dirs['warm']}",
        "--json-out",
        str(verdict),
        "--junit",
        str(tmp_path / "j.xml"),
    )
    assert gate.returncode == 1
    res = harness_cli(
        "report",
        f"warm={run_dirs['warm']}",
        "-o",
        str(out),
        "--verdict",
        str(verdict),
        "--md",
        str(tmp_path / "s.md"),
    )
    assert res.returncode == 0, res.stderr
    assert "Gate cli: FAIL" in (tmp_path / "s.md").read_text()
    assert json.loads(verdict.read_text())["verdict"] == "fail"
    res = harness_cli("report", str(run_dirs["warm"]), "--baseline", str(base), "--verdict", str(verdict))
    assert res.returncode == 2


@pytest.mark.slow
def test_report_of_the_recorded_run(repo_root: Path, tmp_path: Path) -> None:
    """The real recording (client-bound, so every gate refuses) renders with its warnings shown."""
    base = repo_root / "fixtures" / "runs" / "tiny-cpu"
    sets = load_result_sets([f"cold={base / 'cold'}", f"warm={base / 'warm'}"])
    gate = judge(GATES, sets)
    assert gate.verdict == "unjudgeable"
    files = write_report(sets, tmp_path / "real.html", markdown_path=tmp_path / "real.md", gate=gate)
    html = files.html.read_text()
    assert "client-bound" in html and set(PLOTS.names()) <= set(_parse(files.html).figures)
    assert "CANNOT BE JUDGED" in (tmp_path / "real.md").read_text()


def test_capacity_plot_from_a_capacity_result(run_dirs: dict[str, Path], tmp_path: Path) -> None:
    import numpy as np

    from harness.experiments.capacity_search import search
    from harness.gates.slo import ProbeSamples, parse_slo
    from harness.reports.experiment_plots import capacity_plot

    def measure(rate: float) -> ProbeSamples:
        ttft = np.linspace(40, 60, 100) * (1 if rate <= 8 else 20)
        n = ttft.size
        return ProbeSamples(rate=rate, columns={"ttft_from_intended_ms": ttft, "e2e_from_intended_ms": ttft,
                            "tpot_ms": np.full(n, 5.0)}, ok=np.ones(n, bool), itl=np.empty(0),
                            dir=str(run_dirs["warm"]))  # fmt: skip

    result = search(measure, parse_slo("ttft_from_intended_p95<=3x,error_rate<=0.05"), start=2.0)
    fig = capacity_plot(result)
    assert isinstance(fig, Figure)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    for ax in axes:
        assert ax.get_title() and "(" in ax.get_ylabel() and "requests/s" in ax.get_xlabel()
        assert ax.get_legend() is not None
    assert result.cliff and any(t.get_text() == "cliff" for t in axes[0].texts)
    path = tmp_path / "capacity.json"
    path.write_text(result.model_dump_json())
    out = tmp_path / "cap.html"
    # With no run directories the probes themselves are the result sets.
    res = harness_cli("report", "--capacity-json", str(path), "-o", str(out))
    assert res.returncode == 0, res.stderr
    page = _parse(out)
    assert page.figures["fig-capacity"]["src"].startswith("data:image/png;base64,")
    assert "capacity:" in out.read_text() and result.probes[0].dir.endswith("warm")


def test_a_session_run_gets_a_per_turn_section(tmp_path: Path) -> None:
    from dataclasses import replace

    from harness.gates import load_result_sets
    from harness.reports.render import render_html, render_markdown
    from harness.reports.tables import per_turn
    from tests.gates.factory import make_records, write_run

    recs = make_records(40, 3, stages=("replay",))
    # Ten conversations of four turns: TTFT falls and the cached share grows as the history does.
    turned = [
        replace(
            r,
            session_id=f"s{i // 4}",
            turn=i % 4 + 1,
            history_source="live",
            ttft_ms=100.0 - 20 * (i % 4),
            prompt_tokens=100 * (i % 4 + 1),
            cached_tokens=100 * (i % 4),
        )
        for i, r in enumerate(recs)
    ]
    sets = load_result_sets([("sessions", write_run(tmp_path / "s", turned))])
    html = render_html(sets)
    assert 'id="turns"' in html and "Per turn" in html
    md = render_markdown(sets)
    section = md.split("### Per turn", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| sessions | ")]
    assert [row.split(" | ")[1] for row in rows] == ["1", "2", "3", "4"]
    assert (
        rows[3].startswith("| sessions | 4 | 10 | ") and "75.0 %" in rows[3]
    )  # turn 4: 300 of 400 prompt tokens were cached
    plain = load_result_sets([("plain", write_run(tmp_path / "p", recs))])
    assert per_turn(plain).rows == [] and "### Per turn" not in render_markdown(plain)


def test_the_server_hit_rate_across_a_restart_counts_from_zero() -> None:
    """The plot's per-interval rate uses the summary's counter rule: after a restart the counters'
    values are what the server did since it came back (it used to drop that interval)."""
    from harness.load.server_metrics import ServerSample
    from harness.reports.plots import _interval_hit_rate

    rows = ((0, 0, 0), (1, 100, 50), (2, 40, 30), (3, 140, 30), (4, 140, 30))
    samples = [ServerSample(t_s=t, kind="vllm", prefix_queries=q, prefix_hits=h) for t, q, h in rows]
    xs, ys = _interval_hit_rate(samples)
    # 50 of 100; restarted: 30 of the 40 since; 0 of 100; no lookups in the last interval: no point.
    assert xs.tolist() == [1, 2, 3] and ys.tolist() == [50.0, 75.0, 0.0]


def test_a_run_that_thought_and_called_tools_gets_its_section(tmp_path: Path) -> None:
    from dataclasses import replace

    from harness.reports.render import render_html, render_markdown
    from harness.reports.tables import thinking_and_tools
    from tests.gates.factory import make_records, write_run

    recs = make_records(20, 3, stages=("replay",))
    # Half the responses think 40 tokens (their answer 400 ms after the first token), a quarter call a tool.
    shaped = [
        replace(
            r,
            ttft_ms=50.0,
            ttfa_ms=450.0 if i % 2 == 0 else 50.0,
            reasoning_tokens=40 if i % 2 == 0 else 0,
            reasoning_source="counted",
            tool_calls=1 if i % 4 == 1 else 0,
            tool_names=["search"] if i % 4 == 1 else [],
        )
        for i, r in enumerate(recs)
    ]
    sets = load_result_sets([("agent", write_run(tmp_path / "a", shaped))])
    table = thinking_and_tools(sets)
    assert len(table.rows) == 1
    row = dict(zip(table.columns, table.rows[0], strict=True))
    assert row["thinking"] == "10 (50.0 %)" and row["reasoning tokens P95"] == "40.00 tokens"
    assert row["TTFT P50"] == "50.00 ms" and row["TTFA P95"] == "450.0 ms"
    assert row["tool calls"] == "5 in 5 (search 5)"
    assert 'id="thinking"' in render_html(sets) and "### Reasoning and tool calls" in render_markdown(sets)
    plain = load_result_sets([("plain", write_run(tmp_path / "p", recs))])
    assert thinking_and_tools(plain).rows == [] and 'id="thinking"' not in render_html(plain)
