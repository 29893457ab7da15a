"""``harness corpus``: build a synthetic request corpus (or one of agent sessions from traces' call
graphs), and show the stats of one on disk."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from harness.common import console as cons
from harness.common.errors import CheckFailed, ConfigError, InputError
from harness.common.options import old_spellings

if TYPE_CHECKING:
    from rich.table import Table

    from harness.corpus.settings import Thresholds

app = typer.Typer(
    help="Synthetic request corpora: templates, few-shot pool, dedup, quality.", no_args_is_help=True
)
console = cons.err()

DEFAULT_TEMPLATE = Path("templates/prompts/four_section.j2")
SPREAD_OUT_S = 3600.0
"""Sessions whose recorded starts span more than this are suggested a rate, not their own times."""


@app.command(
    epilog="Example: harness corpus build --scenarios runs/scenarios.json --n 60 --seed 0 "
    "--max-input-tokens 320 -o runs/corpus"
)
@old_spellings(dedup_threshold="--threshold")
def build(  # noqa: PLR0917 - typer maps parameters to options
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Output directory (corpus.jsonl, manifest.json, quality.json)."),
    ],
    template: Annotated[
        Path, typer.Option("--template", help="A .j2 prompt template or a .messages.json spec.")
    ] = DEFAULT_TEMPLATE,
    n: Annotated[
        int | None,
        typer.Option("--n", min=1, help="Requests to produce (default with --trace: one per line)."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed; the same seed gives the same corpus.")
    ] = None,
    scenarios: Annotated[
        Path | None, typer.Option("--scenarios", help="scenarios.json weighting intents and lengths.")
    ] = None,
    fewshot: Annotated[
        list[Path] | None,
        typer.Option(
            "--fewshot",
            help="Request log for the few-shot pool and the queries (repeatable): CLINC150 JSON, "
            "CrossWOZ dialogues (.json or .json.zip) or a JSONL log; format detected. "
            "Default: the bundled CLINC150 and CrossWOZ samples.",
        ),
    ] = None,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Request trace giving arrivals, token lengths, hash_ids.")
    ] = None,
    trace_format: Annotated[
        str | None, typer.Option("--trace-format", help="Trace format (default: detected).")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="Target tokenizer.json or checkpoint dir.")
    ] = None,
    dedup_threshold: Annotated[
        float | None,
        typer.Option(
            "--dedup-threshold",
            help="Dedup: drop a request at least this cosine-similar to a kept one (default 0.82).",
        ),
    ] = None,
    dedup_method: Annotated[
        str | None, typer.Option("--dedup-method", help="Embedding pair search: auto, exact or faiss.")
    ] = None,
    locales: Annotated[
        str | None, typer.Option("--locales", help="Comma-separated Faker locales (en_US,zh_CN).")
    ] = None,
    template_root: Annotated[
        list[Path] | None, typer.Option("--template-root", help="Extra directory templates may include from.")
    ] = None,
    max_input_tokens: Annotated[
        int | None,
        typer.Option("--max-input-tokens", min=1, help="Clip prompt-length targets to the target's context."),
    ] = None,
    block_tokens: Annotated[
        int | None,
        typer.Option(
            "--block-tokens",
            min=1,
            help="Rescale the --trace so each hash_ids block is this many tokens (input lengths by the same "
            "factor; which requests share which blocks is kept).",
        ),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Fail (exit 1) when quality misses a threshold.")
    ] = True,
    sessions: Annotated[
        bool,
        typer.Option(
            "--sessions",
            help="Whole conversations from dialogue logs (--fewshot: CrossWOZ, a JSONL dialogue log, or "
            "an agent's log in OpenAI's chat shape with tool calls; default the bundled CrossWOZ "
            "sample), one record per turn; --n counts sessions, "
            "--trace gives session starts and think times (a JSONL trace with session ids, "
            "or Mooncake hash_ids: sessions inferred from growing prefixes).",
        ),
    ] = False,
    think_time: Annotated[
        str | None,
        typer.Option(
            "--think-time",
            help="With --sessions: think times where the log has no timestamps: lognormal:MEDIAN,SIGMA "
            "(default lognormal:8,0.8), exponential:MEAN or constant:SECONDS.",
        ),
    ] = None,
) -> None:
    """Build a corpus; deterministic for a seed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from harness.common.settings import load_settings
    from harness.corpus.build import BuildInputs, build_corpus
    from harness.corpus.settings import CorpusSettings, Thresholds

    settings = load_settings(
        CorpusSettings,
        seed=seed,
        tokenizer=tokenizer,
        dedup_threshold=dedup_threshold,
        dedup_method=dedup_method,
        max_input_tokens=max_input_tokens,
        block_tokens=block_tokens,
        locales=[s.strip() for s in locales.split(",") if s.strip()] if locales else None,
    )
    inputs = BuildInputs(
        template=template,
        out=out,
        n=n,
        scenarios=scenarios,
        fewshot=list(fewshot) if fewshot else None,
        trace=trace,
        trace_format=trace_format,
        template_roots=list(template_root or []),
    )
    if sessions:
        _build_sessions(out, template, n, fewshot, trace, template_root, think_time, settings, check)
        return
    if think_time is not None:
        raise ConfigError("--think-time applies to --sessions only", field="--think-time")
    tasks: dict[str, TaskID] = {}
    with Progress(
        TextColumn("{task.description:>14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:

        def tick(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        result = build_corpus(inputs, settings, tick)
    thresholds = Thresholds.of(settings)
    cons.out().print(_quality_table(result.metrics, thresholds))
    console.print(
        f"wrote {len(result.records)} requests to {out} ({result.candidates} candidates, "
        f"{result.dropped} near-duplicates dropped)"
    )
    _report_build(result.examples, result.failures, check, out, "corpus quality below threshold")


def _report_build(
    examples: list[dict[str, object]], failures: list[str], check: bool, out: Path, what: str
) -> None:
    """What both builds print after their tables: a few dropped near-duplicates, the quality
    failures, and with ``--check`` the failure as exit 1 naming ``quality.json``."""
    for ex in examples[:3]:
        console.print(f"  dropped {ex['dropped']!r} ≈ kept {ex['kept']!r} ({ex['cosine']})", highlight=False)
    for line in failures:
        console.print(f"[yellow]quality:[/] {line}", highlight=False)
    if check and failures:
        raise CheckFailed(f"{what}: " + "; ".join(failures), file=str(out / "quality.json"))


def _build_sessions(  # noqa: PLR0917 - the options of `build` that apply to sessions
    out: Path,
    template: Path,
    n: int | None,
    logs: list[Path] | None,
    trace: Path | None,
    template_root: list[Path] | None,
    think_time: str | None,
    settings: object,
    check: bool,
) -> None:
    from harness.corpus.sessions import DEFAULT_SESSION_TEMPLATE, SessionBuildInputs, build_sessions
    from harness.corpus.settings import CorpusSettings
    from harness.corpus.timing import ThinkTime

    assert isinstance(settings, CorpusSettings)
    inputs = SessionBuildInputs(
        out=out,
        logs=list(logs) if logs else None,
        template=DEFAULT_SESSION_TEMPLATE if template == DEFAULT_TEMPLATE else template,
        n=n,
        think_time=ThinkTime.parse(think_time) if think_time else ThinkTime(),
        trace=trace,
        template_roots=list(template_root or []),
    )
    result = build_sessions(inputs, settings)
    cons.out().print(_metrics_table("sessions", result.metrics))
    console.print(
        f"wrote {result.metrics['sessions']} sessions, {len(result.records)} turns to {out} "
        f"({result.dropped} sessions dropped: first turn a near-duplicate)"
    )
    _report_build(result.examples, result.failures, check, out, "session corpus")


@app.command(epilog="Example: harness corpus stats runs/corpus")
def stats(
    corpus: Annotated[Path, typer.Argument(help="A corpus directory (or its corpus.jsonl).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the metrics as JSON.")] = False,
) -> None:
    """Recompute quality metrics from a corpus on disk (no embeddings: diversity is lexical only)."""
    from collections import Counter

    from harness.common.settings import load_settings
    from harness.corpus import quality
    from harness.corpus.model import read_corpus
    from harness.corpus.settings import CorpusSettings, Thresholds

    records = list(read_corpus(corpus))
    if not records:
        raise InputError("corpus has no records", file=corpus)
    metrics = quality.compute(records)
    per_session = _session_stats(corpus, records)
    if as_json:
        doc: dict[str, object] = dict(metrics)
        if per_session is not None:
            doc["session_metrics"], doc["sessions"] = per_session
        typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return
    out = cons.out()
    # The same thresholds `build` checks, so HARNESS__CORPUS__MIN_* settings apply here too.
    out.print(_quality_table(metrics, Thresholds.of(load_settings(CorpusSettings))))
    composition = (
        ("lang", Counter(r.lang for r in records)),
        ("domain", Counter(r.domain for r in records)),
        ("scenario", Counter(r.scenario or "—" for r in records)),
        ("prefix groups", Counter("shared" if r.prefix_group else "none" for r in records)),
    )
    counts = [(name, ", ".join(f"{k}: {v}" for k, v in c.most_common(8))) for name, c in composition]
    out.print(cons.table("composition", ("field", "counts"), counts))
    if per_session is not None:
        session_metrics, rows = per_session
        out.print(_metrics_table("sessions", session_metrics))
        cells = [[str(v) for v in row.values()] for row in rows]
        out.print(cons.table(f"per session ({len(rows)})", rows[0], cells))


@app.command(
    "graph",
    epilog="Example: harness corpus graph runs/agent/graph.jsonl -o runs/agent",
)
def graph_cmd(
    graphs: Annotated[
        list[Path],
        typer.Argument(help="Replay graph JSONL files (harness traces graph), one session a line."),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Output directory (corpus.jsonl is written in it), or a .jsonl file to write."
        ),
    ],
    fill: Annotated[
        Path | None,
        typer.Option(
            "--fill",
            help="A corpus (directory or corpus.jsonl) whose records stand in for calls the trace "
            "recorded no content of: the one nearest the call's input tokens.",
        ),
    ] = None,
) -> None:
    """Agent sessions from traces' call graphs: one record per LLM call, replayed as the agent ran them."""
    from harness.common.io import check_output_file, iter_jsonl, write_jsonl
    from harness.corpus.graph import graph_records
    from harness.corpus.model import CORPUS_FILE, read_corpus
    from harness.traces.graph import SessionGraph

    target = out if out.suffix == ".jsonl" else out / CORPUS_FILE
    # Fail on a bad output path before reading anything.
    check_output_file(target)
    sessions: list[SessionGraph] = []
    files: dict[str, Path] = {}
    for path in graphs:
        for _, g in iter_jsonl(path, SessionGraph, expected="a session graph (harness traces graph)"):
            sessions.append(g)
            files.setdefault(g.session, path)
    fill_records = None
    if fill is not None:
        fill_records = list(read_corpus(fill))
        if not fill_records:
            raise InputError("the fill corpus has no records", file=fill)
    records = graph_records(sessions, fill=fill_records, file=files)
    write_jsonl(target, (r.model_dump(mode="json", exclude_none=True) for r in records))
    kept = [g for g in sessions if g.calls]
    fan_out = sum(1 for g in kept if g.fan_out() > 1)
    fan_in = sum(1 for g in kept if g.fan_in() > 1)
    # Sessions arrive at their traces' own starts: traces from different days span days (--speedup).
    span = max(r.arrival_offset_s or 0.0 for r in records)
    console.print(
        f"{len(records)} call{'s' * (len(records) != 1)} in {len(kept)} session{'s' * (len(kept) != 1)} "
        f"({fan_out} with fan-out, {fan_in} with fan-in; "
        f"arrivals over {span:,.1f} s) → {target}",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip
    # Traces from days apart would make a replay at their own times wait days: then the hint starts
    # the sessions at a rate instead, each once (--max-requests counts sessions).
    when = (
        f"--rate 1 --max-requests {len(kept)}"
        if span > SPREAD_OUT_S
        else f"--speedup {math.ceil(span / 60)}"
        if span > 600
        else ""
    )
    console.print(
        "next: locust -f locustfiles/replay.py --headless --host http://127.0.0.1:8000 "
        f"--corpus {target} {when + ' ' if when else ''}--out {target.parent / 'replay'}",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip


def _metrics_table(title: str, metrics: dict[str, Any]) -> Table:
    return cons.table(title, ("metric", "value"), [(k, str(v)) for k, v in metrics.items()])


def _quality_table(metrics: dict[str, float | int | None], thresholds: Thresholds) -> Table:
    """The quality metrics with their thresholds (:func:`harness.corpus.quality.limits`) and marks."""
    from harness.corpus import quality

    limits = quality.limits(thresholds)
    rows: list[tuple[str, str, str, str]] = []
    for name, value in metrics.items():
        shown = "—" if value is None else (f"{value:.4f}" if isinstance(value, float) else str(value))
        limit, kind = limits.get(name, (None, ""))
        if limit is None or value is None:
            rows.append((name, shown, "", ""))
            continue
        mark = "[green]✓[/]" if quality.meets(value, limit, kind) else "[red]✗[/]"
        rows.append((name, shown, f"{'≥' if kind == 'min' else '≤'} {limit}", mark))
    return cons.table(
        "corpus quality", ("metric", ("value", "right"), ("threshold", "right"), ("ok", "center")), rows
    )


def _session_stats(corpus: Path, records: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A session corpus's metrics and per-session rows, as its build wrote them to ``quality.json``
    (history tokens counted with the manifest's tokenizer, else the configured one); ``None`` for a
    corpus of single requests."""
    if not any(r.session is not None for r in records):
        return None
    from harness.common.settings import load_settings
    from harness.corpus.model import MANIFEST_FILE, Manifest
    from harness.corpus.sessions import session_metrics, session_rows
    from harness.corpus.settings import CorpusSettings
    from harness.corpus.tokens import load_tokenizer

    manifest = (corpus if corpus.is_dir() else corpus.parent) / MANIFEST_FILE
    if manifest.is_file():
        tokenizer: str | None = Manifest.model_validate_json(manifest.read_bytes()).tokenizer
    else:
        configured = load_settings(CorpusSettings).tokenizer
        tokenizer = str(configured) if configured else None
    rows = session_rows(records, load_tokenizer(tokenizer, 0).count_batch)
    return session_metrics(records, rows), rows
