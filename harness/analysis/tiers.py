"""Hot-zone tiers: which queries deserve a long TTL, from where they cluster and how sure the model is.

Queries are embedded with the shared MiniLM (:mod:`harness.common.embeddings`, unit vectors, so a
cosine is an inner product) and grouped by **leader clustering** at a cosine-distance radius ``r``:
in order of decreasing request count, a query joins the first zone whose leader is within ``r``,
else it leads a new zone. Each zone's centroid is then the count-weighted mean of its members
(renormalized), and

* **density** = requests (history counts) whose query lies within ``r`` of the centroid;
* **entropy** = the count-weighted mean output entropy (nats per token, the engine's
  ``usage.harness.mean_entropy``) of the zone's queries whose entropy is known.

A zone is **hot** when density ≥ ``density_min`` (50) *and* entropy ≤ ``entropy_max`` (2.1), **warm**
when exactly one holds and **cold** when neither does; an unknown entropy does not hold. Every
query takes its zone's tier and the result is a :class:`harness.target.cache.policy.TierFile` (tier → TTL
and one entry per query, named by the prompt fingerprint the server stores with each completion),
which ``harness serve --cache --tiers FILE`` loads.

Entropy comes, per query and in this order, from: an explicit value (``--entropy`` JSONL of
``{query|id|prompt_fp, mean_entropy}``, or ``mean_entropy`` in a ``--queries`` row), a load run's
records (:attr:`harness.load.results.RequestRecord.mean_entropy`, which the load stage fills from the
server's ``usage.harness.mean_entropy``), and last the cached completion's ``mean_entropy`` in the
server's saved cache state (``<state_dir>/l3/<tenant>/meta.json``, matched by prompt fingerprint).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import Field, model_validator

from harness.common.embeddings import FloatMatrix
from harness.common.errors import InputError
from harness.common.io import iter_jsonl
from harness.common.model import StrictModel
from harness.target.cache.api import Tier
from harness.target.cache.policy import TierEntry, TierFile, TierTTLs
from harness.target.cache.settings import CacheSettings

TIERS: tuple[Tier, ...] = ("hot", "warm", "cold")
# Number of conditions met (dense, confident) → tier.
_TIER_BY_MET: dict[int, Tier] = {2: "hot", 1: "warm", 0: "cold"}


class TierThresholds(StrictModel):
    """The hot-zone rule's knobs."""

    radius: float = Field(default=0.3, gt=0.0, lt=2.0)
    """Cosine distance (1 − cosine) of the zone radius."""
    density_min: float = Field(default=50.0, ge=0.0)
    entropy_max: float = Field(default=2.1, ge=0.0)


def classify(density: float, entropy: float | None, thresholds: TierThresholds) -> Tier:
    """Hot when dense and confident, warm when one of them, cold when neither (unknown entropy fails)."""
    met = int(density >= thresholds.density_min) + int(
        entropy is not None and entropy <= thresholds.entropy_max
    )
    return _TIER_BY_MET[met]


# --------------------------------------------------------------------------- inputs


class QueryRow(StrictModel):
    """One line of a ``--queries`` JSONL: a query as users send it."""

    query: str = Field(min_length=1)
    count: int = Field(default=1, ge=1)
    """How often the history holds it."""
    mean_entropy: float | None = Field(default=None, ge=0.0)
    api: Literal["chat", "completions"] = "chat"
    """Sent as one user message (chat) or as a raw prompt (completions): the fingerprint differs."""


class EntropyRow(StrictModel):
    """One line of an ``--entropy`` JSONL: a measured mean output entropy for a query."""

    mean_entropy: float = Field(ge=0.0)
    query: str | None = None
    id: str | None = None
    """Corpus record id."""
    prompt_fp: str | None = None

    @model_validator(mode="after")
    def _named(self) -> EntropyRow:
        if self.query is None and self.id is None and self.prompt_fp is None:
            raise ValueError("a row needs 'query', 'id' or 'prompt_fp'")
        return self


