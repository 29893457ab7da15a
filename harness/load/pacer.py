"""The open-loop pacer: one greenlet per process releases arrivals at their intended times.

Locust's ``wait_time``, ``constant_pacing`` and ``LoadTestShape`` are closed-loop: a user sends its
next request when its previous one finished, so a slow server silently lowers the offered load
(coordinated omission). Here the schedule decides: the pacer puts each :class:`Arrival` on a queue
at its intended time on the monotonic clock, whatever earlier responses did, and the Locust users
are only the concurrency pool that takes from the queue (k6's constant-arrival-rate model). When
every user is busy an arrival waits in the queue; the user that finally takes it measures
``sent − intended`` as lateness, and the ``*_from_intended_ms`` latencies include the wait.

Precision: gevent's libev loop rounds timer waits up to whole milliseconds (epoll's resolution), and
a long wait overshoots in proportion to its length (measured here: about 3 %, so a 250 ms wait wakes
5–9 ms late; 10 ms waits < 1 ms). Preparing a request (headers, trace context) takes a few hundred
microseconds too, milliseconds after an idle spell. So the pacer naps in steps of at most
:data:`MAX_NAP_S` and hands each arrival over ``lead_s`` (after idleness :data:`IDLE_LEAD_S`)
*before* its intended time; the user that takes it prepares
the request, then :meth:`Pacer.wait_until` the intended time, yielding in a loop
(``gevent.sleep(0)``: other greenlets keep running), and sends. The yield loop's idle time is counted
(:attr:`Pacer.idle_spin_s`) so that the client's CPU figure can leave it out: a busy-wait is not load.

Why a request was late: each arrival goes on the queue wrapped in a :class:`Handover` stamped with
its release time and whether a user was waiting for it (blocked in :meth:`Pacer.take_handover`).
When none was, every user was busy with an earlier request: the time from release (or from the
intended time, if later) until a user took it is **queue wait**, the target's backpressure, and the
``*_from_intended`` latencies rightly include it. When a user was waiting, any delay is the client's
own (the pacer or the user woke late: CPU, scheduling). While the queue is full the pacer itself is
held by busy users; the arrivals it could not release meanwhile count that hold as queue wait too,
not as the pacer's lateness. :meth:`Pacer.take_handover` returns the queue wait with the arrival.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import gevent
from gevent.event import Event
from gevent.queue import Queue

from harness.load.arrivals import Arrival, ArrivalSource

QUEUE_LIMIT = 4096
"""Arrivals released but not yet taken, at most. Beyond it the pacer waits for users; every arrival
keeps its intended time, so lateness stays truthful, but an overloaded client holds bounded memory."""
_YIELD_EVERY = 32
"""While releasing a backlog of overdue arrivals, let the users run after this many."""
MAX_NAP_S = 0.01
"""Longest single timer wait: short enough that its overshoot stays well under ``lead_s`` (see
above), long enough that an idle pacer wakes only 100 times a second."""
IDLE_AFTER_S = 0.1
IDLE_LEAD_S = 0.02
"""An arrival that follows ``IDLE_AFTER_S`` without a release is handed over ``IDLE_LEAD_S`` ahead:
measured on a 2-core VM, the same code ran 5–20× slower in the first milliseconds after 250 ms of
idleness, and the run's first request was 7–15 ms late with the ordinary lead."""
_IDLE_YIELD_S = 50e-6
"""A ``sleep(0)`` that returns faster than this ran no other greenlet: count it as idle spinning."""


@dataclass(slots=True)
class Handover:
    """An arrival on the queue, stamped by the pacer as it released it."""

    arrival: Arrival
    released: float
    """``perf_counter`` when the pacer released it, less any time the pacer was held by a full queue
    after the arrival was due (that hold is the users', not the pacer's, lateness)."""
    put: float
    """``perf_counter`` when the pacer began to put it on the queue (a full queue then blocks it)."""
    busy: bool
    """No user was waiting for an arrival: every user was busy (target backpressure)."""


@dataclass(slots=True)
class Taken:
    """What a user takes: the arrival, and how long it waited for a free user."""

    arrival: Arrival
    queue_wait_s: float
    """The part of the arrival's lateness spent waiting for a free user (0 when a user was free)."""


def queue_wait_s(h: Handover, taken: float, epoch: float) -> float:
    """Seconds of ``h``'s lateness spent waiting for a free user, if it was taken at ``taken``.

    Busy at release: ``taken − max(released, intended)``, where ``released`` already left out a hold
    by a full queue. A user was free: only that hold (``put − max(released, intended)``), normally 0.
    """
    start = max(h.released, epoch + h.arrival.intended_s)
    return max(0.0, (taken if h.busy else h.put) - start)


