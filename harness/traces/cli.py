"""``harness traces``: inspect trace files, extract cold paths, build scenarios and arrival schedules.

Every command streams its inputs (bounded memory), reports bad input as one :class:`InputError` line
(exit 3) and, with ``--skip-invalid``, skips bad rows and reports how many and why on stderr.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
import typer

from harness.common import console as cons
from harness.common.errors import ConfigError, HarnessError
from harness.common.options import old_spellings
from harness.common.settings import load_settings
from harness.traces.settings import default

app = typer.Typer(
    help="Read distributed and LLM request traces; extract cold paths, scenarios and schedules.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
err_console = cons.err()


def _say(text: str) -> None:
    """One plain message on stderr: file names and messages are not Rich markup, and long lines wrap
    softly so paths stay copyable."""
    err_console.print(text, highlight=False, markup=False, soft_wrap=True)


FORMAT_HELP = "Trace format (default: detected). One of the names `harness traces formats` lists."
SKIP_HELP = "Skip invalid rows/spans instead of stopping at the first; report how many and why."
RENAMED = old_spellings(output="--output", format="--format")
"""The old spellings of the commands reading traces: ``--output`` of ``--out`` (every output path is
``--out/-o``), ``--format`` of ``--trace-format`` (docs/cli.md)."""


@contextmanager
def _progress(label: str) -> Iterator[Any]:
    """A transient spinner with a running count, shown only on a terminal."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed:,.0f}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not sys.stderr.isatty(),
    ) as progress:
        task = progress.add_task(label, total=None)

        def advance(n: int = 1) -> None:
            progress.advance(task, n)

        yield advance


def _report_skips(skips: Any) -> None:
    if skips.count:
        _say(f"harness: warning: {skips.summary()}")
        for example in skips.examples[:3]:
            _say(f"  e.g. {example}")


def _fmt_time(us: float, epoch: bool) -> str:
    if not epoch:
        return f"+{us / 1e6:.6f}s (not an epoch)"
    return dt.datetime.fromtimestamp(us / 1e6, tz=dt.UTC).isoformat()


def _settings() -> Any:
    from harness.traces.settings import TracesSettings

    return load_settings(TracesSettings)


@app.command("formats", epilog="Example: harness traces formats")
def formats_cmd() -> None:
    """List the input formats and what they read."""
    from harness.traces._base import all_readers
    from harness.traces.api import formats  # noqa: F401  (registers readers)

    for family, reader in sorted(all_readers(), key=lambda fr: (fr[0], fr[1].name)):
        typer.echo(f"{reader.name:12} {family:9} {reader.description}")


def inspect_file(path: str, fmt: str | None, skip_invalid: bool) -> dict[str, Any]:
    """Format, counts, time range and warnings of one input, as a JSON-ready dict."""
    from harness.traces._base import SkipLog, family_of
    from harness.traces.api import detect_format, read_requests, read_traces

    name = fmt or detect_format(path)
    skips = SkipLog()
    info: dict[str, Any] = {"file": path, "format": name}
    family = family_of(name)
    with _progress(f"reading {Path(path).name}") as advance:
        if family == "requests":
            n = 0
            first = last = None
            tokens_in = tokens_out = failed = 0
            tenants: set[str] = set()
            services: set[str] = set()
            for ev in read_requests(path, format=name, skip_invalid=skip_invalid, on_skip=skips):
                n += 1
                first = ev.arrival_s if first is None else first
                last = ev.arrival_s
                tokens_in += ev.input_tokens
                tokens_out += ev.output_tokens
                failed += ev.failed
                if ev.tenant:
                    tenants.add(ev.tenant)
                if ev.service:
                    services.add(ev.service)
                if n % 10_000 == 0:
                    advance(10_000)
            info.update(
                family="requests",
                requests=n,
                failed=failed,
                tenants=len(tenants),
                services=sorted(services),
                input_tokens=tokens_in,
                output_tokens=tokens_out,
                time_range_s=[first, last] if n else None,
                warnings=[],
            )
        else:
            traces = spans = 0
            services = set()
            lo = hi = None
            epoch = True
            warnings: list[str] = []
            n_warn = 0
            for tr in read_traces(path, format=name, skip_invalid=skip_invalid, on_skip=skips):
                traces += 1
                spans += len(tr.spans)
                services |= tr.services
                lo = tr.start_us if lo is None else min(lo, tr.start_us)
                end = tr.start_us + tr.duration_us
                hi = end if hi is None else max(hi, end)
                epoch = epoch and tr.epoch_known
                n_warn += len(tr.warnings)
                warnings.extend(
                    f"trace {tr.trace_id}: {w}" for w in tr.warnings[: max(0, 20 - len(warnings))]
                )
                advance(1)
            info.update(
                family="traces",
                traces=traces,
                spans=spans,
                services=sorted(services),
                time_range=[_fmt_time(lo, epoch), _fmt_time(hi, epoch)]
                if lo is not None and hi is not None
                else None,
                epoch_known=epoch,
                warning_count=n_warn,
                warnings=warnings,
            )
    info["skipped"] = skips.count
    info["skip_reasons"] = dict(skips.reasons)
    return info


