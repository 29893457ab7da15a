"""Near-duplicate removal on unit-norm embeddings at a cosine threshold.

Invariant: after :func:`dedup`, no two kept items have cosine ≥ ``threshold``. Keep order is greedy
first-come: item ``j`` is dropped iff some kept ``i < j`` is at or above the threshold; its
representative is the first such ``i``. That makes the result a function of the input order only.

Candidate pairs come from one of two searches, registered by name:

* ``exact``: blockwise matrix products over the upper triangle (N²/2 dot products, BLAS-bound);
* ``faiss``: an IVF inner-product index with ``nprobe`` probed lists and ``range_search`` — far
  fewer dot products; it can miss a pair whose two ends fall in lists the other does not probe,
  so its recall is measured in the benchmark and tests against ``exact`` (see docs/corpus.md).

Either way every candidate is re-checked with one float32 dot per pair (:func:`_verify`), so both
searches decide the threshold identically.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.common.registry import Registry

Pairs = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float32]]
PairSearch = Callable[[npt.NDArray[np.float32], float], Pairs]

searches: Registry[PairSearch] = Registry("dedup method")

EXACT_MAX_N = 20_000
"""``auto`` uses ``exact`` up to this many vectors, ``faiss`` beyond."""
_SLACK = 1e-4  # candidates are gathered a little below the threshold, then re-checked exactly


@dataclass
class DedupResult:
    keep: npt.NDArray[np.int64]
    """Indices of kept items, ascending."""
    dropped: dict[int, int]
    """Dropped index → its representative (a kept index before it)."""
    pairs: int
    """Pairs at or above the threshold found among all items."""
    method: str
    examples: list[tuple[int, int, float]] = field(default_factory=list)
    """Up to 10 (kept, dropped, cosine) examples."""

    @property
    def n_dropped(self) -> int:
        return len(self.dropped)


def _verify(
    x: npt.NDArray[np.float32], i: npt.NDArray[np.int64], j: npt.NDArray[np.int64], threshold: float
) -> Pairs:
    sims = np.einsum("ij,ij->i", x[i], x[j]).astype(np.float32)
    ok = sims >= threshold
    return i[ok], j[ok], sims[ok]


@searches.register("exact")
def pairs_exact(x: npt.NDArray[np.float32], threshold: float, block: int = 1024) -> Pairs:
    """All pairs i < j with cosine ≥ threshold, by blockwise products of the upper triangle."""
    n = len(x)
    ii: list[npt.NDArray[np.int64]] = []
    jj: list[npt.NDArray[np.int64]] = []
    for s in range(0, n, block):
        e = min(n, s + block)
        sims = x[s:e] @ x[s:].T  # (rows, n - s): only columns at or after the block start
        r, c = np.nonzero(sims >= threshold - _SLACK)
        c = c + s
        upper = c > r + s
        ii.append((r[upper] + s).astype(np.int64))
        jj.append(c[upper].astype(np.int64))
    if not ii:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    return _verify(x, np.concatenate(ii), np.concatenate(jj), threshold)


@searches.register("faiss")
def pairs_faiss(
    x: npt.NDArray[np.float32],
    threshold: float,
    nlist: int | None = None,
    nprobe: int | None = None,
    seed: int = 0,
) -> Pairs:
    """Candidate pairs from an inverted-file partition (FAISS spherical k-means), re-checked exactly.

    Each vector lives in its nearest list and probes its ``nprobe`` nearest lists; a pair is a
    candidate when either end probes the other's list. Per list, all probing vectors are scored
    against its members in one matrix product, so the scan runs at BLAS speed (FAISS's own
    ``range_search`` over IVF lists scores one vector at a time and was ~10× slower here).
    """
    import faiss

    n, d = x.shape
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    nlist = nlist or max(1, min(4096, int(3 * math.sqrt(n))))
    nlist = max(1, min(nlist, n // 39))  # FAISS wants ~39 training points per list
    nprobe = min(nprobe or max(16, nlist // 20), nlist)
    rng = np.random.default_rng(seed)
    train = x if n <= nlist * 40 else x[np.sort(rng.choice(n, size=nlist * 40, replace=False))]
    km = faiss.Kmeans(d, nlist, niter=10, spherical=True, seed=seed, verbose=False)
    km.train(np.ascontiguousarray(train))
    _, probes = km.index.search(x, nprobe)  # (n, nprobe) nearest lists, nearest first
    primary = probes[:, 0]
    order = np.argsort(primary, kind="stable")
    starts = np.searchsorted(primary[order], np.arange(nlist + 1))
    flat_lists = probes.ravel()
    q_order = np.argsort(flat_lists, kind="stable")
    q_starts = np.searchsorted(flat_lists[q_order], np.arange(nlist + 1))
    ii: list[npt.NDArray[np.int64]] = []
    jj: list[npt.NDArray[np.int64]] = []
    for c in range(nlist):
        members = order[starts[c] : starts[c + 1]]
        if len(members) == 0:
            continue
        queries = (q_order[q_starts[c] : q_starts[c + 1]] // nprobe).astype(np.int64)
        sims = x[queries] @ x[members].T
        r, k = np.nonzero(sims >= threshold - _SLACK)
        a, b = queries[r], members[k].astype(np.int64)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        ne = lo != hi
        ii.append(lo[ne])
        jj.append(hi[ne])
    if not ii:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    i = np.concatenate(ii)
    j = np.concatenate(jj)
    if len(i):
        key = np.unique(i * n + j)  # a pair found from both ends is kept once
        i, j = key // n, key % n
    return _verify(x, i, j, threshold)


def greedy_keep(n: int, pairs: Pairs) -> tuple[npt.NDArray[np.int64], dict[int, int]]:
    """First-come greedy: drop ``j`` iff a kept ``i < j`` pairs with it; returns (keep, dropped → rep)."""
    i, j, _ = pairs
    kept = np.ones(n, dtype=bool)
    dropped: dict[int, int] = {}
    if len(i):
        order = np.lexsort((i, j))  # by j, then i: the first kept i is the representative
        i, j = i[order], j[order]
        bounds = np.flatnonzero(np.diff(j)) + 1
        for gi, gj in zip(np.split(i, bounds), np.split(j, bounds), strict=True):
            jj = int(gj[0])
            for cand in gi:
                if kept[cand]:
                    kept[jj] = False
                    dropped[jj] = int(cand)
                    break
    return np.flatnonzero(kept).astype(np.int64), dropped


def dedup(
    vectors: npt.NDArray[np.float32],
    threshold: float = 0.82,
    method: str = "auto",
    **search_kwargs: int,
) -> DedupResult:
    """Drop near-duplicates (cosine ≥ ``threshold``) from unit-norm ``vectors``, keeping first occurrences."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if method == "auto":
        method = "exact" if len(x) <= EXACT_MAX_N else "faiss"
    search = searches.get(method)
    pairs = search(x, threshold, **search_kwargs) if search_kwargs else search(x, threshold)
    keep, dropped = greedy_keep(len(x), pairs)
    sims = (
        {(int(a), int(b)): float(s) for a, b, s in zip(*pairs, strict=True)}
        if len(pairs[0]) <= 100_000
        else {}
    )
    examples = [(rep, d, sims.get((rep, d), float("nan"))) for d, rep in sorted(dropped.items())[:10]]
    return DedupResult(keep=keep, dropped=dropped, pairs=len(pairs[0]), method=method, examples=examples)


