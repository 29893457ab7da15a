"""The asyncio face of the engine: one step loop that owns the core, and per-request ``asyncio.Queue``
streams on the caller's side.

:class:`StepLoop` owns :class:`~harness.target.engine.core.EngineCore` outright: callers never touch
it, they post commands (add, abort, reset the prefix cache) to its inbox, and it hands each step's
:class:`TokenEvent` s to a sink. Where the loop runs is the only difference between the two engines:

* :class:`ThreadedAsyncEngine`: on a thread of the caller's process (tests, benchmarks, and
  ``harness serve --step-loop thread``); the sink posts events into the callers' event loops with
  ``loop.call_soon_threadsafe``;
* :class:`~harness.target.engine.process.ProcessAsyncEngine`: in a process of its own (``harness
  serve``'s default), the sink a socket.

Both share the caller's half, :class:`StreamingEngine`: a request is checked against the engine's
:class:`~harness.target.engine.api.RequestLimits` at once, then streamed from its queue. Leaving the
``async for`` early (client disconnect, task cancelled) aborts the request, which frees its KV blocks
in the step loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from harness.target.engine.api import (
    EngineError,
    EngineFull,
    EngineStats,
    RequestLimits,
    SamplingParams,
    TokenEvent,
    Tokenizer,
)
from harness.target.engine.placement import Placement, enter_compute

if TYPE_CHECKING:  # torch-free at import: the front end of an engine process imports this module
    from harness.target.engine.core import EngineCore

log = logging.getLogger(__name__)

AddCommand = tuple[str, list[int], SamplingParams, bool, int]
"""``("add", …)``'s payload: request id, prompt ids, params, use_prefix_cache, priority."""
Reply = Callable[[int | BaseException], None]
"""How a reset's answer (blocks freed, or the error) gets back to whoever asked."""
SHUT_DOWN = "the engine shut down"


class StepLoop:
    """The engine's step loop: commands in from :attr:`inbox`, each step's events out to ``emit``.

    ``emit(events, stats)`` is called after every step, and after commands that changed the queue
    (``events`` may then be empty); ``refuse(request_id, error)`` answers an add the core refused.
    Run by exactly one thread (:meth:`run`), which alone touches the core.
    """

    def __init__(
        self,
        core: EngineCore,
        emit: Callable[[list[TokenEvent], EngineStats], None],
        refuse: Callable[[str, BaseException], None],
        *,
        validate_every_step: bool = False,
    ) -> None:
        self.core = core
        self.inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self.adds_seen = 0
        """Add commands taken from the inbox so far (the caller counts the ones it posted: the
        difference is the requests not yet in the core's waiting queue, counted against max_waiting)."""
        self.stats = core.stats()
        self._replies: list[tuple[Reply, int | BaseException]] = []
        self._emit = emit
        self._refuse = refuse
        self.validate_every_step = validate_every_step
        """Run :meth:`EngineCore.validate` after every step (a failure fails the in-flight requests like
        any step error): slow, for tests and debugging."""

    def post(self, kind: str, payload: object = None) -> None:
        """Thread-safe: ``add`` (:data:`AddCommand`), ``abort`` (request id), ``reset_prefix_cache``
        (a :data:`Reply`, answered after the events and stats of the round that handled it) or
        ``wake`` (nothing: :meth:`run` looks at its stop event)."""
        self.inbox.put((kind, payload))

    def _handle(self, kind: str, payload: object) -> list[TokenEvent]:
        core = self.core
        if kind == "add":
            request_id, prompt, params, use_prefix_cache, priority = cast("AddCommand", payload)
            self.adds_seen += 1
            try:
                core.add_request(
                    request_id, prompt, params, use_prefix_cache=use_prefix_cache, priority=priority
                )
            except EngineError as exc:
                self._refuse(request_id, exc)
        elif kind == "abort":
            ev = core.abort(str(payload))
            if ev is not None:
                return [ev]
        elif kind == "reset_prefix_cache":
            result: int | BaseException
            try:
                result = core.reset_prefix_cache()
            except Exception as exc:  # a bug: the caller gets it, the engine keeps serving
                log.exception("prefix cache reset failed")
                result = exc
            # Answered after this round's events and stats are out: a reset's answer is a barrier
            # (whoever gets it has also got everything the loop did before it).
            self._replies.append((cast("Reply", payload), result))
        return []

    def run(self, stop: threading.Event) -> None:
        """Step while there is work, wait on the inbox while there is none, until ``stop`` is set."""
        core = self.core
        while not stop.is_set():
            events: list[TokenEvent] = []
            handled = False
            try:
                if not core.has_work():
                    kind, payload = self.inbox.get(timeout=0.5)
                    events += self._handle(kind, payload)
                    handled = True
                while True:
                    kind, payload = self.inbox.get_nowait()
                    events += self._handle(kind, payload)
                    handled = True
            except queue.Empty:
                pass
            if stop.is_set():
                break
            if core.has_work():
                try:
                    events += core.step()
                    if self.validate_every_step:
                        core.validate()
                except Exception:  # a bug or OOM: fail the in-flight requests, keep serving
                    log.exception("engine step failed")
                    events += self._abort_all()
                handled = True
            if handled:
                self.stats = core.stats()
                self._emit(events, self.stats)
                self._answer()
        events = self._abort_all()
        self.stats = core.stats()
        self._emit(events, self.stats)
        self._answer()
        # Requests posted after the last inbox read would otherwise wait on their queues for ever.
        with contextlib.suppress(queue.Empty):
            while True:
                kind, payload = self.inbox.get_nowait()
                if kind == "add":
                    self.adds_seen += 1
                    self._refuse(cast("AddCommand", payload)[0], EngineError(SHUT_DOWN))
                elif kind == "reset_prefix_cache":
                    cast("Reply", payload)(EngineError(SHUT_DOWN))

    def _answer(self) -> None:
        replies, self._replies = self._replies, []
        for reply, result in replies:
            reply(result)

    def _abort_all(self) -> list[TokenEvent]:
        """End every request with ``finish_reason="error"`` and free its blocks (a failed step, shutdown)."""
        core = self.core
        out = []
        for req in list(core.running) + list(core.waiting):
            ev = core.abort(req.request_id)
            if ev is not None:
                ev.finish_reason = "error"
                out.append(ev)
        return out


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenEvent | BaseException]


