"""Stack behaviour: single-flight, tenant isolation across L1/L2, bypass rules, Bloom guard, metrics."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from prometheus_client import generate_latest

from harness.common.errors import InputError
from tests.cache.conftest import CountingEngine, StackFactory, bloom_of, chat, completion, l2_of, serve


async def test_32_concurrent_identical_requests_make_one_engine_call(make_stack: StackFactory) -> None:
    """Not a race: ``gather`` starts all 32 in one event-loop pass, and a follower's ``begin``
    reaches the single-flight wait without suspending, so all 31 are waiting before the leader's
    engine coroutine (which yields, like a decode loop) can finish, however slow the machine."""
    stack = await make_stack()
    engine = CountingEngine(delay_s=0.2)
    body = chat("Explain single-flight in one sentence.")
    results = await asyncio.gather(*(serve(stack, engine, dict(body)) for _ in range(32)))
    assert engine.calls == 1
    assert {text for _, text in results} == {"answer for default: Explain single-flight in one sentence."}
    statuses = [s for s, _ in results]
    assert statuses.count("MISS") == 1 and statuses.count("HIT-L1") == 31
    assert stack.merges == 31
    assert stack.metrics.registry.get_sample_value("cache_singleflight_merges_total") == 31


async def test_followers_take_over_when_the_leader_fails(make_stack: StackFactory) -> None:
    stack = await make_stack()
    engine = CountingEngine(delay_s=0.1, fail_first=1)  # the first generation does not complete
    body = chat("flaky generation")
    results = await asyncio.gather(*(serve(stack, engine, body) for _ in range(8)))
    assert engine.calls == 2  # the failed leader, then one new leader for the 7 followers
    assert sum(1 for _, t in results if t == "answer for default: flaky generation") == 7
    assert not stack._inflight


async def test_tenants_never_see_each_other_in_l1_and_l2(make_stack: StackFactory) -> None:
    stack = await make_stack()
    engine = CountingEngine(delay_s=0.0)
    body = chat("What is our refund policy?")
    tenants = ["acme", "globex", "a:b", "a/b"]
    for t in tenants:
        status, text = await serve(stack, engine, body, tenant=t)
        assert status == "MISS" and text == f"answer for {t}: What is our refund policy?"
    assert await stack.drain() == 0
    for tier_flush in (None, "l1"):
        if tier_flush:
            await stack.flush(tier_flush)
        for t in tenants:
            status, text = await serve(stack, engine, body, tenant=t)
            assert status in {"HIT-L1", "HIT-L2"}
            assert text == f"answer for {t}: What is our refund policy?"
    assert engine.calls == len(tenants)
    keys = {stack.keys.normalize("chat.completions", body, t).key for t in tenants}
    assert len(keys) == len(tenants)


async def test_no_cache_sampled_and_unkeyable_requests_bypass(make_stack: StackFactory) -> None:
    stack = await make_stack()
    body = chat("hello")
    await stack.put("chat.completions", body, "default", completion("stored"))
    t = await stack.begin("chat.completions", body, "default", no_cache=True)
    assert t.status == "BYPASS" and t.completion is None and t.key
    sampled = chat("hello", temperature=0.8)
    assert (await stack.begin("chat.completions", sampled, "default")).status == "BYPASS"
    seeded = chat("hello", temperature=0.8, seed=7)
    t = await stack.begin("chat.completions", seeded, "default")
    assert t.status == "MISS" and t.is_leader
    await stack.finish(t, completion("seeded answer"))
    assert (await stack.begin("chat.completions", seeded, "default")).status == "HIT-L1"
    bad = await stack.begin("chat.completions", {"messages": "nope"}, "default")
    assert bad.status == "BYPASS" and "unkeyable" in bad.context["reason"]
    stack2 = await make_stack(cache_sampled=True)
    t = await stack2.begin("chat.completions", sampled, "default")
    assert t.status == "MISS"
    await stack2.finish(t, completion("a sampled answer, cached by policy"))
    assert (await stack2.begin("chat.completions", sampled, "default")).status == "HIT-L1"


async def test_a_forced_miss_looks_nothing_up_and_stores_nothing(make_stack: StackFactory) -> None:
    """The server's ``--inject-cache-miss-rate``: a MISS although the entry is there, counted as a
    miss, no single-flight (the identical request meanwhile still leads), and its ``finish`` stores
    nothing: the next request finds the cache as the forced miss found it."""
    stack = await make_stack()
    stored = chat("stored already")
    await stack.put("chat.completions", stored, "default", completion("the stored answer"))
    for forced in (stack.begin_nowait("chat.completions", stored, "default", force_miss=True),
                   await stack.begin("chat.completions", stored, "default", force_miss=True)):  # fmt: skip
        assert forced is not None and forced.status == "MISS" and forced.completion is None
        assert not forced.is_leader and forced.key and not stack._inflight
        await stack.finish(forced, completion("another answer"))
    hit = await stack.begin("chat.completions", stored, "default")
    assert (
        hit.status == "HIT-L1" and hit.completion is not None and hit.completion.text == "the stored answer"
    )
    fresh = chat("never stored")
    forced = await stack.begin("chat.completions", fresh, "default", force_miss=True)
    leader = await stack.begin("chat.completions", fresh, "default")  # not a follower of the forced miss
    assert leader.status == "MISS" and leader.is_leader
    await stack.finish(forced, completion("not stored"))
    await stack.finish(leader, completion("stored by the leader"))
    again = await stack.begin("chat.completions", fresh, "default")
    assert again.completion is not None and again.completion.text == "stored by the leader"
    bypass = await stack.begin("chat.completions", fresh, "default", no_cache=True, force_miss=True)
    assert bypass.status == "BYPASS"  # a bypass never looks either, and says so
    assert stack.stats()["requests"] == {"MISS": 4, "HIT-L1": 2, "BYPASS": 1}  # 3 forced, 1 leader
    assert await stack.drain() == 0


async def test_storing_what_is_never_served_is_refused(make_stack: StackFactory) -> None:
    """A preload of a sampled request would warm nothing: the stack says so instead of storing it."""
    stack = await make_stack()
    sampled = chat("hello", temperature=0.8)
    reason = stack.never_served("chat.completions", sampled, "default")
    assert reason is not None and "seed" in reason
    with pytest.raises(InputError, match="never served from the cache"):
        await stack.put("chat.completions", sampled, "default", completion("x"))
    assert stack.never_served("chat.completions", chat("hello", temperature=0.8, seed=1), "default") is None
    assert "no cache key" in (stack.never_served("chat.completions", {"messages": "nope"}, "default") or "")
    stack2 = await make_stack(cache_sampled=True)
    assert stack2.never_served("chat.completions", sampled, "default") is None
    await stack2.put("chat.completions", sampled, "default", completion("x"))


async def test_incomplete_completions_are_not_cached(make_stack: StackFactory) -> None:
    stack = await make_stack()
    body = chat("cut short")
    t = await stack.begin("chat.completions", body, "default")
    await stack.finish(t, completion("partial", finish_reason="abort"))
    assert await stack.drain() == 0
    t2 = await stack.begin("chat.completions", body, "default")
    assert t2.status == "MISS"
    await stack.finish(t2, None)


async def test_bloom_guard_skips_lookups_for_unseen_keys(make_stack: StackFactory) -> None:
    stack = await make_stack()
    engine = CountingEngine(delay_s=0.0)
    for i in range(10):
        await serve(stack, engine, chat(f"unique prompt {i}"))
    assert await stack.drain() == 0
    assert bloom_of(stack).intercepted == 10 and bloom_of(stack).passed == 0
    # Intercepted keys never reached Redis: no L2 lookups were counted.
    c = stack.metrics.counts["l2"]
    assert c["hits"] + c["misses"] + c["errors"] == 0
    await stack.flush("l1")
    assert (await serve(stack, engine, chat("unique prompt 3")))[0] == "HIT-L2"
    assert bloom_of(stack).passed == 1
    assert stack.metrics.registry.get_sample_value("cache_bloom_intercepts_total") == 10


async def test_metrics_and_stats(make_stack: StackFactory) -> None:
    stack = await make_stack()
    engine = CountingEngine(delay_s=0.0)
    for i in range(4):
        await serve(stack, engine, chat(f"m{i}"))
    for i in range(3):
        await serve(stack, engine, chat(f"m{i}"))
    assert await stack.drain() == 0  # the L2 write-backs have landed …
    await stack.refresh()  # … and one housekeeping pass read Redis INFO for the L2 gauges
    reg = stack.metrics.registry
    hits = reg.get_sample_value("cache_hits_total", {"tier": "l1"})
    misses = reg.get_sample_value("cache_misses_total", {"tier": "l1"}) or 0.0
    assert hits == 3
    assert reg.get_sample_value("cache_hit_rate", {"tier": "l1"}) == hits / (hits + misses)
    assert reg.get_sample_value("cache_entries", {"tier": "l1"}) == 4
    assert reg.get_sample_value("cache_entries", {"tier": "l2"}) == 4
    assert 0 < (reg.get_sample_value("cache_fill_rate", {"tier": "l2"}) or 0) < 1
    assert reg.get_sample_value("cache_lookup_seconds_count", {"tier": "l1"}) == 3
    assert (reg.get_sample_value("cache_thermal_drift", {"tier": "l1"}) or 0) >= 0
    assert reg.get_sample_value("cache_requests_total", {"status": "MISS"}) == 4
    text = generate_latest(reg).decode()
    for name in (
        "cache_errors_total",
        "cache_evictions_total",
        "cache_bloom_fp_rate",
        "cache_writebacks_total",
    ):
        assert name in text
    s = stack.stats()
    orjson.dumps(s)  # JSON-ready
    assert s["requests"] == {"MISS": 4, "HIT-L1": 3}
    assert s["tiers"]["l1"]["hits"] == 3 and s["tiers"]["l2"]["entries"] == 4
    assert s["bloom"]["items"] == 4


async def test_l1_entry_caps_count_evictions(make_stack: StackFactory) -> None:
    stack = await make_stack(l1_max_entries=3)
    for i in range(5):
        await stack.put("chat.completions", chat(f"e{i}"), "default", completion(f"v{i}"))
    assert len(stack.l1) == 3 and stack.l1.evictions == 2  # counted as they happen, no refresh needed
    assert stack.metrics.registry.get_sample_value("cache_evictions_total", {"tier": "l1"}) == 2


async def test_l1_disabled_serves_from_l2_and_stores_nothing_in_l1(make_stack: StackFactory) -> None:
    stack = await make_stack(l1_enabled=False)
    engine = CountingEngine(delay_s=0.0)
    body = chat("Where does a hit come from without L1?")
    assert (await serve(stack, engine, body))[0] == "MISS"
    assert await stack.drain() == 0
    assert len(stack.l1) == 0
    assert [(await serve(stack, engine, body))[0] for _ in range(2)] == ["HIT-L2", "HIT-L2"]
    assert len(stack.l1) == 0 and engine.calls == 1
    assert stack.stats()["tiers"]["l1"]["enabled"] is False


async def test_unreachable_external_redis_fails_open(make_stack: StackFactory, tmp_path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stack = await make_stack(redis_url=f"redis://127.0.0.1:{port}/0", breaker_failures=2)
    assert stack.embedded is None
    engine = CountingEngine(delay_s=0.0)
    body = chat("no redis at all")
    assert await serve(stack, engine, body) == ("MISS", "answer for default: no redis at all")
    assert await stack.drain() == 0  # the L2 write-back fails and is counted
    await stack.flush("l1")
    assert await serve(stack, engine, body) == ("MISS", "answer for default: no redis at all")
    assert stack.metrics.counts["l2"]["errors"] >= 2
    from harness.common.errors import UnavailableError

    with pytest.raises(UnavailableError):
        l2_of(stack).breaker.opened_at = None  # let the admin call through to the dead server
        await stack.flush("l2")


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.common.errors import ConfigError
    from harness.common.settings import load_settings
    from harness.target.cache.settings import CacheSettings

    monkeypatch.setenv("REDIS_URL", "redis://example.invalid:6379/2")
    monkeypatch.setenv("HARNESS__CACHE__L3_THRESHOLD", "0.95")
    s = load_settings(CacheSettings)
    assert s.redis_url == "redis://example.invalid:6379/2" and s.l3_threshold == 0.95
    monkeypatch.setenv("HARNESS__CACHE__L3_THRESHOLD", "1.5")
    with pytest.raises(ConfigError) as err:
        load_settings(CacheSettings)
    assert err.value.field == "HARNESS__CACHE__L3_THRESHOLD"
    monkeypatch.delenv("HARNESS__CACHE__L3_THRESHOLD")
    monkeypatch.setenv("HARNESS__CACHE__TTL_COLD_S", "99999")
    with pytest.raises(ConfigError):
        load_settings(CacheSettings)


async def test_tiers_come_from_the_registry_in_lookup_order(make_stack: StackFactory) -> None:
    from harness.target.cache.api import FLUSH_TIERS, TIER_NAMES
    from harness.target.cache.tiers import CACHE_TIERS

    assert CACHE_TIERS.names() == list(TIER_NAMES) and (*TIER_NAMES, "bloom") == FLUSH_TIERS
    stack = await make_stack()
    assert [t.name for t in stack.tiers] == ["l1", "l2"]  # L3 is off in these tests
    assert [t.name for t in (await make_stack(l1_enabled=False, l2_enabled=False)).tiers] == []
    assert set(stack.stats()["tiers"]) == set(TIER_NAMES)
    assert (await stack.flush()).keys() == set(FLUSH_TIERS)
