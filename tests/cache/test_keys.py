"""Canonical keys: formatting-only variants share a key, semantic changes never do (hypothesis)."""

from __future__ import annotations

import json
import random
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.common.errors import InputError
from harness.target.cache.keys import KeyBuilder, normalize_text, tenant_slug
from harness.target.cache.settings import CacheSettings

KB = KeyBuilder(CacheSettings(redis_url=None))

WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789.,?!'-é", min_size=1, max_size=8)
SEP = st.sampled_from([" ", "  ", "\t", "\n", "\r\n", " \n\t ", "\u00a0", "\n\n"])
PAD = st.sampled_from(["", " ", "\n", "\r\n  ", "\t"])


def key(body: dict[str, Any], tenant: str = "t", endpoint: str = "chat.completions", **kw: Any) -> str:
    return KB.normalize(endpoint, body, tenant, **kw).key


def chat(text: str, system: str | None = "You are terse.", **params: Any) -> dict[str, Any]:
    msgs = [{"role": "system", "content": system}] if system is not None else []
    body: dict[str, Any] = {"model": "m", "messages": [*msgs, {"role": "user", "content": text}]}
    body.update(params)
    return body


def shuffled(d: dict[str, Any], seed: int) -> dict[str, Any]:
    items = list(d.items())
    random.Random(seed).shuffle(items)
    return dict(items)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(WORD, min_size=1, max_size=12), data=st.data())
def test_whitespace_unicode_and_key_order_variants_share_a_key(words: list[str], data: st.DataObject) -> None:
    plain = " ".join(words)
    seps = [data.draw(SEP) for _ in words[1:]]
    messy = data.draw(PAD) + words[0] + "".join(s + w for s, w in zip(seps, words[1:], strict=True))
    messy += data.draw(PAD)
    messy = unicodedata.normalize("NFD", messy)  # é as e + combining accent
    base = chat(plain, temperature=0.0, max_tokens=32)
    variant = shuffled(chat(messy, max_tokens=32, temperature=0, stream=True, request_id="r-123"), 7)
    variant["messages"] = [shuffled(m, 3) for m in variant["messages"]]
    assert key(base) == key(variant)


@settings(max_examples=100, deadline=None)
@given(k=st.integers(min_value=0, max_value=199), delta=st.floats(min_value=-0.0049, max_value=0.0049))
def test_temperature_is_rounded_to_two_decimals(k: int, delta: float) -> None:
    exact = k / 100
    near = max(0.0, exact + delta) if k else abs(delta)
    assume_same = round(near * 100) == k  # the grid point near is closest to, independently
    if assume_same:
        assert key(chat("hi", temperature=near, seed=1)) == key(chat("hi", temperature=exact, seed=1))
    assert key(chat("hi", temperature=(k + 1) / 100, seed=1)) != key(chat("hi", temperature=exact, seed=1))


@settings(max_examples=100, deadline=None)
@given(a=st.integers(min_value=0, max_value=10**6), b=st.integers(min_value=0, max_value=10**6))
def test_a_changed_number_changes_the_key(a: int, b: int) -> None:
    same = a == b
    assert (key(chat(f"What is {a} plus 3?")) == key(chat(f"What is {b} plus 3?"))) is same


@settings(max_examples=60, deadline=None)
@given(words=st.lists(WORD, min_size=2, max_size=8), pos=st.integers(min_value=0, max_value=7))
def test_inserting_a_negation_changes_the_key(words: list[str], pos: int) -> None:
    neg = [*words[: pos % len(words)], "not", *words[pos % len(words) :]]
    assert key(chat(" ".join(words))) != key(chat(" ".join(neg)))


