"""Stored values: JSON (never pickle) that round-trips, and any tampered byte is detected."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.target.cache.codec import CorruptValue, StoredValue, decode, encode
from tests.cache.conftest import completion


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(max_size=200),
    entropy=st.none() | st.floats(min_value=0, max_value=10),
    meta=st.dictionaries(
        st.text(max_size=5),
        st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(max_size=5),
        max_size=3,
    ),
    pos=st.integers(min_value=0),
    flip=st.integers(min_value=1, max_value=255),
)
def test_round_trip_and_every_flipped_byte_is_caught(
    text: str, entropy: float | None, meta: dict[str, object], pos: int, flip: int
) -> None:
    value = StoredValue("t:abc", completion(text, mean_entropy=entropy, meta=meta), "hot", 1.5, 99.25)
    raw = encode(value, schema=3)
    parsed = orjson.loads(raw)  # plain JSON
    assert parsed["schema"] == 3 and parsed["body"]["completion"]["text"] == text
    back = decode(raw, "t:abc", 3)
    assert back == value
    i = pos % len(raw)
    tampered = raw[:i] + bytes([raw[i] ^ flip]) + raw[i + 1 :]
    with pytest.raises(CorruptValue):
        decode(tampered, "t:abc", 3)
    with pytest.raises(CorruptValue):
        decode(raw, "t:other", 3)
    with pytest.raises(CorruptValue):
        decode(raw, "t:abc", 4)


def test_unserializable_completion_is_a_value_error() -> None:
    value = StoredValue("t:k", completion("x", meta={"n": 2**70}), "warm", 0.0, 1.0)
    with pytest.raises(ValueError, match="JSON-serializable"):
        encode(value, schema=1)
