"""L3: semantic cache for near-duplicate prompts (MiniLM embeddings + FAISS inner product).

One index per tenant, so a search can never return another tenant's entry. An index is exact
(``IndexFlatIP``) while small and switches to HNSW (inner-product metric) at ``l3_hnsw_min``
vectors. Vectors are unit-norm, so the inner product is the cosine similarity.

A candidate above the threshold is served only if the verifier agrees: same ``params_hash``
(model, revision, endpoint, sampling parameters, system prompt, tools, tenant, schema), not
expired, and, by default, the same numbers and the same count of negation words in the text (a
MiniLM embedding barely moves between "2+3" and "2+4" or "is" and "is not"). Deletions (expiry,
cap) are tombstones; the index is rebuilt from the stored vectors when half of it is dead.

Persistence per tenant: ``index.faiss`` (``faiss.write_index``), ``vectors.npy`` (``np.save``
without pickle) and ``meta.json`` (entries, vectors checksum). On load the index's reconstructed
vectors must equal the stored ones within 1e-5, else the index is rebuilt from the vectors (and
the tenant is dropped if the vectors' checksum fails too).

Embedding and FAISS calls run in a small thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from harness.common.io import atomic_write, write_json
from harness.target.cache.api import CachedCompletion
from harness.target.cache.codec import CorruptValue, completion_from_dict, completion_to_dict
from harness.target.cache.keys import NormalizedRequest, tenant_slug
from harness.target.cache.settings import CacheSettings

if TYPE_CHECKING:
    from harness.common.embeddings import Embedder

log = logging.getLogger(__name__)

Vector = npt.NDArray[np.float32]
CONSISTENCY_TOL = 1e-5
META_SCHEMA = 1


@dataclass(slots=True)
class L3Entry:
    key: str
    params_hash: str
    numbers: tuple[str, ...]
    negations: int
    completion: CachedCompletion
    expires_at: float
    value_tier: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "params_hash": self.params_hash,
            "numbers": list(self.numbers),
            "negations": self.negations,
            "completion": completion_to_dict(self.completion),
            "expires_at": self.expires_at,
            "value_tier": self.value_tier,
            "text": self.text,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> L3Entry:
        return cls(
            key=str(d["key"]),
            params_hash=str(d["params_hash"]),
            numbers=tuple(str(x) for x in d["numbers"]),
            negations=int(d["negations"]),
            completion=completion_from_dict(d["completion"]),
            expires_at=float(d["expires_at"]),
            value_tier=str(d["value_tier"]),
            text=str(d["text"]),
        )


@dataclass(slots=True)
class L3Hit:
    entry: L3Entry
    score: float


class TenantIndex:
    """The vectors, entries and FAISS index of one tenant."""

    def __init__(self, dim: int, settings: CacheSettings) -> None:
        self.dim = dim
        self.settings = settings
        self.vectors: Vector = np.zeros((0, dim), dtype=np.float32)
        self.entries: list[L3Entry | None] = []
        self.pos: dict[str, int] = {}
        """Key → position of its live entry (a re-written key replaces its old entry)."""
        self.live = 0
        self.index: Any = self._new_index(0)
        self.lock = threading.Lock()
        self.evictions = 0

    def _new_index(self, n: int) -> Any:
        import faiss

        if n >= self.settings.l3_hnsw_min:
            idx = faiss.IndexHNSWFlat(self.dim, self.settings.l3_hnsw_m, faiss.METRIC_INNER_PRODUCT)
            idx.hnsw.efSearch = 64
            return idx
        return faiss.IndexFlatIP(self.dim)

    @property
    def kind(self) -> str:
        return "hnsw" if "HNSW" in type(self.index).__name__ else "flat"

    def rebuild(self) -> None:
        """Drop tombstones and rebuild the index (flat or HNSW by size) from the live vectors."""
        keep = [i for i, e in enumerate(self.entries) if e is not None]
        self.vectors = (
            np.ascontiguousarray(self.vectors[keep]) if keep else np.zeros((0, self.dim), np.float32)
        )
        self.entries = [self.entries[i] for i in keep]
        self.pos = {e.key: i for i, e in enumerate(self.entries) if e is not None}
        self.index = self._new_index(len(keep))
        if keep:
            self.index.add(self.vectors)
        self.live = len(keep)

    def add(self, vec: Vector, entry: L3Entry) -> None:
        old = self.pos.get(entry.key)
        if old is not None:  # the same key again replaces the old entry
            self.drop(old)
        while self.live >= self.settings.l3_max_entries:
            self.drop(next(i for i, e in enumerate(self.entries) if e is not None))
            self.evictions += 1
        self.vectors = np.concatenate([self.vectors, vec.reshape(1, -1).astype(np.float32)])
        self.entries.append(entry)
        self.pos[entry.key] = len(self.entries) - 1
        self.live += 1
        self.index.add(vec.reshape(1, -1).astype(np.float32))
        total = len(self.entries)
        if (total > 64 and self.live < total / 2) or (
            self.kind == "flat" and total >= self.settings.l3_hnsw_min
        ):
            self.rebuild()

    def search(self, vec: Vector, k: int) -> list[tuple[float, L3Entry, int]]:
        n = len(self.entries)
        if n == 0:
            return []
        scores, ids = self.index.search(vec.reshape(1, -1).astype(np.float32), min(k, n))
        out: list[tuple[float, L3Entry, int]] = []
        for s, i in zip(scores[0].tolist(), ids[0].tolist(), strict=True):
            if i < 0:
                continue
            e = self.entries[i]
            if e is not None:
                out.append((float(s), e, i))
        return out

    def drop(self, pos: int) -> None:
        e = self.entries[pos]
        if e is not None:
            self.entries[pos] = None
            self.live -= 1
            if self.pos.get(e.key) == pos:
                del self.pos[e.key]

    def expire(self, now: float) -> int:
        n = 0
        for i, e in enumerate(self.entries):
            if e is not None and e.expires_at <= now:
                self.drop(i)
                n += 1
        return n


class SemanticCache:
    """Per-tenant FAISS indexes over MiniLM embeddings, with a verifier and persistence."""

    def __init__(self, settings: CacheSettings, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self._embedder = embedder
        self._executor = ThreadPoolExecutor(settings.embed_threads, thread_name_prefix="cache-l3")
        self.tenants: dict[str, TenantIndex] = {}
        self._tenants_lock = threading.Lock()
        self.refused = {"params": 0, "numbers": 0, "negation": 0, "expired": 0}
        self.consistency: dict[str, str] = {}
        """Per tenant, the outcome of the reload check: ok / rebuilt / dropped."""
        self.embed_s_total = 0.0
        self.search_s_total = 0.0
        self.lookups = 0

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from harness.common.embeddings import shared_embedder

            self._embedder = shared_embedder(self.settings.embed_model_path, self.settings.embed_device)
        return self._embedder

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def warm(self) -> None:
        """Load the model now (seconds) instead of on the first request."""
        self.embedder.encode(["warm up"])

    def _tenant(self, tenant: str) -> TenantIndex:
        with self._tenants_lock:
            idx = self.tenants.get(tenant)
            if idx is None:
                idx = self.tenants[tenant] = TenantIndex(self.dim, self.settings)
            return idx

    # ------------------------------------------------------------------ sync core (worker thread)

    def embed_sync(self, text: str) -> Vector:
        t0 = time.perf_counter()
        v: Vector = self.embedder.encode([text])[0]
        self.embed_s_total += time.perf_counter() - t0
        return v

    def lookup_sync(self, req: NormalizedRequest, vec: Vector) -> L3Hit | None:
        idx = self.tenants.get(req.tenant)
        if idx is None:
            return None
        t0 = time.perf_counter()
        now = time.time()
        with idx.lock:
            cands = idx.search(vec, 8)
            best: L3Hit | None = None
            for score, e, pos in cands:
                if score < self.settings.l3_threshold:
                    break  # scores come sorted, best first
                if e.expires_at <= now:
                    idx.drop(pos)
                    self.refused["expired"] += 1
                    continue
                if e.params_hash != req.params_hash:
                    self.refused["params"] += 1
                    continue
                if self.settings.l3_guard_numbers and e.numbers != req.numbers:
                    self.refused["numbers"] += 1
                    continue
                if self.settings.l3_guard_negation and e.negations != req.negations:
                    self.refused["negation"] += 1
                    continue
                best = L3Hit(e, score)
                break
        self.search_s_total += time.perf_counter() - t0
        self.lookups += 1
        return best

    def add_sync(self, req: NormalizedRequest, vec: Vector, entry: L3Entry) -> None:
        idx = self._tenant(req.tenant)
        with idx.lock:
            idx.add(vec, entry)

    # ------------------------------------------------------------------ async API

    async def lookup(self, req: NormalizedRequest) -> tuple[L3Hit | None, Vector]:
        def work() -> tuple[L3Hit | None, Vector]:
            vec = self.embed_sync(req.text)
            return self.lookup_sync(req, vec), vec

        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    async def add(self, req: NormalizedRequest, entry: L3Entry, vec: Vector | None = None) -> None:
        def work() -> None:
            v = vec if vec is not None else self.embed_sync(req.text)
            self.add_sync(req, v, entry)

        await asyncio.get_running_loop().run_in_executor(self._executor, work)

    # ------------------------------------------------------------------ housekeeping

    def entries(self) -> int:
        return sum(t.live for t in self.tenants.values())

    def evictions(self) -> int:
        return sum(t.evictions for t in self.tenants.values())

    def clear(self) -> int:
        with self._tenants_lock:
            n = self.entries()
            self.tenants.clear()
            return n

    def expire(self) -> int:
        now = time.time()
        n = 0
        for t in list(self.tenants.values()):
            with t.lock:
                n += t.expire(now)
        return n

    def save(self, root: Path) -> int:
        """Write every tenant's index, vectors and metadata under ``root``; returns entries saved."""
        import faiss

        self.expire()
        saved = 0
        root.mkdir(parents=True, exist_ok=True)
        live_dirs = set()
        for tenant, t in list(self.tenants.items()):
            with t.lock:
                t.rebuild()
                if t.live == 0:
                    continue
                d = root / tenant_slug(tenant)
                live_dirs.add(d.name)
                d.mkdir(parents=True, exist_ok=True)
                with atomic_write(d / "vectors.npy", "wb", encoding=None) as fh:
                    np.save(fh, t.vectors, allow_pickle=False)
                with atomic_write(d / "index.faiss", "wb", encoding=None) as fh:
                    fh.write(faiss.serialize_index(t.index).tobytes())
                write_json(
                    d / "meta.json",
                    {
                        "schema": META_SCHEMA,
                        "cache_schema": self.settings.schema_version,
                        "tenant": tenant,
                        "dim": t.dim,
                        "kind": t.kind,
                        "count": t.live,
                        "vectors_sha256": hashlib.sha256(t.vectors.tobytes()).hexdigest(),
                        "entries": [e.to_json() for e in t.entries if e is not None],
                    },
                )
                saved += t.live
        for d in root.iterdir():  # tenants emptied since the last save
            if d.is_dir() and d.name not in live_dirs and (d / "meta.json").exists():
                shutil.rmtree(d, ignore_errors=True)
        return saved

    def load(self, root: Path) -> int:
        """Load every tenant under ``root`` with the consistency check; returns entries loaded."""
        import faiss

        if not root.is_dir():
            return 0
        loaded = 0
        now = time.time()
        for d in sorted(p for p in root.iterdir() if (p / "meta.json").is_file()):
            try:
                meta = orjson.loads((d / "meta.json").read_bytes())
                if (
                    meta.get("schema") != META_SCHEMA
                    or meta.get("cache_schema") != self.settings.schema_version
                ):
                    self.consistency[d.name] = "dropped: other schema"
                    continue
                tenant = str(meta["tenant"])
                with (d / "vectors.npy").open("rb") as fh:
                    vectors = np.load(fh, allow_pickle=False).astype(np.float32, copy=False)
                entries = [L3Entry.from_json(e) for e in meta["entries"]]
            except (OSError, ValueError, KeyError, TypeError, CorruptValue) as exc:
                log.warning("L3 state in %s is unreadable (%s); dropped", d, exc)
                self.consistency[d.name] = f"dropped: {exc}"
                continue
            if hashlib.sha256(vectors.tobytes()).hexdigest() != meta.get(
                "vectors_sha256"
            ) or vectors.shape != (len(entries), int(meta.get("dim", -1))):
                log.warning("L3 vectors of tenant %r fail their checksum; tenant dropped", tenant)
                self.consistency[tenant] = "dropped: vectors checksum"
                continue
            t = TenantIndex(vectors.shape[1], self.settings)
            t.vectors = np.ascontiguousarray(vectors)
            t.entries = list(entries)
            t.pos = {e.key: i for i, e in enumerate(entries)}
            t.live = len(entries)
            status = "ok"
            try:
                index = faiss.deserialize_index(np.fromfile(d / "index.faiss", dtype=np.uint8))
                ok = index.ntotal == len(entries) and index.d == vectors.shape[1]
                if ok and entries:
                    rec = index.reconstruct_n(0, index.ntotal)
                    ok = float(np.max(np.abs(rec - vectors))) <= CONSISTENCY_TOL
            except (RuntimeError, OSError, ValueError) as exc:
                log.warning("L3 index of tenant %r unreadable: %s", tenant, exc)
                ok = False
            if ok:
                t.index = index
            else:
                log.warning("L3 index of tenant %r disagrees with its vectors; rebuilt from them", tenant)
                t.rebuild()
                status = "rebuilt"
            t.expire(now)
            self.tenants[tenant] = t
            self.consistency[tenant] = status
            loaded += t.live
        return loaded

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
