"""Render a report: one self-contained HTML file (plots inlined as PNG) and a Markdown summary.

The HTML has no external reference at all (no script, font, stylesheet or image URL), so it opens
offline, from a CI artifact or an e-mail attachment. The Markdown summary is short enough for a CI
comment: the gate verdict first, one row per run, the gates that did not pass.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import jinja2
import orjson
from markupsafe import Markup

from harness import __version__
from harness.analysis.effect import EffectReport
from harness.common.io import atomic_write
from harness.experiments.capacity_result import CapacityResult, answer_line
from harness.gates.judge import VERDICT_WORDS, GateReport
from harness.gates.metrics import format_value
from harness.gates.runs import ResultSet
from harness.reports.experiment_plots import CAPACITY_PLOT, EFFECT_PLOT, capacity_plot, effect_plot
from harness.reports.plots import PLOTS, Drawn, Plot, pair, to_png_base64
from harness.reports.session_plots import (
    MAKESPAN_PLOT,
    WATERFALL_PLOT,
    makespan_cdf,
    session_runs,
    session_waterfall,
)
from harness.reports.tables import (
    Table,
    agent_sessions_table,
    effect_preload,
    effect_rows,
    overview,
    per_scenario,
    per_turn,
    speedup,
    thinking_and_tools,
)

Tick = Callable[[str], None]


@dataclass(frozen=True)
class RenderedPlot:
    """A plot as the HTML shows it: an embedded PNG, or the reason it does not apply."""

    plot: Plot
    png_base64: str | None
    reason: str | None


def rendered(plot: Plot, drawn: Drawn) -> RenderedPlot:
    """A drawn figure as the HTML embeds it (or the sentence saying why it does not apply)."""
    if isinstance(drawn, str):
        return RenderedPlot(plot, None, drawn)
    return RenderedPlot(plot, to_png_base64(drawn), None)


def render_plots(sets: Sequence[ResultSet], tick: Tick | None = None) -> list[RenderedPlot]:
    """Draw every registered plot; ``tick(plot_id)`` after each (for a progress bar)."""
    out = []
    for _, plot in PLOTS.items():
        drawn = plot.draw(sets)
        if isinstance(drawn, str):
            out.append(RenderedPlot(plot, None, drawn))
        else:
            out.append(RenderedPlot(plot, to_png_base64(drawn), None))
        if tick is not None:
            tick(plot.id)
    return out


_TEMPLATE = """{%- macro figure(r) -%}
<figure id="{{ r.plot.id }}" class="plot{% if not r.png_base64 %} empty{% endif %}">
<figcaption><h3>{{ r.plot.title }}</h3></figcaption>
{% if r.png_base64 %}<img alt="{{ r.plot.alt }}" src="data:image/png;base64,{{ r.png_base64 }}">
{% else %}<p>{{ r.reason }}</p>{% endif %}
</figure>
{%- endmacro -%}
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="harness {{ version }}">
<title>{{ title }}</title>
<style>
 body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto;
        max-width: 1400px; padding: 1.2rem 2rem 3rem; color: #1d1d1f; background: #fff; }
 h1 { font-size: 1.6rem; margin: .2rem 0; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; }
 h3 { font-size: 1.05rem; margin: 0 0 .4rem; }
 .meta { color: #555; } nav a { margin-right: 1rem; }
 .verdict { font-size: 1.25rem; font-weight: 600; padding: .7rem 1rem; border-radius: 6px; margin: 1rem 0; }
 .verdict-pass { background: #e6f4ea; color: #1e6b34; border: 1px solid #a8d5b5; }
 .verdict-fail { background: #fde7e7; color: #a11d1d; border: 1px solid #f2a7a7; }
 .verdict-unjudgeable { background: #fff4d6; color: #7a5200; border: 1px solid #f0d28a; }
 .verdict-none, .verdict-skipped { background: #f2f2f2; color: #444; border: 1px solid #ddd; }
 table { border-collapse: collapse; margin: .6rem 0 1rem; font-size: 13px; }
 th, td { border: 1px solid #ddd; padding: .3rem .55rem; text-align: right; vertical-align: top; }
 th { background: #f6f6f6; } td.l, th.l { text-align: left; }
 tr.fail td { background: #fde7e7; } tr.inconclusive td, tr.unjudgeable td { background: #fff4d6; }
 tr.skipped td { background: #f2f2f2; color: #555; }
 figure.plot { margin: 1.4rem 0; } figure.plot img { max-width: 100%; height: auto; border: 1px solid #eee; }
 figure.empty p { color: #666; font-style: italic; }
 ul.problems { color: #7a5200; }
 code { background: #f4f4f4; padding: 0 .25rem; border-radius: 3px; }
</style>
</head>
<body>
<header>
<h1>{{ title }}</h1>
<p class="meta">Generated {{ generated }} by harness {{ version }} from {{ sets|length }} run(s):
{% for rs in sets %}<code>{{ rs.label }}</code> = <code>{{ rs.path }}</code>
{%- if not loop.last %}, {% endif %}{% endfor %}.</p>
<div id="verdict" class="verdict verdict-{{ verdict_class }}">{{ verdict_text }}</div>
{% if verdicts %}<section id="verdicts"><h2>Verdicts</h2>{{ verdicts }}</section>{% endif %}
<nav><a href="#runs">Runs</a><a href="#plots">Plots</a><a href="#scenarios">Per scenario</a>
{% if turns %}<a href="#turns">Per turn</a>{% endif %}
{% if thinking %}<a href="#thinking">Reasoning and tool calls</a>{% endif %}
{% if sessions %}<a href="#sessions">Agent sessions</a>{% endif %}
{% if effect %}<a href="#effect">Warmup effect</a>{% endif %}<a href="#gate">Gate</a></nav>
</header>

<section id="runs">
<h2>Runs</h2>
{{ overview }}
{% for label, about, notes in run_notes %}
<p class="meta"><b>{{ label }}</b>: {{ about }}</p>
{% if notes %}<ul class="problems">
{% for n in notes %}<li>{{ label }}: {{ n }}</li>{% endfor %}
</ul>{% endif %}
{% endfor %}
{% if speedups %}<p>Cold → warm: {{ speedups }}.</p>{% endif %}
{% if capacity_line %}<p id="capacity">{{ capacity_line }}</p>{% endif %}
</section>

{% if effect %}<section id="effect">
<h2>Warmup effect</h2>
<p class="meta">The window replayed three times from flushed caches: <b>cold</b> (nothing preloaded),
<b>planned</b> (the plan's preload, chosen from the history alone) and <b>oracle</b> (the best preload
knowing the window). Gains are 1 − P95(pass) ÷ P95(cold) over the same requests, with paired bootstrap
intervals; <i>simulated</i> is the cache simulator's prediction of the shared-block hit rate for the same
preload (docs/analysis.md, <i>Warmup effect</i>).</p>
<p>{{ effect_line }}</p>
{{ effect }}
</section>{% endif %}

<section id="plots">
<h2>Plots</h2>
{% for r in plots %}
{{ figure(r) }}
{% endfor %}
</section>

<section id="scenarios">
<h2>Per scenario</h2>
{{ scenarios }}
</section>

{% if turns %}<section id="turns">
<h2>Per turn</h2>
<p class="meta">Session runs: each turn index of the conversations. With live history a turn's prompt
extends the previous one's, so a prefix cache shows as falling TTFT and a rising cached share.</p>
{{ turns }}
</section>{% endif %}

{% if thinking %}<section id="thinking">
<h2>Reasoning and tool calls</h2>
<p class="meta">Runs whose responses thought or called tools. TTFT counts the first token of any kind,
thinking included; TTFA the first answer, refusal or tool-call token. Thinking tokens are the target's
<code>usage.completion_tokens_details.reasoning_tokens</code> where it reports them, else the client's
count (docs/load.md, <i>Reasoning and tool calls</i>).</p>
{{ thinking }}
</section>{% endif %}

{% if sessions %}<section id="sessions">
<h2>Agent sessions</h2>
<p class="meta">Runs that replayed agent sessions: each session's LLM calls sent as its call graph allows,
a call once the calls it waits for have ended, plus its recorded gap (tool or think time). A session
succeeds when every call does; a call whose predecessor failed is not sent (blocked). Makespan runs from
the session's start to its last call's end; the session prefix hit rate is Σ cached ÷ Σ prompt tokens
over the sessions' calls (docs/gates.md, <i>Reports</i>).</p>
{{ sessions }}
{% for r in session_plots %}
{{ figure(r) }}
{% endfor %}
</section>{% endif %}

<section id="gate">
<h2>Gate</h2>
{% if gate %}<p class="meta">Baseline <code>{{ gate.baseline.name }}</code>
{%- if gate.baseline.path %} (<code>{{ gate.baseline.path }}</code>){% endif %};
{{ '%.0f'|format(gate.confidence * 100) }} % confidence. A gate fails only when its run proves the limit
exceeded; one with a regression to catch passes only when the run had the power to catch it, otherwise it
cannot be judged (docs/gates.md).</p>
{% if loose %}<ul class="problems">{% for l in loose %}
<li>looser than a user would set: {{ l }}</li>{% endfor %}</ul>{% endif %}
{{ gate_table }}
{% else %}<p>No gate was run: pass <code>--baseline FILE</code> or <code>--verdict gate.json</code>.</p>
{% endif %}
</section>
</body>
</html>
"""


def _html_table(table: Table, row_classes: Sequence[str] | None = None, left: int = 1) -> str:
    """An escaped HTML table; the first ``left`` columns are left-aligned (names, not numbers)."""
    head = "".join(
        f'<th class="l">{html.escape(c)}</th>' if i < left else f"<th>{html.escape(c)}</th>"
        for i, c in enumerate(table.columns)
    )
    body = []
    for j, row in enumerate(table.rows):
        cls = f' class="{row_classes[j]}"' if row_classes else ""
        cells = "".join(
            f'<td class="l">{html.escape(c)}</td>'
            if i < left or i == len(row) - 1
            else f"<td>{html.escape(c)}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


GATE_COLUMNS = ("run", "metric", "baseline", "limit", "measured", "delta", "interval", "n", "verdict", "why")


def gate_rows(report: GateReport) -> Table:
    rows: list[tuple[str, ...]] = []
    for g in report.gates:
        sign = "≤" if g.direction == "at_most" else "≥"
        delta = (
            "—" if g.delta is None else ("+" if g.delta >= 0 else "−") + format_value(abs(g.delta), g.unit)
        )
        why = g.why
        rows.append(
            (
                g.label or "—",
                g.id,
                format_value(g.baseline, g.unit),
                f"{sign} {format_value(g.limit, g.unit)}",
                format_value(g.measured, g.unit),
                delta,
                g.interval_text(),
                str(g.n),
                g.verdict,
                why,
            )
        )
    return Table(GATE_COLUMNS, rows)


@dataclass(frozen=True)
class NamedVerdict:
    """One verdict the report shows beside the others: what was judged, and where the file is."""

    name: str
    verdict: str
    """``pass``, ``fail`` or ``unjudgeable``."""
    exit_code: int
    headline: str
    file: str


def read_verdict(name: str, path: Path) -> tuple[NamedVerdict, GateReport | None]:
    """A verdict file as a row of the report's verdict table: a gate's ``gate.json`` (returned too, for
    the detail) or ``harness ab``'s ``ab.json`` (its judgement)."""
    from pydantic import ValidationError

    from harness.common.errors import InputError
    from harness.common.io import check_input_file, validation_input_error
    from harness.gates import read_report_json
    from harness.gates.ab import ABJudgement

    raw = orjson.loads(check_input_file(path).read_bytes())
    if isinstance(raw, dict) and "judgement" in raw:
        if raw["judgement"] is None:
            raise InputError("the A/B run did not finish: no judgement", file=path)
        try:
            j = ABJudgement.model_validate(raw["judgement"])
        except ValidationError as exc:
            raise validation_input_error(exc, file=path, expected="an A/B verdict (harness ab)") from None
        return NamedVerdict(name, j.verdict, j.exit_code, f"A/B: {j.headline}", str(path)), None
    report = read_report_json(path)
    return NamedVerdict(name, report.verdict, report.exit_code, report.headline(), str(path)), report


def loose_gates(report: GateReport) -> list[str]:
    """The gates whose limit is looser than a user would set (:func:`harness.gates.policy.loose_limit`)."""
    from harness.gates.policy import loose_limit

    out = []
    for g in report.gates:
        why = loose_limit(g.metric, g.unit, g.direction, g.baseline, g.limit)
        if why is not None:
            out.append(f"{g.id}@{g.label or '—'}: {why}")
    return list(dict.fromkeys(out))


def verdict_text(report: GateReport | None) -> tuple[str, str]:
    """The banner text and its CSS class: the verdict, or ``skipped`` (grey, not green) for a pass
    whose every gate was skipped (measured elsewhere than the baseline: nothing was judged)."""
    if report is None:
        return "Gate: not run", "none"
    text = (
        f"Gate {report.baseline.name}: {VERDICT_WORDS[report.verdict]} — {report.tally()} "
        f"(exit {report.exit_code})"
    )
    return text, "skipped" if report.all_skipped else report.verdict


def _run_notes(sets: Sequence[ResultSet]) -> list[tuple[str, str, list[str]]]:
    """Per run: where it came from (target, start, duration, inputs) and its problems and warnings."""
    out = []
    for rs in sets:
        s = rs.summary
        if s is None:
            about = "no summary.json"
        else:
            model = f" ({s.target.model})" if s.target.model else ""
            about = f"target {s.target.url}{model}, started {s.started_at}, {s.duration_s:.1f} s"
            for name, ref in (("corpus", s.corpus), ("schedule", s.schedule)):
                if ref is not None:
                    about += f", {name} sha256 {ref.sha256[:12]}"
        notes = [f"cannot be judged: {p}" for p in rs.problems]
        # summary.json's warnings, unless a problem above already quotes them.
        notes += [w for w in (s.warnings if s is not None else []) if not any(w in p for p in rs.problems)]
        out.append((rs.label, about, notes))
    return out


def _speedups(sets: Sequence[ResultSet]) -> str:
    both = pair(sets)
    if both is None:
        return ""
    parts = []
    for column, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
        x = speedup(both[0], both[1], column)
        if not math.isnan(x):
            parts.append(f"P95 {name} {x:.2f}× faster warm")
    return ", ".join(parts)


def render_html(
    sets: Sequence[ResultSet],
    gate: GateReport | None = None,
    *,
    title: str = "harness load report",
    tick: Tick | None = None,
    capacity: CapacityResult | None = None,
    verdicts: Sequence[NamedVerdict] = (),
    effect: EffectReport | None = None,
) -> str:
    """The whole report as one HTML string; ``capacity`` adds the capacity search's plot first,
    ``effect`` the warmup effect's section (its plot first);
    ``verdicts`` are shown as a table under the banner (``gate``, the first, in detail)."""
    plots = render_plots(sets, tick)
    turn_table = per_turn(sets)
    thinking = thinking_and_tools(sets)
    session_table = agent_sessions_table(sets)
    session_plots: list[RenderedPlot] = []
    if session_table.rows:
        # Read the session runs' records once for both figures (the summary keeps only aggregates).
        runs = session_runs(sets)
        session_plots = [
            rendered(MAKESPAN_PLOT, makespan_cdf(runs)),
            rendered(WATERFALL_PLOT, session_waterfall(runs)),
        ]
    if capacity is not None:
        drawn = capacity_plot(capacity)
        cap = (
            RenderedPlot(CAPACITY_PLOT, None, drawn)
            if isinstance(drawn, str)
            else RenderedPlot(CAPACITY_PLOT, to_png_base64(drawn), None)
        )
        plots.insert(0, cap)
    if effect is not None:
        drawn = effect_plot(effect, sets)
        plots.insert(
            0,
            RenderedPlot(EFFECT_PLOT, None, drawn)
            if isinstance(drawn, str)
            else RenderedPlot(EFFECT_PLOT, to_png_base64(drawn), None),
        )
    text, cls = verdict_text(gate)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(_TEMPLATE)
    return template.render(
        title=title,
        version=__version__,
        generated=datetime.now(UTC).isoformat(timespec="seconds"),
        sets=sets,
        verdict_text=text,
        verdict_class=cls,
        overview=_markup(overview(sets)),
        scenarios=_markup(per_scenario(sets), left=2),
        turns=_markup(turn_table, left=2) if turn_table.rows else "",
        thinking=_markup(thinking) if thinking.rows else "",
        sessions=_markup(session_table, left=1) if session_table.rows else "",
        session_plots=session_plots,
        plots=plots,
        speedups=_speedups(sets),
        run_notes=_run_notes(sets),
        gate=gate,
        gate_table=_markup(gate_rows(gate), left=2, classes=[g.verdict for g in gate.gates]) if gate else "",
        capacity_line=answer_line(capacity) if capacity is not None else "",
        effect=_markup(effect_rows(effect), left=2) if effect is not None else "",
        effect_line=effect_preload(effect) if effect is not None else "",
        verdicts=_markup(_verdict_table(verdicts), left=4, classes=[v.verdict for v in verdicts])
        if verdicts
        else "",
        loose=loose_gates(gate) if gate else [],
    )


VERDICT_COLUMNS = ("judged", "verdict", "exit", "what", "file")


def _verdict_table(verdicts: Sequence[NamedVerdict]) -> Table:
    words: dict[str, str] = {str(k): v for k, v in VERDICT_WORDS.items()}
    rows: list[tuple[str, ...]] = [
        (v.name, words.get(v.verdict, v.verdict.upper()), str(v.exit_code), v.headline, v.file)
        for v in verdicts
    ]
    return Table(VERDICT_COLUMNS, rows)


def _markup(table: Table, left: int = 1, classes: Sequence[str] | None = None) -> Markup:
    # Safe: _html_table escapes every cell itself.
    return Markup(_html_table(table, classes, left))


# ------------------------------------------------------------------------------------ markdown


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> list[str]:
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return lines


MD_MAX_GATES = 30


def render_markdown(
    sets: Sequence[ResultSet],
    gate: GateReport | None = None,
    html_name: str | None = None,
    verdicts: Sequence[NamedVerdict] = (),
    effect: EffectReport | None = None,
) -> str:
    """A short Markdown summary for a CI comment: verdict, one row per run, gates that did not pass."""
    text, cls = verdict_text(gate)
    icon = {"pass": "✅", "fail": "❌", "unjudgeable": "⚠️", "skipped": "⏭️"}.get(cls, "ℹ️")
    lines = [f"## {icon} {text}", ""]
    if verdicts:
        lines += [*_md_table(_verdict_table(verdicts)), ""]
    if gate is not None:
        lines += [f"- looser than a user would set: {loose}" for loose in loose_gates(gate)]
    ov = overview(sets)
    keep = ("run", "requests", "errors", "TTFT P95", "TPOT P95", "E2E P95", "hit rate", "warm rate", "status")
    idx = [ov.columns.index(c) for c in keep]
    lines += _md_table(Table(keep, [tuple(r[i] for i in idx) for r in ov.rows]))
    problems = [f"- {rs.label}: cannot be judged: {p}" for rs in sets for p in rs.problems]
    if problems:
        lines += ["", *problems]
    ups = _speedups(sets)
    if ups:
        lines += ["", f"Cold → warm: {ups}."]
    turns = per_turn(sets)
    if turns.rows:
        lines += ["", "### Per turn", "", *_md_table(turns)]
    thinking = thinking_and_tools(sets)
    if thinking.rows:
        lines += ["", "### Reasoning and tool calls", "", *_md_table(thinking)]
    sessions = agent_sessions_table(sets)
    if sessions.rows:
        lines += ["", "### Agent sessions", "", *_md_table(sessions)]
    if effect is not None:
        lines += ["", "### Warmup effect", "", effect_preload(effect), "", *_md_table(effect_rows(effect))]
    if gate is not None:
        rows = gate_rows(gate)
        not_passed = [r for r, g in zip(rows.rows, gate.gates, strict=True) if g.verdict != "pass"]
        shown = rows.rows if len(rows.rows) <= MD_MAX_GATES else not_passed
        lines += ["", f"### Gates ({'all' if shown is rows.rows else 'not passed'})", ""]
        if shown:
            lines += _md_table(Table(rows.columns, shown))
        else:
            lines.append(f"All {len(rows.rows)} gates passed.")
        # Failures in full (numbers and cause): what a reviewer reads first in the comment.
        reasons = [f"- `{g.id}@{g.label or '—'}`: {g.reason}" for g in gate.gates if g.verdict == "fail"]
        if reasons:
            lines += ["", *reasons[:MD_MAX_GATES]]
        # Skipped gates once per cause: the run was measured elsewhere than the baseline.
        skipped = Counter((g.label or "—", g.why) for g in gate.gates if g.verdict == "skipped")
        lines += [""] if skipped else []
        lines += [
            f"- skipped on `{label}` ({k} gate{'s' if k > 1 else ''}): {why}"
            for (label, why), k in skipped.items()
        ]
    if html_name:
        lines += ["", f"Full report with plots: `{html_name}`."]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    markdown: Path | None


def write_report(
    sets: Sequence[ResultSet],
    html_path: str | Path,
    *,
    markdown_path: str | Path | None = None,
    gate: GateReport | None = None,
    title: str = "harness load report",
    tick: Tick | None = None,
    capacity: CapacityResult | None = None,
    verdicts: Sequence[NamedVerdict] = (),
    effect: EffectReport | None = None,
) -> ReportFiles:
    """Write the HTML report (and the Markdown summary when ``markdown_path`` is given), atomically."""
    out = Path(html_path)
    page = render_html(
        sets, gate, title=title, tick=tick, capacity=capacity, verdicts=verdicts, effect=effect
    )
    with atomic_write(out) as fh:
        fh.write(page)
    md: Path | None = None
    if markdown_path is not None:
        md = Path(markdown_path)
        with atomic_write(md) as fh:
            fh.write(render_markdown(sets, gate, html_name=out.name, verdicts=verdicts, effect=effect))
    return ReportFiles(out, md)
