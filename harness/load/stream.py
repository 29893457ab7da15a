"""What one streamed OpenAI response looked like on the wire, and the token timings it implies.

The load user reads the response body line by line as bytes arrive and stores each line with its
``perf_counter`` arrival time, nothing else: all parsing and token counting happens here, *after*
the stream ended, so that work done on one line never delays the timestamp of the next.

Token counting (:data:`COUNTERS`, chosen with ``--token-counting``) decides how many tokens each
chunk carried. A chunk may carry several tokens (speculative decoding, detokenizer hold-back,
server-side batching of the flush), so "one chunk = one token" would overstate the decode rate
(llmperf's mistake); it is never used silently:

``usage``
    vLLM's ``stream_options.continuous_usage_stats``: every chunk carries the cumulative
    ``usage.completion_tokens``; a chunk's tokens are the difference to the previous chunk. Exact.
``logprobs``
    The chunk's logprobs list has one entry per token (requires asking for logprobs, which makes
    some servers, ours included, bypass their response cache). Exact.
``tokenizer``
    Re-tokenize the cumulative text of each kind with a local ``tokenizer.json``; a chunk's tokens
    are the growth of the counts. Exact when the tokenizer is the target's, approximate otherwise.
``final-usage``
    Only the final ``usage.completion_tokens`` is known: it is spread over the token-bearing chunks as
    evenly as possible. The total and TTFT are right, ITL/TPOT are approximate (a warning says so).
``chunks``
    One token per token-bearing chunk: the last resort when a server reports no usage at all; the summary
    and a warning say so.
``auto`` (default)
    Per stream, the first of ``usage``, ``logprobs``, ``tokenizer`` (when one is configured),
    ``final-usage``, ``chunks`` that the response supports.

**Every kind of delta is a token.** A chunk's tokens may be thinking (``delta.reasoning_content`` or
``delta.reasoning``), the answer (``delta.content``, a completion's ``text``), a tool call's name and
argument fragments (``delta.tool_calls[*].function``) or a refusal (``delta.refusal``): each is
classified here, once, per chunk (:func:`parse_lines`), and all of them are counted and timed. A chunk
that carries several kinds gives each a share of its tokens (:func:`token_kinds`). A delta field
this reader does not know that carries a value is reported (:attr:`ParsedStream.unread`), never
silently dropped. A ``<think>…</think>`` that a server leaves inline in ``content`` is content here,
as that server counts it.

Timings follow :mod:`harness.load.results`: TTFT to the first chunk with a token of any kind, TTFA to
the first with an answer, refusal or tool-call token; each later chunk contributes its gap to the
previous token-bearing chunk once and ``k − 1`` zero gaps for its other tokens, whatever their kind
(:attr:`StreamTiming.itl_reasoning` says which gaps were thinking).
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


DeltaKind = Literal["reasoning", "content", "tool_call", "refusal"]
"""What a streamed token was: thinking (``delta.reasoning_content`` / ``delta.reasoning``), the answer's
text (``delta.content``, a completion's ``text``), a tool call's name or argument fragment
(``delta.tool_calls[*].function``, the legacy ``delta.function_call``) or a refusal (``delta.refusal``)."""
ANSWER_KINDS: frozenset[str] = frozenset({"content", "tool_call", "refusal"})
"""Kinds a user (or an agent) acts on: the first of them is the time to first answer (TTFA)."""
REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Where servers put thinking: ``reasoning_content`` (DeepSeek's API, SGLang, older vLLM, ours) and
``reasoning`` (vLLM's current name). A server that sends both with the same text counts it once."""
READ_DELTA_FIELDS: frozenset[str] = frozenset(
    {"role", "content", "tool_calls", "function_call", "refusal", *REASONING_FIELDS}
)
"""Chat delta fields this reader understands; any other that carries a value is reported
(:attr:`ParsedStream.unread`), so that tokens in a field nobody reads are never silently lost."""


@dataclass(slots=True)
class Chunk:
    """One parsed SSE event that carried a choice."""

    t: float
    """perf_counter time its line arrived."""
    parts: tuple[tuple[DeltaKind, str], ...] = ()
    """The token-bearing texts it carried, by kind, in the order a server generates them (thinking,
    then the answer, then tool calls); empty for a role-only or finish-only chunk."""
    cumulative_tokens: int | None = None
    """``usage.completion_tokens`` on this chunk (continuous usage), if the server sent it."""
    logprob_tokens: int | None = None
    """Number of logprob entries on this chunk, if any."""

    @property
    def text(self) -> str:
        """Every token-bearing text of the chunk, joined ("" when it carried none)."""
        parts = self.parts
        if not parts:
            return ""
        return parts[0][1] if len(parts) == 1 else "".join(p for _, p in parts)


@dataclass(slots=True)
class ToolCall:
    """One tool call of a response, assembled from its streamed fragments."""

    index: int
    id: str | None = None
    name: str = ""
    arguments: str = ""

    def message(self) -> dict[str, Any]:
        """The call as an assistant message's ``tool_calls`` entry (OpenAI shape)."""
        return {
            "id": self.id or f"call_{self.index}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


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
    tool_calls: list[ToolCall] = field(default_factory=list)
    """The tool calls the response made, in order of their first fragment."""
    unread: set[str] = field(default_factory=set)
    """Delta fields that carried a value this reader does not understand (not timed, not counted)."""

    def answer_text(self) -> str:
        """The answer's text (``content`` / ``text``; thinking and tool calls left out)."""
        return "".join(p for c in self.chunks for k, p in c.parts if k == "content")


def _tool_part(out: ParsedStream, index: int, call: dict[str, Any]) -> str:
    """Merge one streamed tool-call fragment into ``out.tool_calls``; the text it adds (its name the
    first time, then argument fragments), which is what its tokens spell."""
    acc = next((c for c in out.tool_calls if c.index == index), None)
    if acc is None:
        acc = ToolCall(index)
        out.tool_calls.append(acc)
    cid = call.get("id")
    if isinstance(cid, str) and cid and acc.id is None:
        acc.id = cid
    fn = call.get("function")
    if not isinstance(fn, dict):
        fn = call  # the legacy function_call delta is the function itself
    text = ""
    name = fn.get("name")
    # Some servers repeat the whole name on every fragment: a repeat is no new token.
    if isinstance(name, str) and name and name != acc.name:
        acc.name += name
        text += name
    args = fn.get("arguments")
    if isinstance(args, str) and args:
        acc.arguments += args
        text += args
    return text


def _choice_parts(choice: dict[str, Any], out: ParsedStream) -> tuple[tuple[DeltaKind, str], ...]:
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        text = choice.get("text")  # completions
        return (("content", text),) if isinstance(text, str) and text else ()
    content = delta.get("content")
    if delta.keys() <= {"role", "content"}:  # the common chunk, decided at once
        return (("content", content),) if isinstance(content, str) and content else ()
    parts: list[tuple[DeltaKind, str]] = []
    seen: list[str] = []
    for key in REASONING_FIELDS:
        r = delta.get(key)
        if isinstance(r, str) and r and r not in seen:
            seen.append(r)
            parts.append(("reasoning", r))
    if isinstance(content, str) and content:
        parts.append(("content", content))
    refusal = delta.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append(("refusal", refusal))
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for j, call in enumerate(calls):
            if isinstance(call, dict):
                idx = call.get("index")
                text = _tool_part(out, idx if isinstance(idx, int) else j, call)
                if text:
                    parts.append(("tool_call", text))
    legacy = delta.get("function_call")
    if isinstance(legacy, dict):
        text = _tool_part(out, -1, legacy)
        if text:
            parts.append(("tool_call", text))
    for key, value in delta.items():
        if key not in READ_DELTA_FIELDS and value not in (None, "", [], {}):
            out.unread.add(key)
    return tuple(parts)


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
                parts=_choice_parts(choice, out),
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
    content = [c for c in s.chunks if c.parts]
    if not content or any(c.logprob_tokens is None for c in content):
        return None
    return [c.logprob_tokens or 0 for c in s.chunks]


@COUNTERS.register("tokenizer")
def _count_tokenizer(s: ParsedStream, tokenize: Tokenize | None) -> list[int] | None:
    if tokenize is None:
        return None
    # Each kind is its own text (thinking, the answer, the arguments): re-tokenized apart, a token
    # never spans the seam between two of them, as it never does in what the model generated.
    texts: dict[str, str] = {}
    prev: dict[str, int] = {}
    counts: list[int] = []
    for c in s.chunks:
        n = 0
        for kind, part in c.parts:
            text = texts[kind] = texts.get(kind, "") + part
            m = tokenize(text)
            n += max(0, m - prev.get(kind, 0))
            prev[kind] = max(prev.get(kind, 0), m)
        counts.append(n)
    return counts


def _final_completion_tokens(s: ParsedStream) -> int | None:
    if s.usage is None:
        return None
    ct = s.usage.get("completion_tokens")
    return ct if isinstance(ct, int) else None


def reported_reasoning_tokens(usage: dict[str, Any] | None) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens`` when the server reported it (OpenAI; vLLM
    with a reasoning parser in recent versions; ours for a template that marks thinking), else ``None``."""
    details = usage.get("completion_tokens_details") if usage else None
    n = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


@COUNTERS.register("final-usage")
def _count_final_usage(s: ParsedStream, tokenize: Tokenize | None) -> list[int] | None:
    total = _final_completion_tokens(s)
    idx = [i for i, c in enumerate(s.chunks) if c.parts]
    if total is None or not idx:
        return None
    hidden = reported_reasoning_tokens(s.usage)
    if hidden and not any(k == "reasoning" for c in s.chunks for k, _ in c.parts):
        # Thinking the server counted but never streamed (OpenAI's reasoning models): those tokens
        # arrived in no chunk, so they are not spread over the ones that did.
        total = max(len(idx), total - hidden)
    counts = [0] * len(s.chunks)
    base, extra = divmod(total, len(idx))
    for j, i in enumerate(idx):
        counts[i] = base + (1 if j < extra else 0)
    return counts


@COUNTERS.register("chunks")
def _count_chunks(s: ParsedStream, tokenize: Tokenize | None) -> list[int] | None:
    return [1 if c.parts else 0 for c in s.chunks]


AUTO_ORDER: tuple[str, ...] = ("usage", "logprobs", "tokenizer", "final-usage", "chunks")


@dataclass(slots=True)
class StreamTiming:
    """Token timings of one response, in ms, as :class:`~harness.load.results.RequestRecord` wants them."""

    mode: str | None
    """The token counting mode actually used (``None``: no token of any kind arrived)."""
    first_token_t: float | None = None
    """The first token of any kind (thinking included): TTFT."""
    first_answer_t: float | None = None
    """The first answer, refusal or tool-call token: TTFA (``None``: the response only thought)."""
    last_token_t: float | None = None
    completion_tokens: int = 0
    itl_ms: list[float] = field(default_factory=list)
    tpot_ms: float | None = None
    reasoning_tokens: int = 0
    """Tokens counted as thinking, the way the run counts tokens (a server's own count is in usage)."""
    itl_reasoning: list[tuple[int, int]] = field(default_factory=list)
    """Ranges ``[start, end)`` of ``itl_ms`` whose token was thinking (the gap belongs to the token
    it precedes, so the gap before the first answer token is the answer's)."""


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


def token_kinds(k: int, parts: Sequence[tuple[DeltaKind, str]]) -> list[DeltaKind]:
    """The kinds of a chunk's ``k`` tokens, in order, when it carried several kinds of text (a
    server's chunk at the seam of thinking and answer): each part gets tokens in proportion to its
    characters, at least one while there are tokens to give (largest remainder), none past ``k``."""
    if len(parts) == 1 or k <= 0:
        return [parts[0][0]] * k if parts else []
    if k <= len(parts):
        return [kind for kind, _ in parts[:k]]
    lengths = [len(p) for _, p in parts]
    total = sum(lengths) or 1
    rest = k - len(parts)
    shares = [rest * n / total for n in lengths]
    give = [1 + int(x) for x in shares]
    left = k - sum(give)
    for i in sorted(range(len(parts)), key=lambda i: (-(shares[i] - int(shares[i])), i))[:left]:
        give[i] += 1
    return [kind for (kind, _), n in zip(parts, give, strict=True) for _ in range(n)]


def timing(s: ParsedStream, mode: TokenCounting, tokenize: Tokenize | None = None) -> StreamTiming:
    """Per-token timings of a parsed stream (see the module docstring for the definitions)."""
    chunks = s.chunks
    first = next((i for i, c in enumerate(chunks) if c.parts), None)
    if first is None:
        return StreamTiming(mode=None)
    used, counts = count_tokens(s, mode, tokenize)
    # Tokens reported on choice chunks before the first text (e.g. a role chunk) belong to the first token.
    counts = list(counts)
    counts[first] += sum(counts[:first])
    # Only a stream with something besides answer text pays for the per-token kinds.
    plain = all(len(c.parts) <= 1 and (not c.parts or c.parts[0][0] == "content") for c in chunks)
    kinds: list[DeltaKind] = []
    first_answer_t: float | None = chunks[first].t if plain else None
    itl: list[float] = []
    total = 0
    prev_t: float | None = None
    last_t = chunks[first].t
    for i in range(first, len(chunks)):
        c = chunks[i]
        if first_answer_t is None and any(kind in ANSWER_KINDS for kind, _ in c.parts):
            first_answer_t = c.t
        k = counts[i]
        if k <= 0:
            continue
        if not plain:
            kinds += token_kinds(k, c.parts) if c.parts else [kinds[-1] if kinds else "content"] * k
        t = c.t
        if prev_t is not None:
            itl.append((t - prev_t) * 1000.0)  # the gap belongs to this chunk's first token
        itl.extend([0.0] * (k - 1))  # its other tokens arrived with it
        total += k
        prev_t = last_t = t
    first_t = chunks[first].t
    tpot = (last_t - first_t) * 1000.0 / (total - 1) if total > 1 else None
    spans: list[tuple[int, int]] = []
    for j, kind in enumerate(kinds[1:]):  # gap j belongs to token j + 1
        if kind == "reasoning":
            if spans and spans[-1][1] == j:
                spans[-1] = (spans[-1][0], j + 1)
            else:
                spans.append((j, j + 1))
    return StreamTiming(
        mode=used,
        first_token_t=first_t,
        first_answer_t=first_answer_t,
        last_token_t=last_t,
        completion_tokens=total,
        itl_ms=itl,
        tpot_ms=tpot,
        reasoning_tokens=sum(1 for kind in kinds if kind == "reasoning"),
        itl_reasoning=spans,
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
