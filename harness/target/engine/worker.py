"""The engine process's own side (``python -m harness.target.engine.worker --fd N``, started by
:class:`~harness.target.engine.process.ProcessAsyncEngine`): read the settings, load the model, say
ready, run the step loop until the channel closes.

Its own module, not :mod:`.process`: the front end's module never imports the model's code
(:mod:`.factory`, torch), and this one needs nothing of the front end's.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import threading
from pathlib import Path

from harness.common.errors import HarnessError
from harness.target.engine import wire
from harness.target.engine.async_engine import AddCommand, StepLoop
from harness.target.engine.factory import create_core
from harness.target.engine.placement import enter_compute, plan
from harness.target.engine.settings import EngineSettings


def _serve(sock: socket.socket) -> None:
    """The engine process: load, say ready, run the step loop until the channel closes."""
    first = wire.recv(sock)
    settings = EngineSettings.model_validate(first["settings"])
    # Before the first torch call (loading the model): the process's OpenMP team is created bound.
    enter_compute(plan(settings.bind_cores, settings.cpu_threads))
    try:
        core, loaded = create_core(settings)
    except HarnessError as exc:
        wire.send(sock, {"fatal": wire.error_out(exc)})
        return
    if settings.engine_nice:
        # The front end's work is short and waited on (a cache hit, an SSE write); the engine's is
        # long: when both want a core, the kernel runs the front end first (see EngineSettings).
        # Only now, once loaded: loading measures nothing, and at a lower priority beside a busy
        # neighbour it would take minutes.
        _lower_priority(settings.engine_nice)
    send_lock = threading.Lock()

    def put(message: object) -> None:
        with send_lock, contextlib.suppress(OSError):  # the front end is gone: the loop stops below
            wire.send(sock, message)

    step_loop = StepLoop(
        core,
        lambda events, stats: put(
            ["step", [wire.event_out(e) for e in events], wire.stats_out(stats), step_loop.adds_seen]
        ),
        lambda rid, exc: put(["refused", rid, wire.error_out(exc)]),
    )
    put(
        {
            "ready": {
                "model_name": settings.model_name or loaded.name,
                "limits": {
                    "max_model_len": core.limits.max_model_len,
                    "vocab_size": core.limits.vocab_size,
                    "vocab_limit": core.limits.vocab_limit,
                },
                "stats": wire.stats_out(core.stats()),
            }
        }
    )
    stop = threading.Event()

    def read() -> None:
        """Frames in → the step loop's inbox; the channel closing stops the loop."""
        try:
            while True:
                frame = wire.recv(sock)
                kind = frame[0]
                if kind == "add":
                    _, rid, prompt, params, use_prefix_cache, priority = frame
                    add: AddCommand = (rid, prompt, wire.params_in(params), use_prefix_cache, priority)
                    step_loop.post("add", add)
                elif kind == "abort":
                    step_loop.post("abort", frame[1])
                elif kind == "reset":
                    token = frame[1]
                    step_loop.post(
                        "reset_prefix_cache",
                        lambda result, token=token: put(
                            ["reset", token, result if isinstance(result, int) else wire.error_out(result)]
                        ),
                    )
        except (OSError, wire.ChannelClosed):
            pass
        stop.set()
        step_loop.post("wake")

    threading.Thread(target=read, name="engine-channel", daemon=True).start()
    step_loop.run(stop)


def _lower_priority(by: int) -> None:
    """Lower this process's CPU priority by ``by`` (nice). On Linux niceness belongs to each thread:
    every thread there now (the OpenMP team loading started) is lowered, and threads started later
    inherit it from the one that starts them."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        if hasattr(os, "nice"):
            os.nice(by)
        return
    for task in tasks.iterdir():
        tid = int(task.name)
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="harness's engine process (started by harness serve)")
    parser.add_argument("--fd", type=int, required=True, help="the socket to the server")
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group: the server shuts down and closes the
    # channel, which ends this process after its step (no second traceback from here).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="engine process: %(levelname)s %(message)s")
    sock = socket.socket(fileno=args.fd)
    try:
        _serve(sock)
    finally:
        sock.close()
    os._exit(0)  # no interpreter teardown of torch's thread pools: the server waits for this exit


if __name__ == "__main__":
    main()
