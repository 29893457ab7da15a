"""Canonical request keys: formatting-only variants share a key, semantic changes never do.

A request body becomes a :class:`NormalizedRequest` with two parts:

* ``text``: the conversation the L3 semantic cache embeds (non-system messages, or the raw prompt);
* ``params``: everything else that decides the completion (schema version, tenant, endpoint, model,
  model revision, system prompts, sampling parameters rounded to ``float_precision``, tools, …).

The exact key hashes both; the L3 verifier compares only ``params_hash`` so a near-duplicate is
never served across models, revisions, sampling settings, system prompts or tenants.

What is normalized, and why (also in ``docs/cache.md``):

* Unicode NFC, CRLF/CR → LF everywhere (encodings of the same text).
* Prose in chat messages (``collapse``): every whitespace run, newlines included, becomes one
  space and the ends are trimmed; chat models read meaning, not layout.
* Fenced code blocks (````` / ``~~~``) and inline code spans are *not* collapsed: whitespace in code
  can be semantic (Python indentation, Makefile tabs, string literals). Inside a fence only trailing
  spaces are stripped, common indentation is removed (a block indented as a whole inside a list)
  and blank lines at the block's ends are dropped; relative indentation and tabs are kept.
* Raw completion prompts (``lines``) are often code: line structure and relative indentation are
  kept; trailing spaces, common indentation and blank lines at the ends are normalized.
* JSON: the body's own key order never matters (canonical JSON with sorted keys); tool-call
  arguments and message content that parse as a JSON object/array are re-serialized sorted.
* Tool-call ids (random ``call_…`` strings) are replaced by their ordinal, consistently in the
  assistant's ``tool_calls`` and the tool messages' ``tool_call_id``.
* Absent sampling fields equal their defaults; floats are rounded; ``stop`` is a sorted set.
* Non-deterministic fields (request id, timestamps, user agent, stream options …) are dropped.
"""

from __future__ import annotations

import hashlib
import math
import re
import textwrap
import threading
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from harness.common.errors import InputError
from harness.target.cache.settings import CacheSettings, WhitespaceMode

