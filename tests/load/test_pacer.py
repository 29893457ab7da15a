"""The pacer in a gevent loop: order, the end mark, a backlog, and stop() (no timing assertions)."""

from __future__ import annotations

import time

import gevent

from harness.load.arrivals import Arrival, ListArrivals, RateArrivals, Segment
from harness.load.pacer import Pacer


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
