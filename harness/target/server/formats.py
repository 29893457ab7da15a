"""OpenAI responses out: chunks, full responses and ``usage``, and a cached answer split as it would
have streamed.

:class:`CompletionsFormat` and :class:`ChatFormat` build the JSON of chunks and full responses for
their endpoint, with per-chunk ``usage`` when the client asked for
``stream_options.continuous_usage_stats``; the request handler does not care which one it has.
Chunks are plain dicts serialized with orjson (the hot path); tests check them against the pydantic
models in :mod:`harness.common.openai`. The requests coming in are :mod:`harness.target.server.prepare`'s.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.common.openai import Endpoint, HarnessUsage
from harness.target.engine.api import RequestMetrics, TokenEvent, Tokenizer, TopLogprob
from harness.target.server.chat_output import OutputDelta

REASONING_FIELD = "reasoning_content"
"""Where thinking goes in a message and a delta: the name DeepSeek's API, SGLang and vLLM before its
rename to ``reasoning`` use, and most clients read (the load stage reads both)."""

# Sampled tokens per response-cache split; longer cached texts are split by characters (see split_tokens).
_SPLIT_WINDOW = 6

TokenCounts = tuple[int, int]
"""(prompt tokens, completion tokens so far): what a chunk's continuous ``usage`` reports."""


PIECE_ENDS = "piece_ends"
"""A cache entry's ``meta`` key: where each text piece the engine streamed ended (character offsets
into the entry's text, increasing, the last one its length), so a hit replays the very chunks the
miss sent without asking the tokenizer (:func:`replay_pieces`)."""


def piece_ends(pieces: list[str]) -> list[int]:
    """The :data:`PIECE_ENDS` of streamed ``pieces`` (empty pieces carry no end)."""
    return list(itertools.accumulate(len(p) for p in pieces if p))


def replay_pieces(tokenizer: Tokenizer, text: str, completion_tokens: int, meta: dict[str, Any]) -> list[str]:
    """The pieces a cached answer is replayed in: the engine's own, cut at the entry's
    :data:`PIECE_ENDS`, when it carries valid ones (no tokenizer work: the hit path's cost is the
    cache lookup and the JSON), else :func:`split_tokens` (an entry preloaded with its text, or one
    stored before the ends were kept). Ends that do not fit the text are ignored, not trusted."""
    ends = meta.get(PIECE_ENDS)
    if isinstance(ends, list) and ends and ends[-1] == len(text) and len(ends) <= max(completion_tokens, 1):
        pieces: list[str] = []
        start = 0
        for end in ends:
            if not isinstance(end, int) or end <= start:
                break
            pieces.append(text[start:end])
            start = end
        else:
            return pieces
    return split_tokens(tokenizer, text, completion_tokens)


def split_tokens(tokenizer: Tokenizer, text: str, max_pieces: int | None = None) -> list[str]:
    """Split ``text`` into the text pieces the engine's tokens would have streamed.

    Each token's piece is the text it adds, decoded in a small window so the cost stays linear.
    Tokenizers that normalize (lower-casing, spaces around CJK characters, a dropped leading space)
    decode to something close to but not exactly ``text``; then each decoded piece is located in
    ``text`` and the cut is made there, so a replay always carries the exact cached text. When even
    that fails (accents stripped), the text is cut into as many equal character runs as it has tokens.

    Sampled text need not re-tokenize the way it was generated (word pieces the model put together
    split differently), so ``max_pieces`` (the completion's own token count) caps the result:
    neighbouring pieces are merged evenly, and a replay never streams more chunks than tokens.
    """
    pieces = _split_tokens(tokenizer, text)
    if max_pieces is not None and 0 < max_pieces < len(pieces):
        bounds = [round(k * len(pieces) / max_pieces) for k in range(max_pieces + 1)]
        pieces = ["".join(pieces[a:b]) for a, b in itertools.pairwise(bounds)]
    return pieces


