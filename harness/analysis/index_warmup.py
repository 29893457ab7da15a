"""Embedding-index warmup: how long a FAISS index takes to come back after a restart, and what it costs.

For each index kind in :data:`INDEX_KINDS` (``flat``: exact ``IndexFlatIP``; ``ivf``: ``IndexIVFFlat``
with ``√n`` lists, trained on the vectors; ``hnsw``: ``IndexHNSWFlat``, M = 32) and each size, the
index is built from the vectors, saved with ``faiss.write_index``, loaded back with
``faiss.read_index`` (timed, median of repeats; the load is what a restarted L3 pays before it can
answer) and checked: the loaded index's reconstructed vectors must equal the originals within
1e-5 (every kind here stores vectors uncompressed, so reconstruction is exact; IVF needs its direct
map, which is made before saving), and a search for a sample of the vectors themselves must return
them first (self-recall; HNSW and IVF are approximate). Memory is the serialized size and the
resident-memory growth of loading the index in a fresh Python process (in this process freed
memory of the build would be reused and hide it).

Vectors come from a corpus (embedded with the shared MiniLM), an ``.npy`` matrix, or both; sizes
beyond the vectors available are made by tiling them with small Gaussian noise (renormalized), so
that large sizes can be timed on a small corpus (said so in the report as ``synthetic``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.embeddings import FloatMatrix
from harness.common.errors import InputError
from harness.common.model import StrictModel
from harness.common.registry import Registry
from harness.common.stats import percentile

RECONSTRUCT_TOL = 1e-5

IndexBuilder = Callable[[FloatMatrix], Any]
INDEX_KINDS: Registry[IndexBuilder] = Registry("FAISS index kind")


@INDEX_KINDS.register("flat")
def build_flat(x: FloatMatrix) -> Any:
    import faiss

    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    return index


@INDEX_KINDS.register("ivf")
def build_ivf(x: FloatMatrix) -> Any:
    import faiss

    n, d = x.shape
    # √n lists, but at least 39 training points per list (FAISS's own rule of thumb).
    nlist = max(1, min(int(math.sqrt(n)), n // 39))
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    index.make_direct_map()  # reconstruct() by id; saved with the index
    index.nprobe = max(1, nlist // 8)
    return index


@INDEX_KINDS.register("hnsw")
def build_hnsw(x: FloatMatrix) -> Any:
    import faiss

    index = faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 40
    index.add(x)
    index.hnsw.efSearch = 64
    return index


class IndexResult(StrictModel):
    """One index kind at one size."""

    kind: str
    n: int
    dim: int
    synthetic: int
    """Vectors made by tiling with noise (0: all real)."""
    build_s: float
    save_s: float
    load_s: float
    """Median ``faiss.read_index`` time over the repeats."""
    load_s_all: list[float]
    file_bytes: int
    rss_growth_bytes: int
    """Resident memory a fresh process gained by loading the index."""
    fresh_load_s: float
    """The load time in that fresh process (cold allocator, warm page cache)."""
    reconstruct_max_err: float | None
    """Largest |reconstructed − original| over all vectors; ``None``: the index cannot reconstruct."""
    reconstruct_ok: bool | None
    self_recall: float
    """Share of sampled vectors that find themselves first."""


def grow(vectors: FloatMatrix, n: int, seed: int = 0, noise: float = 0.02) -> tuple[FloatMatrix, int]:
    """``n`` unit vectors: the given ones first, then noisy renormalized copies; (matrix, synthetic)."""
    have = vectors.shape[0]
    if have == 0:
        raise InputError("no vectors to build indexes from")
    if n <= have:
        return np.ascontiguousarray(vectors[:n]), 0
    rng = np.random.default_rng(seed)
    extra = vectors[rng.integers(0, have, size=n - have)] + rng.normal(
        0.0, noise, (n - have, vectors.shape[1])
    )
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    return np.ascontiguousarray(np.vstack([vectors, extra.astype(np.float32)])), n - have


_FRESH_LOAD = """
import sys, time, faiss, psutil
proc = psutil.Process()
before = proc.memory_info().rss
t0 = time.perf_counter()
index = faiss.read_index(sys.argv[1])
dt = time.perf_counter() - t0
print(proc.memory_info().rss - before, dt, index.ntotal)
"""


def fresh_load(path: Path) -> tuple[int, float]:
    """(RSS growth in bytes, seconds) of ``faiss.read_index`` in a new Python process."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _FRESH_LOAD, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    growth, seconds, _ = out.stdout.split()
    return max(0, int(growth)), float(seconds)