def surviving_pairs(vectors: npt.NDArray[np.float32], keep: npt.NDArray[np.int64], threshold: float) -> int:
    """Pairs ≥ threshold among kept items (0 when the invariant holds), by exact search."""
    return len(pairs_exact(np.ascontiguousarray(vectors[keep], dtype=np.float32), threshold)[0])


# --------------------------------------------------------------------------- judges per language

MARGIN = 1e-4
"""Judges drop at ``threshold - MARGIN``: batch-dependent float noise in an embedding (≈1e-6) can
then never make a kept pair reach the threshold when someone re-embeds the texts independently."""


class Judge:
    """Decides which texts of one language are near-duplicates, by a cosine on its own vectors.

    Subclasses are registered in :data:`judges` by name and chosen per language by the
    ``dedup_judges`` setting (``{"en": "embedding", "zh": "char-tfidf"}``). ``vectors`` returns
    row vectors of unit norm (dense or scipy-sparse), ``stack`` appends rows, ``pairs`` finds every
    pair at or above a threshold.
    """

    name = "judge"

    def vectors(self, texts: list[str], *, ahead: Sequence[str] = ()) -> Any:
        """Rows for ``texts``, in order. ``ahead``: texts likely asked for next, which a judge that
        keeps a memo computes in the same pass (the others ignore them)."""
        raise NotImplementedError

    def stack(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def pairs(self, x: Any, threshold: float) -> Pairs:
        raise NotImplementedError

    def describe(self) -> dict[str, object]:
        raise NotImplementedError


judges: Registry[Callable[..., Judge]] = Registry("dedup judge")


@judges.register("embedding")
class EmbeddingJudge(Judge):
    """Cosine of sentence embeddings (the shared MiniLM :class:`~harness.common.embeddings.Embedder`);
    pairs by the ``exact`` or ``faiss`` search (``method``)."""

    name = "embedding"

    def __init__(
        self,
        embedder: Any,
        method: str = "auto",
        tick: Callable[[int, int], None] | None = None,
        **_: object,
    ) -> None:
        self.embedder = embedder
        self.method = method
        self.tick = tick or (lambda done, total: None)
        self.encoded = 0
        """Texts sent to the encoder (each distinct text once per judge)."""
        self._memo: dict[str, npt.NDArray[np.float32]] = {}

    def vectors(self, texts: list[str], *, ahead: Sequence[str] = ()) -> npt.NDArray[np.float32]:
        # A text judged before (a few-shot pool line drawn again as a query, or a query encoded
        # ahead of its round) is not re-encoded.
        todo = list(dict.fromkeys(t for t in (*texts, *ahead) if t not in self._memo))
        chunk = max(self.embedder.batch_size * 8, 512)
        for s in range(0, len(todo), chunk):
            part = todo[s : s + chunk]
            for t, v in zip(part, self.embedder.encode(part), strict=True):
                self._memo[t] = v
            self.tick(min(len(todo), s + chunk), len(todo))
        self.encoded += len(todo)
        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        return np.ascontiguousarray(np.stack([self._memo[t] for t in texts]), dtype=np.float32)

    def memo(self) -> dict[str, npt.NDArray[np.float32]]:
        """Every vector this judge has encoded (or was given by :meth:`remember`), by text."""
        return dict(self._memo)

    def remember(self, vectors: dict[str, npt.NDArray[np.float32]]) -> None:
        """Serve these texts' vectors from now on without encoding them (a cached few-shot pool's,
        made by the same model in an earlier build: the vectors that build's memo held)."""
        for t, v in vectors.items():
            self._memo.setdefault(t, np.asarray(v, dtype=np.float32))

    def stack(self, a: Any, b: Any) -> Any:
        return b if len(a) == 0 else np.vstack([a, b])

    def pairs(self, x: Any, threshold: float) -> Pairs:
        method = self.method if self.method != "auto" else ("exact" if len(x) <= EXACT_MAX_N else "faiss")
        return searches.get(method)(np.ascontiguousarray(x, dtype=np.float32), threshold)

    def describe(self) -> dict[str, object]:
        return {"method": "embedding", "model": getattr(self.embedder, "name", "?"), "search": self.method}


@judges.register("char-tfidf")
class CharTfidfJudge(Judge):
    """Cosine of character 2–3-gram TF-IDF vectors: a lexical guard for languages the embedder was
    not trained on. The IDF is fitted once on a fixed reference (every text of the language the
    sources hold), so a text's vector does not depend on which other candidates were drawn and
    greedy dedup stays prefix-stable. :meth:`refit_pairs` re-checks a kept set with the IDF fitted on
    that set alone, the other natural reading of "TF-IDF cosine", so the corpus passes both."""

    name = "char-tfidf"
    NGRAMS = (2, 3)

    def __init__(self, reference: list[str], **_: object) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.reference_size = len(reference)
        self.vec = TfidfVectorizer(analyzer="char", ngram_range=self.NGRAMS, dtype=np.float32)
        self.vec.fit(reference or [" "])

    def vectors(self, texts: list[str], *, ahead: Sequence[str] = ()) -> Any:
        return self.vec.transform(texts).tocsr()  # rows are L2-normalized: dot products are cosines

    def stack(self, a: Any, b: Any) -> Any:
        import scipy.sparse as sp

        return b if a.shape[0] == 0 else sp.vstack([a, b], format="csr")

    def pairs(self, x: Any, threshold: float) -> Pairs:
        return sparse_pairs(x, threshold)

    def refit_pairs(self, texts: list[str], threshold: float) -> Pairs:
        """Pairs of ``texts`` at or above ``threshold`` with the IDF fitted on ``texts`` themselves."""
        from sklearn.feature_extraction.text import TfidfVectorizer

        if len(texts) < 2:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
        vec = TfidfVectorizer(analyzer="char", ngram_range=self.NGRAMS, dtype=np.float32)
        return sparse_pairs(vec.fit_transform(texts).tocsr(), threshold)

    def describe(self) -> dict[str, object]:
        return {
            "method": "char-tfidf",
            "ngrams": list(self.NGRAMS),
            "idf_reference_texts": self.reference_size,
            "also_checked": "IDF refitted on the kept texts",
        }


def sparse_pairs(x: Any, threshold: float, block: int = 2048) -> Pairs:
    """All pairs i < j of sparse unit rows with dot ≥ threshold, blockwise (memory stays bounded)."""
    n = x.shape[0]
    ii: list[npt.NDArray[np.int64]] = []
    jj: list[npt.NDArray[np.int64]] = []
    ss: list[npt.NDArray[np.float32]] = []
    xt = x.T.tocsc()
    for s in range(0, n, block):
        prod = (x[s : s + block] @ xt).tocoo()
        r = prod.row.astype(np.int64) + s
        c = prod.col.astype(np.int64)
        keep = (c > r) & (prod.data >= threshold)
        ii.append(r[keep])
        jj.append(c[keep])
        ss.append(prod.data[keep].astype(np.float32))
    if not ii:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    return np.concatenate(ii), np.concatenate(jj), np.concatenate(ss)
