"""The asyncio face of the engine: a step-loop thread plus per-request ``asyncio.Queue`` streams.

The engine thread owns :class:`~harness.target.engine.core.EngineCore` outright. Callers never touch it;
they post commands (add, abort, reset the prefix cache) to a thread-safe inbox, and the thread
hands each :class:`TokenEvent` (or the reset's answer) back with ``loop.call_soon_threadsafe`` into
the caller's event loop. Leaving the ``async for`` early (client disconnect, task cancelled) aborts
the request, which frees its KV blocks on the engine thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import cast

from harness.target.engine.api import (
    EngineError,
    EngineFull,
    EngineStats,
    SamplingParams,
    TokenEvent,
    Tokenizer,
)
from harness.target.engine.core import EngineCore
from harness.target.engine.placement import Placement, enter_compute

log = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenEvent | BaseException]


def _settle(fut: asyncio.Future[int], result: int | BaseException) -> None:
    """Complete ``fut`` on its own loop (unless its caller gave up waiting)."""
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


def _put_all(items: list[tuple[asyncio.Queue[TokenEvent | BaseException], TokenEvent]]) -> None:
    """On the caller's loop: hand one step's events to their streams' queues."""
    for q, ev in items:
        q.put_nowait(ev)


class ThreadedAsyncEngine:
    """:class:`~harness.target.engine.api.AsyncEngine` over an :class:`EngineCore` on its own thread."""

    def __init__(
        self,
        core: EngineCore,
        model_name: str,
        max_waiting: int,
        *,
        validate_every_step: bool = False,
        placement: Placement | None = None,
    ) -> None:
        """``validate_every_step`` runs :meth:`EngineCore.validate` after every step (a failure
        fails the in-flight requests like any step error): slow, for tests and debugging.
        ``placement``: the step-loop thread's CPUs and torch threads, entered when it starts (the
        front end's half is the server's to enter: :func:`~harness.target.engine.placement.enter_front`)."""
        self.placement = placement or Placement()
        self.core = core
        self.model_name = model_name
        self.max_model_len = core.max_model_len
        self.tokenizer: Tokenizer = core.tokenizer
        self.max_waiting = max_waiting
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._pending = 0
        """Requests posted but not yet seen by the engine thread (counted against max_waiting)."""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stats = core.stats()
        self.validate_every_step = validate_every_step

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._inbox.put(("wake", None))
        thread = self._thread
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 10.0)
        self._thread = None

    async def __aenter__(self) -> ThreadedAsyncEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ---- requests -------------------------------------------------------------------------------
    def _check(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        self.core.check_request(len(prompt_token_ids), params)
        if len(self.core.waiting) + self._pending >= self.max_waiting:
            raise EngineFull(f"the waiting queue is full ({self.max_waiting} requests)", retry_after_s=1.0)
        if request_id in self._streams:
            raise EngineError(f"request id {request_id!r} is already in use")

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        use_prefix_cache: bool = True,
        priority: int = 0,
    ) -> AsyncIterator[TokenEvent]:
        """Validate now (raising :class:`EngineFull` / :class:`PromptTooLong` at once), stream later."""
        if self._thread is None:
            raise EngineError("the engine is not started")
        self.core.check_prompt(prompt_token_ids)
        self._check(request_id, prompt_token_ids, params)
        return self._stream(request_id, list(prompt_token_ids), params, use_prefix_cache, priority)

    async def _stream(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        use_prefix_cache: bool,
        priority: int,
    ) -> AsyncIterator[TokenEvent]:
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check(request_id, prompt, params)
            stream = _Stream(loop, asyncio.Queue())
            self._streams[request_id] = stream
            self._pending += 1
        self._inbox.put(("add", (request_id, prompt, params, use_prefix_cache, priority)))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._inbox.put(("abort", request_id))
            with self._lock:
                self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    async def reset_prefix_cache(self) -> int:
        """Empty the prefix cache on the engine thread, between two steps (the block tables are
        the thread's alone); returns the number of cached blocks freed."""
        if self._thread is None:
            raise EngineError("the engine is not started")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._inbox.put(("reset_prefix_cache", (loop, done)))
        return await done

    def stats(self) -> EngineStats:
        return dataclasses.replace(self._stats, waiting=self._stats.waiting + self._pending)

    # ---- the engine thread ----------------------------------------------------------------------
    def _deliver(self, request_id: str, item: TokenEvent | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody listens
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)

    def _deliver_step(self, events: list[TokenEvent]) -> None:
        """A step's events with one ``call_soon_threadsafe`` per caller loop, not one per event: each
        call writes the loop's wake-up pipe and takes its lock, 16 times a step at 16 streams."""
        by_loop: dict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[TokenEvent | BaseException], TokenEvent]]
        ] = {}
        for ev in events:
            stream = self._streams.get(ev.request_id)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream.queue, ev))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody listens
                loop.call_soon_threadsafe(_put_all, items)

    def _handle(self, kind: str, payload: object) -> None:
        core = self.core
        if kind == "add":
            request_id, prompt, params, use_prefix_cache, priority = cast(
                "tuple[str, list[int], SamplingParams, bool, int]", payload
            )
            with self._lock:
                self._pending -= 1
            try:
                core.add_request(
                    request_id, prompt, params, use_prefix_cache=use_prefix_cache, priority=priority
                )
            except EngineError as exc:
                self._deliver(request_id, exc)
        elif kind == "abort":
            ev = core.abort(str(payload))
            if ev is not None:
                self._deliver(ev.request_id, ev)
        elif kind == "reset_prefix_cache":
            loop, done = cast("tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]", payload)
            result: int | BaseException
            try:
                result = core.reset_prefix_cache()
            except Exception as exc:  # a bug: the caller gets it, the engine keeps serving
                log.exception("prefix cache reset failed")
                result = exc
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, done, result)

    def _run(self) -> None:
        enter_compute(self.placement)  # before this thread's first torch call: its OpenMP team inherits it
        core = self.core
        while not self._stop.is_set():
            try:
                if not core.has_work():
                    kind, payload = self._inbox.get(timeout=0.5)
                    self._handle(kind, payload)
                while True:
                    kind, payload = self._inbox.get_nowait()
                    self._handle(kind, payload)
            except queue.Empty:
                pass
            if self._stop.is_set():
                break
            if core.has_work():
                try:
                    events = core.step()
                    if self.validate_every_step:
                        core.validate()
                except Exception:  # a bug or OOM: fail the in-flight requests, keep serving
                    log.exception("engine step failed")
                    self._fail_all()
                    events = []
                self._deliver_step(events)
            self._stats = core.stats()
        self._fail_all()
        # Requests posted after the last inbox read would otherwise wait on their queues for ever.
        with contextlib.suppress(queue.Empty):
            while True:
                kind, payload = self._inbox.get_nowait()
                if kind == "add":
                    request_id = cast("tuple[str, list[int], SamplingParams, bool, int]", payload)[0]
                    with self._lock:
                        self._pending -= 1
                    self._deliver(request_id, EngineError("the engine shut down"))
                elif kind == "reset_prefix_cache":
                    loop, done = cast("tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]", payload)
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(_settle, done, EngineError("the engine shut down"))

    def _fail_all(self) -> None:
        """End every request with ``finish_reason="error"`` and free its blocks (a failed step, shutdown)."""
        core = self.core
        for req in list(core.running) + list(core.waiting):
            ev = core.abort(req.request_id)
            if ev is not None:
                ev.finish_reason = "error"
                self._deliver(ev.request_id, ev)
        self._stats = core.stats()
