"""Stored value format: JSON with a schema version and a checksum, never pickle.

``{"schema":1,"sum":"<first 16 hex of the body's SHA-256>","body":{…}}`` where the body holds the
key it was written under, the value tier, write and expiry times and the completion. The checksum
covers the body's exact bytes, which sit at a fixed offset, so reading a value parses JSON once. A value
that does not parse, has another schema, a wrong checksum or another key is corrupt: the caller
treats it as a miss and deletes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from harness.target.cache.api import CachedCompletion


class CorruptValue(ValueError):
    """A stored value failed decoding or verification."""


@dataclass(slots=True)
class StoredValue:
    key: str
    completion: CachedCompletion
    value_tier: str
    written_at: float
    expires_at: float


_FIELDS = {f.name for f in dataclasses.fields(CachedCompletion)}


def completion_to_dict(c: CachedCompletion) -> dict[str, Any]:
    return dataclasses.asdict(c)


def completion_from_dict(d: Any) -> CachedCompletion:
    if not isinstance(d, dict) or not {"text", "finish_reason", "model"} <= d.keys():
        raise CorruptValue("completion lacks required fields")
    unknown = d.keys() - _FIELDS
    if unknown:
        raise CorruptValue(f"completion has unknown fields {sorted(unknown)}")
    try:
        c = CachedCompletion(**d)
    except TypeError as exc:
        raise CorruptValue(str(exc)) from None
    if not isinstance(c.text, str) or not isinstance(c.meta, dict):
        raise CorruptValue("completion field types are wrong")
    return c


def _head(schema: int) -> bytes:
    return b'{"schema":%d,"sum":"' % schema


_MID = b'","body":'
_SUM_LEN = 16


def encode(value: StoredValue, schema: int) -> bytes:
    """``{"schema":N,"sum":"<16 hex>","body":{…}}`` — valid JSON, laid out so that ``decode`` can
    checksum the body's exact bytes and parse JSON once."""
    try:
        body = orjson.dumps(
            {
                "key": value.key,
                "tier": value.value_tier,
                "written_at": value.written_at,
                "expires_at": value.expires_at,
                "completion": completion_to_dict(value.completion),
            }
        )
    except TypeError as exc:  # e.g. an int beyond 64 bits or an object in ``meta``
        raise ValueError(f"completion is not JSON-serializable: {exc}") from None
    return _head(schema) + hashlib.sha256(body).hexdigest()[:_SUM_LEN].encode() + _MID + body + b"}"


def decode(raw: bytes, key: str, schema: int) -> StoredValue:
    head = _head(schema)
    start = len(head) + _SUM_LEN + len(_MID)
    if not raw.startswith(head) or raw[len(head) + _SUM_LEN : start] != _MID or not raw.endswith(b"}"):
        raise CorruptValue(f"not a schema-{schema} cache value")
    body_bytes = raw[start:-1]
    if hashlib.sha256(body_bytes).hexdigest()[:_SUM_LEN].encode() != raw[len(head) : len(head) + _SUM_LEN]:
        raise CorruptValue("checksum mismatch")
    try:
        body = orjson.loads(body_bytes)
        if body.get("key") != key:
            raise CorruptValue("value was written under another key")
        return StoredValue(
            key=key,
            completion=completion_from_dict(body["completion"]),
            value_tier=str(body["tier"]),
            written_at=float(body["written_at"]),
            expires_at=float(body["expires_at"]),
        )
    except CorruptValue:
        raise
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptValue(f"undecodable value: {exc}") from None


def completion_nbytes(c: CachedCompletion) -> int:
    """Approximate in-memory cost of an entry, for the L1 byte cap: its JSON size plus overhead."""
    return len(c.text.encode("utf-8")) + len(c.model) + 256 + (len(orjson.dumps(c.meta)) if c.meta else 0)
