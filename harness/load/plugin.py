"""The load stage inside a Locust process: the process state and Locust's event hooks, which create
and end each test's :class:`~harness.load.loadrun.LoadRun`.

Importing this module (the locustfiles do, through :mod:`harness.load.user`) registers event
listeners on Locust's global ``events``:

``init_command_line_parser``
    adds the load options (:func:`harness.load.options.add_arguments`).
``init``
    validates the options and input files early (a bad corpus, or none given headless, fails before
    any user spawns, with the documented exit code), registers the custom messages, mounts the web UI
    tab (:mod:`harness.load.web`, handed :func:`current`), and makes SIGTERM stop the run the way
    Ctrl-C does (see :func:`_sigterm_as_ctrl_c`).
``test_start``
    builds the :class:`~harness.load.loadrun.LoadRun` of this process and starts it.
``test_stop``
    finalizes: ``records.jsonl`` closed and ``summary.json`` written atomically, marked
    ``interrupted`` unless every arrival was sent and answered (or the ladder ended); the exit code
    goes to ``environment.process_exit_code``.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import gevent
import locust  # noqa: F401  (patches gevent before requests/urllib3, which the OTLP exporter uses)
from locust import events
from locust.env import Environment

from harness.common.errors import ConfigError, ExitCode, HarnessError
from harness.load.arrivals import (
    Segment,
)
from harness.load.inputs import Inputs
from harness.load.loadrun import LoadRun, process_role
from harness.load.messages import (
    Batch,
    listen_master,
    listen_worker,
)
from harness.load.options import LoadOptions, add_arguments
from harness.load.web import mount

log = logging.getLogger("harness.load")


class _State:
    run: LoadRun | None = None
    runs: int = 0
    """Tests started in this process (a web UI session may run several)."""
    checked: Inputs | None = None
    """The inputs ``init`` read and checked: the first test start hands them on instead of reading
    the corpus and schedule again (a web UI start with other files reads those)."""


STATE = _State()


def current() -> LoadRun | None:
    """The run of this process, once its test started."""
    return STATE.run


def _results_dir(base: Path, n: int) -> Path:
    # A second test in the same process (web UI) must not overwrite the first one's results.
    return base if n <= 1 else base.with_name(f"{base.name}-{n}")


def _is_ladder(env: Environment) -> bool:
    return bool(getattr(env.shape_class, "ladder", False))


def _fail(env: Environment, exc: HarnessError) -> None:
    log.error("harness: error: %s", exc)
    env.process_exit_code = int(exc.exit_code)
    if env.runner is not None:
        gevent.spawn(env.runner.quit)


def _on_parser(parser: Any, **_kw: Any) -> None:
    add_arguments(parser)


def _on_init(environment: Environment, **_kw: Any) -> None:
    env = environment
    if env.parsed_options is None:
        return
    role = process_role(env)
    if role != "worker" and env.parsed_options.headless and not env.host:
        sys.stderr.write("harness: error: --host: no target: give its base URL (http://127.0.0.1:8000)\n")
        sys.exit(int(ExitCode.CONFIG))
    # Headless, the inputs are checked (a missing --corpus too) before Locust spawns a user; the web
    # UI may still be given them in its form.
    if role != "worker" and (env.parsed_options.headless or getattr(env.parsed_options, "corpus", None)):
        try:  # fail before any load, with the documented exit code
            opts = LoadOptions.from_namespace(env.parsed_options)
            STATE.checked = Inputs.load(opts, ladder=_is_ladder(env))
        except HarnessError as exc:
            sys.stderr.write(f"harness: error: {exc}\n")
            sys.exit(int(exc.exit_code))
    if role != "worker" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm_as_ctrl_c)
    if env.runner is not None and role == "master":
        listen_master(env.runner, _on_records)
    if env.runner is not None and role == "worker":
        listen_worker(env.runner, _on_segments, _on_stop)
    if env.web_ui is not None:
        mount(env, current)


def _sigterm_as_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does: the run stops, finalized, exit 130.

    Headless, Locust installs its own SIGTERM handler only after a ``LoadTestShape`` run has
    returned; until then SIGTERM (a CI job's timeout, ``kill``, a launcher whose child inherited
    SIGINT ignored) would end the process where it stood, with no ``summary.json``. Locust's later
    handler, where it installs one, replaces this one and also shuts down gracefully.
    """
    raise KeyboardInterrupt


def _on_records(batch: Batch) -> None:
    run = STATE.run
    if run is not None:
        run.receive(batch)


def _on_segments(segs: list[Segment], final: bool) -> None:
    run = STATE.run
    if run is not None:
        run.control.apply_segments(segs, final=final)


def _on_stop(reason: str) -> None:
    run = STATE.run
    if run is not None:
        run.control.stop(reason)


def _on_test_start(environment: Environment, **_kw: Any) -> None:
    env = environment
    role = process_role(env)
    try:
        if role != "worker" and not env.host:  # the web UI's form may leave it empty too
            raise ConfigError(
                "no target: give its base URL with --host (http://127.0.0.1:8000)", field="--host"
            )
        opts = LoadOptions.from_namespace(env.parsed_options)
        ladder, posts = _is_ladder(env), role != "worker"
        # Once: a later test of a web UI session reads the files again (they may have been rebuilt).
        checked, STATE.checked = STATE.checked, None
        same_files = checked is not None and (opts.corpus, opts.schedule) == (
            checked.opts.corpus,
            checked.opts.schedule,
        )
        if checked is not None and same_files:
            inputs = checked.with_options(opts, ladder=ladder, posts_preload=posts)
        else:
            inputs = Inputs.load(opts, ladder=ladder, posts_preload=posts)
    except HarnessError as exc:
        STATE.run = None
        _fail(env, exc)
        return
    STATE.runs += 1
    run = LoadRun(env, inputs, role, _results_dir(opts.results_dir, STATE.runs))
    STATE.run = run
    try:
        run.start()
    except HarnessError as exc:
        STATE.run = None
        _fail(env, exc)


def _on_test_stop(environment: Environment, **_kw: Any) -> None:
    run = STATE.run
    if run is None:
        return
    summary = run.finalize()
    if summary is None:
        return
    if summary.interrupted:
        environment.process_exit_code = int(ExitCode.INTERRUPTED)
    elif summary.target_died is not None:
        # Named as such, not as N failed requests (docs/exit-codes.md).
        environment.process_exit_code = int(ExitCode.TARGET_DIED)
    elif any(w.missing for w in summary.workers):
        # A share of the schedule was never sent: what was measured is not the load asked for.
        environment.process_exit_code = int(ExitCode.UNJUDGEABLE)
    elif run.ladder is not None:
        environment.process_exit_code = int(ExitCode.CHECK_FAILED if run.ladder.stopped else ExitCode.OK)


def _on_quitting(environment: Environment, **_kw: Any) -> None:
    # Ctrl-C / SIGTERM while the test still runs: the exit code is read right after this event,
    # before the runner stops (test_stop then writes the summary marked interrupted).
    run = STATE.run
    if run is not None and not run.finalized and not run.completed:
        environment.process_exit_code = int(ExitCode.INTERRUPTED)


# Locust's EventHook is untyped; registered once, when a locustfile imports the load stage.
for _hook, _listener in (
    (events.init_command_line_parser, _on_parser),
    (events.init, _on_init),
    (events.test_start, _on_test_start),
    (events.test_stop, _on_test_stop),
    (events.quitting, _on_quitting),
):
    _hook.add_listener(_listener)  # type: ignore[no-untyped-call]
