"""The shared Embedder's token-length batches give the model's own vectors, in input order."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_bucketed_batches_match_the_models_own_encode() -> None:
    from harness.common.embeddings import Embedder

    emb = Embedder(device="cpu", batch_size=4)  # small batches: many buckets, several per length
    texts = [
        "hi",
        "what is my car's gas mileage",
        "这家餐馆的地址是什么？",
        "hi",  # a repeat keeps its place
        "please transfer two hundred dollars from my savings account to checking before friday",
        "word " * 400,  # longer than the model's window: truncated the same way
        "spell aaron",
    ]
    ours = emb.encode(texts)
    theirs = emb.model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.shape == (len(texts), emb.dim) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # Same vectors up to float noise (dedup decides at threshold − 1e-4, far above it).
    assert float(np.abs(ours - theirs).max()) < 1e-5
    np.testing.assert_array_equal(ours[0], ours[3])
