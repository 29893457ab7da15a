"""Cleanup paths that are hard to reach over a real socket, exercised at the ASGI interface.

The ASGI ``receive``/``send`` callables below stand in for uvicorn's connection: they are the real
interface Starlette runs against, driven to the timing that matters (a client gone before the first
body chunk).
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from harness.common.errors import ConfigError
from harness.target.server.asgi import GuardedStream
from harness.target.server.cli import load_cache_settings


async def test_guarded_stream_cleans_up_when_the_body_never_starts():
    started = False
    closed: list[int] = []

    async def body():
        nonlocal started
        started = True
        yield b"data: x\n\n"

    async def on_close() -> None:
        closed.append(1)

    async def receive():
        return {"type": "http.disconnect"}  # the client is already gone

    stuck = asyncio.Event()

    async def send(message):
        await stuck.wait()  # a socket that never drains: only the disconnect can end the response

    resp = GuardedStream(body(), on_close, {})
    await asyncio.wait_for(resp({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send), 60)
    assert started is False  # the generator's own finally never ran …
    assert closed == [1]  # … but the cleanup did


async def test_guarded_stream_cleans_up_once_after_a_full_stream():
    closed: list[int] = []
    sent: list[bytes] = []

    async def on_close() -> None:
        closed.append(1)

    async def body():
        try:
            yield b"data: a\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            await on_close()

    never = asyncio.Event()

    async def receive():
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    # on_close is idempotent in the server; here the guard calls it a second time, which we count.
    resp = GuardedStream(body(), on_close, {})
    await resp({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
    assert b"".join(sent) == b"data: a\n\ndata: [DONE]\n\n"
    assert len(closed) == 2


def test_cache_flag_without_the_cache_stack_is_a_config_error(monkeypatch):
    """A ``None`` entry in sys.modules is how Python itself marks a module as not importable."""
    from harness.target.engine.settings import EngineSettings

    monkeypatch.setitem(sys.modules, "harness.target.cache.factory", None)
    with pytest.raises(ConfigError) as info:
        load_cache_settings(EngineSettings())
    assert "harness.target.cache.factory" in str(info.value)
