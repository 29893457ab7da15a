"""Request corpora from real request logs: real queries, coherent sessions, few-shot pool, per-language dedup.

Queries are real utterances of CLINC150, CrossWOZ or JSONL logs (:mod:`harness.corpus.logs`); the
prompt around them comes from sandboxed Jinja templates and real catalogues; near-duplicates are
judged on the query as sent (MiniLM for English, a character TF-IDF guard for Chinese).

Public API for later stages (the load stage reads corpora back with validation)::

    read_corpus(path) -> Iterator[CorpusRecord]     # corpus.jsonl or its directory
    CorpusRecord, Manifest                           # pydantic models, extra="forbid"

Building is ``harness corpus build`` or :func:`harness.corpus.build.build_corpus`.
"""

from __future__ import annotations

from harness.corpus.model import CORPUS_FILE, MANIFEST_FILE, QUALITY_FILE, CorpusRecord, Manifest, read_corpus

__all__ = ["CORPUS_FILE", "MANIFEST_FILE", "QUALITY_FILE", "CorpusRecord", "Manifest", "read_corpus"]