@dataclass(slots=True)
class Query:
    """A distinct query with what the tiers need to know about it."""

    text: str
    """What is embedded (the user's query, not the system prompt or few-shot around it)."""
    prompt_fp: str
    count: int = 1
    entropy: float | None = None
    ids: list[str] = field(default_factory=list)
    entropy_source: str | None = None


def _fp_chat(messages: list[dict[str, str]]) -> str:
    from harness.target.server.prepare import prompt_fingerprint

    # What the server fingerprints for a chat request: role/content pairs, generation prompt on.
    return prompt_fingerprint(([{"role": m["role"], "content": m["content"]} for m in messages], True))


def _fp_prompt(prompt: str) -> str:
    from harness.target.server.prepare import prompt_fingerprint

    return prompt_fingerprint(prompt)


def queries_from_rows(path: str | Path) -> list[Query]:
    """Queries from a ``--queries`` JSONL (:class:`QueryRow` per line; repeated queries add up)."""
    out: dict[str, Query] = {}
    for _, row in iter_jsonl(path, QueryRow, expected="a query row"):
        fp = (
            _fp_chat([{"role": "user", "content": row.query}]) if row.api == "chat" else _fp_prompt(row.query)
        )
        q = out.get(fp)
        if q is None:
            q = out[fp] = Query(text=row.query, prompt_fp=fp, count=0)
        q.count += row.count
        if row.mean_entropy is not None:
            q.entropy, q.entropy_source = row.mean_entropy, "queries"
    return list(out.values())


def queries_from_corpus(corpus: str | Path, runs: Sequence[str | Path] = ()) -> list[Query]:
    """Queries of a corpus, counted by how often load runs replayed them (once each without runs).

    Entropy recorded by the runs (each record's ``mean_entropy``, the server's
    ``usage.harness.mean_entropy``) is averaged per query.
    """
    from harness.corpus.model import read_corpus

    by_fp: dict[str, Query] = {}
    fp_of_id: dict[str, str] = {}
    for rec in read_corpus(corpus):
        if rec.messages is not None:
            fp = _fp_chat([m.model_dump() for m in rec.messages])
            users = [m.content for m in rec.messages if m.role == "user"]
            text = users[-1] if users else rec.text()
        else:
            assert rec.prompt is not None
            fp = _fp_prompt(rec.prompt)
            text = rec.prompt
        if rec.variables is not None and rec.variables.query:
            text = rec.variables.query
        q = by_fp.get(fp)
        if q is None:
            q = by_fp[fp] = Query(text=text, prompt_fp=fp, count=0 if runs else 1)
        q.ids.append(rec.id)
        fp_of_id[rec.id] = fp
    sums: dict[str, list[float]] = {}
    for run in runs:
        for rid, entropy in _run_rows(run):
            known = fp_of_id.get(rid)
            if known is None:
                continue
            by_fp[known].count += 1
            if entropy is not None:
                sums.setdefault(known, []).append(entropy)
    for fp, vals in sums.items():
        by_fp[fp].entropy, by_fp[fp].entropy_source = float(np.mean(vals)), "records"
    return [q for q in by_fp.values() if q.count > 0]


def _run_rows(run: str | Path) -> Iterable[tuple[str, float | None]]:
    """(record id, mean entropy if the target reported it) per request of a load run, read through
    the load stage's model (:func:`harness.load.results.read_records`: a malformed record is an
    :class:`InputError` naming its line and field)."""
    from harness.load.results import read_records

    for record in read_records(run):
        yield record.id, record.mean_entropy


