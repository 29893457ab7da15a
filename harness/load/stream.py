"""What one streamed OpenAI response looked like on the wire, and the token timings it implies.

The load user reads the response body line by line as bytes arrive and stores each line with its
``perf_counter`` arrival time, nothing else: all parsing and token counting happens here, *after*
the stream ended, so that work done on one line never delays the timestamp of the next.

Token counting (:data:`COUNTERS`, chosen with ``--token-counting``) decides how many tokens each
content chunk carried. A chunk may carry several tokens (speculative decoding, detokenizer hold-back,
server-side batching of the flush), so "one chunk = one token" would overstate the decode rate
(llmperf's mistake); it is never used silently:

``usage``
    vLLM's ``stream_options.continuous_usage_stats``: every chunk carries the cumulative
    ``usage.completion_tokens``; a chunk's tokens are the difference to the previous chunk. Exact.
``logprobs``
    The chunk's logprobs list has one entry per token (requires asking for logprobs, which makes
    some servers, ours included, bypass their response cache). Exact.
``tokenizer``
    Re-tokenize the cumulative text with a local ``tokenizer.json``; a chunk's tokens are the growth
    of the count. Exact when the tokenizer is the target's, approximate otherwise.
``final-usage``
    Only the final ``usage.completion_tokens`` is known: it is spread over the content chunks as
    evenly as possible. The total and TTFT are right, ITL/TPOT are approximate (a warning says so).
``chunks``
    One token per content chunk: the last resort when a server reports no usage at all; the summary
    and a warning say so.
``auto`` (default)
    Per stream, the first of ``usage``, ``logprobs``, ``tokenizer`` (when one is configured),
    ``final-usage``, ``chunks`` that the response supports.

Timings follow :mod:`harness.load.results`: TTFT to the first chunk with content; each later chunk
contributes its gap to the previous content chunk once and ``k − 1`` zero gaps for its other tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import orjson

from harness.common.openai import SSE_DONE
from harness.common.registry import Registry

TokenCounting = Literal["auto", "usage", "logprobs", "tokenizer", "final-usage", "chunks"]
TOKEN_COUNTINGS: tuple[TokenCounting, ...] = get_args(TokenCounting)
APPROXIMATE_MODES = frozenset({"final-usage", "chunks"})
"""Modes whose per-token gaps are estimates (the summary warns when any request used one)."""


DATA = b"data:"
"""The prefix of an SSE data line: the only lines a stream's meaning is in."""
DONE_LINE = SSE_DONE.rstrip()
"""``data: [DONE]``, the end of an OpenAI stream (spelled once, in :mod:`harness.common.openai`)."""
DONE_PAYLOAD = DONE_LINE[len(DATA) :].strip()
NOT_DONE = f"stream ended without {DONE_PAYLOAD.decode()}"
"""The error of a stream that stopped before ``[DONE]`` (cut off: not a complete answer)."""


def sse_payload(raw: bytes) -> bytes | None:
    """The payload of one SSE line when it is a ``data:`` line (``[DONE]`` included), else ``None``;
    the line may keep its newline. The one unframing rule of the project (the server frames with
    :func:`harness.common.openai.sse_event`)."""
    line = raw.strip()
    return line[5:].strip() if line.startswith(DATA) else None


@dataclass(slots=True)
class Chunk:
    """One parsed content-bearing SSE event."""

    t: float
    """perf_counter time its line arrived."""
    text: str
    cumulative_tokens: int | None = None
    """``usage.completion_tokens`` on this chunk (continuous usage), if the server sent it."""
    logprob_tokens: int | None = None
    """Number of logprob entries on this chunk, if any."""


@dataclass(slots=True)
class ParsedStream:
    """The events of one response body, parsed."""

    chunks: list[Chunk] = field(default_factory=list)
    """Chunks that carried choices (content or not), in arrival order."""
    usage: dict[str, Any] | None = None
    """The last ``usage`` object seen (the final one with ``include_usage``)."""
    error: str | None = None
    """An in-stream ``{"error": …}`` event, or a line that is not valid JSON."""
    done: bool = False
    """``data: [DONE]`` arrived."""
    finish_reason: str | None = None