def _put_all(items: list[tuple[asyncio.Queue[TokenEvent | BaseException], TokenEvent]]) -> None:
    """On the caller's loop: hand one step's events to their streams' queues."""
    for q, ev in items:
        q.put_nowait(ev)


def settle(fut: asyncio.Future[int], result: int | BaseException) -> None:
    """Complete ``fut`` on its own loop (unless its caller gave up waiting)."""
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


def reply_on(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[int]) -> Reply:
    """A :data:`Reply` that settles ``fut`` on ``loop`` from any thread."""

    def reply(result: int | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, fut, result)

    return reply


class StreamingEngine:
    """The caller's half of an engine whose step loop runs elsewhere: checks, streams, delivery.

    A subclass says how a command reaches its step loop (:meth:`_post`), how many adds the loop has
    taken (:meth:`_adds_seen`) and what the loop last reported (:meth:`_loop_stats`); it calls
    :meth:`_deliver_step` and :meth:`_deliver` (from any thread) with what comes back.
    """

    def __init__(
        self, model_name: str, limits: RequestLimits, tokenizer: Tokenizer, max_waiting: int
    ) -> None:
        self.model_name = model_name
        self.limits = limits
        self.max_model_len = limits.max_model_len
        self.tokenizer = tokenizer
        self.max_waiting = max_waiting
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._adds_posted = 0
        self._started = False

    # ---- what a subclass provides ---------------------------------------------------------------
    def _post(self, kind: str, payload: object) -> None:
        raise NotImplementedError

    def _adds_seen(self) -> int:
        raise NotImplementedError

    def _loop_stats(self) -> EngineStats:
        raise NotImplementedError

    # ---- requests -------------------------------------------------------------------------------
    def _pending(self) -> int:
        """Requests posted but not yet seen by the step loop (counted against max_waiting)."""
        return self._adds_posted - self._adds_seen()

    def _check(self, request_id: str, prompt_len: int, params: SamplingParams) -> None:
        failure = self._loop_stats().failure
        if failure is not None:
            raise EngineError(failure)
        self.limits.check_request(prompt_len, params)
        if self._loop_stats().waiting + self._pending() >= self.max_waiting:
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
        if not self._started:
            raise EngineError("the engine is not started")
        self.limits.check_prompt(prompt_token_ids)
        self._check(request_id, len(prompt_token_ids), params)
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
            self._check(request_id, len(prompt), params)
            stream = _Stream(loop, asyncio.Queue())
            self._streams[request_id] = stream
            self._adds_posted += 1
        self._post("add", (request_id, prompt, params, use_prefix_cache, priority))
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
                self._post("abort", request_id)
            with self._lock:
                self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def stats(self) -> EngineStats:
        s = self._loop_stats()
        return dataclasses.replace(s, waiting=s.waiting + self._pending())

    # ---- what comes back ------------------------------------------------------------------------
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

    def _fail_streams(self, error: EngineError) -> None:
        """Every open stream ends with ``error`` (the step loop is gone)."""
        with self._lock:
            ids = list(self._streams)
        for request_id in ids:
            self._deliver(request_id, error)


class ThreadedAsyncEngine(StreamingEngine):
    """:class:`~harness.target.engine.api.AsyncEngine` over an :class:`EngineCore` on a thread of its own."""

    def __init__(
        self,
        core: EngineCore,
        model_name: str,
        max_waiting: int,
        *,
        validate_every_step: bool = False,
        placement: Placement | None = None,
    ) -> None:
        """``validate_every_step``: see :attr:`StepLoop.validate_every_step`. ``placement``: the
        step-loop thread's CPUs and torch threads, entered when it starts (the front end's half is the
        server's to enter: :func:`~harness.target.engine.placement.enter_front`)."""
        super().__init__(model_name, core.limits, core.tokenizer, max_waiting)
        self.placement = placement or Placement()
        self.core = core
        self._loop = StepLoop(
            core,
            lambda events, _stats: self._deliver_step(events),
            self._deliver,
            validate_every_step=validate_every_step,
        )
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def _post(self, kind: str, payload: object) -> None:
        self._loop.post(kind, payload)

    def _adds_seen(self) -> int:
        return self._loop.adds_seen

    def _loop_stats(self) -> EngineStats:
        return self._loop.stats

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
        self._thread.start()
        self._started = True

    def _run(self) -> None:
        enter_compute(self.placement)  # before this thread's first torch call: its OpenMP team inherits it
        self._loop.run(self._stop)

    async def shutdown(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._loop.post("wake")
        thread = self._thread
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 10.0)
        self._thread = None
        self._started = False

    async def __aenter__(self) -> ThreadedAsyncEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def reset_prefix_cache(self) -> int:
        """Empty the prefix cache in the step loop, between two steps (the block tables are the
        loop's alone); returns the number of cached blocks freed."""
        if not self._started:
            raise EngineError("the engine is not started")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._post("reset_prefix_cache", reply_on(loop, done))
        return await done
