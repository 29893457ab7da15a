"""Request plumbing at the ASGI level, shared by the route modules: reading a capped body, parsing
JSON, awaiting work unless the client disconnects, and a streaming response whose cleanup always
runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from harness.target.server.errors import APIError, bad_request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the response started."""


class GuardedStream(StreamingResponse):
    """A streaming response whose cleanup runs however the response ends.

    The body generator's own ``finally`` covers completion and cancellation mid-stream, but a
    generator that never started (the client left before the first chunk was pulled) never runs
    its ``finally``. ``on_close`` (idempotent) runs here in every case, shielded from cancellation.
    """

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], headers: dict[str, str]
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(
            413,
            f"request body is {declared} bytes; the limit is {limit}",
            code="request_too_large",
            reason="body_too_large",
        )
    # The ASGI receive channel directly: Starlette's ``request.stream()`` generator costs tens of µs.
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise APIError(
                413,
                f"request body exceeds the limit of {limit} bytes",
                code="request_too_large",
                reason="body_too_large",
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, aw: Awaitable[T]) -> T:
    """Await ``aw`` unless the client disconnects first (then it is cancelled and ClientGone raised)."""
    task = asyncio.ensure_future(aw)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise ClientGone
