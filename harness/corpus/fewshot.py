"""The few-shot pool: the most confident real requests of the logs, stratified by domain, deduplicated.

**Confidence.** A log line's own ``confidence`` when it has one (the JSONL log). Lines without
one (CLINC150, CrossWOZ) get the confidence of their label: ``0.5 + (cos_own − cos_other) / 2``,
where ``cos_own`` is the cosine between the line's character 2–3-gram TF-IDF vector and the
centroid of the other lines with its label (leave-one-out), and ``cos_other`` the best cosine to
another label's centroid. It lies in [0, 1] and is above 0.5 exactly when a nearest-centroid
classifier would give the line its own label: typical, unambiguous phrasings rank first.

**Strata.** The lines' domain labels; a log without labels is clustered (KMeans on the judge's
vectors, ``k`` by silhouette in 2..10) and the clusters are the strata. The pool's ``top_n`` (100)
places are allocated over strata in proportion to their size with a floor (:func:`allocate`), and
each stratum is filled with its most confident lines, skipping any line the language's dedup
judge finds too close (cosine ≥ threshold) to one already in the pool. A stratified shot set is
drawn from the pool, and each prompt shows a few shots, one from its own domain when possible.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.corpus.dedup import MARGIN, Judge
from harness.corpus.logs import Utterance


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


def label_confidence(texts: Sequence[str], labels: Sequence[str]) -> np.ndarray:
    """Nearest-centroid label confidence of each text (see the module docstring), in [0, 1]."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    n = len(texts)
    if n == 0:
        return np.zeros(0)
    x = TfidfVectorizer(analyzer="char", ngram_range=(2, 3), dtype=np.float64).fit_transform(texts).tocsr()
    names = sorted(set(labels))
    if len(names) < 2:
        return np.full(n, 0.5)
    index = {lab: k for k, lab in enumerate(names)}
    y = np.array([index[lab] for lab in labels])
    counts = np.bincount(y, minlength=len(names)).astype(np.float64)
    sums = np.vstack([np.asarray(x[y == k].sum(axis=0)).ravel() for k in range(len(names))])  # (L, F)
    sq = np.einsum("ij,ij->i", sums, sums)  # ‖Σ_l‖²
    dots = np.asarray(x @ sums.T)  # (n, L): x · Σ_l
    cos = dots / np.sqrt(np.maximum(sq, 1e-12))[None, :]
    rows = np.arange(n)
    own_dot = dots[rows, y] - 1.0  # leave the line itself out of its own centroid (‖x‖ = 1)
    own_sq = sq[y] - 2.0 * dots[rows, y] + 1.0
    own = np.where(counts[y] > 1, own_dot / np.sqrt(np.maximum(own_sq, 1e-12)), 0.0)
    cos[rows, y] = -np.inf
    other = cos.max(axis=1)
    out: np.ndarray = np.clip(0.5 + (own - other) / 2.0, 0.0, 1.0)
    return out


def fill_confidence(utterances: Sequence[Utterance]) -> list[Utterance]:
    """The utterances with a confidence each: their own, or their label's (per source and language)."""
    out = list(utterances)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, u in enumerate(out):
        if u.confidence is None:
            groups.setdefault((u.source, u.lang), []).append(i)
    for members in groups.values():
        labels = [out[i].intent or out[i].domain or "" for i in members]
        conf = label_confidence([out[i].text for i in members], labels)
        for i, c in zip(members, conf, strict=True):
            out[i] = replace(out[i], confidence=round(float(c), 4))
    return out


def top_by_confidence(entries: Sequence[Utterance], n: int) -> list[Utterance]:
    """The ``n`` most confident lines; ties broken by id so the order is deterministic."""
    return sorted(entries, key=lambda e: (-(e.confidence or 0.0), e.id))[:n]


