"""Unit tests of the OpenAI protocol layer: request models, error mapping, translation, chunk shapes.

These run without a server. The tokenizer is the engine's real preset tokenizer (MiniLM WordPiece).
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from harness.common.openai import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    sse_event,
)
from harness.target.engine.api import RequestMetrics, TokenEvent, TopLogprob
from harness.target.engine.tokenizer import preset_tokenizer
from harness.target.server.errors import APIError, from_validation_error, loc_to_param, retry_after_header
from harness.target.server.formats import (
    PIECE_ENDS,
    TokenLog,
    formatter,
    piece_ends,
    replay_pieces,
    replay_progress,
    split_tokens,
    usage_dict,
)
from harness.target.server.prepare import prepare
from tests.server.sse import sse_payloads, typed_chunk


@pytest.fixture(scope="module")
def tok():
    return preset_tokenizer()


# Bodies as the named clients send them (field sets taken from each tool's request builder).
OPENAI_PYTHON_CHAT = {
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say hi"}]},
    ],
    "model": "tiny",
    "max_completion_tokens": 8,
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0,
    "seed": 7,
    "user": "u-1",
    "n": 1,
}
VLLM_BENCH_COMPLETIONS = {
    "model": "tiny",
    "prompt": "hello world",
    "temperature": 0.0,
    "repetition_penalty": 1.0,
    "max_tokens": 16,
    "logprobs": None,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": False,
}
GUIDELLM_COMPLETIONS = {
    "model": "tiny",
    "prompt": "hello",
    "max_tokens": 4,
    "stop": None,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}
GENAI_PERF_CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 10,
    "min_tokens": 10,
    "ignore_eos": True,
    "stream": True,
}


@pytest.mark.parametrize(
    ("cls", "body"),
    [
        (ChatCompletionRequest, OPENAI_PYTHON_CHAT),
        (CompletionRequest, VLLM_BENCH_COMPLETIONS),
        (CompletionRequest, GUIDELLM_COMPLETIONS),
        (ChatCompletionRequest, GENAI_PERF_CHAT),
    ],
)
def test_client_bodies_validate_and_prepare(cls, body, tok):
    req = cls.model_validate(body)
    prep = prepare(req, tokenizer=tok, model_name="tiny", max_model_len=512, default_max_tokens=32)
    assert prep.stream is True
    assert len(prep.prompt_ids) > 0
    want = body.get("max_completion_tokens") or body.get("max_tokens")
    assert prep.params.max_tokens == want


def test_unknown_field_is_named():
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": "x", "max_tokns": 3})
    err = from_validation_error(info.value)
    assert err.status == 400
    assert err.param == "max_tokns"
    assert "max_tokns" in err.message
    body = ErrorResponse.model_validate(err.body())
    assert body.error.param == "max_tokns"


def test_nested_bad_field_path():
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "a"}, {"role": "robot"}]}
        )
    err = from_validation_error(info.value)
    assert err.param == "messages[1].role"


def test_loc_to_param_drops_union_branches():
    assert (
        loc_to_param(("messages", 0, "content", "list[ContentPart]", 2, "type"))
        == "messages[0].content[2].type"
    )
    assert loc_to_param(("prompt", "str")) == "prompt"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
        ({"prompt": "x", "max_tokens": 8, "min_tokens": 9}, "min_tokens"),
        ({"prompt": "x", "logit_bias": {"five": 1.0}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"30522": 1.0}}, "logit_bias"),  # the preset's vocab is 30522
        ({"prompt": "x", "logit_bias": {"-1": 1.0}}, "logit_bias"),
    ],
)
def test_unsupported_values_are_400_naming_the_param(body, param, tok):
    req = CompletionRequest.model_validate(body)
    with pytest.raises(APIError) as info:
        prepare(req, tokenizer=tok, model_name="tiny", max_model_len=512, default_max_tokens=16)
    assert info.value.status == 400
    assert info.value.param == param


def test_image_part_refused(tok):
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    )
    with pytest.raises(APIError) as info:
        prepare(req, tokenizer=tok, model_name="tiny", max_model_len=512, default_max_tokens=16)
    assert info.value.param == "messages[0].content[0].type"


def test_context_length(tok):
    words = "alpha beta gamma delta " * 40
    n_prompt = len(tok.encode(words))
    req = CompletionRequest.model_validate({"prompt": words, "max_tokens": 10})
    # fits exactly
    prep = prepare(req, tokenizer=tok, model_name="m", max_model_len=n_prompt + 10, default_max_tokens=16)
    assert prep.params.max_tokens == 10
    with pytest.raises(APIError) as info:
        prepare(req, tokenizer=tok, model_name="m", max_model_len=n_prompt + 9, default_max_tokens=16)
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"
    # no max_tokens: the default is capped by the room left
    req2 = CompletionRequest.model_validate({"prompt": words})
    prep2 = prepare(req2, tokenizer=tok, model_name="m", max_model_len=n_prompt + 5, default_max_tokens=16)
    assert prep2.params.max_tokens == 5


def test_token_id_prompt_and_sampling_translation(tok):
    req = CompletionRequest.model_validate(
        {"prompt": [[101, 2023, 2003]], "temperature": 0.5, "top_k": -1, "top_p": 0.9, "stop": "x", "seed": 3}
    )
    prep = prepare(req, tokenizer=tok, model_name="m", max_model_len=64, default_max_tokens=4)
    assert prep.prompt_ids == [101, 2023, 2003]
    assert prep.cache_body["prompt"] == [101, 2023, 2003]
    p = prep.params
    assert (p.temperature, p.top_k, p.top_p, p.stop, p.seed) == (0.5, 0, 0.9, ("x",), 3)


def test_min_tokens_is_a_real_floor(tok):
    """min_tokens is passed on as it is (it used to be mapped to ignore_eos when it equalled max_tokens)."""
    req = ChatCompletionRequest.model_validate(GENAI_PERF_CHAT | {"ignore_eos": False})
    prep = prepare(req, tokenizer=tok, model_name="m", max_model_len=512, default_max_tokens=4)
    assert (prep.params.min_tokens, prep.params.max_tokens, prep.params.ignore_eos) == (10, 10, False)
    assert prep.cache_body["min_tokens"] == 10
    req2 = CompletionRequest.model_validate({"prompt": "x", "max_tokens": 8, "min_tokens": 3})
    prep2 = prepare(req2, tokenizer=tok, model_name="m", max_model_len=512, default_max_tokens=4)
    assert prep2.params.min_tokens == 3
    # Without max_tokens the floor is checked against the default.
    req3 = CompletionRequest.model_validate({"prompt": "x", "min_tokens": 5})
    with pytest.raises(APIError) as info:
        prepare(req3, tokenizer=tok, model_name="m", max_model_len=512, default_max_tokens=4)
    assert info.value.param == "min_tokens"


def test_sampling_parameters_reach_the_engine_and_the_cache_key(tok):
    body = {
        "prompt": "x",
        "max_tokens": 6,
        "temperature": 0.7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "repetition_penalty": 1.2,
        "min_p": 0.05,
        "logit_bias": {"2023": 250, "101": -3.5, "2003": -1000},
        "logprobs": 5,
    }
    prep = prepare(
        CompletionRequest.model_validate(body),
        tokenizer=tok,
        model_name="m",
        max_model_len=64,
        default_max_tokens=4,
    )
    p = prep.params
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p) == (0.5, -0.25, 1.2, 0.05)
    # Sorted by id and clamped to ±100, as vLLM does.
    assert p.logit_bias == ((101, -3.5), (2003, -100.0), (2023, 100.0))
    assert (p.logprobs, p.top_logprobs) == (True, 5)
    assert not prep.cacheable  # logprobs cannot be replayed from the cache
    cb = prep.cache_body
    assert (cb["presence_penalty"], cb["repetition_penalty"], cb["min_p"]) == (0.5, 1.2, 0.05)
    assert cb["logit_bias"] == {"101": -3.5, "2003": -100.0, "2023": 100.0}
    # A request without the new fields keys as before: no logit_bias / min_tokens in the body.
    plain = prepare(
        CompletionRequest.model_validate({"prompt": "x", "max_tokens": 6}),
        tokenizer=tok,
        model_name="m",
        max_model_len=64,
        default_max_tokens=4,
    )
    assert "logit_bias" not in plain.cache_body and "min_tokens" not in plain.cache_body
    assert plain.params.top_logprobs == 0 and not plain.params.logprobs


def test_chat_top_logprobs(tok):
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    prep = prepare(
        ChatCompletionRequest.model_validate(base | {"logprobs": True, "top_logprobs": 20}),
        tokenizer=tok,
        model_name="m",
        max_model_len=64,
        default_max_tokens=4,
    )
    assert (prep.params.logprobs, prep.params.top_logprobs) == (True, 20)
    with pytest.raises(APIError) as info:
        prepare(
            ChatCompletionRequest.model_validate(base | {"top_logprobs": 3}),
            tokenizer=tok,
            model_name="m",
            max_model_len=64,
            default_max_tokens=4,
        )
    assert info.value.param == "top_logprobs"
    with pytest.raises(ValidationError):  # OpenAI's and vLLM's limit
        ChatCompletionRequest.model_validate(base | {"logprobs": True, "top_logprobs": 21})


@pytest.mark.parametrize(
    "text",
    ["hello world, this is a test", "unbelievably tokenized words", "Mixed CASE Text!", " lead 部部 space"],
)
def test_split_tokens_one_piece_per_token(tok, text):
    pieces = split_tokens(tok, text)
    assert "".join(pieces) == text
    # one piece per token the engine would have produced (the tokenizer is the judge)
    assert len(pieces) == len(tok.encode(text))


def test_split_tokens_exact_even_when_the_tokenizer_normalizes(tok):
    text = "Crème brûlée at the café, naïvely"  # the uncased WordPiece tokenizer strips accents
    assert tok.decode(tok.encode(text)) != text
    pieces = split_tokens(tok, text)
    assert "".join(pieces) == text
    assert 1 < len(pieces) <= len(tok.encode(text))
    assert split_tokens(tok, "") == []


def test_split_tokens_never_more_pieces_than_the_completion_had_tokens(tok):
    text = "unbelievably tokenized words and more words"
    pieces = split_tokens(tok, text)
    assert len(pieces) > 3
    capped = split_tokens(tok, text, max_pieces=3)
    assert len(capped) == 3 and "".join(capped) == text and all(capped)
    assert split_tokens(tok, text, max_pieces=len(pieces) + 5) == pieces


def test_replay_pieces_are_the_stored_ones_and_bad_ends_are_not_trusted(tok):
    text = "unbelievably tokenized words"
    engine = ["unbeliev", "ably", " token", "ized", " words"]  # not how the tokenizer would split it
    meta = {PIECE_ENDS: piece_ends(["", *engine])}  # an empty piece (a held byte) carries no end
    assert meta[PIECE_ENDS] == [8, 12, 18, 22, 28]
    assert replay_pieces(tok, text, 5, meta) == engine
    resplit = split_tokens(tok, text, 5)
    for bad in ([8, 12, 18, 22], [8, 8, 18, 22, 28], [8, 12, "18", 22, 28], [12, 8, 18, 22, 28], "8,28", []):
        assert replay_pieces(tok, text, 5, {PIECE_ENDS: bad}) == resplit, bad
    # more ends than the completion had tokens: not this entry's pieces
    assert replay_pieces(tok, text, 4, meta) == split_tokens(tok, text, 4)
    assert replay_pieces(tok, text, 5, {}) == resplit  # an entry preloaded with its text


def test_chunk_shapes_parse_as_openai_models():
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    comp = formatter("completions", "abc", 1, "m", include_usage=True)
    log = TokenLog(["hi"], [-0.5], [0])
    c = CompletionChunk.model_validate(comp.delta("hi", log))
    assert c.choices[0].text == "hi" and c.usage is None
    assert c.choices[0].logprobs is not None and c.choices[0].logprobs.token_logprobs == [-0.5]
    u = CompletionChunk.model_validate(comp.usage_chunk(usage))
    assert u.choices == [] and u.usage is not None and u.usage.total_tokens == 5
    CompletionResponse.model_validate(comp.response("hi", "stop", None, usage))

    chat = formatter("chat.completions", "abc", 1, "m", include_usage=False)
    first = ChatCompletionChunk.model_validate(chat.start_chunks(None)[0])
    assert first.choices[0].delta.role == "assistant"
    d = chat.delta("yo", None)
    assert "usage" not in d  # without include_usage the field is absent, as OpenAI does
    assert ChatCompletionChunk.model_validate(d).choices[0].delta.content == "yo"
    fin = ChatCompletionChunk.model_validate(chat.finish("length"))
    assert fin.choices[0].finish_reason == "length"
    r = ChatCompletionResponse.model_validate(chat.response("yo", "stop", None, usage))
    assert r.choices[0].message.content == "yo" and r.id.startswith("chatcmpl-")


def test_sse_framing_roundtrip():
    obj = {"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": []}
    framed = sse_event(obj) + b"data: [DONE]\n\n"
    lines = framed.decode().split("\n")
    payloads = list(sse_payloads(lines))
    assert payloads == [json.dumps(obj, separators=(",", ":")), "[DONE]"]
    assert typed_chunk(payloads[0]).id == "x"  # the load stage's parser unframes what the server frames


def test_retry_after_is_whole_seconds():
    assert retry_after_header(0.2) == {"Retry-After": "1"}
    assert retry_after_header(2.5) == {"Retry-After": "3"}


def _log_with_alternatives() -> TokenLog:
    log = TokenLog()
    ev = TokenEvent(
        "r", 7, " hi", logprob=-0.5, top_logprobs=[TopLogprob(7, " hi", -0.5), TopLogprob(9, " yo", -1.5)]
    )
    step = log.add(ev, 0)
    assert step.tokens == [" hi"] and step.top == [ev.top_logprobs]
    # A sampled token that is not among its alternatives.
    log.add(TokenEvent("r", 8, " there", logprob=-3.0, top_logprobs=[TopLogprob(3, "!", -0.1)]), 3)
    return log


def test_top_logprobs_shapes_completions():
    comp = formatter("completions", "abc", 1, "m", include_usage=False)
    log = _log_with_alternatives()
    body = comp.response(
        " hi there", "length", log, {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    )
    lp = CompletionResponse.model_validate(body).choices[0].logprobs
    assert lp is not None
    assert lp.tokens == [" hi", " there"] and lp.token_logprobs == [-0.5, -3.0] and lp.text_offset == [0, 3]
    # The alternatives plus the sampled token (logprobs + 1 entries when it is not among them).
    assert lp.top_logprobs == [{" hi": -0.5, " yo": -1.5}, {"!": -0.1, " there": -3.0}]
    chunk = CompletionChunk.model_validate(comp.delta(" hi", TokenLog([" hi"], [-0.5], [0])))
    assert chunk.choices[0].logprobs is not None
    assert chunk.choices[0].logprobs.top_logprobs == [{" hi": -0.5}]  # logprobs=0: the sampled token


def test_top_logprobs_shapes_chat():
    chat = formatter("chat.completions", "abc", 1, "m", include_usage=False)
    log = _log_with_alternatives()
    body = chat.response(
        " hi there", "stop", log, {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    )
    content = ChatCompletionResponse.model_validate(body).choices[0].logprobs.content
    assert content is not None and [c.token for c in content] == [" hi", " there"]
    assert [(t.token, t.logprob, t.bytes) for t in content[0].top_logprobs] == [
        (" hi", -0.5, list(b" hi")),
        (" yo", -1.5, list(b" yo")),
    ]
    assert [t.token for t in content[1].top_logprobs] == ["!"]  # exactly the top ones, as OpenAI
    chunk = ChatCompletionChunk.model_validate(chat.delta(" hi", TokenLog([" hi"], [-0.5], [0])))
    assert chunk.choices[0].logprobs is not None and chunk.choices[0].logprobs.content is not None
    assert chunk.choices[0].logprobs.content[0].top_logprobs == []  # top_logprobs=0


@pytest.mark.parametrize("endpoint", ["completions", "chat.completions"])
def test_continuous_usage_on_every_chunk(endpoint):
    fmt = formatter(endpoint, "abc", 1, "m", include_usage=True, continuous_usage=True)
    chunks = [*fmt.start_chunks("echo", (5, 0)), fmt.delta("a", None, (5, 1)), fmt.finish("stop", (5, 2))]
    parsed = [typed_chunk(json.dumps(c)) for c in chunks]
    got = [(c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) for c in parsed]
    assert got == [(5, 0, 5), (5, 1, 6), (5, 2, 7)]
    plain = formatter(endpoint, "abc", 1, "m", include_usage=True)
    assert plain.delta("a", None, (5, 1))["usage"] is None  # counts ignored without continuous usage
    assert "usage" not in formatter(endpoint, "abc", 1, "m", include_usage=False).delta("a", None, (5, 1))


def test_continuous_usage_request_flag(tok):
    body = {
        "prompt": "x",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
    }
    prep = prepare(
        CompletionRequest.model_validate(body),
        tokenizer=tok,
        model_name="m",
        max_model_len=64,
        default_max_tokens=4,
    )
    assert prep.continuous_usage and not prep.include_usage
    body["stream"] = False  # only streams have chunks
    prep = prepare(
        CompletionRequest.model_validate(body),
        tokenizer=tok,
        model_name="m",
        max_model_len=64,
        default_max_tokens=4,
    )
    assert not prep.continuous_usage


def test_replay_progress_spreads_the_stored_count():
    assert replay_progress(4, 4) == [1, 2, 3, 4]
    assert replay_progress(3, 7) == [2, 5, 7]
    p = replay_progress(7, 3)
    assert p[-1] == 3 and p == sorted(p)
    assert replay_progress(0, 5) == []


def test_usage_mean_entropy_from_engine_or_cache():
    common = dict(
        prompt_tokens=3,
        completion_tokens=2,
        cached_tokens=0,
        cache_status="MISS",
        ttft_ms=1.0,
        tpot_ms=1.0,
        e2e_ms=2.0,
        device="cpu",
    )
    m = RequestMetrics(prompt_tokens=3, output_tokens=2, mean_entropy=1.25)
    assert usage_dict(metrics=m, **common)["harness"]["mean_entropy"] == 1.25
    assert usage_dict(metrics=None, mean_entropy=0.5, **common)["harness"]["mean_entropy"] == 0.5
    assert usage_dict(metrics=None, **common)["harness"]["mean_entropy"] is None


def test_usage_harness_fields_are_the_wire_types_and_the_engine_measures_each() -> None:
    """``usage.harness`` is built from one field list (HarnessUsage's): the engine's RequestMetrics
    has every one of them, and what the server sends validates as the wire type, hit or miss."""
    from dataclasses import fields

    from harness.common.openai import HarnessUsage
    from harness.target.engine.api import RequestMetrics
    from harness.target.server.formats import ENGINE_USAGE_FIELDS, usage_dict

    assert set(ENGINE_USAGE_FIELDS) <= {f.name for f in fields(RequestMetrics)}
    m = RequestMetrics(prefill_kv_bytes=4096, ttft_ms=12.0, device="cuda", mean_entropy=1.5)
    miss = usage_dict(prompt_tokens=3, completion_tokens=2, cached_tokens=0, metrics=m, cache_status="MISS",
                      ttft_ms=0.0, tpot_ms=0.0, e2e_ms=0.0, device="cpu")  # fmt: skip
    hit = usage_dict(prompt_tokens=3, completion_tokens=2, cached_tokens=3, metrics=None,
                     cache_status="HIT-L1", ttft_ms=1.0, tpot_ms=0.5, e2e_ms=2.0, device="cpu",
                     mean_entropy=0.7)  # fmt: skip
    assert HarnessUsage.model_validate(miss["harness"]) == HarnessUsage(
        prefill_kv_bytes=4096, ttft_ms=12.0, device="cuda", mean_entropy=1.5, cache="MISS"
    )
    # A hit allocated no KV at all: its 0 is exact, so it is as measured as an engine run's count.
    assert HarnessUsage.model_validate(hit["harness"]) == HarnessUsage(
        ttft_ms=1.0, tpot_ms=0.5, e2e_ms=2.0, mean_entropy=0.7, cache="HIT-L1", prefill_kv_measured=True
    )