def warm_index(
    kind: str, x: FloatMatrix, out_dir: Path, *, repeats: int = 3, synthetic: int = 0
) -> IndexResult:
    """Build, save, load (timed ``repeats`` times) and check one index."""
    import faiss

    builder = INDEX_KINDS.get(kind)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{kind}-{x.shape[0]}.faiss"
    t0 = time.perf_counter()
    index = builder(x)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tmp = path.with_name(f".{path.name}.tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(path)  # atomic: a reader never sees half an index
    save_s = time.perf_counter() - t0
    del index
    loads: list[float] = []
    loaded: Any = None
    for _ in range(max(1, repeats)):
        loaded = None
        t0 = time.perf_counter()
        loaded = faiss.read_index(str(path))
        loads.append(time.perf_counter() - t0)
    assert loaded is not None
    rss_growth, fresh_s = fresh_load(path)
    err: float | None
    try:
        rec = loaded.reconstruct_n(0, loaded.ntotal)
        err = float(np.max(np.abs(rec - x))) if x.size else 0.0
    except RuntimeError:
        err = None  # this index type keeps no reconstructable vectors
    sample = np.linspace(0, x.shape[0] - 1, num=min(200, x.shape[0]), dtype=np.int64)
    _, ids = loaded.search(x[sample], 1)
    recall = float(np.mean(ids[:, 0] == sample))
    return IndexResult(
        kind=kind,
        n=int(x.shape[0]),
        dim=int(x.shape[1]),
        synthetic=synthetic,
        build_s=build_s,
        save_s=save_s,
        load_s=percentile(loads, 50),
        load_s_all=loads,
        file_bytes=path.stat().st_size,
        rss_growth_bytes=rss_growth,
        fresh_load_s=fresh_s,
        reconstruct_max_err=err,
        reconstruct_ok=None if err is None else err <= RECONSTRUCT_TOL,
        self_recall=recall,
    )


def index_warmup(
    vectors: FloatMatrix,
    sizes: Sequence[int],
    kinds: Sequence[str],
    out_dir: str | Path,
    *,
    repeats: int = 3,
) -> list[IndexResult]:
    """Every kind at every size (vectors grown with noise where needed)."""
    out: list[IndexResult] = []
    for n in sizes:
        if n < 1:
            raise InputError(f"index size must be at least 1, got {n}", field="sizes")
        x, synthetic = grow(vectors, n)
        for kind in kinds:
            out.append(warm_index(kind, x, Path(out_dir), repeats=repeats, synthetic=synthetic))
    return out


def corpus_texts(corpus: str | Path) -> list[str]:
    """The texts of a corpus, as the L3 cache would embed them (each record's text)."""
    from harness.corpus.model import read_corpus

    return [rec.text() for rec in read_corpus(corpus)]


def load_vectors(path: str | Path) -> FloatMatrix:
    """An ``(n, d)`` float32 ``.npy`` matrix (no pickle), rows normalized."""
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", file=p)
    try:
        with p.open("rb") as fh:
            x = np.load(fh, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"not a NumPy array file ({exc})", file=p) from None
    if x.ndim != 2 or x.shape[0] == 0:
        raise InputError(f"expected an (n, d) matrix, got shape {x.shape}", file=p)
    x = x.astype(np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(x)
