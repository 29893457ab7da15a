"""What the build does for throughput changes no output: the encoder's work in a worker thread, the
first round's look-ahead, and the few-shot pool's vectors cached with the pool."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pytest

from harness.common import embeddings
from harness.corpus import rounds as rounds_mod
from harness.corpus.build import BuildInputs, build_corpus
from harness.corpus.settings import CorpusSettings

from .conftest import FIXTURES, TEMPLATES

pytestmark = pytest.mark.slow


def _settings(**kw: object) -> CorpusSettings:
    return CorpusSettings(**{"seed": 5, "embed_cache": False, "device": "cpu", **kw})  # type: ignore[arg-type]


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every call the build makes to the encoder, with its texts."""
    calls: list[list[str]] = []
    original = embeddings.Embedder.encode

    def recording(self: embeddings.Embedder, texts: list[str], **kw: bool) -> np.ndarray:
        calls.append(list(texts))
        return original(self, texts, **kw)

    monkeypatch.setattr(embeddings.Embedder, "encode", recording)
    return calls


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("corpus.jsonl", "quality.json")}


def test_look_ahead_changes_no_candidate(
    tmp_path: Path, encoded: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # English only: near-duplicates need a second round, which the look-ahead serves from memo.
    inputs = dict(template=TEMPLATES / "four_section.j2", n=300, fewshot=[FIXTURES / "clinc150_sample.json"])
    s = _settings(locales=["en_US"], pool_cache=False)
    ahead = build_corpus(BuildInputs(out=tmp_path / "ahead", **inputs), s)  # type: ignore[arg-type]
    with_ahead = [list(c) for c in encoded]
    encoded.clear()
    monkeypatch.setattr(rounds_mod, "LOOKAHEAD", 0.0)
    monkeypatch.setattr(rounds_mod._Draws, "peek", lambda self, count: [])
    plain = build_corpus(BuildInputs(out=tmp_path / "plain", **inputs), s)  # type: ignore[arg-type]
    assert (tmp_path / "ahead" / "corpus.jsonl").read_bytes() == (
        tmp_path / "plain" / "corpus.jsonl"
    ).read_bytes()
    assert ahead.candidates == plain.candidates > 300  # dedup dropped some: there were later rounds
    assert ahead.manifest.counts == plain.manifest.counts
    # Without look-ahead every round encodes; with it the later rounds found their queries encoded.
    texts = [t for c in with_ahead for t in c]
    assert len(texts) == len(set(texts))  # each text encoded once
    assert len(with_ahead) < len(encoded)


def test_queries_that_run_out_end_the_build_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 143 log lines, 400 asked: the look-ahead meets the end of the queries before the rounds do.
    inputs = dict(template=TEMPLATES / "four_section.j2", n=400, fewshot=[FIXTURES / "fewshot_log.jsonl"])
    ahead = build_corpus(BuildInputs(out=tmp_path / "a", **inputs), _settings())  # type: ignore[arg-type]
    monkeypatch.setattr(rounds_mod._Draws, "peek", lambda self, count: [])
    plain = build_corpus(BuildInputs(out=tmp_path / "p", **inputs), _settings())  # type: ignore[arg-type]
    assert _files(tmp_path / "a") == _files(tmp_path / "p")
    assert ahead.failures == plain.failures
    assert any("distinct requests were possible" in f for f in ahead.failures)


def test_cached_pool_vectors_spare_the_encoder_and_change_nothing(
    tmp_path: Path, encoded: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESS__RUN_DIR", str(tmp_path / "run"))  # a pool cache of its own
    inputs = dict(template=TEMPLATES / "four_section.j2", n=150)
    s = _settings(locales=["en_US"], pool_cache=True)
    cold = build_corpus(BuildInputs(out=tmp_path / "cold", **inputs), s)  # type: ignore[arg-type]
    cold_texts = {t for c in encoded for t in c}
    (saved,) = (tmp_path / "run" / "cache" / "fewshot").glob("*.vectors.npz")
    encoded.clear()
    cached = build_corpus(BuildInputs(out=tmp_path / "cached", **inputs), s)  # type: ignore[arg-type]
    cached_texts = {t for c in encoded for t in c}
    entries = cast("list[dict[str, object]]", cold.manifest.fewshot["entries"])
    pool_texts = {str(e["text"]) for e in entries}
    queries = {r.variables.query for r in cached.records if r.variables is not None}
    # The cached build encodes its candidates' queries except the pool's lines, which it already has.
    assert queries & pool_texts  # pool lines are drawn as queries too (else this test shows nothing)
    assert not cached_texts & pool_texts
    assert cached_texts < cold_texts
    # Same vectors either way (the memo's, saved): every output file is byte-identical.
    assert _files(tmp_path / "cold") == _files(tmp_path / "cached")
    # Without the saved vectors (an older cache, or a deleted file) the pool lines are encoded again.
    saved.unlink()
    encoded.clear()
    build_corpus(BuildInputs(out=tmp_path / "bare", **inputs), s)  # type: ignore[arg-type]
    assert {t for c in encoded for t in c} & pool_texts
    bare = _files(tmp_path / "bare")
    assert bare["corpus.jsonl"] == _files(tmp_path / "cold")["corpus.jsonl"]