@app.command(
    "inspect", epilog="Example: harness traces inspect fixtures/traces/mooncake_synthetic_head20.jsonl --json"
)
@old_spellings(format="--format")
def inspect_cmd(
    *,
    files: Annotated[list[str], typer.Argument(help="Trace files (or a Jaeger query URL).")],
    format: Annotated[str | None, typer.Option("--trace-format", "-f", help=FORMAT_HELP)] = None,
    skip_invalid: Annotated[bool, typer.Option("--skip-invalid", help=SKIP_HELP)] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per file instead of text.")
    ] = False,
) -> None:
    """Print each file's detected format, counts, time range and warnings."""
    for path in files:
        try:
            info = inspect_file(path, format, skip_invalid)
        except HarnessError as exc:
            if as_json:
                typer.echo(orjson.dumps(exc.to_dict()).decode())
                raise typer.Exit(int(exc.exit_code)) from None
            raise
        if as_json:
            typer.echo(orjson.dumps(info).decode())
            continue
        typer.echo(f"{path}: {info['format']}")
        if info["family"] == "requests":
            typer.echo(
                f"  requests {info['requests']:,} (failed {info['failed']:,}), tenants {info['tenants']}, "
                f"services {len(info['services'])}"
            )
            typer.echo(f"  tokens   in {info['input_tokens']:,}  out {info['output_tokens']:,}")
            if info["time_range_s"]:
                a, b = info["time_range_s"]
                typer.echo(f"  arrivals {a:.3f}s … {b:.3f}s")
        else:
            typer.echo(
                f"  traces {info['traces']:,}  spans {info['spans']:,}  services {len(info['services'])}"
            )
            if info["time_range"]:
                typer.echo(f"  time   {info['time_range'][0]} … {info['time_range'][1]}")
            typer.echo(f"  warnings {info['warning_count']}")
            for w in info["warnings"][:10]:
                typer.echo(f"    {w}")
        if info["skipped"]:
            reasons = "; ".join(f"{n}× {r}" for r, n in Counter(info["skip_reasons"]).most_common(3))
            typer.echo(f"  skipped {info['skipped']} invalid: {reasons}")


def _coldpath_config(
    threshold_ms: float | None,
    protocol: str | None,
    hops: str | None,
    cache_scope: str | None,
    cache_hit: list[str] | None,
) -> Any:
    from harness.traces.coldpaths import ColdPathConfig

    s = _settings()
    return ColdPathConfig.build(
        threshold_ms=s.threshold_ms if threshold_ms is None else threshold_ms,
        protocols=protocol or s.protocols,
        hops=hops or s.hops,
        cache_scope=cache_scope or s.cache_scope,
        cache_hit=cache_hit if cache_hit else s.cache_hit,
    )


def check_inputs(files: list[str], fmt: str | None) -> list[str]:
    """Check every input before any is read (exists, readable, text; the format named or
    detected), so a bad last file fails at once, not after the others were streamed. Returns the
    format of each."""
    from harness.common.io import check_input_file
    from harness.traces._base import family_of
    from harness.traces.api import URL_PREFIXES, detect_format

    if fmt is not None:
        family_of(fmt)  # an unknown name is a ConfigError listing the formats
    names = []
    for path in files:
        if fmt is not None and not path.startswith(URL_PREFIXES):
            check_input_file(path)
        names.append(fmt or detect_format(path))
    return names


def collect_coldpaths(
    files: list[str], fmt: str | None, skip_invalid: bool, config: Any
) -> tuple[list[Any], Any, Any]:
    from harness.traces._base import SkipLog
    from harness.traces.api import read_traces
    from harness.traces.coldpaths import ColdPathStats, extract
    from harness.traces.model import ColdPathRecord

    skips = SkipLog()
    stats = ColdPathStats()
    out: list[ColdPathRecord] = []
    for path, name in zip(files, check_inputs(files, fmt), strict=True):
        if name == "coldpaths":
            from harness.common.io import check_input_file
            from harness.traces.readers.coldpaths import read_records

            out.extend(rec for _, rec in read_records(check_input_file(path), skip_invalid, skips))
            continue
        with _progress(f"cold paths in {Path(path).name}") as advance:
            for tr in read_traces(path, format=name, skip_invalid=skip_invalid, on_skip=skips):
                out.extend(extract(tr, config, stats))
                advance(1)
    out.sort(key=lambda r: (r.start_us, r.trace_id, r.hop_span_id))
    return out, stats, skips


