"""The pacer in a gevent loop: order, the end mark, a backlog, and stop() (no timing assertions)."""

from __future__ import annotations

import time

import gevent
import pytest

from harness.load.arrivals import Arrival, ListArrivals, RateArrivals, Segment
from harness.load.pacer import Handover, Pacer, Taken, queue_wait_s


def consume(p: Pacer, out: list[Arrival], hold_s: float = 0.0) -> None:
    while (a := p.take()) is not None:
        out.append(a)
        if hold_s:
            gevent.sleep(hold_s)
        p.done()


def test_every_arrival_is_released_in_order_and_every_user_sees_the_end() -> None:
    arrivals = [Arrival(i, i * 0.002, i % 3) for i in range(50)]
    p = Pacer(ListArrivals(arrivals), lead_s=0.0005)
    got: list[Arrival] = []
    users = [gevent.spawn(consume, p, got) for _ in range(4)]
    p.start(time.perf_counter() + 0.01)
    assert gevent.joinall(users, timeout=60) and all(u.dead for u in users)
    assert [a.seq for a in got] == list(range(50))
    assert p.drained and p.released == p.taken == 50 and p.in_flight == 0


def test_settled_is_set_when_the_last_request_taken_is_answered_and_not_before() -> None:
    """What the shape waits on to end a finished run at once: the source exhausted *and* every
    request taken answered; the last one still in flight keeps it unset."""
    p = Pacer(ListArrivals([Arrival(i, 0.0, 0) for i in range(3)]), lead_s=0.0)
    p.start(time.perf_counter())
    taken = [p.take() for _ in range(3)]
    assert all(t is not None for t in taken) and p.take() is None  # the end mark: source exhausted
    p.done()
    p.done()
    assert p.finished.is_set() and not p.settled.is_set() and p.in_flight == 1
    p.done()
    assert p.drained and p.settled.wait(timeout=10)
    stopped = Pacer(ListArrivals([Arrival(0, 3600.0, 0)]))
    stopped.start(time.perf_counter())
    stopped.stop()  # nothing taken, nothing in flight: settled at the end mark
    assert stopped.settled.is_set()


def test_a_busy_pool_keeps_intended_times_and_the_backlog_drains() -> None:
    # One user that holds each request 5 ms against arrivals every 1 ms: arrivals wait, never vanish.
    src = RateArrivals(5)
    src.set_segments([Segment(0.0, 0.05, 1000.0)])
    p = Pacer(src, lead_s=0.0)
    got: list[Arrival] = []
    user = gevent.spawn(consume, p, got, 0.005)
    p.start(time.perf_counter())
    assert gevent.joinall([user], timeout=60)
    assert len(got) == 50 and [a.intended_s for a in got] == sorted(a.intended_s for a in got)
    assert got[-1].intended_s < 0.05  # the schedule, not the pool, set the times


def test_wait_until_never_lets_a_request_leave_early() -> None:
    """Arrivals are handed over up to the lead ahead of time; the send waits for the intended time."""
    arrivals = [Arrival(i, 0.05 + i * 0.02, 0) for i in range(5)]
    p = Pacer(ListArrivals(arrivals), lead_s=0.005)
    sent: list[float] = []

    def user() -> None:
        while (a := p.take()) is not None:
            p.wait_until(a.intended_s)
            sent.append(p.now_s() - a.intended_s)
            p.done()

    u = gevent.spawn(user)
    p.start(time.perf_counter())
    assert gevent.joinall([u], timeout=60) and len(sent) == 5
    assert all(s >= 0 for s in sent)


def test_stop_drops_what_was_not_taken_and_releases_waiting_users() -> None:
    src = RateArrivals(5)
    src.set_segments([Segment(0.0, 1000.0, 10.0)], final=False)
    p = Pacer(src)
    p.start(time.perf_counter() + 3600)  # nothing is due for an hour
    waiting = [gevent.spawn(p.take) for _ in range(3)]
    gevent.sleep(0)  # let them block in take(); the end mark reaches late takers too
    p.stop()
    assert gevent.joinall(waiting, timeout=10) and [w.value for w in waiting] == [None, None, None]
    assert p.finished.is_set() and p.drained


# ------------------------------------------------------------------------- why an arrival was late


def test_an_arrival_no_free_user_could_take_waited_in_the_queue() -> None:
    """One user holds the first arrival until the pacer released every other one: those found no
    free user, so the time until they were taken is queue wait (never more than their lateness)."""
    arrivals = [Arrival(i, 0.001 * i, 0) for i in range(6)]
    p = Pacer(ListArrivals(arrivals), lead_s=0.0)
    got: list[tuple[Taken, float]] = []

    def user() -> None:
        while (t := p.take_handover()) is not None:
            got.append((t, p.now_s()))
            if len(got) == 1:
                p.finished.wait()  # busy until everything was released
            p.done()

    u = gevent.spawn(user)
    gevent.sleep(0)  # the user waits in take() before the first release
    p.start(time.perf_counter())
    assert gevent.joinall([u], timeout=60) and len(got) == 6
    first, _ = got[0]
    assert first.queue_wait_s == 0.0  # a user was free: whatever lateness it has is the client's own
    for t, taken_at in got[1:]:
        assert 0.0 < t.queue_wait_s <= taken_at - t.arrival.intended_s


def test_users_waiting_for_a_backlog_take_it_without_queue_wait() -> None:
    """Four users wait; five overdue arrivals are released in one burst (the hub hands them over
    only after it). The first four found a free user each and did not wait for one; the fifth did."""
    arrivals = [Arrival(i, 0.0, 0) for i in range(5)]
    p = Pacer(ListArrivals(arrivals))
    waits: dict[int, float] = {}

    def user() -> None:
        while (t := p.take_handover()) is not None:
            waits[t.arrival.seq] = t.queue_wait_s
            p.done()

    users = [gevent.spawn(user) for _ in range(4)]
    gevent.sleep(0)  # every user blocks in take()
    p.start(time.perf_counter() - 1.0)  # all are a second overdue
    assert gevent.joinall(users, timeout=60) and len(waits) == 5
    assert [waits[i] for i in range(4)] == [0.0] * 4 and waits[4] > 0.0


def test_queue_wait_formula() -> None:
    a = Arrival(0, 1.0, 0)
    epoch = 100.0
    due = epoch + 1.0
    # Busy at release: from the later of release and intended time until taken.
    assert queue_wait_s(Handover(a, due - 0.003, due - 0.003, True), due + 0.5, epoch) == 0.5
    assert queue_wait_s(Handover(a, due + 0.1, due + 0.1, True), due + 0.5, epoch) == pytest.approx(0.4)
    # A free user: no queue wait, however late it was taken (the client's own lateness).
    assert queue_wait_s(Handover(a, due + 0.1, due + 0.1, False), due + 0.5, epoch) == 0.0
    # The pacer was held by a full queue until due + 0.3 and released it at due + 0.31: the hold is
    # the users' backpressure, released counts from intended + 0.01, so only those 10 ms are its own.
    h = Handover(a, due + 0.01, due + 0.31, False)
    assert queue_wait_s(h, due + 0.32, epoch) == pytest.approx(0.30)
    h = Handover(a, due + 0.01, due + 0.31, True)
    assert queue_wait_s(h, due + 0.5, epoch) == pytest.approx(0.49)
