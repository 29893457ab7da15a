"""CorpusRecord.to_request: the body the load stage sends keeps every field of the record."""

from __future__ import annotations

from harness.common.openai import ChatCompletionRequest, CompletionRequest
from harness.corpus.model import CorpusRecord, Provenance


def make(**kw: object) -> CorpusRecord:
    base: dict[str, object] = {
        "id": "r1",
        "max_tokens": 200,
        "expected_output_tokens": 50,
        "lang": "en",
        "domain": "travel",
        "intent": "book_flight",
        "sampling": {"temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["\n\n", "END"]},
        "provenance": Provenance(seed=0, candidate=0, template="t.j2", template_sha256="0" * 64),
    }
    base.update(kw)
    return CorpusRecord.model_validate(base)


def test_chat_record_keeps_sampling_and_asks_for_usage() -> None:
    rec = make(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    endpoint, body = rec.to_request(model="m", max_tokens_cap=64)
    assert endpoint == "chat.completions"
    req = ChatCompletionRequest.model_validate(body)  # what our server (strict) would accept
    assert [m.role for m in req.messages] == ["system", "user"]
    assert (req.model, req.max_tokens, req.temperature, req.top_p, req.seed) == ("m", 64, 0.2, 0.9, 7)
    assert req.stop == ["\n\n", "END"]
    assert req.stream and req.stream_options is not None and req.stream_options.include_usage


def test_prompt_record_and_forced_api() -> None:
    rec = make(prompt="hello", sampling={"temperature": 0.0})
    endpoint, body = rec.to_request(stream=False)
    assert endpoint == "completions" and "stop" not in body and "stream" not in body
    assert CompletionRequest.model_validate(body).max_tokens == 200
    endpoint, body = rec.to_request("chat.completions")
    assert endpoint == "chat.completions" and body["messages"] == [{"role": "user", "content": "hello"}]
    chat = make(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    endpoint, body = chat.to_request("completions")
    assert endpoint == "completions" and body["prompt"] == "a\nb"