def test_semantic_and_identity_fields_split_the_key() -> None:
    base = chat("Summarize the report.", temperature=0)
    k0 = key(base)
    assert key(chat("Summarize the report.", system="You are verbose.", temperature=0)) != k0
    assert key({**base, "model": "other"}) != k0
    assert key(base, model_revision="rev2") != k0
    assert key(base, tenant="u") != k0
    assert key({**base, "max_tokens": 17}) != key({**base, "max_tokens": 16})
    assert key({**base, "seed": 1}) != key({**base, "seed": 2})
    assert key({**base, "top_p": 0.9}) != k0
    assert key({**base, "response_format": {"type": "json_object"}}) != k0
    assert KB.normalize("completions", {"model": "m", "prompt": "x"}, "t").key != key(chat("x", system=None))
    v2 = KeyBuilder(CacheSettings(redis_url=None, schema_version=2))
    assert v2.normalize("chat.completions", base, "t").key != k0


def test_defaults_and_dropped_fields_do_not_split_the_key() -> None:
    base = chat("Hello", temperature=0)
    explicit = {**base, "top_p": 1.0, "n": 1, "presence_penalty": 0, "user": "u-9", "timestamp": 17}
    assert key(explicit) == key(base)
    assert key({**base, "stop": ["b", "a", "a"]}) == key({**base, "stop": ["a", "b"]})
    assert key({**base, "stop": "a"}) == key({**base, "stop": ["a"]})
    assert key({**base, "max_completion_tokens": 5}) == key({**base, "max_tokens": 5})


def test_all_messages_count_not_only_the_last() -> None:
    def convo(first: str) -> dict[str, Any]:
        return {
            "model": "m",
            "messages": [
                {"role": "user", "content": first},
                {"role": "assistant", "content": "Sure."},
                {"role": "user", "content": "And then?"},
            ],
        }

    assert key(convo("Tell me about cats.")) != key(convo("Tell me about dogs."))


def test_tool_arguments_and_call_ids_are_canonical() -> None:
    def convo(args: str, call_id: str, tools_order: int) -> dict[str, Any]:
        tools = [
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"parameters": {"type": "object"}, "name": "b"}},
        ]
        return {
            "model": "m",
            "tools": tools if tools_order == 0 else tools[::-1],
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": call_id, "type": "function", "function": {"name": "a", "arguments": args}}
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": '{"temp": 21, "unit": "C"}'},
            ],
        }

    k = key(convo('{"city": "Oslo", "days": [1, 2]}', "call_abc", 0))
    assert key(convo('{ "days":[1,2],\n "city":"Oslo" }', "call_xyz", 1)) == k
    assert key(convo('{"city": "Bergen", "days": [1, 2]}', "call_abc", 0)) != k
    assert key(convo('{"city": "Oslo", "days": [2, 1]}', "call_abc", 0)) != k


def test_json_content_key_order_is_normalized() -> None:
    a = json.dumps({"b": 1, "a": {"y": 2, "x": [3, 4]}})
    b = '{"a": {"x": [3,4], "y": 2},\n  "b": 1}'
    assert key(chat(a)) == key(chat(b))
    assert key(chat(a)) != key(chat(a.replace("3", "5")))


FENCED = "Fix this:\n```python\n{code}\n```\nplease"


def test_code_fences_keep_semantic_whitespace() -> None:
    code = "def f(x):\n    if x:\n        return 1\n    return 2"
    same = "\n".join("  " + line + "   " for line in code.split("\n")).replace("\n", "\r\n")  # indented block
    flattened = "def f(x):\n    if x:\n        return 1\n        return 2"  # a semantic change
    assert key(chat(FENCED.format(code=code))) == key(chat("Fix  this:\n\n" + FENCED.format(code=same)[10:]))
    assert key(chat(FENCED.format(code=code))) != key(chat(FENCED.format(code=flattened)))
    tabs = "all:\n\tcc main.c"
    spaces = "all:\n    cc main.c"  # a Makefile needs the tab
    assert key(chat(FENCED.format(code=tabs))) != key(chat(FENCED.format(code=spaces)))
    assert "`a  b`" in normalize_text("use   `a  b`   here", "collapse")


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.text(alphabet="abc xyz():=0123", min_size=0, max_size=12), min_size=1, max_size=6),
    indent=st.sampled_from(["", "  ", "    ", "\t"]),
)
def test_completion_prompts_keep_layout_but_not_line_endings(lines: list[str], indent: str) -> None:
    code = "\n".join(lines)
    variant = "\n".join(indent + line + "  " for line in lines).replace("\n", "\r\n") + "\n\n"
    prompt_key = KB.normalize("completions", {"model": "m", "prompt": code}, "t").key
    if code.strip():
        assert KB.normalize("completions", {"model": "m", "prompt": variant}, "t").key == prompt_key
    reindented = "\n".join(("  " if i % 2 else "") + line for i, line in enumerate(lines))
    if {i % 2 for i, x in enumerate(lines) if x.strip()} == {0, 1}:
        # Relative indentation changed: a different program, a different key.
        assert KB.normalize("completions", {"model": "m", "prompt": reindented}, "t").key != prompt_key


