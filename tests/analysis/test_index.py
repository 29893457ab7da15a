"""FAISS index warmup: save, load, reconstruct within 1e-5, self-recall, timings and sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.analysis.index_warmup import grow, index_warmup, load_vectors
from harness.common.errors import InputError


def unit_vectors(n: int, d: int = 64, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_every_kind_round_trips(tmp_path: Path) -> None:
    x = unit_vectors(500)
    results = index_warmup(x, [500, 1200], ["flat", "ivf", "hnsw"], tmp_path, repeats=2)
    assert [(r.kind, r.n) for r in results] == [
        ("flat", 500), ("ivf", 500), ("hnsw", 500), ("flat", 1200), ("ivf", 1200), ("hnsw", 1200)
    ]  # fmt: skip
    for r in results:
        assert (
            r.reconstruct_ok is True and r.reconstruct_max_err is not None and r.reconstruct_max_err <= 1e-5
        )
        assert r.self_recall >= 0.95
        assert r.load_s > 0 and len(r.load_s_all) == 2 and r.fresh_load_s > 0
        assert r.file_bytes >= r.n * r.dim * 4  # vectors are stored uncompressed
        assert (tmp_path / f"{r.kind}-{r.n}.faiss").stat().st_size == r.file_bytes
        assert r.synthetic == (0 if r.n == 500 else 700)
    assert not list(tmp_path.glob(".*.tmp"))


def test_grow_keeps_real_vectors_first_and_unit_norm() -> None:
    x = unit_vectors(10)
    g, synthetic = grow(x, 25)
    assert synthetic == 15 and np.array_equal(g[:10], x)
    assert np.allclose(np.linalg.norm(g, axis=1), 1.0, atol=1e-5)
    assert grow(x, 4)[1] == 0


def test_vectors_file(tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", unit_vectors(5) * 3)
    assert np.allclose(np.linalg.norm(load_vectors(tmp_path / "v.npy"), axis=1), 1.0, atol=1e-6)
    np.save(tmp_path / "bad.npy", np.zeros(3))
    with pytest.raises(InputError, match="matrix"):
        load_vectors(tmp_path / "bad.npy")