@app.command(
    "coldpaths",
    epilog="Example: harness traces coldpaths fixtures/traces/genaiTestTrace.json --hops all --protocol any "
    "--cache-scope hop -o runs/coldpaths.jsonl",
)
@RENAMED
def coldpaths_cmd(
    *,
    files: Annotated[list[str], typer.Argument(help="Jaeger / OTLP trace files (or a Jaeger query URL).")],
    output: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Cold-path JSONL to write.", show_default="coldpaths.jsonl"),
    ] = None,
    format: Annotated[str | None, typer.Option("--trace-format", "-f", help=FORMAT_HELP)] = None,
    threshold_ms: Annotated[
        float | None,
        typer.Option(
            "--threshold-ms", help=f"First-hop latency threshold, ms (default {default('threshold_ms'):g})."
        ),
    ] = None,
    protocol: Annotated[
        str | None,
        typer.Option(
            "--protocol",
            help=f"Comma-separated: http, grpc, genai, other or any (default {default('protocols')}).",
        ),
    ] = None,
    hops: Annotated[
        str | None,
        typer.Option("--hops", help=f"first or all cross-service server spans (default {default('hops')})."),
    ] = None,
    cache_scope: Annotated[
        str | None, typer.Option("--cache-scope", help=f"subtree or hop (default {default('cache_scope')}).")
    ] = None,
    cache_hit: Annotated[
        list[str] | None,
        typer.Option(
            "--cache-hit", help="Cache-hit predicate (repeatable): key, key=value, key~text, key>number."
        ),
    ] = None,
    skip_invalid: Annotated[bool, typer.Option("--skip-invalid", help=SKIP_HELP)] = False,
) -> None:
    """Extract cold paths (slow, uncached first hops of HTTP/gRPC call chains) to JSONL."""
    from harness.common.io import check_output_file, write_jsonl

    output = output or Path("coldpaths.jsonl")
    config = _coldpath_config(threshold_ms, protocol, hops, cache_scope, cache_hit)
    check_output_file(output)
    paths, stats, skips = collect_coldpaths(files, format, skip_invalid, config)
    n = write_jsonl(output, (p.model_dump(mode="json") for p in paths))
    rejected = ", ".join(f"{v} {k}" for k, v in stats.rejected.most_common())
    _say(
        f"{n} cold path(s) from {stats.traces} trace(s), {stats.hops} hop(s)"
        + (f"; rejected: {rejected}" if rejected else "")
        + f" → {output}"
    )
    _report_skips(skips)


@app.command(
    "scenarios", epilog="Example: harness traces scenarios runs/coldpaths.jsonl --k 12 -o runs/scenarios.json"
)
@RENAMED
def scenarios_cmd(
    *,
    files: Annotated[
        list[str], typer.Argument(help="Cold-path JSONL (or trace files: cold paths are extracted).")
    ],
    k: Annotated[
        int | None, typer.Option("--k", help=f"Number of scenario classes (default {default('k')}).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="ScenarioSet JSON to write.", show_default="scenarios.json"),
    ] = None,
    format: Annotated[str | None, typer.Option("--trace-format", "-f", help=FORMAT_HELP)] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help=f"k-means seed (default {default('seed')}).")
    ] = None,
    threshold_ms: Annotated[
        float | None,
        typer.Option("--threshold-ms", help=f"For trace inputs (default {default('threshold_ms'):g})."),
    ] = None,
    protocol: Annotated[str | None, typer.Option("--protocol", help="For trace inputs.")] = None,
    hops: Annotated[str | None, typer.Option("--hops", help="For trace inputs.")] = None,
    cache_scope: Annotated[str | None, typer.Option("--cache-scope", help="For trace inputs.")] = None,
    skip_invalid: Annotated[bool, typer.Option("--skip-invalid", help=SKIP_HELP)] = False,
) -> None:
    """Cluster cold paths into k scenario classes (weights, latency/token distributions, examples)."""
    from harness.common.io import check_output_file, write_json
    from harness.traces.scenarios import build_scenarios

    output = output or Path("scenarios.json")
    s = _settings()
    k = s.k if k is None else k
    if k < 1:
        raise ConfigError("--k must be ≥ 1")
    config = _coldpath_config(threshold_ms, protocol, hops, cache_scope, None)
    check_output_file(output)
    paths, _stats, skips = collect_coldpaths(files, format, skip_invalid, config)

    scen, _warnings = build_scenarios(
        paths, k=k, threshold_ms=config.threshold_ms, sources=files, seed=s.seed if seed is None else seed
    )
    for w in _warnings:
        _say(f"harness: warning: {w}")
    write_json(output, scen.model_dump(mode="json"))
    _say(f"{len(scen.classes)} scenario class(es) from {len(paths)} cold path(s) → {output}")
    _report_skips(skips)