@dataclass
class FewShotPool:
    """Pool entries, their strata, and the stratified shot set requests draw from."""

    entries: list[Utterance]
    strata: list[str]
    strata_from: str
    """``labels`` (the logs' domains) or ``kmeans`` (clusters of an unlabelled log)."""
    k: int | None = None
    silhouette: float | None = None
    rejected: int = 0
    """Candidates skipped as near-duplicates of a pool member."""
    shots: list[int] = field(default_factory=list)

    def for_request(
        self,
        domain: str,
        rng: np.random.Generator,
        per_prompt: int,
        query: str | None = None,
        lang: str | None = None,
    ) -> list[Utterance]:
        """``per_prompt`` shots in the request's ``lang`` when the shot set has some: one from its own
        domain when there is one, then mixed; never the request's own ``query``."""
        if per_prompt <= 0 or not self.shots:
            return []
        shots = [i for i in self.shots if self.entries[i].text != query]
        same_lang = [i for i in shots if self.entries[i].lang == lang]
        shots = same_lang or shots
        same = [i for i in shots if self.strata[i] == domain]
        chosen: list[int] = []
        if same:
            chosen.append(same[int(rng.integers(len(same)))])
        others = [i for i in shots if i not in chosen]
        take = min(per_prompt - len(chosen), len(others))
        if take > 0:
            chosen.extend(int(others[j]) for j in rng.choice(len(others), size=take, replace=False))
        return [self.entries[i] for i in chosen]

    def more_for(
        self, domain: str, lang: str, shown: Sequence[str], query: str | None = None
    ) -> list[Utterance]:
        """Further pool lines a prompt can show to reach a target length: the request's language
        only, its own domain first, each stratum in the pool's (confidence) order; never the shots
        already ``shown`` (ids) nor the request's own ``query``."""
        skip = set(shown)
        rest = [
            k for k, e in enumerate(self.entries) if e.lang == lang and e.id not in skip and e.text != query
        ]
        rest.sort(key=lambda k: (self.strata[k] != domain, k))
        return [self.entries[k] for k in rest]

    def summary(self) -> dict[str, object]:
        return {
            "pool_size": len(self.entries),
            "strata_from": self.strata_from,
            "k": self.k,
            "silhouette": self.silhouette,
            "near_duplicates_skipped": self.rejected,
            "confidence": "log's own, else nearest-centroid label confidence (docs/corpus.md)",
            "strata": dict(sorted(Counter(self.strata).items())),
            "shot_set": dict(sorted(Counter(self.strata[i] for i in self.shots).items())),
            "entries": [
                {"id": e.id, "lang": e.lang, "domain": e.domain, "confidence": e.confidence, "text": e.text}
                for e in self.entries
            ],
        }


POOL_CACHE_VERSION = 2


def pool_vectors_path(path: Path) -> Path:
    """Where the encoder's vectors of a cached pool's lines lie, beside the pool's JSON."""
    return path.with_suffix(".vectors.npz")


def save_pool_vectors(path: Path, vectors: dict[str, dict[str, np.ndarray]]) -> None:
    """Write the vectors the pool's judges encoded (language → text → unit vector) beside the pool
    at ``path``: every line the pool step judged, not only those it kept.

    Pool lines are drawn as queries too (41 of 400 English requests in the bundled logs), so a
    build from a cached pool would otherwise encode them again; with all of them saved, its
    judges start from the same memo as the build that made the pool, and encode the same texts
    in the same batches (the same vectors: output byte-identical). ``.npz`` of unicode arrays and
    a float32 matrix, read back without pickle; written atomically
    (:func:`~harness.common.io.atomic_write`), so a reader never sees half a file.
    """
    rows = [(lang, t, v) for lang, got in sorted(vectors.items()) for t, v in got.items()]
    if not rows:
        return
    from harness.common.io import atomic_write

    with atomic_write(pool_vectors_path(path), "wb") as fh:
        np.savez(
            fh,
            langs=np.array([r[0] for r in rows], dtype=np.str_),
            texts=np.array([r[1] for r in rows], dtype=np.str_),
            vectors=np.stack([np.asarray(r[2], dtype=np.float32) for r in rows]),
        )


def load_pool_vectors(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """The vectors saved by :func:`save_pool_vectors`; empty when there are none or they are unreadable."""
    try:
        with np.load(pool_vectors_path(path), allow_pickle=False) as z:
            langs, texts, vecs = z["langs"], z["texts"], z["vectors"]
    except (OSError, KeyError, ValueError):
        return {}
    if vecs.ndim != 2 or not len(langs) == len(texts) == len(vecs):
        return {}
    out: dict[str, dict[str, np.ndarray]] = {}
    for lang, t, v in zip(langs, texts, vecs, strict=True):
        out.setdefault(str(lang), {})[str(t)] = np.ascontiguousarray(v, dtype=np.float32)
    return out


def save_pool(path: Path, pool: FewShotPool) -> None:
    """Write ``pool`` (which log lines, their strata, the shot set) as JSON, atomically."""
    from harness.common.io import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        path,
        {
            "version": POOL_CACHE_VERSION,
            "entries": [[e.id, e.confidence] for e in pool.entries],
            "strata": pool.strata,
            "strata_from": pool.strata_from,
            "k": pool.k,
            "silhouette": pool.silhouette,
            "rejected": pool.rejected,
            "shots": pool.shots,
        },
    )


def load_pool(path: Path, lines: Sequence[Utterance]) -> FewShotPool | None:
    """The pool saved at ``path``, its entries looked up among ``lines`` by id, with the
    confidences saved beside them; ``None`` when there is none or it does not fit these lines
    (it is then rebuilt)."""
    import orjson

    try:
        doc = orjson.loads(path.read_bytes())
        by_id = {u.id: u for u in lines}
        entries = [replace(by_id[i], confidence=c) for i, c in doc["entries"]]
        pool = FewShotPool(
            entries,
            [str(x) for x in doc["strata"]],
            str(doc["strata_from"]),
            doc["k"],
            doc["silhouette"],
            int(doc["rejected"]),
            [int(x) for x in doc["shots"]],
        )
    except (OSError, KeyError, TypeError, ValueError, orjson.JSONDecodeError):
        return None
    if doc.get("version") != POOL_CACHE_VERSION or len(pool.strata) != len(entries):
        return None
    if any(not 0 <= i < len(entries) for i in pool.shots):
        return None
    return pool


