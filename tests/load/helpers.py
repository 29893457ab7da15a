"""Helpers for the load stage's tests: small corpora, schedules and launching Locust."""

from __future__ import annotations

import re
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


def decided_precision(stop_reason: str) -> dict[str, tuple[float, int]]:
    """``"precision reached: ttft_ms P95 ±4.1 %, tpot_ms P95 ±7.9 % (n=412) after 3.0 s"`` →
    ``{"ttft_ms P95": (0.041, 412), …}``: each watched percentile's half-width and sample count
    *when the run decided to stop*.

    The summary's (and the web tab's) precision is over every record, including the requests that
    drained after that decision, so on a busy machine it may widen past the target; what the stopping
    rule promises is only what it saw when it stopped, which is what this reads back.
    """
    assert stop_reason.startswith("precision reached: "), stop_reason
    body = stop_reason.removeprefix("precision reached: ").rsplit(" after ", 1)[0]
    shared = re.search(r" \(n=(\d+)\)$", body)
    if shared:
        body = body[: shared.start()]
    out: dict[str, tuple[float, int]] = {}
    for part in body.split(", "):
        m = re.fullmatch(r"(\S+ P[0-9.]+) ±([0-9.]+) %(?: \(n=(\d+)\))?", part)
        assert m, (part, stop_reason)
        n = m[3] or (shared[1] if shared else None)
        assert n is not None, stop_reason
        out[m[1]] = (float(m[2]) / 100.0, int(n))
    return out
