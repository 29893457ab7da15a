"""``harness analysis tiers``: hot-zone tiers of a corpus's queries → a tier policy file for the cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from harness.analysis.cli_common import JSON_HELP, console, echo_json, pct
from harness.common.console import table
from harness.common.io import write_json


def tiers(
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="Tier policy file to write (JSON).")] = Path(
        "tiers.json"
    ),
    corpus: Annotated[Path | None, typer.Option("--corpus", help="Corpus whose queries to classify.")] = None,
    run: Annotated[
        list[Path] | None,
        typer.Option("--run", help="Load run(s) that replayed the corpus: counts, entropy."),
    ] = None,
    queries: Annotated[
        Path | None, typer.Option("--queries", help="JSONL of {query, count?, mean_entropy?, api?}.")
    ] = None,
    entropy: Annotated[
        Path | None, typer.Option("--entropy", help="JSONL of {query|id|prompt_fp, mean_entropy}.")
    ] = None,
    cache_state: Annotated[
        Path | None, typer.Option("--cache-state", help="Saved cache state dir: fallback entropy.")
    ] = None,
    radius: Annotated[float, typer.Option("--radius", help="Zone radius (cosine distance).")] = 0.3,
    density_min: Annotated[float, typer.Option("--density-min", help="Hot needs density ≥ this.")] = 50.0,
    entropy_max: Annotated[float, typer.Option("--entropy-max", help="Hot needs entropy ≤ this.")] = 2.1,
    ttl_hot: Annotated[float | None, typer.Option("--ttl-hot", help="Seconds (default: cache's).")] = None,
    ttl_warm: Annotated[float | None, typer.Option("--ttl-warm", help="Seconds.")] = None,
    ttl_cold: Annotated[float | None, typer.Option("--ttl-cold", help="Seconds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Hot-zone tiers: cluster queries, density and entropy per zone → tier policy file for the cache."""
    from pydantic import ValidationError

    from harness.analysis.tiers import (
        TierThresholds,
        apply_cache_state,
        apply_entropy_file,
        build_tiers,
        default_ttls,
        embed_queries,
        queries_from_corpus,
        queries_from_rows,
    )
    from harness.target.cache.policy import TierTTLs

    if corpus is not None and queries is None:
        qs = queries_from_corpus(corpus, run or [])
    elif queries is not None and corpus is None:
        qs = queries_from_rows(queries)
    else:
        raise typer.BadParameter("give exactly one of --corpus and --queries", param_hint="--corpus")
    if entropy is not None:
        apply_entropy_file(qs, entropy)
    if cache_state is not None:
        apply_cache_state(qs, cache_state)
    try:
        th = TierThresholds(radius=radius, density_min=density_min, entropy_max=entropy_max)
        base = default_ttls()
        ttl = TierTTLs(hot=ttl_hot or base.hot, warm=ttl_warm or base.warm, cold=ttl_cold or base.cold)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc.errors()[0]["msg"])) from None
    vectors = embed_queries(qs, show_progress=sys.stderr.isatty())
    tier_file, report = build_tiers(qs, vectors, th, ttl)
    write_json(out, tier_file.model_dump(mode="json"))
    if as_json:
        echo_json(report.model_dump())
        return
    rows = [
        (
            str(z.id),
            z.tier,
            f"{z.density:,.0f}",
            "—" if z.entropy is None else f"{z.entropy:.2f}",
            f"{z.queries:,}",
            z.example[:60],
        )
        for z in report.zones[:30]
    ]
    columns = ("zone", "tier", "density", "entropy", "queries", "example")
    title = f"hot zones — {report.queries:,} queries, {report.requests:,} requests"
    console.print(table(title, columns, rows, left={"tier", "example"}))
    console.print(
        f"tiers: {report.tiers}; entropy known for {pct(report.entropy_known)} of requests; "
        f"TTLs hot/warm/cold {ttl.hot:g}/{ttl.warm:g}/{ttl.cold:g} s; wrote {out} "
        f"(harness serve --cache --tiers {out})",
        highlight=False,
    )
