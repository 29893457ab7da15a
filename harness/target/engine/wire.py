"""The front end ↔ engine process channel: length-prefixed JSON frames over a local socket pair.

JSON, not pickle: nothing that crosses the boundary can run code on the other side, and each frame
is one of a handful of shapes written and read here only. One frame per step carries every event of
that step and the engine's stats, so the cost is per step (~0.1 ms), not per token.

Frames, front end → engine: ``{"settings": …}`` once, then ``["add", id, prompt, params, use_prefix,
priority]``, ``["abort", id]``, ``["reset", token]``. Engine → front end: ``{"ready": …}`` or
``{"fatal": …}`` once, then ``["step", events, stats, adds_seen]``, ``["refused", id, error]``,
``["reset", token, freed | error]``.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
from typing import Any

import orjson

from harness.common.errors import ConfigError, HarnessError, InputError, UnavailableError
from harness.target.engine.api import (
    EngineError,
    EngineFull,
    EngineStats,
    InvalidPrompt,
    PromptTooLong,
    RequestMetrics,
    SamplingParams,
    TokenEvent,
    TopLogprob,
)

_HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024
"""A frame longer than this is a broken channel, not a message (a prompt is at most a few MB)."""


class ChannelClosed(EOFError):
    """The other side closed the socket (or died)."""


def send(sock: socket.socket, message: object) -> None:
    body = orjson.dumps(message)
    sock.sendall(_HEADER.pack(len(body)) + body)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ChannelClosed("the other side closed the channel")
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> Any:
    (n,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    if n > MAX_FRAME:
        raise ChannelClosed(f"a frame of {n} bytes: the channel is out of step")
    return orjson.loads(_read_exact(sock, n))


# ---- values -----------------------------------------------------------------------------------
def params_out(p: SamplingParams) -> dict[str, Any]:
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}


def params_in(d: dict[str, Any]) -> SamplingParams:
    return SamplingParams(
        **{
            **d,
            "logit_bias": tuple((int(t), float(b)) for t, b in d["logit_bias"]),
            "stop": tuple(d["stop"]),
            "stop_token_ids": tuple(d["stop_token_ids"]),
        }
    )


def event_out(ev: TokenEvent) -> list[Any]:
    top = None if ev.top_logprobs is None else [[t.token_id, t.text, t.logprob] for t in ev.top_logprobs]
    metrics = None if ev.metrics is None else dataclasses.asdict(ev.metrics)
    return [
        ev.request_id, ev.token_id, ev.text, ev.finished, ev.finish_reason, ev.logprob, ev.entropy,
        top, metrics,
    ]  # fmt: skip


def event_in(row: list[Any]) -> TokenEvent:
    rid, tok, text, finished, reason, logprob, entropy, top, metrics = row
    return TokenEvent(
        rid,
        tok,
        text,
        finished,
        reason,
        logprob,
        entropy,
        None if top is None else [TopLogprob(t, s, lp) for t, s, lp in top],
        None if metrics is None else RequestMetrics(**metrics),
    )


def stats_out(s: EngineStats) -> dict[str, Any]:
    return dataclasses.asdict(s)


def stats_in(d: dict[str, Any]) -> EngineStats:
    return EngineStats(**d)


def error_out(exc: BaseException) -> dict[str, Any]:
    """An engine error as data (its class and the fields its constructor needs)."""
    out: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, EngineFull):
        out["retry_after_s"] = exc.retry_after_s
    elif isinstance(exc, PromptTooLong):
        out.update(
            prompt_tokens=exc.prompt_tokens, max_tokens=exc.max_tokens, max_model_len=exc.max_model_len
        )
    elif isinstance(exc, HarnessError):
        out.update(exc.to_dict())
    return out


def error_in(d: dict[str, Any]) -> Exception:
    kind, message = d["type"], d["message"]
    if kind == "EngineFull":
        return EngineFull(message, d["retry_after_s"])
    if kind == "PromptTooLong":
        return PromptTooLong(d["prompt_tokens"], d["max_tokens"], d["max_model_len"])
    if kind == "InvalidPrompt":
        return InvalidPrompt(message)
    if kind in _HARNESS_ERRORS:  # the engine could not start: a setting, a file, a resource
        return _HARNESS_ERRORS[kind](
            message, file=d.get("file"), line=d.get("line"), field=d.get("field"), hint=d.get("hint")
        )
    return EngineError(message)


_HARNESS_ERRORS: dict[str, type[HarnessError]] = {
    cls.__name__: cls for cls in (HarnessError, ConfigError, InputError, UnavailableError)
}