def cluster(
    vectors: Any, k: int | None, seed: int, k_range: tuple[int, int] = (2, 10)
) -> tuple[np.ndarray, int, float | None]:
    """KMeans labels, the ``k`` used, and its silhouette (``k`` chosen by silhouette when not given)."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    n = vectors.shape[0]
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
    entries: Sequence[Utterance],
    judge_for: Callable[[str], Judge],
    *,
    top_n: int = 100,
    threshold: float = 0.82,
    k: int | None = None,
    shot_set_size: int = 12,
    floor: int = 1,
    seed: int = 0,
) -> FewShotPool:
    """The ``top_n`` most confident lines, stratified by domain (or cluster), near-duplicates skipped.

    ``entries`` must carry confidences (:func:`fill_confidence`); ``judge_for(lang)`` gives the
    dedup judge of a language.
    """
    ranked = top_by_confidence(entries, len(entries))
    strata_from = "labels" if all(e.domain for e in ranked) else "kmeans"
    k_used: int | None = None
    sil: float | None = None
    if strata_from == "labels":
        strata_of = {e.id: str(e.domain) for e in ranked}
    else:
        # Cluster the most confident lines (a few times the pool, so clusters are not all one topic).
        head = ranked[: max(4 * top_n, 50)]
        strata_of = {}
        for lang in sorted({e.lang for e in head}):
            same = [e for e in head if e.lang == lang]
            labels, k_used, sil = cluster(judge_for(lang).vectors([e.text for e in same]), k, seed)
            strata_of.update({e.id: f"{lang}-cluster-{int(c)}" for e, c in zip(same, labels, strict=True)})
        ranked = head
    by_stratum: dict[str, list[Utterance]] = {}
    for e in ranked:
        if e.id in strata_of:
            by_stratum.setdefault(strata_of[e.id], []).append(e)
    sizes = {s: float(len(v)) for s, v in by_stratum.items()}
    quota = allocate(sizes, min(top_n, sum(int(v) for v in sizes.values())), floor)

    chosen: list[Utterance] = []
    strata: list[str] = []
    kept_vecs: dict[str, Any] = {}
    judges: dict[str, Judge] = {}
    rejected = 0
    need = {st: quota.get(st, 0) for st in by_stratum}
    pos = dict.fromkeys(by_stratum, 0)
    margin = 1  # one spare line per stratum: a rejection rarely costs another encoder call
    while True:
        # One batch over every stratum still short, the most confident lines first, so the
        # encoder runs once per pass instead of once per stratum.
        batch = [
            (st, e)
            for st in sorted(by_stratum)
            if need[st] > 0
            for e in by_stratum[st][pos[st] : pos[st] + need[st] + margin]
        ]
        if not batch:
            break
        vecs: dict[int, Any] = {}
        for lang in sorted({e.lang for _, e in batch}):
            judge = judges.setdefault(lang, judge_for(lang))
            rows = [k for k, (_, e) in enumerate(batch) if e.lang == lang]
            mat = judge.vectors([batch[b][1].text for b in rows])
            vecs.update({b: mat[r : r + 1] for r, b in enumerate(rows)})
        for idx, (st, e) in enumerate(batch):
            if need[st] <= 0:
                continue  # the stratum filled up; its spare lines stay unjudged for a later pass
            pos[st] += 1
            judge, v = judges[e.lang], vecs[idx]
            have = kept_vecs.get(e.lang)
            if have is not None and _max_cos(judge, have, v) >= threshold - MARGIN:
                rejected += 1
                continue
            kept_vecs[e.lang] = v if have is None else judge.stack(have, v)
            chosen.append(e)
            strata.append(st)
            need[st] -= 1
        margin = 4
    pool = FewShotPool(chosen, strata, strata_from, k_used, sil, rejected)
    weights = {s: n / len(strata) for s, n in Counter(strata).items()} if strata else {}
    alloc = allocate(weights, shot_set_size, floor)
    rng = np.random.default_rng(seed)
    shots: list[int] = []
    for stratum in sorted(alloc):
        members = [i for i, name in enumerate(strata) if name == stratum]
        take = min(alloc[stratum], len(members))
        shots.extend(sorted(int(members[j]) for j in rng.choice(len(members), size=take, replace=False)))
    pool.shots = shots
    return pool


def _max_cos(judge: Judge, have: Any, v: Any) -> float:
    prod = have @ v.T
    arr = prod.toarray() if hasattr(prod, "toarray") else np.asarray(prod)
    return float(arr.max()) if arr.size else -1.0
