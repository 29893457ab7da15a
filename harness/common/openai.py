"""OpenAI-compatible protocol models shared by the server (requests in) and the load stage (responses in).

Request models are strict (``extra="forbid"``): an unknown or misspelt field is an error that names
it, not a silently ignored knob. They cover what real clients and benchmark tools send (openai-python,
vLLM ``bench serve``, guidellm, genai-perf, LLMPerf), including vLLM's sampling extras (``top_k``,
``ignore_eos``, ``min_tokens`` …). Whether a *value* is supported (``n > 1``) is the server's
decision, so a client gets "not supported" rather than "unknown field". ``tools`` / ``tool_choice``
are always accepted (a load test of an agent's traffic must not be refused); what a model does with
them is its chat template's (``harness.target.server.chat_output``).

Response and chunk models are lenient (``extra="allow"``): the load stage parses responses of other
servers too (vLLM, SGLang, OpenAI itself), which add fields of their own. ``usage.harness`` is our
extension: per-request engine measurements (prefill time and memory, TTFT, TPOT, mean output entropy).

The SSE helpers at the end frame OpenAI streams (``data: {...}\\n\\n`` … ``data: [DONE]``); the load
stage's :mod:`harness.load.stream` unframes them (the one parser, tests included).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from harness.common.model import StrictModel

Endpoint = Literal["completions", "chat.completions"]
"""The two generation endpoints, named by the ``object`` prefix of their responses."""

RESET_PREFIX_CACHE_PATH = "/reset_prefix_cache"
"""``POST`` here empties the engine's KV prefix cache: vLLM's admin endpoint (its dev mode), which
``harness serve`` answers too, so one client call resets either server."""

COMPLETED_FINISH_REASONS: frozenset[str] = frozenset({"stop", "length"})
"""``finish_reason`` values of a generation that ran to its end (a stop condition, or
``max_tokens``). Anything else (``abort``, ``error``) is incomplete: the server reports it as an
error and the response cache never stores it."""

# --------------------------------------------------------------------------------------------------
# requests


class StreamOptions(StrictModel):
    include_usage: bool | None = None
    """Send one last chunk with ``usage`` and empty ``choices`` before ``[DONE]``."""
    continuous_usage_stats: bool | None = None
    """vLLM extension: ``usage`` (prompt, completion so far, total) on every chunk. vLLM honours it
    only together with ``include_usage``; we honour it alone too."""
    include_obfuscation: bool | None = None
    """OpenAI extension (padding against side channels); accepted and ignored."""


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None


class ContentPart(StrictModel):
    """One part of a chat message's content; only ``text`` parts can be served by a text model."""

    type: Literal["text", "image_url", "input_audio", "file", "refusal"]
    text: str | None = None
    image_url: dict[str, Any] | None = None
    input_audio: dict[str, Any] | None = None
    file: dict[str, Any] | None = None
    refusal: str | None = None


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    reasoning_content: str | None = None


class _SamplingFields(StrictModel):
    """Fields both endpoints accept."""

    model: str | None = None
    """Optional as in vLLM; absent means the served model."""
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    response_format: ResponseFormat | None = None
    echo: bool | None = None
    """Completions: prepend the prompt to the output (vLLM also accepts it on chat)."""
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    request_id: str | None = None
    """vLLM extension; the server uses X-Request-Id when set, else this."""
    priority: int | None = None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``.

    ``prompt`` is a string, a list holding one string, a list of token ids, or a list holding one list
    of token ids (batched prompts are refused by the server: one request, one choice).
    """

    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    add_special_tokens: bool | None = None


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    verbosity: str | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# --------------------------------------------------------------------------------------------------
# responses


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class HarnessUsage(_Lenient):
    """Our extension of ``usage``: what the engine measured for this request.

    ``prefill_peak_bytes`` is measured on CUDA (``peak_measured=True``) and an analytic estimate on
    CPU. ``prefill_kv_bytes`` is the KV the engine's block manager allocated for this request's
    prefill, counted where it hands out blocks (``prefill_kv_measured=True``; false from a server
    that computes it from token counts, or does not say). On a response-cache hit no engine ran:
    the prefill fields are 0 (``prefill_kv_measured`` true: nothing was allocated, exactly) and
    ``cache`` says which tier answered; ``ttft_ms`` / ``tpot_ms`` are then the server's own timings
    of the replayed stream.

    ``mean_entropy`` is the mean over the generated tokens of the entropy (nats) of the model's
    next-token distribution at each step (raw logits: temperature 1, before bias, penalties and
    filters, so it measures the model's uncertainty, not the sampling settings; greedy requests
    have one too). On a cache hit it is the cached completion's; None when unknown (an entry
    stored without it, or a server that does not send it).
    """

    prefill_ms: float = 0.0
    prefill_kv_bytes: int = 0
    prefill_peak_bytes: int = 0
    peak_measured: bool = False
    prefill_kv_measured: bool = False
    device: str = "cpu"
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    queued_ms: float = 0.0
    e2e_ms: float = 0.0
    preemptions: int = 0
    cache: str = "BYPASS"
    mean_entropy: float | None = None


class PromptTokensDetails(_Lenient):
    cached_tokens: int = 0


class Usage(_Lenient):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    harness: HarnessUsage | None = None


class CompletionLogprobs(_Lenient):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Lenient):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(_Lenient):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


CompletionChunk = CompletionResponse
"""A streamed completions chunk has the same shape as the full response (``object`` included)."""


class TopLogprob(_Lenient):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(_Lenient):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(_Lenient):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(_Lenient):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    """Thinking, for a model whose template marks it (vLLM's newer servers name it ``reasoning``)."""
    tool_calls: list[dict[str, Any]] | None = None
    """``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments a JSON string."""


class ChatChoice(_Lenient):
    index: int = 0
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(_Lenient):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ChatDelta(_Lenient):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """Fragments: ``{"index", "id", "type", "function": {"name", "arguments"}}`` when a call starts,
    ``{"index", "function": {"arguments"}}`` after (the load stage assembles them)."""


class ChatChunkChoice(_Lenient):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Lenient):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(_Lenient):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "harness"
    max_model_len: int | None = None


class ModelList(_Lenient):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(_Lenient):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(_Lenient):
    """``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""

    error: ErrorBody


# --------------------------------------------------------------------------------------------------
# server-sent events

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(obj: Any) -> bytes:
    """Frame one JSON object as an SSE ``data:`` event."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"
