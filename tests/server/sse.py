"""Reading the server's streams in tests: the load stage's one SSE parser, then the protocol models.

Unframing is :func:`harness.load.stream.sse_payload` (what the load stage measures with); validating
each payload against the response models is the tests' own check that the server speaks OpenAI.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from harness.common.openai import ChatCompletionChunk, CompletionChunk
from harness.load.stream import sse_payload


def sse_payloads(lines: Iterable[str | bytes]) -> list[str]:
    """The payload of each ``data:`` line (``[DONE]`` included), as text."""
    out: list[str] = []
    for raw in lines:
        payload = sse_payload(raw.encode() if isinstance(raw, str) else raw)
        if payload is not None:
            out.append(payload.decode())
    return out


def typed_chunk(payload: str | bytes) -> CompletionChunk | ChatCompletionChunk:
    """One payload as a completions or chat chunk (by its ``object``); raises on anything else."""
    obj = orjson.loads(payload)
    if isinstance(obj, dict) and obj.get("object") == "chat.completion.chunk":
        return ChatCompletionChunk.model_validate(obj)
    return CompletionChunk.model_validate(obj)