_FENCE = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([^\n`]*)$", re.MULTILINE)
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_WS = re.compile(r"\s+")
_SAFE_TENANT = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nobody|nothing|neither|nor|without|cannot)\b|n't\b", re.IGNORECASE
)

MEMO_ENTRIES = 2048
"""Normalized requests :meth:`KeyBuilder.normalize` remembers by their body's bytes."""
MEMO_MAX_BODY_BYTES = 4096
"""Longer bodies are normalized every time: the memo stays under ~25 MB (a key, its canonical
text and the body, 2,048 times), and a long prompt's own hashing dominates its key's cost."""

# Sampling defaults of the OpenAI API: an absent field and its default give the same completion.
_FLOAT_DEFAULTS: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
}
_INT_DEFAULTS: dict[str, int | None] = {"n": 1, "top_k": 0, "seed": None, "best_of": None}
_BOOL_DEFAULTS: dict[str, bool] = {"echo": False, "ignore_eos": False}
_MAX_TOKENS_DEFAULT = {"completions": 16, "chat.completions": None}


@dataclass(frozen=True, slots=True)
class NormalizedRequest:
    """A request reduced to what decides its completion."""

    key: str
    """``<tenant>:<32 hex>``; the Redis key adds a prefix and the schema version."""
    tenant: str
    endpoint: str
    model: str
    text: str
    """What L3 embeds."""
    params_hash: str
    """Hash of everything but ``text``: equal for requests an L3 hit may be served across."""
    canonical: str
    """What the key hashes: the canonical params JSON, a newline, the normalized text (debugging)."""
    sampled: bool
    """temperature > 0 (after rounding) without a seed: a random draw, cacheable only by policy."""
    numbers: tuple[str, ...]
    negations: int
    bloom_item: int = 0
    """The key's first 64 hash bits as a signed integer: the Bloom filter's item (``bloom.key_item``)."""


def tenant_slug(tenant: str) -> str:
    """A tenant name safe inside a Redis key and a directory name; distinct tenants stay distinct."""
    t = tenant or "default"
    if _SAFE_TENANT.match(t) and t not in {".", ".."}:
        return t
    # '~' is outside the safe alphabet, so a hashed slug never equals a verbatim one.
    return "t~" + hashlib.sha256(t.encode("utf-8")).hexdigest()[:24]


# ASCII characters ``str.rstrip``/``str.split`` treat as whitespace besides space, tab and newline.
_ODD_ASCII_SPACE = re.compile(r"[\r\x0b\x0c\x1c-\x1f]")


def _lines_already_normal(text: str) -> bool:
    """True when ``lines`` normalization would return ``text`` unchanged (checked without copying).

    ASCII only (NFC is the identity there), no CR or odd whitespace, no trailing blanks on any
    line, no blank first/last line and an unindented first line (so there is no common indentation).
    """
    return (
        text.isascii()
        and bool(text)
        and text[0] not in " \t\n"
        and text[-1] not in " \t\n"
        and " \n" not in text
        and "\t\n" not in text
        and _ODD_ASCII_SPACE.search(text) is None
    )


def normalize_text(text: str, mode: WhitespaceMode) -> str:
    """Normalize one piece of message text (see the module docstring for the rules)."""
    if mode == "lines" and _lines_already_normal(text):
        return text  # the common case of a prompt that is already canonical: no copies, no dedent
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if mode == "lines":
        return _normalize_code(text)
    if "`" not in text and "~~~" not in text:
        # No fence and no inline code can start without these: the text is all prose.
        return _WS.sub(" ", text).strip()
    out: list[str] = []
    pos = 0
    lines_iter = list(_FENCE.finditer(text))
    i = 0
    while i < len(lines_iter):
        opening = lines_iter[i]
        closing = next(
            (m for m in lines_iter[i + 1 :] if m.group(1)[0] == opening.group(1)[0] and not m.group(2)),
            None,
        )
        if closing is None:
            break
        out.append(_collapse_prose(text[pos : opening.start()]))
        body = text[opening.end() : closing.start()].strip("\n")
        info = opening.group(2).strip().lower()
        out.append(f"\n```{info}\n{_normalize_code(body)}\n```\n")
        pos = closing.end()
        i = lines_iter.index(closing) + 1
    out.append(_collapse_prose(text[pos:]))
    return "".join(out).strip()


def _collapse_prose(text: str) -> str:
    parts: list[str] = []
    pos = 0
    for m in _INLINE_CODE.finditer(text):
        parts.append(_WS.sub(" ", text[pos : m.start()]))
        parts.append(m.group(0))
        pos = m.end()
    parts.append(_WS.sub(" ", text[pos:]))
    joined = "".join(parts)
    return joined.strip()


def _normalize_code(text: str) -> str:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return textwrap.dedent("\n".join(lines))


def _canon_json_value(value: Any) -> Any:
    """Recursively NFC-normalize strings; dict key order is handled by sorted dumping."""
    # Exact type checks first: this runs on every request and ABC isinstance checks are slow.
    t = type(value)
    if t is str:
        return value if value.isascii() else unicodedata.normalize("NFC", value)
    if t is dict:
        return {(k if type(k) is str else str(k)): _canon_json_value(v) for k, v in value.items()}
    if t is list or t is tuple:
        return [_canon_json_value(v) for v in value]
    if t is int or t is bool or value is None:
        return value
    if t is float:
        return int(value) if value.is_integer() else value  # 1.0 and 1 are the same JSON number
    if isinstance(value, Mapping):
        return {str(k): _canon_json_value(v) for k, v in value.items()}
    if isinstance(value, str):
        return unicodedata.normalize("NFC", str(value))
    if isinstance(value, list | tuple):
        return [_canon_json_value(v) for v in value]
    return value


def dumps_canonical(value: Any) -> bytes:
    return orjson.dumps(_canon_json_value(value), option=orjson.OPT_SORT_KEYS)


class KeyBuilder:
    """Builds :class:`NormalizedRequest` objects under one :class:`CacheSettings`."""

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings
        self._drop = frozenset(settings.drop_fields)
        self._memo: dict[tuple[str, str, str | None, bytes], NormalizedRequest] = {}
        self._memo_lock = threading.Lock()
        prec = settings.float_precision
        self._defaults: dict[str, Any] = {
            **{k: _json_num(_round(v, prec, k)) for k, v in _FLOAT_DEFAULTS.items()},
            **_INT_DEFAULTS,
            **_BOOL_DEFAULTS,
        }

    def normalize(
        self, endpoint: str, body: Mapping[str, Any], tenant: str, *, model_revision: str | None = None
    ) -> NormalizedRequest:
        """Canonicalize ``body``; an unusable body raises :class:`InputError` naming the field.

        A body serialized to the same bytes as one normalized lately (and not longer than
        :data:`MEMO_MAX_BODY_BYTES`) gets that result again: normalization is a pure function of the
        body, tenant, endpoint, revision and these settings, and a load test repeats its bodies byte
        for byte, so a repeated request (every exact hit) is keyed for the price of one ``orjson``
        dump instead of the whole canonicalization (measured: ``bench/cache.py``)."""
        memo_key: tuple[str, str, str | None, bytes] | None = None
        try:
            raw = orjson.dumps(body)
        except TypeError:  # not JSON (a non-string key, a huge int): normalized afresh, refused there
            raw = b""
        if 0 < len(raw) <= MEMO_MAX_BODY_BYTES:
            memo_key = (endpoint, tenant, model_revision, raw)
            found = self._memo.get(memo_key)
            if found is not None:
                return found
        req = self._normalize(endpoint, body, tenant, model_revision=model_revision)
        if memo_key is not None:
            with self._memo_lock:  # the L3 pool's threads key requests too
                self._memo[memo_key] = req
                if len(self._memo) > MEMO_ENTRIES:  # oldest first out: a bounded window
                    del self._memo[next(iter(self._memo))]
        return req

    def _normalize(
        self, endpoint: str, body: Mapping[str, Any], tenant: str, *, model_revision: str | None
    ) -> NormalizedRequest:
        if not isinstance(body, Mapping):
            raise InputError("request body must be a JSON object")
        s = self.settings
        rest: dict[str, Any] = {k: v for k, v in body.items() if k not in self._drop}
        model = str(rest.pop("model", None) or s.default_model)
        params: dict[str, Any] = {}
        text_parts: list[str] = []
        if endpoint == "chat.completions":
            messages = rest.pop("messages", None)
            if not isinstance(messages, list) or not messages:
                raise InputError("'messages' must be a non-empty list", field="messages")
            system, convo = self._messages(messages)
            params["system"] = _canon_json_value(system) if system else []
            params["messages_shape"] = [_nfc(m["role"]) for m in convo]
            text_parts = [f"{m['role']}: {m['content']}" for m in convo]
            params["messages_extra"] = [
                _canon_json_value({k: v for k, v in m.items() if k not in {"role", "content"}}) for m in convo
            ]
        elif endpoint == "completions":
            prompt = rest.pop("prompt", None)
            text_parts = [self._prompt(prompt)]
        else:
            raise InputError(f"unknown endpoint {endpoint!r}; expected completions or chat.completions")
        if "max_completion_tokens" in rest:
            rest.setdefault("max_tokens", rest.pop("max_completion_tokens"))
        params.update(self._sampling(endpoint, rest))
        text = "\n".join(text_parts)
        params.update(
            schema=s.schema_version,
            tenant=_nfc(tenant),
            endpoint=_nfc(endpoint),
            model=_nfc(model),
            revision=_nfc(model_revision if model_revision is not None else s.model_revision),
        )
        # Every part of ``params`` is canonical already (strings NFC, integral floats as ints, raw
        # user values through ``_canon_json_value``), so this equals ``dumps_canonical(params)``
        # without walking the whole structure again.
        params_bytes = orjson.dumps(params, option=orjson.OPT_SORT_KEYS)
        params_hash = hashlib.sha256(params_bytes).hexdigest()[:32]
        # The key hashes the canonical params and the normalized text, separated by a NUL (which
        # canonical JSON never contains), so no (params, text) pair can collide with another.
        text_bytes = text.encode("utf-8")
        full = hashlib.sha256(params_bytes + b"\x00" + text_bytes).digest()
        digest = full[:16].hex()
        temperature = params.get("temperature", 1.0)
        sampled = bool(temperature and temperature > 0 and params.get("seed") is None)
        return NormalizedRequest(
            key=f"{tenant_slug(tenant)}:{digest}",
            tenant=tenant,
            endpoint=endpoint,
            model=model,
            text=text,
            params_hash=params_hash,
            canonical=params_bytes.decode("utf-8") + "\n" + text,
            bloom_item=int.from_bytes(full[:8], "big", signed=True),
            sampled=sampled,
            # Only the L3 verifier reads these; skip the regexes when there is no L3.
            numbers=tuple(sorted(n.replace(",", "") for n in _NUMBER.findall(text))) if s.l3_enabled else (),
            negations=len(_NEGATION.findall(text)) if s.l3_enabled else 0,
        )

    # ------------------------------------------------------------------ pieces

    def _prompt(self, prompt: Any) -> str:
        mode = self.settings.completion_whitespace
        if isinstance(prompt, str):
            return normalize_text(prompt, mode)
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            # A batch of prompts: keep the boundaries; the order is part of the response.
            return "\n\u241e\n".join(normalize_text(p, mode) for p in prompt)
        if isinstance(prompt, list) and prompt:
            # Token ids are exact by nature; keyed verbatim.
            return "tokens:" + dumps_canonical(prompt).decode("utf-8")
        raise InputError("'prompt' must be a non-empty string, list of strings or token ids", field="prompt")

    def _content(self, content: Any, field: str) -> str:
        mode = self.settings.chat_whitespace
        if content is None:
            return ""
        if isinstance(content, str):
            return self._maybe_json(content, mode)
        if isinstance(content, list):
            pieces: list[str] = []
            for j, part in enumerate(content):
                if isinstance(part, str):
                    pieces.append(self._maybe_json(part, mode))
                elif isinstance(part, Mapping) and part.get("type") == "text":
                    pieces.append(self._maybe_json(str(part.get("text", "")), mode))
                elif isinstance(part, Mapping):
                    pieces.append("part:" + dumps_canonical(part).decode("utf-8"))
                else:
                    raise InputError("content part must be a string or an object", field=f"{field}[{j}]")
            return normalize_text("\n".join(pieces), mode) if mode == "collapse" else "\n".join(pieces)
        raise InputError("content must be a string or a list of parts", field=field)

    def _maybe_json(self, text: str, mode: WhitespaceMode) -> str:
        stripped = text.strip()
        if self.settings.canonical_json_content and stripped[:1] in {"{", "["}:
            try:
                parsed = orjson.loads(stripped)
            except orjson.JSONDecodeError:
                pass
            else:
                if isinstance(parsed, dict | list):
                    return dumps_canonical(parsed).decode("utf-8")
        return normalize_text(text, mode)

    def _messages(self, messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        system: list[dict[str, Any]] = []
        convo: list[dict[str, Any]] = []
        call_ids: dict[str, str] = {}
        for i, msg in enumerate(messages):
            field = f"messages[{i}]"
            if not isinstance(msg, Mapping):
                raise InputError("each message must be an object", field=field)
            role = str(msg.get("role", "")).strip().lower()
            if not role:
                raise InputError("message has no role", field=f"{field}.role")
            out: dict[str, Any] = {
                "role": role,
                "content": self._content(msg.get("content"), f"{field}.content"),
            }
            for k, v in msg.items():
                if k in {"role", "content"}:
                    continue
                if k == "tool_calls" and isinstance(v, list):
                    out[k] = [
                        self._tool_call(c, call_ids, f"{field}.tool_calls[{j}]") for j, c in enumerate(v)
                    ]
                elif k == "tool_call_id":
                    out[k] = call_ids.setdefault(str(v), f"call_{len(call_ids)}")
                elif k == "name":
                    out[k] = unicodedata.normalize("NFC", str(v)).strip()
                else:
                    out[k] = v
            (system if role in {"system", "developer"} else convo).append(out)
        return system, convo

    def _tool_call(self, call: Any, call_ids: dict[str, str], field: str) -> dict[str, Any]:
        if not isinstance(call, Mapping):
            raise InputError("tool call must be an object", field=field)
        out = {k: v for k, v in call.items() if k not in {"id", "index"}}
        if "id" in call:
            out["id"] = call_ids.setdefault(str(call["id"]), f"call_{len(call_ids)}")
        fn = call.get("function")
        if isinstance(fn, Mapping):
            fn_out = dict(fn)
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn_out["arguments"] = orjson.loads(args) if args.strip() else {}
                except orjson.JSONDecodeError:
                    fn_out["arguments"] = normalize_text(args, "lines")
            out["function"] = fn_out
        return out

    def _sampling(self, endpoint: str, rest: dict[str, Any]) -> dict[str, Any]:
        prec = self.settings.float_precision
        # Start from the defaults (computed once) and convert only the fields the body has.
        out = dict(self._defaults)
        for name in _FLOAT_DEFAULTS.keys() & rest.keys():
            raw = rest.pop(name)
            # A body usually spells the defaults out (the server's does): equal to the default, it
            # keeps the default's canonical form (µs saved on every request's key).
            if raw is not None and raw != _FLOAT_DEFAULTS[name]:
                out[name] = _json_num(_round(raw, prec, name))
        for name in _INT_DEFAULTS.keys() & rest.keys():
            raw = rest.pop(name)
            if raw is not None:
                out[name] = _int(raw, name)
        for name in _BOOL_DEFAULTS.keys() & rest.keys():
            raw = rest.pop(name)
            if raw is not None:
                out[name] = bool(raw)
        mt = rest.pop("max_tokens", None)
        out["max_tokens"] = _int(mt, "max_tokens") if mt is not None else _MAX_TOKENS_DEFAULT[endpoint]
        stop = rest.pop("stop", None)
        if isinstance(stop, str):
            stop = [stop]
        out["stop"] = sorted({unicodedata.normalize("NFC", str(x)) for x in stop}) if stop else []
        bias = rest.pop("logit_bias", None)
        if isinstance(bias, Mapping):
            out["logit_bias"] = {
                str(k): _json_num(_round(v, prec, "logit_bias")) for k, v in bias.items() if v
            }
        for name in ("tools", "functions"):
            if isinstance(rest.get(name), list):
                out[name] = sorted(
                    (_canon_json_value(t) for t in rest.pop(name)),
                    key=dumps_canonical,
                )
        # Anything else (logprobs, response_format, tool_choice, suffix, unknown fields) is kept
        # verbatim: a field we do not know might change the output, so it must split the key.
        out["extra"] = {k: _canon_json_value(v) for k, v in rest.items()}
        return out


def _nfc(text: str) -> str:
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def _json_num(f: float) -> float | int:
    """What ``_canon_json_value`` makes of a float: 1.0 and 1 are the same JSON number."""
    return int(f) if f.is_integer() else f


def _round(value: Any, prec: int, field: str) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise InputError(f"expected a number, got {value!r}", field=field) from None
    if not math.isfinite(f):
        raise InputError("must be a finite number", field=field)
    r = round(f, prec)
    return 0.0 if r == 0 else r  # -0.0 and 0.0 are the same setting


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
        raise InputError(f"expected an integer, got {value!r}", field=field)
    return int(value)