def _split_tokens(tokenizer: Tokenizer, text: str) -> list[str]:
    if not text:
        return []
    ids = tokenizer.encode(text)
    if not ids:
        return [text]
    decoded: list[str] = []
    for i in range(len(ids)):
        start = max(0, i - _SPLIT_WINDOW)
        before = tokenizer.decode(ids[start:i]) if i > start else ""
        after = tokenizer.decode(ids[start : i + 1])
        decoded.append(after[len(before) :] if after.startswith(before) else after)
    if "".join(decoded) == text:
        return decoded
    aligned = _align(decoded, text)
    if aligned is not None:
        return aligned
    n = len(ids)
    bounds = [round(k * len(text) / n) for k in range(n + 1)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _align(decoded: list[str], text: str) -> list[str] | None:
    """Cut ``text`` after each decoded piece's occurrence, in order; ``None`` if nothing aligns.

    A piece is accepted only where the text skipped to reach it is whitespace, or no longer than
    the pieces not found just before it (an accent the tokenizer stripped); a piece that is not
    found merges into the next one.
    """
    folded = text.lower() if len(text.lower()) == len(text) else text
    cuts: list[int] = []
    pos = 0
    slack = 0
    for piece in decoded:
        core = piece.strip()
        if not core:
            continue
        at = folded.find(core.lower() if folded is not text else core, pos)
        gap = len(text[pos:at].strip()) if at >= 0 else 0
        if at < 0 or gap > slack:
            slack += len(core)
            continue
        pos = at + len(core)
        slack = 0
        cuts.append(pos)
    if not cuts:
        return None
    cuts[-1] = len(text)
    bounds = [0, *cuts]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@dataclass(slots=True)
class TokenLog:
    """Sampled tokens with their logprobs and alternatives, for the ``logprobs`` field.

    ``tokens`` are the texts the tokens added to the output (so they join to the generated text,
    as OpenAI's do); ``top`` holds each token's ``top_logprobs`` alternatives, most likely first.
    """

    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    top: list[list[TopLogprob]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.top.extend([] for _ in range(len(self.tokens) - len(self.top)))

    def add(self, ev: TokenEvent, offset: int) -> TokenLog:
        """Append an engine event that carries a token and its logprob, starting at character
        ``offset`` of the output; returns its entry alone (what a streamed chunk carries)."""
        assert ev.logprob is not None
        top = list(ev.top_logprobs or ())
        self.tokens.append(ev.text)
        self.logprobs.append(ev.logprob)
        self.offsets.append(offset)
        self.top.append(top)
        return TokenLog([ev.text], [ev.logprob], [offset], [top])


def replay_progress(pieces: int, completion_tokens: int) -> list[int]:
    """Completion tokens to report after each of ``pieces`` replayed pieces of a cached answer: the
    stored count spread evenly, ending exactly on it (the pieces are a re-tokenization of the
    cached text and need not number ``completion_tokens``)."""
    return [round(k * completion_tokens / pieces) for k in range(1, pieces + 1)]


def token_counts_usage(counts: TokenCounts) -> dict[str, int]:
    """A continuous-usage ``usage`` object (vLLM's shape: the three counts, no details)."""
    prompt, completion = counts
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


ENGINE_USAGE_FIELDS: tuple[str, ...] = tuple(f for f in HarnessUsage.model_fields if f != "cache")
"""``usage.harness``'s fields that the engine measures (:class:`~harness.target.engine.api.RequestMetrics`
has each by the same name; the wire type, :class:`~harness.common.openai.HarnessUsage`, lists them)."""

_NO_ENGINE_USAGE: dict[str, Any] = {f: HarnessUsage.model_fields[f].default for f in ENGINE_USAGE_FIELDS}
"""``usage.harness`` of an answer no engine ran for (every default a scalar: copied, never shared)."""


def usage_dict(
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    metrics: RequestMetrics | None,
    cache_status: str,
    ttft_ms: float,
    tpot_ms: float,
    e2e_ms: float,
    device: str,
    mean_entropy: float | None = None,
    reasoning_tokens: int | None = None,
) -> dict[str, Any]:
    """OpenAI ``usage`` plus ``harness``; server-side timings stand in where no engine ran.

    ``mean_entropy`` is the engine's (``metrics.mean_entropy``) when it ran, else the given one
    (a cache hit passes its entry's). ``reasoning_tokens`` (a model whose template marks thinking)
    goes in ``completion_tokens_details``, as OpenAI reports it."""
    if metrics is not None:  # the engine ran: every field is its measurement
        harness: dict[str, Any] = {f: getattr(metrics, f) for f in ENGINE_USAGE_FIELDS}
    else:  # a cache hit: the server's own timings of the replayed stream, the rest zero
        harness = dict(_NO_ENGINE_USAGE)
        harness.update(
            device=device,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
            e2e_ms=e2e_ms,
            mean_entropy=mean_entropy,
            # No engine ran, so no block was allocated: the 0 is exact, not a missing value.
            prefill_kv_measured=True,
        )
    harness["cache"] = cache_status
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    usage["harness"] = harness
    return usage


class CompletionsFormat:
    """JSON shapes of ``/v1/completions``.

    ``counts`` (prompt tokens, completion tokens so far) given to :meth:`start_chunks`,
    :meth:`delta` and :meth:`finish` become the chunk's ``usage`` when ``continuous_usage`` is on
    (vLLM's ``continuous_usage_stats``); otherwise they are ignored.
    """

    object_name: Literal["text_completion"] = "text_completion"
    id_prefix = "cmpl-"

    def __init__(
        self, rid: str, created: int, model: str, include_usage: bool, *, continuous_usage: bool = False
    ) -> None:
        self.rid, self.created, self.model, self.include_usage = rid, created, model, include_usage
        self.continuous_usage = continuous_usage

    def _base(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.rid,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None or self.include_usage:
            d["usage"] = usage
        return d

    def _running(self, counts: TokenCounts | None) -> dict[str, Any] | None:
        return token_counts_usage(counts) if self.continuous_usage and counts is not None else None

    @staticmethod
    def _logprobs(log: TokenLog | None) -> dict[str, Any] | None:
        if log is None:
            return None
        top: list[dict[str, float]] = []
        for t, lp, alts in zip(log.tokens, log.logprobs, log.top, strict=True):
            # The alternatives plus the sampled token: up to logprobs + 1 entries, as OpenAI documents.
            entry = {a.text: a.logprob for a in alts}
            entry.setdefault(t, lp)
            top.append(entry)
        return {
            "tokens": log.tokens,
            "token_logprobs": log.logprobs,
            "top_logprobs": top,
            "text_offset": log.offsets,
        }

    def start_chunks(self, echo_text: str | None, counts: TokenCounts | None = None) -> list[dict[str, Any]]:
        if not echo_text:
            return []
        return [self.delta(echo_text, None, counts)]

    def delta(self, text: str, log: TokenLog | None, counts: TokenCounts | None = None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": self._logprobs(log), "finish_reason": None}
        return self._base([choice], self._running(counts))

    def finish(self, reason: str, counts: TokenCounts | None = None) -> dict[str, Any]:
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
        return self._base([choice], self._running(counts))

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return self._base([], usage)

    def response(self, text: str, reason: str, log: TokenLog | None, usage: dict[str, Any]) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": self._logprobs(log), "finish_reason": reason}
        return self._base([choice], usage)


class ChatFormat(CompletionsFormat):
    """JSON shapes of ``/v1/chat/completions``: a role chunk first, then content deltas."""

    id_prefix = "chatcmpl-"

    @staticmethod
    def _chat_logprobs(log: TokenLog | None) -> dict[str, Any] | None:
        if log is None:
            return None
        content = []
        for t, lp, alts in zip(log.tokens, log.logprobs, log.top, strict=True):
            content.append(
                {
                    "token": t,
                    "logprob": lp,
                    "bytes": list(t.encode()),
                    # Exactly the top_logprobs most likely tokens (OpenAI's shape; [] when 0).
                    "top_logprobs": [
                        {"token": a.text, "logprob": a.logprob, "bytes": list(a.text.encode())} for a in alts
                    ],
                }
            )
        return {"content": content}

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        d = self._base(choices, usage)
        d["object"] = "chat.completion.chunk"
        return d

    def start_chunks(self, echo_text: str | None, counts: TokenCounts | None = None) -> list[dict[str, Any]]:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return [self._chunk([choice], self._running(counts))]

    def delta(self, text: str, log: TokenLog | None, counts: TokenCounts | None = None) -> dict[str, Any]:
        choice = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": self._chat_logprobs(log),
            "finish_reason": None,
        }
        return self._chunk([choice], self._running(counts))

    def finish(self, reason: str, counts: TokenCounts | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        return self._chunk([choice], self._running(counts))

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return self._chunk([], usage)

    def parts(
        self, d: OutputDelta, log: TokenLog | None, counts: TokenCounts | None = None
    ) -> dict[str, Any]:
        """A chunk of a parsed answer (:mod:`harness.target.server.chat_output`): thinking in
        ``reasoning_content``, the answer in ``content``, tool-call fragments in ``tool_calls``."""
        delta: dict[str, Any] = {}
        if d.reasoning:
            delta[REASONING_FIELD] = d.reasoning
        if d.content:
            delta["content"] = d.content
        if d.tool_calls:
            delta["tool_calls"] = d.tool_calls
        choice = {"index": 0, "delta": delta, "logprobs": self._chat_logprobs(log), "finish_reason": None}
        return self._chunk([choice], self._running(counts))

    def response(
        self,
        text: str,
        reason: str,
        log: TokenLog | None,
        usage: dict[str, Any],
        *,
        parsed: OutputDelta | None = None,
        calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """``parsed``: the answer split by the chat output parser (then ``text`` is not used);
        ``calls``: its finished tool calls."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if parsed is not None:
            message["content"] = parsed.content or (None if calls else "")
            if parsed.reasoning:
                message[REASONING_FIELD] = parsed.reasoning
            if calls:
                message["tool_calls"] = calls
        choice = {
            "index": 0,
            "message": message,
            "logprobs": self._chat_logprobs(log),
            "finish_reason": reason,
        }
        d = self._base([choice], usage)
        d["object"] = "chat.completion"
        return d


def formatter(
    endpoint: Endpoint,
    rid: str,
    created: int,
    model: str,
    include_usage: bool,
    *,
    continuous_usage: bool = False,
) -> CompletionsFormat:
    cls = ChatFormat if endpoint == "chat.completions" else CompletionsFormat
    return cls(cls.id_prefix + rid, created, model, include_usage, continuous_usage=continuous_usage)
