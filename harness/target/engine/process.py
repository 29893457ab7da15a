"""The engine core in a process of its own (``harness serve``'s default), fed over a local socket.

Why: on a small CPU machine the engine's compute threads, the HTTP front end and the client share
the cores. With the step loop a thread of the server, every SSE write, cache hit and ``/metrics``
scrape also competed with it for one interpreter's GIL, and a compute team stalls while any of its
threads waits. vLLM's engine core runs apart from its API server for the same reason. Here:

* the parent (the server: HTTP, response cache, admission, metrics) never imports torch; it holds
  the tokenizer (to render and count prompts) and the engine's :class:`RequestLimits` (to refuse a
  request at once), and streams each request from its own queue (:class:`StreamingEngine`);
* the child (``python -m harness.target.engine.worker``) loads the model, enters its placement
  before its first torch call, and runs the same :class:`StepLoop` as the threaded engine; one
  frame per step carries every event of the step and the engine's stats back (:mod:`.wire`);
* a child that dies is noticed at once (its socket closes): every request in flight ends with a
  named :class:`EngineError`, :meth:`ProcessAsyncEngine.stats` carries the failure (``/health``
  says so), and ``on_death`` tells the server, which stops and exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any, cast

from harness.common.errors import UnavailableError
from harness.target.engine import wire
from harness.target.engine.api import EngineError, EngineStats, RequestLimits
from harness.target.engine.async_engine import AddCommand, StreamingEngine, reply_on
from harness.target.engine.placement import Placement, plan, spin_briefly
from harness.target.engine.settings import EngineSettings
from harness.target.engine.tokenizer import checkpoint_tokenizer, preset_tokenizer

log = logging.getLogger(__name__)


class ProcessAsyncEngine(StreamingEngine):
    """:class:`~harness.target.engine.api.AsyncEngine` whose step loop runs in a child process.

    Constructing it starts the child and waits until the model is loaded (a setting the child
    refuses is raised here as the same :class:`HarnessError`); :meth:`start` starts reading its
    frames, :meth:`shutdown` closes the channel and waits for the child to exit.
    """

    def __init__(self, settings: EngineSettings, *, on_death: Callable[[str], None] | None = None) -> None:
        self.placement: Placement = plan(settings.bind_cores, settings.cpu_threads)
        self.on_death = on_death
        """Called once, from the reader thread, with the failure when the child dies unasked."""
        parent, child = socket.socketpair()
        self._sock = parent
        self._send_lock = threading.Lock()
        self._closing = False
        self._resets: dict[int, Callable[[int | BaseException], None]] = {}
        self._next_reset = 0
        self._seen = 0
        self._stats = EngineStats()
        self._reader: threading.Thread | None = None
        env = dict(os.environ)
        spin_briefly(env)  # the engine's compute threads: see placement.SPIN_COUNT
        with child:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "harness.target.engine.worker", "--fd", str(child.fileno())],
                pass_fds=(child.fileno(),), env=env,
            )  # fmt: skip
        try:
            wire.send(parent, {"settings": settings.model_dump(mode="json")})
            hello = wire.recv(parent)
        except (OSError, wire.ChannelClosed):  # it crashed while loading: its traceback is above
            self._reap()
            raise UnavailableError(
                self._exit_text("while loading the model"), hint="its output above says why"
            ) from None
        if "fatal" in hello:
            self._reap()
            raise wire.error_in(hello["fatal"])
        ready = hello["ready"]
        tokenizer = (
            preset_tokenizer() if settings.model_dir is None else checkpoint_tokenizer(settings.model_dir)
        )
        super().__init__(
            ready["model_name"], RequestLimits(**ready["limits"]), tokenizer, settings.max_waiting
        )
        self._stats = wire.stats_in(ready["stats"])
        self.pid = self.proc.pid

    # ---- StreamingEngine ------------------------------------------------------------------------
    def _post(self, kind: str, payload: object) -> None:
        if kind == "add":
            rid, prompt, params, use_prefix_cache, priority = cast("AddCommand", payload)
            message: list[Any] = ["add", rid, prompt, wire.params_out(params), use_prefix_cache, priority]
        else:
            message = [kind, payload]
        try:
            with self._send_lock:
                wire.send(self._sock, message)
        except OSError:  # the child is gone: the reader thread fails every stream, this one included
            if kind == "add":
                self._deliver(
                    str(message[1]), EngineError(self._stats.failure or "the engine process is gone")
                )

    def _adds_seen(self) -> int:
        return self._seen

    def _loop_stats(self) -> EngineStats:
        return self._stats

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._reader is not None:
            return
        self._reader = threading.Thread(target=self._read, name="engine-channel", daemon=True)
        self._reader.start()
        self._started = True

    async def shutdown(self) -> None:
        """Close the channel (the child finishes its step, fails what is in flight and exits)."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._reap)
        if self._reader is not None:
            await loop.run_in_executor(None, self._reader.join, 10.0)
        self._sock.close()
        self._started = False

    def _reap(self, timeout: float = 10.0) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("the engine process did not exit within %.0f s; killing it", timeout)
            self.proc.kill()
            self.proc.wait()

    def _exit_text(self, when: str) -> str:
        code = self.proc.poll()
        how = (
            "is gone"
            if code is None
            else (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
        )
        return f"the engine process (pid {self.proc.pid}) {how} {when}"

    async def reset_prefix_cache(self) -> int:
        if not self._started:
            raise EngineError("the engine is not started")
        if self._stats.failure is not None:
            raise EngineError(self._stats.failure)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        with self._lock:
            token = self._next_reset
            self._next_reset += 1
            self._resets[token] = reply_on(loop, done)
        self._post("reset", token)
        return await done

    # ---- the reader thread ----------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                frame = wire.recv(self._sock)
                kind = frame[0]
                if kind == "step":
                    _, events, stats, seen = frame
                    self._stats = wire.stats_in(stats)
                    self._seen = seen
                    if events:
                        self._deliver_step([wire.event_in(e) for e in events])
                elif kind == "refused":
                    self._deliver(frame[1], wire.error_in(frame[2]))
                elif kind == "reset":
                    _, token, result = frame
                    with self._lock:
                        reply = self._resets.pop(token, None)
                    if reply is not None:
                        reply(result if isinstance(result, int) else wire.error_in(result))
        except (OSError, wire.ChannelClosed):
            pass
        if self._closing:
            failure = "the engine shut down"
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2.0)  # its exit code names the death (a kill, an OOM)
            failure = self._exit_text("while serving")
            log.error("%s", failure)
        self._stats = EngineStats(
            **{**wire.stats_out(self._stats), "running": 0, "waiting": 0, "failure": failure}
        )
        error = EngineError(failure)
        self._fail_streams(error)
        with self._lock:
            replies, self._resets = list(self._resets.values()), {}
        for reply in replies:
            reply(error)
        if not self._closing and self.on_death is not None:
            self.on_death(failure)
