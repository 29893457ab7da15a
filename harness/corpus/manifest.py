"""What a corpus build leaves on disk: ``corpus.jsonl``, its ``manifest.json`` and ``quality.json``.

The manifest records how the corpus was made (seed, templates and request logs with their SHA-256,
the embedder, tokenizer and dedup judges, the settings) so that a corpus can be traced back to its
inputs and rebuilt; :mod:`harness.corpus.build` decides what goes into it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.common.io import write_json, write_jsonl
from harness.corpus.logs import detect_log_format
from harness.corpus.model import (
    CORPUS_FILE,
    MANIFEST_FILE,
    QUALITY_FILE,
    CorpusRecord,
    Manifest,
    TemplateInfo,
)
from harness.corpus.settings import CorpusSettings


def file_sha256(paths: Sequence[Path]) -> str:
    """One SHA-256 over the files' bytes, in order."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def corpus_manifest(
    *,
    settings: CorpusSettings,
    records: Sequence[CorpusRecord],
    requested: int,
    template: Path,
    template_files: Sequence[Path],
    scenarios: Path | None,
    trace: Path | None,
    logs: Sequence[Path],
    tokenizer: Path,
    embedder: str,
    embedder_dim: int,
    candidates: int,
    dropped: int,
    pairs: int,
    dedup_judges: dict[str, dict[str, object]],
    fewshot: dict[str, object],
) -> Manifest:
    """The manifest of ``records``, built now from ``settings`` and the build's inputs and counts."""
    return Manifest(
        created_at=datetime.now(UTC).isoformat(),
        seed=settings.seed,
        n=len(records),
        templates=[TemplateInfo(path=str(p), sha256=file_sha256([p])) for p in template_files],
        embedder=embedder,
        embedder_dim=embedder_dim,
        tokenizer=str(tokenizer),
        block_size=settings.block_size,
        dedup={
            "threshold": settings.dedup_threshold,
            "on": "query",
            "candidates": candidates,
            "dropped": dropped,
            "pairs": pairs,
        },
        dedup_judges=dedup_judges,
        counts={
            "requested": requested,
            "records": len(records),
            "candidates": candidates,
            "dropped": dropped,
            "with_prefix": sum(1 for r in records if r.prefix_tokens > 0),
            "fitted_exact": sum(
                1
                for r in records
                if r.target_input_tokens is not None and r.prompt_tokens == r.target_input_tokens
            ),
        },
        inputs={
            "template": str(template),
            "scenarios": str(scenarios) if scenarios else None,
            "fewshot": ", ".join(str(p) for p in logs),
            "trace": str(trace) if trace else None,
        },
        sources=[{"file": str(p), "format": detect_log_format(p), "sha256": file_sha256([p])} for p in logs],
        fewshot=fewshot,
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in settings.model_dump().items()},
    )


def write_corpus_files(
    out: Path, records: Sequence[CorpusRecord], manifest: Manifest, quality: dict[str, Any]
) -> None:
    """Write ``corpus.jsonl``, ``manifest.json`` and ``quality.json`` into ``out`` (each atomically)."""
    write_jsonl(out / CORPUS_FILE, (r.model_dump(mode="json", exclude_none=True) for r in records))
    write_json(out / MANIFEST_FILE, manifest.model_dump(mode="json"))
    write_json(out / QUALITY_FILE, quality)
