"""A run that replayed agent sessions gets an *Agent sessions* section (table, makespan CDF, the slowest
session's waterfall); a run without sessions gets none of it."""

from __future__ import annotations

import base64
from html.parser import HTMLParser

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from harness.gates import ResultSet, load_result_sets
from harness.load.results import RequestRecord
from harness.reports.render import render_html, render_markdown
from harness.reports.session_plots import makespan_cdf, session_runs, session_waterfall
from harness.reports.tables import agent_sessions_table
from tests.gates.factory import make_records, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _call(
    session: str,
    call: int,
    depth: int,
    ready: float,
    gap: float = 0.0,
    *,
    late_ms: float = 0.0,
    ttft_ms: float | None = None,
    e2e_ms: float | None = None,
    status: int = 200,
    error: str | None = None,
    blocked_by: int | None = None,
    prompt: int | None = None,
    cached: int | None = None,
    recorded_ms: float | None = None,
) -> RequestRecord:
    """One agent-session call's record as the replay user writes it (times in s from the epoch)."""
    intended = ready + gap
    return RequestRecord(
        id=f"{session}-c{call}", stage="replay", intended_s=intended, sent_s=intended + late_ms / 1000,
        lateness_ms=late_ms, status=status, error=error, ttft_ms=ttft_ms, e2e_ms=e2e_ms,
        prompt_tokens=prompt, cached_tokens=cached, session_id=session, call=call, depth=depth,
        ready_s=ready, blocked_by=blocked_by, recorded_ms=recorded_ms,
    )  # fmt: skip