def apply_entropy_file(queries: Sequence[Query], path: str | Path) -> int:
    """Set entropies from an ``--entropy`` JSONL (wins over every other source); returns matches."""
    by_text = {q.text: q for q in queries}
    by_fp = {q.prompt_fp: q for q in queries}
    by_id = {i: q for q in queries for i in q.ids}
    n = 0
    for _, row in iter_jsonl(path, EntropyRow, expected="an entropy row"):
        q = (
            (by_fp.get(row.prompt_fp) if row.prompt_fp else None)
            or (by_id.get(row.id) if row.id else None)
            or (by_text.get(row.query) if row.query else None)
        )
        if q is not None:
            q.entropy, q.entropy_source = row.mean_entropy, "entropy-file"
            n += 1
    return n


def apply_cache_state(queries: Sequence[Query], state_dir: str | Path) -> int:
    """Fill unknown entropies from the cached completions in a saved cache state; returns matches.

    Reads ``<state_dir>/l3/*/meta.json`` (written by the server on shutdown): each entry's
    completion carries ``mean_entropy`` and, in ``meta.prompt_fp``, the prompt's fingerprint.
    """
    root = Path(state_dir)
    l3 = root / "l3" if (root / "l3").is_dir() else root
    if not l3.is_dir():
        raise InputError("no saved cache state (expected an l3/ directory)", file=root)
    found: dict[str, float] = {}
    for meta in sorted(l3.glob("*/meta.json")):
        try:
            doc = orjson.loads(meta.read_bytes())
            entries = doc["entries"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputError(f"unreadable cache state ({exc})", file=meta) from None
        for e in entries:
            comp = e.get("completion") if isinstance(e, dict) else None
            if not isinstance(comp, dict):
                continue
            fp = (comp.get("meta") or {}).get("prompt_fp")
            ent = comp.get("mean_entropy")
            if isinstance(fp, str) and isinstance(ent, int | float):
                found[fp] = float(ent)
    n = 0
    for q in queries:
        if q.entropy is None and q.prompt_fp in found:
            q.entropy, q.entropy_source = found[q.prompt_fp], "cache-state"
            n += 1
    return n


# --------------------------------------------------------------------------- zones


def leader_clusters(vectors: FloatMatrix, weights: Sequence[float], radius: float) -> np.ndarray[Any, Any]:
    """Zone index of each vector (unit rows): leaders taken in decreasing weight within ``radius``.

    Chunks are matched against existing leaders with one matrix product; only the queries no leader
    covers are walked one by one, against the leaders born in their own chunk.
    """
    n, d = vectors.shape
    threshold = 1.0 - radius
    order = np.lexsort((np.arange(n), -np.asarray(weights, dtype=np.float64)))
    assign = np.full(n, -1, dtype=np.int64)
    leaders = np.zeros((0, d), dtype=np.float32)
    chunk = 512
    for start in range(0, n, chunk):
        idx = order[start : start + chunk]
        block = vectors[idx]
        if leaders.shape[0]:
            sims = block @ leaders.T
            best = np.argmax(sims, axis=1)
            ok = sims[np.arange(len(idx)), best] >= threshold
            assign[idx[ok]] = best[ok]
            rest = np.flatnonzero(~ok)
        else:
            rest = np.arange(len(idx))
        new: list[np.ndarray[Any, Any]] = []
        base = leaders.shape[0]
        for j in rest.tolist():
            v = block[j]
            if new:
                s = np.stack(new) @ v
                b = int(np.argmax(s))
                if s[b] >= threshold:
                    assign[idx[j]] = base + b
                    continue
            new.append(v)
            assign[idx[j]] = base + len(new) - 1
        if new:
            leaders = np.vstack([leaders, np.stack(new)])
    return assign


class Zone(StrictModel):
    """One hot zone (embedding cluster) and its tier."""

    id: int
    queries: int
    """Distinct queries assigned to the zone."""
    requests: int
    """History requests of those queries."""
    density: float
    """Requests whose query lies within the radius of the centroid (any zone's queries)."""
    entropy: float | None
    entropy_known: float
    """Share of the zone's requests whose entropy is known."""
    tier: Tier
    example: str


class TierReport(StrictModel):
    """``harness analysis tiers --json``: the zones and how many queries each tier got."""

    thresholds: TierThresholds
    ttl_s: TierTTLs
    queries: int
    requests: int
    entropy_known: float
    tiers: dict[str, int]
    """Queries per tier."""
    zones: list[Zone]


def default_ttls() -> TierTTLs:
    """The cache's own default TTLs (``HARNESS__CACHE__TTL_*_S`` defaults)."""
    f = CacheSettings.model_fields
    return TierTTLs(
        hot=float(f["ttl_hot_s"].default),
        warm=float(f["ttl_warm_s"].default),
        cold=float(f["ttl_cold_s"].default),
    )


def build_tiers(
    queries: Sequence[Query],
    vectors: FloatMatrix,
    thresholds: TierThresholds | None = None,
    ttl: TierTTLs | None = None,
) -> tuple[TierFile, TierReport]:
    """Zones, densities, entropies and tiers of ``queries`` (``vectors[i]`` embeds ``queries[i]``)."""
    if not queries:
        raise InputError("no queries to classify")
    th = thresholds or TierThresholds()
    ttls = ttl or default_ttls()
    weights = np.asarray([q.count for q in queries], dtype=np.float64)
    assign = leader_clusters(vectors, weights.tolist(), th.radius)
    k = int(assign.max()) + 1
    centroids = np.zeros((k, vectors.shape[1]), dtype=np.float64)
    np.add.at(centroids, assign, vectors.astype(np.float64) * weights[:, None])
    centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    density = np.zeros(k, dtype=np.float64)
    for start in range(0, len(queries), 2048):
        sims = vectors[start : start + 2048].astype(np.float64) @ centroids.T
        density += (weights[start : start + 2048, None] * (sims >= 1.0 - th.radius)).sum(axis=0)
    zones: list[Zone] = []
    tier_of_zone: list[Tier] = []
    for z in range(k):
        members = np.flatnonzero(assign == z)
        w = weights[members]
        known = [
            (q.entropy, q.count) for q in (queries[i] for i in members.tolist()) if q.entropy is not None
        ]
        known_w = sum(c for _, c in known)
        entropy = sum(e * c for e, c in known) / known_w if known_w else None
        tier = classify(float(density[z]), entropy, th)
        tier_of_zone.append(tier)
        lead = members[int(np.argmax(w))]
        zones.append(
            Zone(
                id=z,
                queries=len(members),
                requests=int(w.sum()),
                density=float(density[z]),
                entropy=entropy,
                entropy_known=known_w / float(w.sum()),
                tier=tier,
                example=queries[lead].text[:200],
            )
        )
    entries = [
        TierEntry(
            tier=tier_of_zone[int(assign[i])], prompt_fp=q.prompt_fp, query=q.text[:500], zone=int(assign[i])
        )
        for i, q in enumerate(queries)
    ]
    counts = {t: sum(1 for e in entries if e.tier == t) for t in TIERS}
    total = float(weights.sum())
    report = TierReport(
        thresholds=th,
        ttl_s=ttls,
        queries=len(queries),
        requests=int(total),
        entropy_known=sum(q.count for q in queries if q.entropy is not None) / total,
        tiers=counts,
        zones=sorted(zones, key=lambda z: (-z.density, z.id)),
    )
    tier_file = TierFile(
        ttl_s=ttls,
        entries=entries,
        provenance={
            "generator": "harness analysis tiers",
            "thresholds": th.model_dump(),
            "zones": [z.model_dump() for z in report.zones],
        },
    )
    return tier_file, report


def embed_queries(queries: Sequence[Query], *, show_progress: bool = False) -> FloatMatrix:
    """Embed each query's text with the shared MiniLM embedder."""
    from harness.common.embeddings import shared_embedder

    return shared_embedder().encode([q.text for q in queries], show_progress=show_progress)
