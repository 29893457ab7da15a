"""OpenAI requests in: a validated request turned into what the engine runs.

:func:`prepare` turns a validated request into token ids, :class:`SamplingParams` and the canonical
body the response cache keys on; it refuses (HTTP 400) values the engine cannot honour instead of
silently ignoring them. Sampling parameters are taken over the way vLLM's OpenAI server takes them
(``logit_bias`` clamped to ±100, ``min_tokens`` at most ``max_tokens``, ``top_logprobs`` only with
``logprobs``); the parameter table is in docs/server.md. The responses going out are
:mod:`harness.target.server.formats`'.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from harness.common.openai import ChatCompletionRequest, CompletionRequest, Endpoint
from harness.target.engine.api import SamplingParams, Tokenizer
from harness.target.server.errors import APIError, bad_request, unsupported

# OpenAI documents logit_bias values in [-100, 100]; vLLM clamps to that range rather than refusing.
_MAX_LOGIT_BIAS = 100.0


@dataclass(slots=True)
class Prepared:
    """Everything the handler needs to serve one request."""

    endpoint: Endpoint
    prompt_ids: list[int]
    prompt_text: str
    """The prompt as text (for ``echo``): the string given, or the decoded token ids."""
    params: SamplingParams
    stream: bool
    include_usage: bool
    want_logprobs: bool
    echo: bool
    cache_body: dict[str, Any]
    cacheable: bool
    """False when the answer cannot be replayed from a cache entry (logprobs were asked for)."""
    prompt_fp: str = ""
    """Fingerprint of exactly what is tokenized (see :func:`prompt_fingerprint`)."""
    tokenized: bool = True
    """False while ``prompt_ids`` is still empty (``prepare(..., tokenize=False)``): a cache hit
    whose entry carries the same fingerprint needs no tokenization; :func:`tokenize_prepared`
    finishes the job otherwise."""
    source: Any = None
    """What :func:`tokenize_prepared` tokenizes: the prompt string, or (messages, add_generation_prompt,
    tools)."""
    continuous_usage: bool = False
    """``stream_options.continuous_usage_stats``: ``usage`` on every chunk of the stream."""
    parse_tools: bool = False
    """The request offers tools (``tool_choice`` not ``none``): a call the model writes in its
    template's syntax is returned as ``tool_calls`` (:mod:`harness.target.server.chat_output`)."""


def check_supported(req: CompletionRequest | ChatCompletionRequest) -> None:
    """Refuse values this engine cannot honour, naming the parameter."""
    if req.n not in (None, 1):
        raise unsupported("n", f"n={req.n} is not supported: this server returns exactly one choice (n=1)")
    if req.include_stop_str_in_output:
        raise unsupported("include_stop_str_in_output", "include_stop_str_in_output=true is not supported")
    if req.response_format is not None and req.response_format.type != "text":
        raise unsupported(
            "response_format",
            f"response_format type '{req.response_format.type}' is not supported (only text)",
        )
    if isinstance(req, CompletionRequest):
        if req.best_of not in (None, 1):
            raise unsupported("best_of", f"best_of={req.best_of} is not supported (only 1)")
        if req.suffix:
            raise unsupported("suffix", "suffix (fill-in-the-middle) is not supported")
    else:
        if req.modalities and set(req.modalities) != {"text"}:
            raise unsupported("modalities", "only the text modality is supported")
        if req.echo:
            raise unsupported("echo", "echo is only supported on /v1/completions")


