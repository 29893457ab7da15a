"""The engine in a process of its own (``step_loop="process"``): what crosses the socket changes
nothing, refusals come at once, aborts and resets cross the boundary, and a killed engine process
is noticed at once and named."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import pytest

from harness.common.errors import ConfigError
from harness.target.engine.api import (
    EngineError,
    EngineFull,
    InvalidPrompt,
    PromptTooLong,
    SamplingParams,
    TokenEvent,
)
from harness.target.engine.factory import create_engine
from harness.target.engine.process import ProcessAsyncEngine

from .conftest import tiny_settings

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=2)
LONG = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
TEXTS = ["the quick brown fox", "a tale of two cities", "once upon a time there was", "hello"]


async def collect(engine: object, rid: str, ids: list[int], params: SamplingParams) -> list[TokenEvent]:
    return [ev async for ev in engine.generate(rid, ids, params)]  # type: ignore[attr-defined]


def summary(events: list[TokenEvent]) -> list[object]:
    """What an event says that must cross the socket unchanged (timings differ between runs)."""
    last = events[-1]
    assert last.metrics is not None
    m = last.metrics
    return [
        [
            (e.token_id, e.text, e.finish_reason, [(t.token_id, t.text) for t in e.top_logprobs or ()])
            for e in events
        ],
        (m.prompt_tokens, m.cached_prompt_tokens, m.output_tokens, m.prefill_kv_bytes),
    ]


def logprobs(events: list[TokenEvent]) -> list[float]:
    return [
        x
        for e in events
        for x in (e.logprob, e.entropy, *(t.logprob for t in e.top_logprobs or ()))
        if x is not None
    ]


async def test_the_same_tokens_as_the_threaded_engine_alone_and_at_4_streams() -> None:
    results = {}
    for where in ("thread", "process"):
        engine = create_engine(tiny_settings(num_kv_blocks=128, step_loop=where))
        assert isinstance(engine, ProcessAsyncEngine) == (where == "process")
        await engine.start()
        try:
            ids = [engine.tokenizer.encode(t) for t in TEXTS]
            alone = await collect(engine, "alone", ids[0], GREEDY)
            together = await asyncio.gather(*(collect(engine, f"s{i}", p, GREEDY) for i, p in enumerate(ids)))
            results[where] = [alone, *together]
        finally:
            await engine.shutdown()
    thread, process = results["thread"], results["process"]
    assert [summary(e) for e in process] == [summary(e) for e in thread]
    # The two processes' thread teams may sum a matmul in another order: the same to float32's last bits.
    for p, t in zip(process, thread, strict=True):
        assert logprobs(p) == pytest.approx(logprobs(t), rel=1e-5, abs=1e-5)


async def test_refusals_come_at_once_and_a_full_queue_is_counted_across_the_boundary() -> None:
    engine = create_engine(tiny_settings(max_waiting=1, max_num_seqs=1, step_loop="process"))
    await engine.start()
    try:
        vocab = engine.limits.vocab_size
        with pytest.raises(InvalidPrompt, match=f"token id {vocab} at prompt position 1"):
            engine.generate("bad", [5, vocab], GREEDY)
        with pytest.raises(PromptTooLong):
            engine.generate("long", [5] * 5000, GREEDY)
        first = engine.generate("a", [5, 6, 7], LONG)
        got = await anext(first)  # type: ignore[call-overload]
        assert got.token_id is not None
        # One request decodes at a time: "b" takes the one waiting slot, whether the engine process
        # has seen it yet (it is counted as posted) or not (it is counted as waiting).
        waiting = engine.generate("b", [5, 6, 8], LONG)
        task = asyncio.ensure_future(anext(waiting))  # type: ignore[call-overload]
        await asyncio.sleep(0)  # the task runs up to its first wait: its add is posted
        with pytest.raises(EngineFull):
            engine.generate("c", [5, 6, 9], GREEDY)
        task.cancel()
        await first.aclose()  # type: ignore[attr-defined]
    finally:
        await engine.shutdown()


async def test_an_abandoned_stream_frees_its_blocks_and_a_reset_crosses_the_boundary() -> None:
    engine = create_engine(tiny_settings(num_kv_blocks=64, step_loop="process"))
    await engine.start()
    try:
        ids = engine.tokenizer.encode("a fairly long prompt to hold some blocks for a while " * 4)
        assert len(ids) >= 32  # two full blocks of 16: the prefix cache keeps them after the abort
        stream = engine.generate("d", ids, LONG)
        got = 0
        async for _ in stream:
            got += 1
            if got == 2:
                assert engine.stats().kv_blocks_used > 0
                break
        await stream.aclose()  # type: ignore[attr-defined]
        # A reset is answered after the stats of the round that handled it, and the abort was posted
        # before it: once it is back, the stats show what the abort and the reset freed.
        freed = await engine.reset_prefix_cache()
        stats = engine.stats()
        assert (stats.running, stats.waiting, stats.kv_blocks_used, stats.kv_blocks_cached) == (0, 0, 0, 0)
        assert freed >= 2
        assert (await engine.reset_prefix_cache()) == 0
    finally:
        await engine.shutdown()


async def test_a_killed_engine_process_fails_what_is_in_flight_by_name() -> None:
    deaths: list[str] = []
    died = threading.Event()

    def on_death(failure: str) -> None:
        deaths.append(failure)
        died.set()

    engine = ProcessAsyncEngine(tiny_settings(step_loop="process"), on_death=on_death)
    await engine.start()
    try:
        ids = engine.tokenizer.encode("a prompt whose answer never ends")
        stream = engine.generate("x", ids, LONG)
        await anext(stream)  # type: ignore[call-overload]
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(
            EngineError, match=f"engine process \\(pid {engine.pid}\\) was killed by signal 9"
        ):
            async for _ in stream:
                pass
        assert await asyncio.get_running_loop().run_in_executor(None, died.wait, 60.0)
        assert deaths == [engine.stats().failure]
        assert "killed by signal 9" in deaths[0]
        with pytest.raises(EngineError, match="killed by signal 9"):
            engine.generate("y", ids, GREEDY)
        with pytest.raises(EngineError, match="killed by signal 9"):
            await engine.reset_prefix_cache()
    finally:
        await engine.shutdown()
    assert deaths == [deaths[0]]  # once, and not again at shutdown


def test_a_setting_the_engine_process_refuses_is_raised_here_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown prefix-cache eviction policy 'nope'"):
        ProcessAsyncEngine(tiny_settings(step_loop="process", prefix_eviction="nope"))


async def test_every_thread_of_the_loaded_engine_runs_engine_nice_below_this_process() -> None:
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        pytest.skip("needs Linux's per-thread niceness in /proc/PID/task")
    engine = ProcessAsyncEngine(tiny_settings(step_loop="process", engine_nice=3))
    await engine.start()
    try:
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        theirs = {
            os.getpriority(os.PRIO_PROCESS, int(t.name)) for t in Path(f"/proc/{engine.pid}/task").iterdir()
        }
        assert theirs == {min(19, ours + 3)}  # the OpenMP team loading started, too
    finally:
        await engine.shutdown()
