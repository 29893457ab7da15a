"""Helpers for the load stage's tests: small corpora, schedules and launching Locust."""

from __future__ import annotations

from pathlib import Path

import orjson

from harness.corpus.model import CorpusRecord


def make_corpus(
    path: Path, n: int = 20, *, chat: bool = True, offsets_s: list[float] | None = None, prefix: str = ""
) -> Path:
    """Write ``n`` minimal corpus records (chat or completions) to ``path``; ``prefix`` goes before
    every prompt (a shared prefix the target's prefix cache can serve)."""
    rows = []
    for i in range(n):
        rec: dict[str, object] = {
            "id": f"r{i}",
            "tenant": "acme" if i % 2 else "default",
            "scenario": f"s{i % 3}",
            "max_tokens": 16,
            "expected_output_tokens": 8,
            "lang": "en",
            "domain": "test",
            "intent": "test",
            "prefix_group": f"g{i % 4}",
            "sampling": {"temperature": 0.0, "stop": ["\n\n"]},
            "provenance": {"seed": 0, "candidate": i, "template": "t", "template_sha256": "0" * 64,
                           "source_trace_id": f"{i + 1:032x}"},
        }  # fmt: skip
        if chat:
            rec["messages"] = [{"role": "user", "content": f"{prefix}question {i}"}]
        else:
            rec["prompt"] = f"{prefix}question {i}"
        if offsets_s is not None:
            rec["arrival_offset_s"] = offsets_s[i]
        rows.append(CorpusRecord.model_validate(rec).model_dump(mode="json", exclude_none=True))
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def make_schedule(path: Path, offsets_s: list[float], **extra: object) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"offset_s": t, **extra}) + b"\n" for t in offsets_s))
    return path