def session_records() -> list[RequestRecord]:
    """Two sessions. ``a`` (start 10 s) succeeds: call 1, then calls 2 and 3 both after it; its last
    call ends at 11.002 s, a 1,002 ms makespan. ``b`` (start 12 s) fails: call 2 (after call 1) gets an
    HTTP 500 that ends at 13.5 s, so call 3, which waits for it, is blocked: a 1,500 ms makespan, the
    slowest. Prompt tokens 100 + 200 + 200 + 100, cached 0 + 100 + 100 + 0: a 33.3 % prefix hit rate.
    ``a``'s critical chain is calls 1 and 2: 500 + 300 ms against 400 + 200 ms in the trace, 1.33×."""
    return [
        _call("a", 1, 0, 10.0, late_ms=1.0, ttft_ms=100.0, e2e_ms=500.0, prompt=100, cached=0,
              recorded_ms=400.0),
        _call("a", 3, 1, 10.501, 0.1, ttft_ms=50.0, e2e_ms=250.0, prompt=200, cached=100, recorded_ms=900.0),
        _call("a", 2, 1, 10.501, 0.2, late_ms=1.0, ttft_ms=80.0, e2e_ms=300.0, prompt=200, cached=100,
              recorded_ms=200.0),
        _call("b", 1, 0, 12.0, ttft_ms=120.0, e2e_ms=400.0, prompt=100, cached=0),
        _call("b", 2, 1, 12.4, 0.5, e2e_ms=600.0, status=500, error="HTTP 500: upstream overloaded"),
        _call("b", 3, 2, 13.5, status=0, blocked_by=2,
              error="not sent: call 2 of session b failed, and this call waited for it"),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def session_sets(tmp_path_factory: pytest.TempPathFactory) -> list[ResultSet]:
    d = tmp_path_factory.mktemp("session-report")
    plain = make_records(20, 3, stages=("replay",))
    return load_result_sets(
        [("agents", write_run(d / "agents", session_records())), ("plain", write_run(d / "plain", plain))]
    )


class _Figures(HTMLParser):
    """The ``<figure>`` elements of a page: id → the ``src`` of its image (``""``: none)."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, str] = {}
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "figure":
            self._in = a.get("id", "")
            self.figures[self._in] = ""
        elif tag == "img" and self._in is not None:
            self.figures[self._in] = a.get("src", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._in = None


def _section(html: str) -> str:
    start = html.index('<section id="sessions">')
    return html[start : html.index("</section>", start)]


def test_the_summary_counts_the_sessions(session_sets: list[ResultSet]) -> None:
    summary = session_sets[0].summary
    assert summary is not None and summary.agent_sessions is not None
    a = summary.agent_sessions
    assert (a.sessions, a.calls, a.succeeded, a.blocked_calls, a.failed_sessions) == (2, 6, 1, 1, ["b"])
    assert a.slowest is not None and a.slowest.session_id == "b"
    assert session_sets[1].summary is not None and session_sets[1].summary.agent_sessions is None


def test_the_table_has_one_row_per_run_with_sessions(session_sets: list[ResultSet]) -> None:
    table = agent_sessions_table(session_sets)
    assert len(table.rows) == 1  # the plain run has none
    row = dict(zip(table.columns, table.rows[0], strict=True))
    assert row == {
        "run": "agents",
        "sessions": "2",
        "calls": "6",
        "success rate": "1/2 (50.0 %)",
        "blocked calls": "1",
        "makespan P50": "1,002 ms",
        "makespan P95": "1,500 ms",
        "makespan max": "1,500 ms",
        "session prefix hit rate": "33.3 %",
        "critical chain vs trace P50": "1.33×",
        "failed sessions": "b",
    }


def test_the_report_has_the_section_its_table_and_both_figures(session_sets: list[ResultSet]) -> None:
    html = render_html(session_sets)
    assert '<a href="#sessions">Agent sessions</a>' in html
    section = _section(html)
    assert "<h2>Agent sessions</h2>" in section
    for cell in ("1/2 (50.0 %)", "1,002 ms", "1,500 ms", "33.3 %", '<td class="l">b</td>'):
        assert cell in section, cell
    page = _Figures()
    page.feed(section)
    assert set(page.figures) == {"fig-session-makespan", "fig-session-waterfall"}
    for fig_id, src in page.figures.items():
        assert src.startswith("data:image/png;base64,"), fig_id
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC, fig_id
    md = render_markdown(session_sets)
    rows = [line for line in md.split("### Agent sessions", 1)[1].splitlines() if line.startswith("| agents")]
    assert rows == [
        "| agents | 2 | 6 | 1/2 (50.0 %) | 1 | 1,002 ms | 1,500 ms | 1,500 ms | 33.3 % | 1.33× | b |"
    ]


def test_a_run_without_sessions_has_no_section(session_sets: list[ResultSet]) -> None:
    plain = session_sets[1:]
    html = render_html(plain)
    assert 'id="sessions"' not in html and "Agent sessions" not in html
    assert "fig-session" not in html
    assert "### Agent sessions" not in render_markdown(plain)
    assert agent_sessions_table(plain).rows == [] and session_runs(plain) == []


def test_the_waterfall_draws_the_slowest_session_call_by_call(session_sets: list[ResultSet]) -> None:
    (run,) = session_runs(session_sets)
    assert [r.call for r in run.calls] == [1, 2, 3]  # by call index, whatever the file order
    fig = session_waterfall([run])
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert "session b (3 calls, 1 failed, 1 blocked)" in ax.get_title()
    # Indented by depth (padded to one width on the right, so right-aligned labels show the indent).
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [t.rstrip() for t in labels] == ["call 1", "  └ call 2", "    └ call 3"]
    assert len({len(t) for t in labels}) == 1
    assert "(ms)" in ax.get_xlabel() and ax.get_ylabel()
    texts = [t.get_text() for t in ax.texts]
    assert "blocked by call 2" in texts and "HTTP 500: upstream overloaded" in texts
    # x is ms from the session's start: call 2 (row 1) waits from 400 ms (call 1's end) to 900 ms, then
    # fails at 1,500 ms.
    row = [
        p for p in ax.patches if isinstance(p, Rectangle) and abs(p.get_y() + p.get_height() / 2 - 1) < 1e-9
    ]
    spans = {(round(p.get_x()), round(p.get_x() + p.get_width())) for p in row if p.get_width() > 0}
    assert {(400, 900), (900, 1500)} <= spans, spans
    assert any(p.get_hatch() for p in ax.patches)  # the blocked call
    legend = {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    assert {"failed call (error beside it)", "blocked: a predecessor failed"} <= legend


def test_the_makespan_cdf_marks_failed_sessions(session_sets: list[ResultSet]) -> None:
    runs = session_runs(session_sets)
    fig = makespan_cdf(runs)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    legend = ax.get_legend()
    assert ax.get_title() and "(ms)" in ax.get_xlabel() and legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert any(lbl.startswith("agents (n=2, P95 1,500 ms)") for lbl in labels), labels
    assert "session with a failed or blocked call" in labels
    assert makespan_cdf([]) == "No run replayed agent sessions."
