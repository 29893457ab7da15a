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
    iter_sse_data,
    parse_chunk,
    sse_event,
)
from harness.engine.tokenizer import preset_tokenizer
from harness.server.errors import APIError, from_validation_error, loc_to_param, retry_after_header
from harness.server.protocol import TokenLog, formatter, prepare, split_tokens


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
        ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
        ({"prompt": "x", "logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "x", "max_tokens": 8, "min_tokens": 3}, "min_tokens"),
        ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
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


def test_min_tokens_equal_to_max_means_ignore_eos(tok):
    req = ChatCompletionRequest.model_validate(GENAI_PERF_CHAT | {"ignore_eos": False})
    prep = prepare(req, tokenizer=tok, model_name="m", max_model_len=512, default_max_tokens=4)
    assert prep.params.ignore_eos is True


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
    payloads = list(iter_sse_data(lines))
    assert payloads == [json.dumps(obj, separators=(",", ":")), "[DONE]"]
    assert parse_chunk(payloads[0]) is not None
    assert parse_chunk(payloads[1]) is None


def test_retry_after_is_whole_seconds():
    assert retry_after_header(0.2) == {"Retry-After": "1"}
    assert retry_after_header(2.5) == {"Retry-After": "3"}