class Pacer:
    """Releases ``source``'s arrivals at ``epoch + intended_s`` (``perf_counter`` seconds)."""

    def __init__(self, source: ArrivalSource, *, lead_s: float = 0.003) -> None:
        self.source = source
        self.lead_s = max(0.0, lead_s)
        self.epoch = math.nan
        self.queue: Queue[Handover | None] = Queue(QUEUE_LIMIT)
        self._wake = Event()
        self._greenlet: gevent.Greenlet[[], None] | None = None
        self.finished = Event()
        """Set when the source is exhausted (or :meth:`stop` was called) and the queue got its end mark."""
        self.settled = Event()
        """Set once :attr:`drained`: the last request taken has been answered (the run may end now)."""
        self.released = 0
        self.taken = 0
        self.in_flight = 0
        self.idle_spin_s = 0.0
        self._idle_until = -math.inf
        self._waiting = 0
        """Users blocked in :meth:`take_handover` (gevent's compiled queue does not expose its getters)."""
        self.dropped = 0
        """Arrivals released but never taken because the run was stopped (a ``--run-time`` cap)."""

    def start(self, epoch: float) -> None:
        """Start releasing; ``epoch`` is the ``perf_counter`` time of offset 0."""
        self.epoch = epoch
        self._greenlet = gevent.spawn(self._run)

    def now_s(self) -> float:
        """Seconds since the epoch."""
        return time.perf_counter() - self.epoch

    def changed(self) -> None:
        """Call after changing the source (a new rate): the pacer re-reads its next arrival now."""
        self._wake.set()

    def stop(self) -> None:
        """Release nothing more and drop what users have not taken; waiting users get ``None``."""
        self.source.finish()
        if self._greenlet is not None:
            self._greenlet.kill(block=False)  # it may be waiting to put into a full queue
        while not self.queue.empty():
            if self.queue.get_nowait() is not None:
                self.dropped += 1
        self._end()

    def _end(self) -> None:
        if not self.finished.is_set():
            self.finished.set()
            self.queue.put(None)  # after the arrivals still queued (stop() emptied it first)
        if self.drained:
            self.settled.set()

    def _run(self) -> None:
        clock = time.perf_counter
        backlog = 0
        last_release = -math.inf
        held_until = -math.inf  # when the last put that found the queue full returned
        try:
            while True:
                t = self.source.peek()
                if t is None:
                    return
                if math.isinf(t):  # paused: wait for a rate change
                    self._wake.wait()
                    self._wake.clear()
                    continue
                now = clock()
                delay = self.epoch + t - now
                # After an idle spell everything runs slower for a while (the first request of a run,
                # every request of a slow schedule), so such an arrival is handed over earlier.
                lead = self.lead_s if now - last_release < IDLE_AFTER_S else max(self.lead_s, IDLE_LEAD_S)
                if delay > lead:
                    if self._wake.wait(min(delay - lead, MAX_NAP_S)):
                        self._wake.clear()
                    continue  # re-read: the source may have changed while we slept
                due = self.epoch + t
                # Stamped before the put: a put that blocks (QUEUE_LIMIT arrivals wait, no user free)
                # is backpressure and counts as queue wait. A user blocked in take() stays counted
                # in ``_waiting`` until the hub hands it an item already queued, so one is free for
                # this arrival only if more users wait than items are queued.
                full = self.queue.full()
                h = Handover(
                    self.source.pop(),
                    now - max(0.0, min(now, held_until) - due),
                    now,
                    self._waiting <= self.queue.qsize(),
                )
                self.queue.put(h)  # blocks only while QUEUE_LIMIT arrivals wait
                last_release = clock()
                if full:
                    held_until = last_release
                self.released += 1
                if delay < 0:
                    backlog += 1
                    if backlog % _YIELD_EVERY == 0:
                        gevent.sleep(0)  # a backlog must not starve the users that send it
                else:
                    backlog = 0
        finally:
            self._end()

    def wait_until(self, intended_s: float) -> None:
        """Yield until ``intended_s`` (seconds since the epoch): the last stretch before a send."""
        clock = time.perf_counter
        target = self.epoch + intended_s
        while clock() < target:
            t0 = clock()
            gevent.sleep(0)
            t1 = clock()
            if t1 - t0 < _IDLE_YIELD_S:
                # Several users may be waiting at once, each yielding to the others: count the union
                # of idle intervals, not each user's share of the same microseconds.
                start = max(t0, self._idle_until)
                if t1 > start:
                    self.idle_spin_s += t1 - start
                    self._idle_until = t1

    def take(self) -> Arrival | None:
        """Block until an arrival is (nearly: ``lead_s``) due; ``None`` when the run has no more (the
        mark is passed on). The caller prepares the request and sends it after :meth:`wait_until`."""
        t = self.take_handover()
        return t.arrival if t is not None else None

    def take_handover(self) -> Taken | None:
        """:meth:`take`, with the time the arrival waited for a free user (see the module docstring)."""
        self._waiting += 1
        try:
            h: Handover | None = self.queue.get()
        finally:
            self._waiting -= 1
        if h is None:
            self.queue.put(None)  # every waiting user must see the end
            return None
        self.taken += 1
        self.in_flight += 1
        return Taken(h.arrival, queue_wait_s(h, time.perf_counter(), self.epoch))

    def done(self) -> None:
        """A user finished the request it took (after recording it)."""
        self.in_flight -= 1
        if self.drained:
            self.settled.set()

    @property
    def queued(self) -> int:
        """Arrivals released but not yet taken (every user busy)."""
        return max(0, self.released - self.taken - self.dropped)

    @property
    def drained(self) -> bool:
        """Everything was released, taken and answered."""
        return self.finished.is_set() and self.in_flight == 0 and self.queued == 0
