"""``harness analysis hitrate`` and ``plan``: the hit-rate ceiling of a request history and the
warmup plan (preload set, ladder) drawn from it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.analysis.cli_common import JSON_HELP, check_api, console, echo_json, pct, say
from harness.common.console import table
from harness.common.errors import InputError
from harness.common.io import write_json
from harness.common.options import old_spellings
from harness.load.options import LoadOptions, load_flags, typer_options

UNIT_HELP = "Cache unit: 'entries' (whole prompts) or 'blocks' (KV blocks from hash_ids)."


def _check_unit(unit: str) -> Any:
    from harness.analysis.references import UNITS

    if unit not in UNITS:
        raise typer.BadParameter(f"{unit!r} is not one of {', '.join(UNITS)}", param_hint="--unit")
    return unit


CACHE_CAPACITY_OLD = ("--cache-size", "--capacity")
"""The old spellings of ``--cache-capacity`` (``--capacity`` is the target's rate: docs/cli.md)."""


def _cache_capacity(sizes: list[int]) -> list[int]:
    """``--cache-capacity``'s values, each at least 1."""
    for size in sizes:
        if size < 1:
            raise typer.BadParameter(
                f"a cache capacity is at least 1, not {size}", param_hint="--cache-capacity"
            )
    return sizes


def _warn_sampled(lines: list[dict[str, Any]]) -> None:
    from harness.load.arrivals import is_sampled

    n = sum(is_sampled(line) for line in lines)
    if n:
        say(
            f"harness: warning: {n} of {len(lines)} preload lines sample (temperature > 0 without a seed): "
            "a response cache does not serve those by default (harness serve: HARNESS__CACHE__CACHE_SAMPLED)"
        )


@old_spellings(cache_capacity=CACHE_CAPACITY_OLD, fmt="--format")
def hitrate(
    *,
    trace: Annotated[
        Path, typer.Option("--trace", help="Request trace (Mooncake, …) or load run directory.")
    ],
    cache_capacity: Annotated[
        list[int],
        typer.Option(
            "--cache-capacity",
            help="How many entries or blocks (--unit) the cache holds; repeatable.",
            show_default=False,
        ),
    ],
    unit: Annotated[str, typer.Option("--unit", help=UNIT_HELP)] = "entries",
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            help="Simulators (min, lru, lru-protect, lfu, s3fifo, s3fifo-seeded, tinylfu); repeatable; "
            "default min, lru, lfu.",
        ),
    ] = None,
    head: Annotated[
        float | None, typer.Option("--head", help="Only the first fraction of the requests (0–1].")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--trace-format", help="Trace format (default: detected).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Belady (MIN) hit-rate ceiling beside LRU and LFU at each cache size, from an empty cache."""
    from harness.analysis.references import load_refs
    from harness.analysis.sim import SIMULATORS, hitrate_report

    capacity = _cache_capacity(cache_capacity)
    policies = policy or ["min", "lru", "lfu"]
    for p in policies:
        SIMULATORS.get(p)  # unknown names: a ConfigError listing the known ones
    refs = load_refs(trace, _check_unit(unit), format=fmt)
    if head is not None:
        refs = refs.head(head)
    report = hitrate_report(refs, capacity, policies)
    if as_json:
        echo_json(report.model_dump())
        return
    rows = [
        (f"{r.capacity:,}", r.policy, f"{r.hits:,}", pct(r.hit_rate), f"{r.requests_per_s:,.0f}")
        for r in report.results
    ]
    columns = ("cache size", "policy", "hits", "hit rate", "requests/s")
    title = f"{trace} — {report.requests:,} requests, {report.refs:,} {unit}, {report.distinct:,} distinct"
    console.print(table(title, columns, rows, left={"policy"}))
    console.print(f"cold ceiling (infinite cache): {pct(report.cold_ceiling)}", highlight=False)


@typer_options(*load_flags("key"))  # as the replay will send them: the cache keys on them
@old_spellings(
    cache_capacity=CACHE_CAPACITY_OLD,
    window_fraction="--window",
    max_error_rate="--max-failure-rate",
)
def plan(
    *,
    trace: Annotated[Path, typer.Option("--trace", help="History: request trace or load run directory.")],
    cache_capacity: Annotated[
        int,
        typer.Option(
            "--cache-capacity",
            help="How many entries or blocks (--unit) the cache to warm holds.",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("warmup-plan"),
    unit: Annotated[str, typer.Option("--unit", help=UNIT_HELP)] = "entries",
    window_fraction: Annotated[
        float,
        typer.Option(
            "--window-fraction",
            help="Evaluation window, a fraction: the history's last fraction; the plan judged on it is "
            "built from the requests before it (with --eval: the eval trace's first fraction).",
        ),
    ] = 0.1,
    eval_trace: Annotated[
        Path | None, typer.Option("--eval", help="Evaluate on this trace (it follows the history).")
    ] = None,
    in_sample: Annotated[
        bool,
        typer.Option(
            "--in-sample",
            help="Evaluation window = the history's first --window-fraction, which the plan sees (upper "
            "bound).",
        ),
    ] = False,
    predictor: Annotated[str, typer.Option("--predictor", help="recent, frequency or replay.")] = "recent",
    tau_s: Annotated[
        float | None,
        typer.Option(
            "--tau-s", help="Decay time of the predictor (default: the window's span; in sample / 10)."
        ),
    ] = None,
    policy: Annotated[str, typer.Option("--policy", help="Replacement policy of the warmed cache.")] = "lru",
    corpus: Annotated[
        Path | None, typer.Option("--corpus", help="Corpus replaying the history: enables preload.jsonl.")
    ] = None,
    stage_s: Annotated[float, typer.Option("--stage-s", help="Duration of each ladder stage.")] = 60.0,
    max_error_rate: Annotated[
        float, typer.Option("--max-error-rate", help="Tolerated error rate per ladder stage.")
    ] = 0.01,
    on_failure: Annotated[
        str, typer.Option("--on-failure", help="Ladder policy after a rollback: retry or stop.")
    ] = "retry",
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    load: dict[str, Any],
) -> None:
    """Rank keys by predicted reuse, pick the preload set, write preload JSONL and the ladder plan.

    ``ladder.yaml`` is the load stage's plan (``locust -f locustfiles/warmup.py --plan DIR/ladder.yaml``),
    naming ``preload.jsonl`` beside it, which the ladder posts to ``/cache/preload`` first.
    """
    from harness.analysis.references import load_refs
    from harness.analysis.warmup import PREDICTORS, ladder_plan, plan_warmup, preload_lines, write_preload
    from harness.load.plan import Policy, write_plan

    (capacity,) = _cache_capacity([cache_capacity])
    PREDICTORS.get(predictor)
    if on_failure not in ("retry", "stop"):
        raise typer.BadParameter("expected 'retry' or 'stop'", param_hint="--on-failure")
    if "api" in load:
        check_api(load["api"])  # a bad value fails before any work
    sends = LoadOptions.validated(load)  # what the replay will send: its options, its defaults
    u = _check_unit(unit)
    history = load_refs(trace, u)
    if eval_trace is not None and in_sample:
        raise typer.BadParameter(
            "--in-sample evaluates on the history itself, not --eval", param_hint="--eval"
        )
    if not 0.0 < window_fraction < 1.0:
        raise typer.BadParameter(f"{window_fraction} is not in (0, 1)", param_hint="--window-fraction")
    win = load_refs(eval_trace, u).head(window_fraction) if eval_trace is not None else None
    report, _, requests = plan_warmup(
        history,
        capacity,
        window=win,
        window_fraction=window_fraction,
        in_sample=in_sample,
        predictor=predictor,
        tau_s=tau_s,
        policy=policy,
    )
    out.mkdir(parents=True, exist_ok=True)
    preload_name: str | None = None
    if corpus is not None:
        lines, missing = preload_lines(
            history,
            requests,
            corpus,
            api=sends.api,
            model=sends.model,
            max_tokens_cap=sends.max_tokens_cap,
        )
        if not lines:
            raise InputError(
                "no request of the preload set has a corpus record (ids or provenance.source_line)",
                file=corpus,
            )
        write_preload(out / "preload.jsonl", lines)
        report = report.model_copy(update={"preload_lines_written": len(lines)})
        preload_name = "preload.jsonl"
        if missing:
            say(f"harness: warning: {missing} preload requests have no corpus record and were left out")
        _warn_sampled(lines)
    ladder = ladder_plan(
        history,
        stage_s=stage_s,
        max_failure_rate=max_error_rate,
        preload=preload_name,
        policy=Policy(on_failure="retry" if on_failure == "retry" else "stop", max_retries=1),
    )
    write_plan(
        out / "ladder.yaml",
        ladder,
        comment=f"warmup ladder from {trace}: stages at 10/25/50/75/100 % of its p95 arrival rate "
        "(10 s bins)\nlocust -f locustfiles/warmup.py --plan THIS_FILE --corpus … --host …",
    )
    write_json(out / "plan.json", report.model_dump())
    if as_json:
        echo_json(report.model_dump())
        return
    label = "in sample: an upper bound" if report.mode == "in_sample" else "out of sample"
    shown = table(
        f"warmup plan — cache size {capacity:,} {unit}; judged on {report.window_requests:,} requests "
        f"after a history of {report.history_requests:,} ({label})",
        ("measure", "hit rate"),
        left={"measure"},
    )
    shown.add_row(f"expected: preload + {policy.upper()}", pct(report.expected_hit_rate))
    shown.add_row("preload protected until first hit, then LRU", pct(report.protected_hit_rate))
    shown.add_row("preload + MIN (plan quality)", pct(report.plan_min_hit_rate))
    for p, v in report.plan_by_policy.items():
        if p not in {policy, "min", "lru-protect"}:  # those have their own rows
            shown.add_row(f"preload + {p.upper()}", pct(v))
    shown.add_row("history ceiling (best preload the history allows + MIN)", pct(report.history_ceiling))
    shown.add_row(f"best history preload + {policy.upper()}", pct(report.history_preload_hit_rate))
    shown.add_row("Belady ceiling (optimal preload + MIN)", pct(report.ceiling))
    for p, v in report.cold.items():
        shown.add_row(f"cold {p.upper()}", pct(v))
    console.print(shown)
    lim = report.limits
    console.print(
        f"expected / history ceiling = {report.ratio:.3f} (/ Belady {report.ratio_belady:.3f}); window "
        f"references to keys the history never saw {pct(lim.refs_unseen)} (one-off {pct(lim.refs_one_off)}); "
        f"preload used in the window {pct(lim.preload_used)}\n"
        f"preload {report.preload_keys:,} {unit} (from the whole history) via "
        f"{report.preload_requests:,} requests; wrote {out}/plan.json, {out}/ladder.yaml"
        + (f", {out}/preload.jsonl ({report.preload_lines_written} lines)" if preload_name else ""),
        highlight=False,
    )
