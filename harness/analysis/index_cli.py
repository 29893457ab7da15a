"""``harness analysis index``: FAISS index warmup (build, save, timed load, check) from real embeddings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from harness.analysis.cli_common import JSON_HELP, console, echo_json
from harness.common.console import table


def index(
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the saved indexes.")] = Path(
        ".harness/index-warmup"
    ),
    corpus: Annotated[Path | None, typer.Option("--corpus", help="Corpus to embed (MiniLM).")] = None,
    vectors: Annotated[Path | None, typer.Option("--vectors", help="(n, d) float32 .npy matrix.")] = None,
    sizes: Annotated[str, typer.Option("--sizes", help="Comma-separated index sizes.")] = "1000,10000",
    kinds: Annotated[
        str, typer.Option("--kinds", help="Comma-separated: flat, ivf, hnsw.")
    ] = "flat,ivf,hnsw",
    repeats: Annotated[int, typer.Option("--repeats", help="Timed loads per index.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Build, save, load (timed) and check FAISS Flat/IVF/HNSW indexes from corpus embeddings."""
    import numpy as np

    from harness.analysis.index_warmup import INDEX_KINDS, corpus_texts, index_warmup, load_vectors

    if corpus is None and vectors is None:
        raise typer.BadParameter("give --corpus or --vectors", param_hint="--corpus")
    kind_list = [k.strip() for k in kinds.split(",") if k.strip()]
    for k in kind_list:
        INDEX_KINDS.get(k)
    try:
        size_list = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"{sizes!r} is not a list of integers", param_hint="--sizes") from None
    mats = []
    if vectors is not None:
        mats.append(load_vectors(vectors))
    if corpus is not None:
        from harness.common.embeddings import shared_embedder

        mats.append(shared_embedder().encode(corpus_texts(corpus), show_progress=sys.stderr.isatty()))
    x = np.ascontiguousarray(np.vstack(mats), dtype=np.float32)
    results = index_warmup(x, size_list, kind_list, out, repeats=repeats)
    if as_json:
        echo_json([r.model_dump() for r in results])
        return
    shown = table(
        f"FAISS index warmup — {x.shape[0]:,} real vectors, dim {x.shape[1]}",
        ("kind", "n", "synthetic", "build s", "load ms", "fresh load ms", "file MiB", "RSS MiB",
         "reconstruct", "self-recall"),
        left={"kind"},
    )  # fmt: skip
    for r in results:
        rec = (
            "n/a"
            if r.reconstruct_ok is None
            else ("ok" if r.reconstruct_ok else f"FAIL {r.reconstruct_max_err:.1e}")
        )
        shown.add_row(
            r.kind,
            f"{r.n:,}",
            f"{r.synthetic:,}",
            f"{r.build_s:.2f}",
            f"{r.load_s * 1000:.1f}",
            f"{r.fresh_load_s * 1000:.1f}",
            f"{r.file_bytes / 2**20:.1f}",
            f"{r.rss_growth_bytes / 2**20:.1f}",
            rec,
            f"{r.self_recall:.3f}",
        )
    console.print(shown)
    if any(r.reconstruct_ok is False for r in results):
        from harness.common.errors import CheckFailed

        raise CheckFailed("a loaded index does not reconstruct its vectors within 1e-5")
