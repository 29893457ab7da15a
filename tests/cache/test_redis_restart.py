"""The embedded Redis is supervised: killed for real (SIGKILL), it is started again in the same
directory with the same persistence, the restart is counted in the metrics, and L2 serves again.

Every wait is on an event the code offers (``EmbeddedRedis.wait_restarted``, ``stack.drain``)
under a generous deadline; nothing sleeps or measures time.
"""

from __future__ import annotations

import asyncio
import os
import signal

from tests.cache.conftest import StackFactory, chat, completion, l2_of, redis_of


async def killed(stack, restarts: int = 1) -> int:
    """SIGKILL the stack's Redis; return the new pid once the supervisor has it answering again."""
    embedded = redis_of(stack)
    old = embedded.pid
    os.kill(old, signal.SIGKILL)
    assert await asyncio.to_thread(embedded.wait_restarted, restarts, 60.0), "Redis was not restarted"
    assert embedded.alive() and embedded.pid != old
    return embedded.pid


def restarts_metric(stack) -> float:
    return stack.metrics.registry.get_sample_value("cache_redis_restarts_total") or 0.0


async def test_killed_redis_is_restarted_and_l2_serves_again(make_stack: StackFactory) -> None:
    stack = await make_stack()  # persistence "none": a restarted Redis is empty
    body = chat("Which tier answers after a crash?")
    await stack.put("chat.completions", body, "default", completion("before the crash"))
    await stack.flush("l1")
    assert (await stack.begin("chat.completions", body, "default")).status == "HIT-L2"
    socket_path = redis_of(stack).socket_path
    pid = await killed(stack)
    assert redis_of(stack).socket_path == socket_path  # same directory, same socket
    assert restarts_metric(stack) == 1
    l2 = stack.stats()["tiers"]["l2"]
    assert l2["embedded_pid"] == pid and l2["embedded_restarts"] == 1 and l2["breaker"] == "closed"
    await stack.flush("l1")
    miss = await stack.begin("chat.completions", body, "default")
    assert miss.status == "MISS"  # the data died with the process …
    await stack.finish(miss, completion("after the crash"))
    assert await stack.drain() == 0  # … and the write-back reaches the new one
    await stack.flush("l1")
    hit = await stack.begin("chat.completions", body, "default")
    assert hit.status == "HIT-L2" and hit.completion is not None
    assert hit.completion.text == "after the crash"
    assert stack.metrics.counts["l2"]["errors"] == 0  # the stack reconnected before using L2 again


async def test_aof_persistence_brings_the_data_back(make_stack: StackFactory) -> None:
    stack = await make_stack(redis_persistence="aof")
    body = chat("Does an append-only file survive kill -9?")
    await stack.put("chat.completions", body, "default", completion("it does"))
    await killed(stack)
    await stack.flush("l1")
    hit = await stack.begin("chat.completions", body, "default")
    assert hit.status == "HIT-L2" and hit.completion is not None and hit.completion.text == "it does"


async def test_every_death_is_restarted_and_counted(make_stack: StackFactory) -> None:
    stack = await make_stack(redis_restart_backoff_s=0.01)
    body = chat("twice")
    for n in (1, 2):
        await killed(stack, restarts=n)
        assert restarts_metric(stack) == n
    await stack.put("chat.completions", body, "default", completion("x"))
    await stack.flush("l1")
    assert (await stack.begin("chat.completions", body, "default")).status == "HIT-L2"
    assert l2_of(stack).breaker.state == "closed"


async def test_stop_ends_the_supervision(make_stack: StackFactory) -> None:
    stack = await make_stack()
    embedded = redis_of(stack)
    proc = embedded.proc
    assert proc is not None and embedded._supervisor is not None
    supervisor = embedded._supervisor
    await stack.close()
    assert proc.poll() is not None and not embedded.alive()  # stopped, not restarted
    assert not supervisor.is_alive() and embedded.restarts == 0


async def test_no_supervisor_when_restarts_are_off(make_stack: StackFactory) -> None:
    stack = await make_stack(redis_restart=False)
    assert redis_of(stack)._supervisor is None