def test_sampled_flag_follows_temperature_and_seed() -> None:
    assert KB.normalize("chat.completions", chat("x", temperature=0.7), "t").sampled
    assert not KB.normalize("chat.completions", chat("x", temperature=0.7, seed=3), "t").sampled
    assert not KB.normalize("chat.completions", chat("x", temperature=0.004), "t").sampled  # rounds to 0
    assert KB.normalize("chat.completions", chat("x"), "t").sampled  # OpenAI default temperature is 1


def test_tenant_slugs_are_safe_and_distinct() -> None:
    names = ["a", "a:b", "a/b", "../x", "t~x", "A", "", "ü"]
    slugs = [tenant_slug(n) for n in names]
    assert len(set(slugs)) == len(set(n or "default" for n in names))
    assert all(":" not in s and "/" not in s and s not in {".", ".."} for s in slugs)


@pytest.mark.parametrize(
    ("endpoint", "body", "field"),
    [
        ("chat.completions", {"messages": []}, "messages"),
        ("chat.completions", {"messages": [{"content": "x"}]}, "messages[0].role"),
        ("completions", {"prompt": 5}, "prompt"),
        (
            "chat.completions",
            {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            "temperature",
        ),
        (
            "chat.completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5},
            "max_tokens",
        ),
    ],
)
def test_bad_bodies_name_the_field(endpoint: str, body: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as err:
        KB.normalize(endpoint, body, "t")
    assert err.value.field == field


def test_a_repeated_body_is_keyed_from_memory_and_only_its_own_tenant_and_revision() -> None:
    kb = KeyBuilder(CacheSettings(redis_url=None))
    body = {"model": "m", "prompt": "remember me", "temperature": 0.5, "max_tokens": 8}
    first = kb.normalize("completions", body, "alpha")
    assert kb.normalize("completions", dict(body), "alpha") is first  # same bytes: the memo's answer
    fresh = KeyBuilder(CacheSettings(redis_url=None))
    assert fresh.normalize("completions", body, "alpha") == first  # and what normalizing gives
    # what is not in the body is in the memo's key: never another tenant's, revision's or endpoint's
    assert kb.normalize("completions", body, "beta").key != first.key
    assert kb.normalize("completions", body, "alpha", model_revision="r2").key != first.key
    # a body that normalizes alike but is spelt differently is normalized (and keyed the same)
    variant = {"max_tokens": 8, "temperature": 0.50, "prompt": "remember me  ", "model": "m"}
    assert kb.normalize("completions", variant, "alpha").key == first.key


def test_the_memo_is_bounded_and_skips_long_and_bad_bodies() -> None:
    from harness.target.cache.keys import MEMO_ENTRIES, MEMO_MAX_BODY_BYTES

    kb = KeyBuilder(CacheSettings(redis_url=None))
    for i in range(MEMO_ENTRIES + 10):
        kb.normalize("completions", {"prompt": f"p{i}"}, "t")
    assert len(kb._memo) == MEMO_ENTRIES
    long = {"prompt": "x" * MEMO_MAX_BODY_BYTES}
    assert kb.normalize("completions", long, "t") is not kb.normalize("completions", long, "t")
    with pytest.raises(InputError):  # refused every time, never remembered
        kb.normalize("completions", {"prompt": 5}, "t")
    with pytest.raises(InputError):
        kb.normalize("completions", {1: "not json"}, "t")  # type: ignore[dict-item]
