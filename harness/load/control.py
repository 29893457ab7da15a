"""Run control: what reshapes or ends the sending while a run goes.

Three things change the arrivals a run releases, and they are decided here, once per second or per
shape tick, by the process that sees every record (the local one, or the master):

* the warmup ladder (:mod:`harness.load.plan`): each tick judges the running stage from the live
  view's window counts and, on a rollback or at the end, hands new rate segments to the pacer (or,
  distributed, to every worker: :func:`harness.load.messages.send_segments`);
* ``--run-time``, Locust's option, read as a cap: at the cap the pacer stops releasing and in-flight
  requests get ``--drain-timeout`` to finish;
* ``--until-precision``: once every watched percentile is known well enough, stop sending
  (distributed: :func:`harness.load.messages.send_stop`).

A worker's :class:`Control` only applies what its master decided (:meth:`Control.apply_segments`,
:meth:`Control.stop`). The shapes (:mod:`harness.load.shapes`) do not touch any of this: they ask the
run whether it is over and how many users to keep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.load.arrivals import ArrivalSource, RateArrivals, Segment
from harness.load.messages import Role, send_segments, send_stop
from harness.load.pacer import Pacer
from harness.load.plan import Ladder, WindowStats
from harness.load.precision import PrecisionTracker, describe

if TYPE_CHECKING:  # locust only for annotations: importing it monkey-patches the process (gevent)
    from locust.runners import Runner

log = logging.getLogger("harness.load")


class Control:
    """The ladder, the ``--run-time`` cap and the precision stop of one process's run."""

    def __init__(
        self,
        *,
        role: Role,
        runner: Runner | None,
        ladder: Ladder | None,
        precision: PrecisionTracker | None,
        arrivals_end_s: float,
        now: Callable[[], float],
        window: WindowStats,
        warnings: list[str],
    ) -> None:
        self.role = role
        self.runner = runner
        """Where a master sends its decisions to the workers."""
        self.ladder = ladder
        self.precision = precision
        """``--until-precision``: the watched percentiles (local / master: it holds every record)."""
        self._arrivals_end_s = arrivals_end_s
        """No arrival is intended later (a precision met after it did not stop the sending)."""
        self._now = now
        self._window = window
        self._warnings = warnings
        """The run's warnings (``summary.json``), which the cap adds to."""
        self.source: ArrivalSource | None = None
        self.pacer: Pacer | None = None
        self.stop_reason: str | None = None
        """Why sending stopped early (precision reached), set when it did."""
        self.capped = False
        """``--run-time`` stopped the sending."""
        self.halted = False
        """:meth:`halt` stopped the sending (the target died)."""

    def attach(self, source: ArrivalSource, pacer: Pacer) -> None:
        """Local / worker: the arrivals and the pacer this process sends from, once they exist."""
        self.source = source
        self.pacer = pacer

    def cap(self, elapsed_s: float, run_time_s: float | None) -> None:
        """Local / master: once ``elapsed_s`` reaches ``--run-time``, send nothing more (once)."""
        if not run_time_s or self.capped or elapsed_s < run_time_s:
            return
        self.capped = True
        self._warnings.append(f"--run-time {run_time_s} s reached: the rest of the schedule was not sent")
        if self.ladder is not None:
            self.ladder.interrupt(self._now())
            self.ladder.done = True
        if self.role == "master":
            assert self.runner is not None
            send_segments(self.runner, [], final=True)
        if self.pacer is not None:
            self.pacer.stop()

    def ladder_tick(self) -> None:
        """Local / master: advance the ladder; push changed segments to the pacer or the workers."""
        if self.ladder is None or self.ladder.done:
            return
        changed = self.ladder.tick(self._now(), self._window)
        if changed is None and not self.ladder.done:
            return
        segs = changed if changed is not None else []
        if self.ladder.done and not changed:
            segs = []
        final = self.ladder.done or self.ladder.stopped
        if self.role == "master":
            assert self.runner is not None
            send_segments(self.runner, segs, final=final)
        else:
            self.apply_segments(segs, final=final)

    def apply_segments(self, segs: list[Segment], *, final: bool) -> None:
        """Local / worker: the ladder's new rate segments replace what is left of the arrivals."""
        if isinstance(self.source, RateArrivals) and self.pacer is not None:
            self.source.set_segments(segs, final=final)
            self.pacer.changed()

    def check_precision(self) -> bool:
        """Local / master: once every watched percentile is known well enough, stop sending.

        Stopping releases no more arrivals (the pacer's queue of released-but-untaken ones is dropped,
        as at a ``--run-time`` cap); requests in flight drain as usual and the run then completes.
        """
        if self.precision is None or self.stop_reason is not None:
            return self.stop_reason is not None
        now = self._now()
        if self.capped or now > self._arrivals_end_s or (self.pacer and self.pacer.finished.is_set()):
            return False  # sending already ended (schedule, --max-duration, --run-time): not our doing
        if not self.precision.met():
            return False
        met = describe(self.precision.states())
        self.stop_reason = f"precision reached: {met} after {max(0.0, now):.1f} s"
        log.info("harness load: %s", self.stop_reason)
        if self.role == "master":
            assert self.runner is not None
            send_stop(self.runner, self.stop_reason)
        else:
            self.stop_sending()
        return True

    def halt(self, reason: str) -> None:
        """Local / master: stop sending for good, whatever the options (the target died: anything sent
        now can only fail). The ladder ends with its running stage interrupted; the run then drains
        and completes (not interrupted)."""
        if self.halted:
            return
        self.halted = True
        self.stop_reason = reason
        if self.ladder is not None:
            self.ladder.interrupt(self._now())
            self.ladder.done = True
        if self.role == "master":
            assert self.runner is not None
            send_stop(self.runner, reason)
        else:
            self.stop_sending()

    def stop(self, reason: str) -> None:
        """Worker: the master says stop sending."""
        self.stop_reason = reason
        self.stop_sending()

    def stop_sending(self) -> None:
        """Release no more arrivals (a worker told by the master, or a local run whose precision is met)."""
        if self.pacer is not None and not self.pacer.finished.is_set():
            self.pacer.stop()
