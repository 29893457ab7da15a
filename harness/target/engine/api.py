"""The engine's public contract: what the server (and benchmarks) may rely on.

Everything else in ``harness.target.engine`` is an implementation detail behind :class:`AsyncEngine`.
A request goes in as token ids plus :class:`SamplingParams`; out comes a stream of
:class:`TokenEvent`, the last one carrying ``finish_reason`` and the request's
:class:`RequestMetrics`. The engine runs its step loop on a thread of its own or in a process of
its own; the async methods are safe to call from any asyncio event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length", "abort", "error"]


class EngineError(Exception):
    """Base class for request-level engine failures (not user input errors)."""


class EngineFull(EngineError):
    """The waiting queue is at capacity; the caller should retry later (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidPrompt(EngineError):
    """The prompt holds token ids the model's embedding table does not have (HTTP 400)."""


class PromptTooLong(EngineError):
    """prompt tokens + max_tokens exceed the model's context (HTTP 400)."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens; the request asks for "
            f"{prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, {max_tokens} to generate)"
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


MAX_TOP_LOGPROBS = 20
"""The most alternatives a request may ask for per token (OpenAI's and vLLM's default limit)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    The sampler applies, in this order (vLLM's): ``logit_bias`` and the ``min_tokens`` floor, then
    ``repetition_penalty`` (over prompt and output tokens), ``frequency_penalty`` and
    ``presence_penalty`` (over output tokens); greedy rows take the argmax there. Sampled rows then
    get ``temperature``, ``min_p``, ``top_k`` and ``top_p``. ``temperature`` 0 (below 1e-5) is greedy;
    ``top_k <= 0``, ``top_p >= 1``, ``min_p == 0``, penalties of 0 (1 for repetition) disable
    those steps. ``seed`` makes a sampled request reproducible regardless of what else is batched
    with it.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    """Drop tokens whose probability (after temperature) is below ``min_p`` × the top token's."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token that occurs in the output so far."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per occurrence in the output so far."""
    repetition_penalty: float = 1.0
    """Divides positive (multiplies negative) logits of tokens seen in the prompt or the output (> 0)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before anything else."""
    min_tokens: int = 0
    """EOS (unless ``ignore_eos``) and ``stop_token_ids`` are masked, and stop strings not matched,
    until this many tokens have been generated."""
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    """Report the chosen token's logprob per step (of the raw distribution, see :class:`TokenEvent`)."""
    top_logprobs: int = 0
    """Also report this many most likely tokens per step (0..:data:`MAX_TOP_LOGPROBS`)."""


@dataclass(slots=True)
class RequestMetrics:
    """Per-request measurements, final once the request finishes.

    ``prefill_peak_bytes`` is measured from CUDA memory stats on a GPU (``peak_measured=True``);
    on CPU it is an estimate (weights are not counted: activations + KV written) and says so.
    ``prefill_kv_bytes`` is counted where the block manager hands out blocks: the KV blocks this
    request took from the pool while its prompt was prefilled (over every chunk, and again after a
    preemption before its first token), times the bytes one block occupies in the KV tensor
    (``prefill_kv_measured=True``); blocks shared from the prefix cache cost nothing and count 0.
    """

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0
    queued_ms: float = 0.0
    prefill_ms: float = 0.0
    prefill_kv_bytes: int = 0
    prefill_peak_bytes: int = 0
    peak_measured: bool = False
    prefill_kv_measured: bool = False
    """``prefill_kv_bytes`` is the block manager's count of the blocks this request allocated, not a
    formula on token counts (always true once the engine has prefilled the request)."""
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    """Mean time per output token after the first: (e2e - ttft) / (output_tokens - 1)."""
    e2e_ms: float = 0.0
    preemptions: int = 0
    device: str = "cpu"
    mean_entropy: float | None = None
    """Mean over the output tokens of the entropy (nats) of the model's next-token distribution
    (raw logits: temperature 1, before bias, penalties and filters); None before any token."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What a request must fit to be served: checked up front, by whoever receives it first.

    The engine checks again when it queues a request; the front end of an engine in another process
    checks with the same limits (sent once at start-up) so that a refused request is refused at once,
    before anything crosses the process boundary.
    """

    max_model_len: int
    """Prompt tokens + ``max_tokens`` may not exceed it."""
    vocab_size: int
    """Rows of the embedding table: a prompt's token ids must be below it."""
    vocab_limit: int
    """Token ids the sampler can produce (``logit_bias`` keys must be below it)."""

    def check_request(self, prompt_len: int, params: SamplingParams) -> None:
        """Refuse up front what can never be served (so the scheduler never spins on it)."""
        if prompt_len < 1:
            raise EngineError("the prompt is empty")
        if params.max_tokens < 1:
            raise EngineError("max_tokens must be at least 1")
        if prompt_len + params.max_tokens > self.max_model_len:
            raise PromptTooLong(prompt_len, params.max_tokens, self.max_model_len)
        self.check_params(params)

    def check_params(self, params: SamplingParams) -> None:
        """Refuse sampling parameters outside their domain (the server checks them first, naming
        the field; this keeps a direct caller from failing a whole batch's step)."""
        vocab = self.vocab_limit
        problems = []
        if params.temperature < 0:
            problems.append(f"temperature must be >= 0, got {params.temperature}")
        if not 0.0 < params.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {params.top_p}")
        if not 0.0 <= params.min_p <= 1.0:
            problems.append(f"min_p must be in [0, 1], got {params.min_p}")
        if params.repetition_penalty <= 0:
            problems.append(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
        if not 0 <= params.min_tokens <= params.max_tokens:
            problems.append(
                f"min_tokens must be in [0, max_tokens={params.max_tokens}], got {params.min_tokens}"
            )
        if not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
            problems.append(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {params.top_logprobs}")
        bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
        if bad:
            problems.append(f"logit_bias token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
        if problems:
            raise EngineError("; ".join(problems))

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Refuse token ids outside the embedding table: one would fail the step of the whole batch."""
        vocab = self.vocab_size
        if prompt_ids and (min(prompt_ids) < 0 or max(prompt_ids) >= vocab):
            pos, tok = next((i, t) for i, t in enumerate(prompt_ids) if not 0 <= t < vocab)
            raise InvalidPrompt(
                f"token id {tok} at prompt position {pos} is outside the vocabulary (0..{vocab - 1})"
            )


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One of the most likely tokens at a step, for ``top_logprobs``."""

    token_id: int
    text: str
    """The text this token would have added at that position (special tokens spelled out)."""
    logprob: float


@dataclass(slots=True)
class TokenEvent:
    """One step's output for one request.

    ``text`` is the newly decodable text (may be empty while a multi-byte character or a stop
    string candidate is held back). The final event has ``finished=True``, a ``finish_reason``
    and ``metrics``; it may also carry a last token.

    ``logprob`` (with ``SamplingParams.logprobs``) and ``top_logprobs`` (the ``top_logprobs``
    most likely tokens, most likely first) describe the model's raw distribution: temperature 1,
    before bias, penalties and filters (vLLM's default ``raw_logprobs``). ``entropy`` (nats, same
    distribution) is set on every event that carries a token.
    """

    request_id: str
    token_id: int | None
    text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    logprob: float | None = None
    entropy: float | None = None
    top_logprobs: list[TopLogprob] | None = None
    metrics: RequestMetrics | None = None


@dataclass(slots=True)
class EngineStats:
    """A snapshot for /metrics and /health."""

    running: int = 0
    waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_cached: int = 0
    """Blocks held only by the prefix cache (unreferenced, evictable)."""
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    extra: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    """Why the engine cannot serve any more (its process died); ``None`` while it can."""

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class Tokenizer(Protocol):
    """What the server needs from a tokenizer."""

    eos_token_id: int | None
    vocab_size: int
    """It knows token ids ``0 .. vocab_size - 1`` (``logit_bias`` keys are checked against it)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    chat_template: str
    """The template's text (what it says the model writes: tool-call and thinking markers)."""

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """Render chat messages (role, content, tool calls) and the offered tools to the prompt text
        the model expects."""
        ...


class AsyncEngine(Protocol):
    """The engine as the server sees it."""

    # Read-only properties (not plain attributes) so that an implementation may narrow the types.
    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        use_prefix_cache: bool = True,
        priority: int = 0,
    ) -> AsyncIterator[TokenEvent]:
        """Stream the request's tokens. Raises :class:`EngineFull` or :class:`PromptTooLong`
        before the first event. Cancelling the iteration (client gone) aborts the request and
        returns its KV blocks to the pool.

        ``use_prefix_cache=False`` serves the request as if the prefix cache were empty: no cached
        block is shared with it (the whole prompt is computed, ``cached_prompt_tokens`` 0), and the
        blocks it computes are not registered in the cache either, so no later request hits them
        (the server's ``--inject-cache-miss-rate``).

        ``priority`` > 0 marks a warmup's request (the server: one carrying ``X-Warmup-Priority``, or a
        ``/cache/preload`` line): the prefix blocks it computes enter the cache with that priority,
        which a scan-resistant eviction policy (``s3fifo``) honours by keeping them through a scan of
        one-off prompts; ``lru`` ignores it."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def reset_prefix_cache(self) -> int:
        """Empty the prefix cache so that no later prompt hits a block cached before the call
        (vLLM's ``reset_prefix_cache``); returns the number of cached blocks freed. Requests in
        flight keep their own blocks."""
        ...

    def stats(self) -> EngineStats: ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...