@app.command(
    "graph",
    epilog="Example: harness traces graph fixtures/traces/genaiTestTrace.json -o runs/graph.jsonl",
)
def graph_cmd(
    *,
    files: Annotated[
        list[str], typer.Argument(help="Jaeger / OTLP trace files of agent runs (GenAI spans).")
    ],
    output: Annotated[
        Path | None, typer.Option("--out", "-o", help="Replay graph JSONL to write (one session a line).")
    ] = None,
    format: Annotated[str | None, typer.Option("--trace-format", "-f", help=FORMAT_HELP)] = None,
    max_gap_s: Annotated[
        float | None,
        typer.Option("--max-gap", min=0.0, help="Cap the recorded gap before a call at this many seconds."),
    ] = None,
    coldpaths: Annotated[
        Path | None,
        typer.Option(
            "--coldpaths",
            help="Cold-path JSONL of the same traces (harness traces coldpaths): marks each "
            "session cold or warm.",
        ),
    ] = None,
    sessions: Annotated[
        str,
        typer.Option(
            "--sessions", help="Keep all sessions, or only the cold or the warm ones (--coldpaths)."
        ),
    ] = "all",
    skip_invalid: Annotated[bool, typer.Option("--skip-invalid", help=SKIP_HELP)] = False,
) -> None:
    """Agent traces' replay graph: each trace's LLM calls, which waits for which, the gaps, the requests."""
    from harness.common.io import check_input_file, check_output_file, write_jsonl
    from harness.traces._base import SkipLog
    from harness.traces.api import read_traces
    from harness.traces.graph import SessionGraph, replay_graphs
    from harness.traces.readers.coldpaths import read_records

    if sessions not in {"all", "cold", "warm"}:
        raise ConfigError(f"--sessions is all, cold or warm, not {sessions!r}", field="--sessions")
    if sessions != "all" and coldpaths is None:
        raise ConfigError(f"--sessions {sessions} needs --coldpaths FILE", field="--sessions")
    if output is not None:
        check_output_file(output)
    skips = SkipLog()
    cold = None
    if coldpaths is not None:
        cold = {rec.trace_id for _, rec in read_records(check_input_file(coldpaths), skip_invalid, skips)}
    gap_ms = max_gap_s * 1000.0 if max_gap_s is not None else None
    keep: Literal["all", "cold", "warm"] = (
        "cold" if sessions == "cold" else "warm" if sessions == "warm" else "all"
    )
    graphs: list[SessionGraph] = []
    traces = 0
    for fmt, path in zip(check_inputs(files, format), files, strict=True):
        for trace in read_traces(path, format=fmt, skip_invalid=skip_invalid, on_skip=skips):
            traces += 1
            graphs += replay_graphs([trace], max_gap_ms=gap_ms, cold=cold, sessions=keep)
    for g in graphs:
        _print_graph(g)
    if output is not None:
        write_jsonl(output, (g.model_dump(mode="json", exclude_none=True) for g in graphs))
    calls = sum(len(g.calls) for g in graphs)
    kept = "" if sessions == "all" else f" {sessions}"
    _say(
        f"{calls} LLM call(s) in {len(graphs)}{kept} session(s) of {traces} trace(s)"
        + (f" → {output}" if output else "")
    )
    _report_skips(skips)


