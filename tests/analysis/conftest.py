"""Helpers for the analysis tests: load-run directories and corpus records written with the real models."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.common.io import write_json, write_jsonl
from harness.corpus.model import CorpusRecord
from harness.load.results import RequestRecord
from harness.load.run_summary import StageOutcome, TargetInfo, summarize


def record(i: int, **kw: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "id": f"r{i}",
        "stage": "replay",
        "intended_s": i * 0.1,
        "sent_s": i * 0.1,
        "lateness_ms": 0.0,
        "e2e_ms": 50.0,
        "cache": "MISS",
        "status": 200,
    }
    base.update(kw)
    return RequestRecord.parse(base)


def write_run(
    run: Path,
    records: Sequence[RequestRecord],
    *,
    stages: Sequence[StageOutcome] = (),
    duration_s: float = 10.0,
) -> Path:
    """A load run directory (records.jsonl + summary.json) as the load stage writes it."""
    write_jsonl(run / "records.jsonl", (r.to_dict() for r in records))
    summary = summarize(
        list(records),
        started_at="2026-12-01T00:00:00Z",
        duration_s=duration_s,
        target=TargetInfo(url="http://127.0.0.1:1"),
        stages=list(stages),
    )
    write_json(run / "summary.json", summary.model_dump())
    return run


def corpus_record(rid: str, **kw: Any) -> CorpusRecord:
    base: dict[str, Any] = {
        "id": rid,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"question {rid}"},
        ],
        "max_tokens": 16,
        "expected_output_tokens": 8,
        "lang": "en",
        "domain": "test",
        "intent": "test",
        "provenance": {"seed": 0, "candidate": 0, "template": "t.j2", "template_sha256": "0" * 64},
    }
    base.update(kw)
    return CorpusRecord.model_validate(base)


def write_corpus(path: Path, records: Sequence[CorpusRecord]) -> Path:
    write_jsonl(path, (r.model_dump(exclude_none=True) for r in records))
    return path
