"""Load shapes: they size the user pool and end the test; arrivals come from the pacer.

Locust's ``LoadTestShape`` sets user counts, which in a closed loop *is* the load. Here users are
only the concurrency pool (:mod:`harness.load.pacer`), so the shapes return a constant user count
(``--concurrency`` per process) and end the test when the run says it is over. Each tick asks the
run (:meth:`harness.load.loadrun.LoadRun.advance`), which applies ``--run-time`` as a cap and steps the
warmup ladder (:mod:`harness.load.control`); the shapes themselves change nothing of the run.
:class:`LadderShape` differs only in telling the run, through ``ladder``, to load the ``--plan``.
"""

from __future__ import annotations

from typing import ClassVar

import locust  # noqa: F401  (gevent's monkey-patching, before anything does I/O)
from locust import LoadTestShape
from locust.runners import MasterRunner

from harness.common.errors import HarnessError
from harness.load import plugin
from harness.load.options import LoadOptions

MIN_SPAWN_RATE = 100.0
"""Users per second at least (users are cheap: they only wait on the pacer's queue); above 100 Locust
warns, so the rate only goes higher when the pool would otherwise not be up within half the start delay."""


TICK_WAIT_S = 0.9
"""How long a tick may wait for the run's last answer: within Locust's one-second tick."""


def spawn_rate(users: int, start_delay: float) -> float:
    """Spawn the whole pool within half the start delay (the epoch), at ≥ :data:`MIN_SPAWN_RATE`/s."""
    return max(MIN_SPAWN_RATE, users / max(0.5 * start_delay, 0.05))


class ReplayShape(LoadTestShape):
    """Keeps ``--concurrency`` users per process until the replay is done."""

    ladder: ClassVar[bool] = False
    use_common_options = True  # reads --run-time as a cap

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._started = False
        self._first: tuple[int, float] = (0, MIN_SPAWN_RATE)
        self._csv = False

    def tick(self) -> tuple[int, float] | None:
        run = plugin.current()
        if run is None or not self._started:
            if self._started:
                return None  # test_start failed (the error is logged, the exit code set)
            # The first tick starts the test (test_start builds the run): size the pool already.
            self._started = True
            env = self.runner.environment if self.runner is not None else None
            self._csv = bool(getattr(env.parsed_options if env is not None else None, "csv_prefix", None))
            users, delay = self._initial_users()
            self._first = (users, spawn_rate(users, delay))
            return self._first
        if not run.started:
            # Locust fires test_start in its spawning greenlet and ticks on meanwhile: while the run
            # is still setting up (posting a preload can take seconds) keep the pool, judge nothing.
            return self._first
        # Locust ticks a shape once a second (it sleeps what is left of the second after the tick):
        # waiting here for the last answer ends a finished run when it finishes, not up to a second
        # later, and leaves the cadence of the ticks (the ladder's, the --run-time cap's) as it was.
        # Not with Locust's --csv: its writer rewrites the files once a second and not at the end, so
        # a test that ended at once would leave out the last second's requests (it ticks just before
        # the shape, so ending on a tick, as before, leaves out at most what ended in between).
        if not self._csv:
            run.wait_settled(TICK_WAIT_S)
        if run.finalized or run.advance(self.get_run_time()):  # type: ignore[no-untyped-call]
            return None
        users = run.users()
        return users, spawn_rate(users, run.opts.start_delay)

    def reset_time(self) -> None:
        super().reset_time()  # type: ignore[no-untyped-call]
        self._started = False  # a new test (web UI) starts again from its first tick

    def _initial_users(self) -> tuple[int, float]:
        runner = self.runner
        env = runner.environment if runner is not None else None
        po = env.parsed_options if env is not None else None
        # The options as the run reads them (cached; bad options are the run's error, not this tick's).
        try:
            opts = LoadOptions.from_namespace(po) if po is not None else LoadOptions()
        except HarnessError:
            opts = LoadOptions()
        concurrency, delay = opts.concurrency, opts.start_delay
        workers = getattr(runner, "worker_count", 1) if isinstance(runner, MasterRunner) else 1
        return concurrency * max(1, workers), delay


class LadderShape(ReplayShape):
    """The warmup ladder of ``--plan``: stages, rollback, retry or stop."""

    ladder: ClassVar[bool] = True