def logit_bias_pairs(bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted (token id, bias) pairs, each bias clamped to ±100 as vLLM does.

    Keys must be token ids written as integers (OpenAI's format: ``{"50256": -100}``) that the
    tokenizer knows; anything else is a 400 naming the key.
    """
    if not bias:
        return ()
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            tid = int(key)
        except ValueError:
            raise bad_request(
                f"logit_bias keys must be token ids (integers), got {key!r}", param="logit_bias"
            ) from None
        if not 0 <= tid < vocab_size:
            raise bad_request(
                f"logit_bias token id {tid} is outside the vocabulary (0..{vocab_size - 1})",
                param="logit_bias",
            )
        out[tid] = out.get(tid, 0.0) + min(_MAX_LOGIT_BIAS, max(-_MAX_LOGIT_BIAS, float(value)))
    return tuple(sorted(out.items()))


def prompt_fingerprint(source: Any) -> str:
    """A 128-bit fingerprint of a text prompt (a string) or a chat (messages, add_generation_prompt,
    and the offered tools when there are any).

    Equal fingerprints mean the same tokenizer input for the same model, so a cached completion
    carrying its prompt's fingerprint and token count (``meta["prompt_fp"]``, ``prompt_tokens``)
    lets a hit report usage without tokenizing. Response-cache keys normalize whitespace; this does
    not, so a differently spaced prompt that hits the same entry is tokenized as before.
    """
    if isinstance(source, str):
        data = b"p\x00" + source.encode("utf-8", "surrogatepass")
    else:
        messages, add_gen, *more = source  # (messages, add_generation_prompt[, tools])
        tools = more[0] if more else None
        # A plain chat keeps the fingerprint it had before tools; tool calls, ids and tools extend it.
        entries: list[Any] = [
            [m["role"], m["content"]] + ([{k: v for k, v in m.items() if k not in ("role", "content")}]
                                         if len(m) > 2 else [])
            for m in messages
        ]  # fmt: skip
        entries.append(bool(add_gen))
        if tools:
            entries.append(tools)
        data = b"m\x00" + orjson.dumps(entries, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def check_context(n_prompt: int, max_tokens: int | None, max_model_len: int, prompt_param: str) -> int:
    """Refuse an empty prompt or one that leaves no room for ``max_tokens``; returns the room left."""
    if not n_prompt:
        raise bad_request("the prompt is empty after tokenization", param=prompt_param)
    room = max_model_len - n_prompt
    if room <= 0 or (max_tokens is not None and max_tokens > room):
        asked = n_prompt + (max_tokens or 1)
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; the request asks for {asked} "
            f"({n_prompt} in the prompt, {max_tokens or 1} to generate). "
            "Shorten the prompt or lower max_tokens.",
            param=prompt_param if room <= 0 else "max_tokens",
            code="context_length_exceeded",
            reason="too_long",
        )
    return room


def tokenize_prepared(prep: Prepared, tokenizer: Tokenizer, max_model_len: int) -> None:
    """Finish a ``prepare(..., tokenize=False)``: tokenize the prompt and check the context length."""
    if prep.tokenized:
        return
    if isinstance(prep.source, str):
        ids = tokenizer.encode(prep.source)
        param = "prompt"
    else:
        messages, add_gen, tools = prep.source
        prep.prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_gen, tools=tools)
        ids = tokenizer.encode(prep.prompt_text)
        param = "messages"
    check_context(len(ids), prep.params.max_tokens, max_model_len, param)
    prep.prompt_ids = ids
    prep.tokenized = True


def _prompt_of(req: CompletionRequest, tokenizer: Tokenizer) -> tuple[list[int], str]:
    p = req.prompt
    if isinstance(p, str):
        return tokenizer.encode(p), p
    if not p:
        raise bad_request("prompt is empty", param="prompt")
    if len(p) != 1 and not isinstance(p[0], int):
        raise unsupported(
            "prompt", f"batched prompts ({len(p)}) are not supported; send one prompt per request"
        )
    first = p[0]
    if isinstance(first, str):
        return tokenizer.encode(first), first
    ids = list(first) if isinstance(first, list) else [int(x) for x in p if isinstance(x, int)]
    if any(i < 0 for i in ids):
        raise bad_request("token ids must be non-negative", param="prompt")
    return ids, tokenizer.decode(ids)


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call as chat templates read it: its arguments an object where they parse as one (the
    Hugging Face template API's shape, which vLLM also hands its templates), else the string."""
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = orjson.loads(fn["arguments"]) if fn["arguments"].strip() else {}
    except orjson.JSONDecodeError:
        return call
    return {**call, "function": {**fn, "arguments": args}}


def chat_tools(req: ChatCompletionRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    """The offered ``tools`` and ``tool_choice``; the legacy ``functions`` / ``function_call`` become
    them (``{"type": "function", "function": …}``)."""
    tools = req.tools
    choice: Any = req.tool_choice
    if not tools and req.functions:
        tools = [{"type": "function", "function": f} for f in req.functions]
        fc = req.function_call
        choice = {"type": "function", "function": fc} if isinstance(fc, dict) else fc
    return (list(tools) if tools else None), choice


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the chat template reads them: ``role`` and ``content`` (text parts joined, other part
    types refused; none is ""), and an assistant's ``tool_calls`` (arguments as objects), a tool
    message's ``tool_call_id``, a ``name`` and ``reasoning_content`` where the message has them."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        content = m.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            texts = []
            for j, part in enumerate(content):
                if part.type != "text":
                    raise unsupported(
                        f"messages[{i}].content[{j}].type",
                        f"content part type '{part.type}' is not supported",
                    )
                texts.append(part.text or "")
            text = "\n".join(texts)
        msg: dict[str, Any] = {"role": m.role, "content": text}
        if m.tool_calls:
            msg["tool_calls"] = [_template_call(c) for c in m.tool_calls]
        if m.function_call:  # the legacy single call
            msg["tool_calls"] = [_template_call({"type": "function", "function": m.function_call})]
        for key in ("tool_call_id", "name", "reasoning_content"):
            value = getattr(m, key)
            if value is not None:
                msg[key] = value
        out.append(msg)
    return out


def prepare(
    req: CompletionRequest | ChatCompletionRequest,
    *,
    tokenizer: Tokenizer,
    model_name: str,
    max_model_len: int,
    default_max_tokens: int,
    tokenize: bool = True,
) -> Prepared:
    """Check, tokenize and translate one request. Raises :class:`APIError` (HTTP 400).

    ``tokenize=False`` (the server with a response cache) defers tokenizing a text prompt or chat
    and the context-length check to :func:`tokenize_prepared`, so a cache hit can skip them. It is
    ignored when the request sets no ``max_tokens``: the default depends on the prompt's length,
    and the cache key on the default.
    """
    check_supported(req)
    endpoint: Endpoint
    body: dict[str, Any] = {"model": model_name}
    source: Any
    ids: list[int] | None
    if isinstance(req, CompletionRequest):
        endpoint = "completions"
        max_tokens = req.max_tokens
        p = req.prompt
        if isinstance(p, str) or (isinstance(p, list) and len(p) == 1 and isinstance(p[0], str)):
            source = p if isinstance(p, str) else p[0]
            prompt_text = source
            lazy = not tokenize and max_tokens is not None
            ids = None if lazy else tokenizer.encode(source)
            body["prompt"] = prompt_text
        else:
            ids, prompt_text = _prompt_of(req, tokenizer)
            source = prompt_text
            # Token-id prompts are keyed by their ids (exact), text prompts by their text.
            text_given = isinstance(req.prompt, str) or isinstance(req.prompt[0], str)
            body["prompt"] = prompt_text if text_given else ids
        prompt_param = "prompt"
        parse_tools = False
        want_logprobs = req.logprobs is not None
        # Legacy completions: logprobs=N asks for the N most likely tokens besides the sampled one.
        top_logprobs = req.logprobs or 0
        echo = bool(req.echo)
    else:
        endpoint = "chat.completions"
        messages = chat_messages(req)
        tools, tool_choice = chat_tools(req)
        add_gen = req.add_generation_prompt is not False and not req.continue_final_message
        source = (messages, add_gen, tools)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if not tokenize and max_tokens is not None:
            prompt_text, ids = "", None
        else:
            prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_gen, tools=tools)
            ids = tokenizer.encode(prompt_text)
        body["messages"] = [m.model_dump(exclude_none=True) for m in req.messages]
        # Tools change the prompt and the answer: they are part of the response cache's key
        # (harness.target.cache.keys sorts them, and keeps tool_choice verbatim).
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
            if req.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = req.parallel_tool_calls
        parse_tools = bool(tools) and tool_choice != "none"
        prompt_param = "messages"
        want_logprobs = bool(req.logprobs)
        top_logprobs = req.top_logprobs or 0
        if top_logprobs and not want_logprobs:
            # OpenAI and vLLM refuse it too: alternatives come only with the sampled token's logprob.
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        echo = False
    if ids is not None:
        room = check_context(len(ids), max_tokens, max_model_len, prompt_param)
        if max_tokens is None:
            max_tokens = min(default_max_tokens, room)
    assert max_tokens is not None  # lazy only with an explicit max_tokens
    min_tokens = req.min_tokens or 0
    if min_tokens > max_tokens:
        raise bad_request(
            f"min_tokens ({min_tokens}) must be less than or equal to max_tokens ({max_tokens})",
            param="min_tokens",
        )
    logit_bias = logit_bias_pairs(req.logit_bias, tokenizer.vocab_size)
    stop: tuple[str, ...] = ()
    if isinstance(req.stop, str):
        stop = (req.stop,) if req.stop else ()
    elif req.stop:
        stop = tuple(s for s in req.stop if s)
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=top_k,
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=logit_bias,
        min_tokens=min_tokens,
        seed=req.seed,
        stop=stop,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=bool(req.ignore_eos),
        logprobs=want_logprobs,
        top_logprobs=top_logprobs if want_logprobs else 0,
    )
    body.update(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        seed=params.seed,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
    )
    # Only when set, so that a request without them keys exactly as before they existed.
    if params.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in params.logit_bias}
    if params.min_tokens:
        body["min_tokens"] = params.min_tokens
    stream = bool(req.stream)
    opts = req.stream_options
    include_usage = bool(stream and opts and opts.include_usage)
    continuous_usage = bool(stream and opts and opts.continuous_usage_stats)
    return Prepared(
        endpoint=endpoint,
        prompt_ids=ids if ids is not None else [],
        prompt_text=prompt_text,
        params=params,
        stream=stream,
        include_usage=include_usage,
        want_logprobs=want_logprobs,
        echo=echo,
        cache_body=body,
        cacheable=not want_logprobs,
        prompt_fp=prompt_fingerprint(source),
        tokenized=ids is not None,
        source=source,
        continuous_usage=continuous_usage,
        parse_tools=parse_tools,
    )
