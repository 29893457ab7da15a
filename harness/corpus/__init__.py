"""Synthetic request corpora: sandboxed Jinja templates, Faker profiles, few-shot pool, embedding dedup.

Public API for later stages (the load stage reads corpora back with validation)::

    read_corpus(path) -> Iterator[CorpusRecord]     # corpus.jsonl or its directory
    CorpusRecord, Manifest                           # pydantic models, extra="forbid"

Building is ``harness corpus build`` or :func:`harness.corpus.build.build_corpus`.
"""

from __future__ import annotations

from harness.corpus.model import CORPUS_FILE, MANIFEST_FILE, QUALITY_FILE, CorpusRecord, Manifest, read_corpus

__all__ = ["CORPUS_FILE", "MANIFEST_FILE", "QUALITY_FILE", "CorpusRecord", "Manifest", "read_corpus"]