def _choice_text(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        return content if isinstance(content, str) else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def _logprob_count(choice: dict[str, Any]) -> int | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    content = lp.get("content")  # chat
    if isinstance(content, list):
        return len(content)
    tokens = lp.get("tokens")  # completions
    if isinstance(tokens, list):
        return len(tokens)
    return None


def parse_lines(lines: Sequence[tuple[float, bytes]]) -> ParsedStream:
    """Parse ``(arrival time, raw line)`` pairs of an OpenAI SSE body (``data:`` lines; others skipped)."""
    out = ParsedStream()
    for t, raw in lines:
        payload = sse_payload(raw)
        if payload is None:
            continue
        if payload == DONE_PAYLOAD:
            out.done = True
            continue
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            out.error = f"invalid JSON in stream: {payload[:80]!r}"
            continue
        if not isinstance(obj, dict):
            continue
        if "error" in obj:
            err = obj["error"]
            out.error = str(err.get("message", err)) if isinstance(err, dict) else str(err)
            continue
        usage = obj.get("usage")
        cumulative: int | None = None
        if isinstance(usage, dict):
            out.usage = usage
            ct = usage.get("completion_tokens")
            cumulative = ct if isinstance(ct, int) else None
        choices = obj.get("choices")
        if not choices:
            continue
        choice = choices[0]
        if choice.get("finish_reason"):
            out.finish_reason = choice["finish_reason"]
        out.chunks.append(
            Chunk(
                t=t,
                text=_choice_text(choice),
                cumulative_tokens=cumulative,
                logprob_tokens=_logprob_count(choice),
            )
        )
    return out


# ----------------------------------------------------------------------------------- token counters

CountFn = Callable[[ParsedStream, "Tokenize | None"], list[int] | None]
"""Tokens per chunk of a stream, or ``None`` when the stream does not support the mode."""
Tokenize = Callable[[str], int]
"""Number of tokens in a text (a local tokenizer)."""

COUNTERS: Registry[CountFn] = Registry("token counting mode")


@COUNTERS.register("usage")
def _count_usage(s: ParsedStream, tokenize: Tokenize | None) -> list[int] | None:
    # Continuous usage: every choice chunk must carry a cumulative count (else the diffs lie).
    if not s.chunks or any(c.cumulative_tokens is None for c in s.chunks):
        return None
    counts: list[int] = []
    prev = 0
    for c in s.chunks:
        cum = c.cumulative_tokens or 0
        counts.append(max(0, cum - prev))
        prev = max(prev, cum)
    final = _final_completion_tokens(s)
    if final is not None and final > prev and counts:
        counts[-1] += final - prev  # tokens the final usage counts but no chunk did (EOS)
    return counts


@COUNTERS.register("logprobs")
def _count_logprobs(s: ParsedStream, tokenize: Tokenize | None) -> list[int] | None:
    content = [c for c in s.chunks if c.text]
    if not content or any(c.logprob_tokens is None for c in content):
        return None
    return [c.logprob_tokens or 0 for c in s.chunks]


@COUNTERS.register("tokenizer")
def _count_tokenizer(s: ParsedStream, tokenize: Tokenize | None) -> list[int] | None:
    if tokenize is None:
        return None
    counts: list[int] = []
    text = ""
    prev = 0
    for c in s.chunks:
        text += c.text
        n = tokenize(text) if text else 0
        counts.append(max(0, n - prev))
        prev = max(prev, n)
    return counts


def _final_completion_tokens(s: ParsedStream) -> int | None:
    if s.usage is None:
        return None
    ct = s.usage.get("completion_tokens")
    return ct if isinstance(ct, int) else None


@COUNTERS.register("final-usage")
def _count_final_usage(s: ParsedStream, tokenize: Tokenize | None) -> list[int] | None:
    total = _final_completion_tokens(s)
    idx = [i for i, c in enumerate(s.chunks) if c.text]
    if total is None or not idx:
        return None
    counts = [0] * len(s.chunks)
    base, extra = divmod(total, len(idx))
    for j, i in enumerate(idx):
        counts[i] = base + (1 if j < extra else 0)
    return counts


@COUNTERS.register("chunks")
def _count_chunks(s: ParsedStream, tokenize: Tokenize | None) -> list[int] | None:
    return [1 if c.text else 0 for c in s.chunks]


AUTO_ORDER: tuple[str, ...] = ("usage", "logprobs", "tokenizer", "final-usage", "chunks")


@dataclass(slots=True)
class StreamTiming:
    """Token timings of one response, in ms, as :class:`~harness.load.results.RequestRecord` wants them."""

    mode: str | None
    """The token counting mode actually used (``None``: no content arrived)."""
    first_token_t: float | None = None
    last_token_t: float | None = None
    completion_tokens: int = 0
    itl_ms: list[float] = field(default_factory=list)
    tpot_ms: float | None = None


def count_tokens(
    s: ParsedStream, mode: TokenCounting, tokenize: Tokenize | None = None
) -> tuple[str, list[int]]:
    """Tokens per chunk under ``mode`` (``auto``: the first mode the stream supports) and the mode used.

    Raises ``ValueError`` when a forced mode is not supported by this stream (the caller records the
    request as an error rather than guessing).
    """
    order = AUTO_ORDER if mode == "auto" else (mode,)
    for name in order:
        counts = COUNTERS.get(name)(s, tokenize)
        if counts is not None:
            return name, counts
    raise ValueError(f"token counting mode {mode!r} is not supported by this response")


def timing(s: ParsedStream, mode: TokenCounting, tokenize: Tokenize | None = None) -> StreamTiming:
    """Per-token timings of a parsed stream (see the module docstring for the definitions)."""
    first = next((i for i, c in enumerate(s.chunks) if c.text), None)
    if first is None:
        return StreamTiming(mode=None)
    used, counts = count_tokens(s, mode, tokenize)
    # Tokens reported on choice chunks before the first text (e.g. a role chunk) belong to the first token.
    counts = list(counts)
    counts[first] += sum(counts[:first])
    itl: list[float] = []
    total = 0
    prev_t: float | None = None
    last_t = s.chunks[first].t
    for i in range(first, len(s.chunks)):
        k = counts[i]
        if k <= 0:
            continue
        t = s.chunks[i].t
        if prev_t is not None:
            itl.append((t - prev_t) * 1000.0)  # the gap belongs to this chunk's first token
        itl.extend([0.0] * (k - 1))  # its other tokens arrived with it
        total += k
        prev_t = last_t = t
    first_t = s.chunks[first].t
    tpot = (last_t - first_t) * 1000.0 / (total - 1) if total > 1 else None
    return StreamTiming(
        mode=used,
        first_token_t=first_t,
        last_token_t=last_t,
        completion_tokens=total,
        itl_ms=itl,
        tpot_ms=tpot,
    )


def load_tokenizer(path: str) -> Tokenize:
    """A :data:`Tokenize` from a Hugging Face ``tokenizer.json`` (special tokens and padding off)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.no_padding()
    tok.no_truncation()

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    return count