def _print_graph(g: Any) -> None:
    from harness.common.console import table

    index = {c.id: str(i) for i, c in enumerate(g.calls, start=1)}
    rows = [
        [
            index[c.id],
            c.name,
            c.agent or "",
            ",".join(index[p] for p in c.depends_on) or "start",
            ",".join(index[p] for p in c.uses_output),
            f"{c.gap_ms:,.0f}",
            f"{c.offset_ms:,.0f}",
            f"{c.duration_ms:,.0f}",
            f"{c.input_tokens or '?'}→{c.output_tokens or '?'}",
            "yes" if c.content else "no",
        ]
        for c in g.calls
    ]
    # "after": the calls it waits for; "uses": those whose output its input holds; "text": content recorded
    columns = ["#", "call", "agent", "after", "uses", "gap ms", "at ms", "ms", "in→out", "text"]
    state = "" if g.cold is None else (" (cold)" if g.cold else " (warm)")
    title = (
        f"session {g.session}{state}: {len(g.calls)} calls, fan-out {g.fan_out()}, fan-in {g.fan_in()}; "
        f"critical path {g.critical_path_ms:,.0f} ms of {g.makespan_ms:,.0f} ms recorded"
    )
    cons.out().print(table(title, columns, rows, left={"call", "agent", "after", "uses"}))


@app.command(
    "schedule",
    epilog="Example: harness traces schedule --rate 2 --duration 60 --seed 0 -o runs/schedule.jsonl",
)
@old_spellings(output="--output", format="--format", process="--process")
def schedule_cmd(
    *,
    source: Annotated[
        str | None, typer.Option("--from", help="Request trace to replay (Mooncake, Azure, …).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Schedule JSONL to write.", show_default="schedule.jsonl"),
    ] = None,
    format: Annotated[str | None, typer.Option("--trace-format", "-f", help=FORMAT_HELP)] = None,
    speedup: Annotated[float, typer.Option("--speedup", help="Replay faster (2 = twice the rate).")] = 1.0,
    start_s: Annotated[float, typer.Option("--start", help="Window start, seconds of source time.")] = 0.0,
    end_s: Annotated[float | None, typer.Option("--end", help="Window end, seconds of source time.")] = None,
    max_gap_s: Annotated[
        float | None, typer.Option("--max-gap", help="Cap idle gaps at this many source seconds.")
    ] = None,
    include_failed: Annotated[
        bool, typer.Option("--include-failed", help="Keep requests the source marks failed.")
    ] = False,
    rate: Annotated[float | None, typer.Option("--rate", help="Synthetic: mean requests per second.")] = None,
    process: Annotated[
        str, typer.Option("--arrival", help="Synthetic: the arrival process, poisson or gamma.")
    ] = "poisson",
    cv: Annotated[
        float, typer.Option("--cv", help="Synthetic gamma: coefficient of variation of the gaps.")
    ] = 1.0,
    duration_s: Annotated[
        float | None, typer.Option("--duration", help="Synthetic: seconds of schedule.")
    ] = None,
    count: Annotated[int | None, typer.Option("--count", help="Synthetic: number of entries.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Synthetic: random seed.")] = 0,
    scenarios: Annotated[
        Path | None, typer.Option("--scenarios", help="Synthetic: label entries by class weight.")
    ] = None,
    skip_invalid: Annotated[bool, typer.Option("--skip-invalid", help=SKIP_HELP)] = False,
) -> None:
    """Write an arrival schedule (JSONL of intended offsets) from a request trace or a synthetic process."""
    from harness.common.io import check_output_file, write_jsonl
    from harness.traces import schedule as sched
    from harness.traces._base import SkipLog
    from harness.traces.api import load_scenarios, read_requests

    output = output or Path("schedule.jsonl")
    skips = SkipLog()
    if (source is None) == (rate is None):
        raise ConfigError("give exactly one of --from FILE (replay) or --rate R (synthetic)")
    check_output_file(output)
    if source is not None:
        (fmt,) = check_inputs([source], format)
        events = read_requests(source, format=fmt, skip_invalid=skip_invalid, on_skip=skips)
        entries = sched.from_requests(
            events,
            speedup=speedup,
            start_s=start_s,
            end_s=end_s,
            max_gap_s=max_gap_s,
            include_failed=include_failed,
        )
    else:
        assert rate is not None
        scen = load_scenarios(scenarios) if scenarios is not None else None
        entries = sched.synthetic(
            rate=rate, process=process, cv=cv, duration_s=duration_s, count=count, seed=seed, scenarios=scen
        )
    with _progress("schedule entries") as advance:

        def rows() -> Iterator[dict[str, Any]]:
            for i, e in enumerate(entries, start=1):
                if i % 10_000 == 0:
                    advance(10_000)
                yield e.model_dump(mode="json", exclude_defaults=True) | {"offset_s": e.offset_s}

        n = write_jsonl(output, rows())
    _say(f"{n} schedule entr{'y' if n == 1 else 'ies'} → {output}")
    _report_skips(skips)
