"""The few-shot pool: the top requests of a production log, clustered by domain, sampled by stratum.

The log's top ``N`` lines by confidence are embedded and clustered with KMeans (``k`` given, or the
``k`` in a small range with the best silhouette). Strata are the log's ``domain`` labels when
lines carry them (clusters are then a check on how well the labels separate, reported as purity),
else the clusters. :func:`allocate` splits a sample over strata proportionally to their weight with
a floor, so every domain appears even when one dominates the log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.common.errors import InputError
from harness.common.io import iter_jsonl
from harness.corpus.model import FewShotLogEntry

if TYPE_CHECKING:
    from harness.common.embeddings import Embedder


def read_log(path: str | Path) -> list[FewShotLogEntry]:
    """Parse a few-shot JSONL log; errors name the file, line and field."""
    out: list[FewShotLogEntry] = []
    seen: set[str] = set()
    for lineno, entry in iter_jsonl(path, FewShotLogEntry):
        if entry.id in seen:
            raise InputError(f"duplicate id {entry.id!r}", file=path, line=lineno, field="id")
        seen.add(entry.id)
        out.append(entry)
    if not out:
        raise InputError("no log lines", file=path)
    return out


def top_by_confidence(entries: list[FewShotLogEntry], n: int) -> list[FewShotLogEntry]:
    """The ``n`` most confident lines; ties broken by id so the pool is deterministic."""
    return sorted(entries, key=lambda e: (-e.confidence, e.id))[:n]


def allocate(weights: Mapping[str, float], total: int, floor: int = 1) -> dict[str, int]:
    """Split ``total`` draws over strata ∝ weight, each getting at least ``floor`` (largest remainder).

    When ``total < floor × strata`` the floor wins (every stratum still appears).
    """
    keys = sorted(weights)
    if not keys:
        return {}
    base = {k: floor for k in keys}
    rest = max(0, total - floor * len(keys))
    w = np.array([max(0.0, weights[k]) for k in keys], dtype=np.float64)
    w = w / w.sum() if w.sum() > 0 else np.full(len(keys), 1.0 / len(keys))
    exact = w * rest
    whole = np.floor(exact).astype(int)
    left = rest - int(whole.sum())
    order = sorted(range(len(keys)), key=lambda i: (-(exact[i] - whole[i]), keys[i]))
    for i in order[:left]:
        whole[i] += 1
    return {k: base[k] + int(whole[i]) for i, k in enumerate(keys)}


@dataclass
class FewShotPool:
    """Pool entries, their strata, and the stratified shot set requests draw from."""

    entries: list[FewShotLogEntry]
    strata: list[str]
    clusters: list[int]
    k: int
    silhouette: float | None
    purity: float | None
    shots: list[int] = field(default_factory=list)
    """Indices into ``entries``: the stratified sample requests take their examples from."""

    @property
    def weights(self) -> dict[str, float]:
        c = Counter(self.strata)
        return {s: n / len(self.strata) for s, n in c.items()}

    def for_request(self, domain: str, rng: np.random.Generator, per_prompt: int) -> list[FewShotLogEntry]:
        """``per_prompt`` shots: one from the request's own domain when the shot set has one, then mixed."""
        if per_prompt <= 0 or not self.shots:
            return []
        same = [i for i in self.shots if self.strata[i] == domain]
        chosen: list[int] = []
        if same:
            chosen.append(same[int(rng.integers(len(same)))])
        others = [i for i in self.shots if i not in chosen]
        take = min(per_prompt - len(chosen), len(others))
        if take > 0:
            chosen.extend(int(others[j]) for j in rng.choice(len(others), size=take, replace=False))
        return [self.entries[i] for i in chosen]

    def summary(self) -> dict[str, object]:
        return {
            "pool_size": len(self.entries),
            "k": self.k,
            "silhouette": self.silhouette,
            "purity": self.purity,
            "strata": dict(sorted(Counter(self.strata).items())),
            "shot_set": dict(sorted(Counter(self.strata[i] for i in self.shots).items())),
        }


def cluster(
    vectors: np.ndarray, k: int | None, seed: int, k_range: tuple[int, int] = (2, 10)
) -> tuple[np.ndarray, int, float | None]:
    """KMeans labels, the ``k`` used, and its silhouette (``k`` chosen by silhouette when not given)."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    n = len(vectors)
    if n < 3:
        return np.zeros(n, dtype=int), 1, None
    if k is not None:
        k = max(1, min(k, n))
        labels = KMeans(n_clusters=k, n_init=4, random_state=seed).fit_predict(vectors)
        sil = float(silhouette_score(vectors, labels, metric="cosine")) if 1 < k < n else None
        return labels, k, sil
    best: tuple[float, int, np.ndarray] | None = None
    for kk in range(k_range[0], min(k_range[1], n - 1) + 1):
        labels = KMeans(n_clusters=kk, n_init=4, random_state=seed).fit_predict(vectors)
        sil = float(silhouette_score(vectors, labels, metric="cosine"))
        if best is None or sil > best[0]:
            best = (sil, kk, labels)
    assert best is not None
    return best[2], best[1], best[0]


def build_pool(
    entries: list[FewShotLogEntry],
    embedder: Embedder,
    *,
    top_n: int = 100,
    k: int | None = None,
    shot_set_size: int = 12,
    floor: int = 1,
    seed: int = 0,
) -> FewShotPool:
    """Top ``top_n`` by confidence → embeddings → clusters → strata → stratified shot set."""
    top = top_by_confidence(entries, top_n)
    vecs = embedder.encode([e.text for e in top])
    labels, k_used, sil = cluster(vecs, k, seed)
    labelled = all(e.domain for e in top)
    strata = [str(e.domain) if labelled else f"cluster-{int(c)}" for e, c in zip(top, labels, strict=True)]
    purity = None
    if labelled:
        agree = 0
        for c in set(labels.tolist()):
            in_cluster = [strata[i] for i in range(len(top)) if labels[i] == c]
            agree += Counter(in_cluster).most_common(1)[0][1]
        purity = agree / len(top)
    pool = FewShotPool(top, strata, [int(c) for c in labels], k_used, sil, purity)
    alloc = allocate(pool.weights, shot_set_size, floor)
    rng = np.random.default_rng(seed)
    shots: list[int] = []
    for stratum in sorted(alloc):
        members = [i for i, name in enumerate(strata) if name == stratum]
        take = min(alloc[stratum], len(members))
        shots.extend(sorted(int(members[j]) for j in rng.choice(len(members), size=take, replace=False)))
    pool.shots = shots
    return pool
