"""The engine's behaviour on the real ``tiny`` preset: batching, paging, prefix cache, preemption,
sampling, stop handling, abort, admission errors and the KV layout validator.

The expected greedy tokens come from :meth:`Transformer.dense_logits`, a brute-force recompute of
the whole sequence for every new token with no KV cache, no paging and no batching.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from harness.common.errors import CheckFailed
from harness.target.engine.api import EngineFull, InvalidPrompt, PromptTooLong, SamplingParams, TokenEvent
from harness.target.engine.async_engine import ThreadedAsyncEngine
from harness.target.engine.core import EngineCore
from harness.target.engine.factory import create_core, create_engine

from .conftest import tiny_settings

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def core() -> EngineCore:
    c, _ = create_core(tiny_settings(num_kv_blocks=128, block_size=4))
    return c


def brute_force_greedy(c: EngineCore, prompt: Sequence[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        logits = c.model.dense_logits(torch.tensor(ids), last_only=True)
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt) :]


def run_all(c: EngineCore, validate: bool = True) -> dict[str, list[TokenEvent]]:
    events: dict[str, list[TokenEvent]] = {}
    for _ in range(10_000):
        if not c.has_work():
            break
        for ev in c.step():
            events.setdefault(ev.request_id, []).append(ev)
        if validate:
            c.validate()
    assert not c.has_work()
    return events


def tokens(evs: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in evs if e.token_id is not None]


def prompts(c: EngineCore) -> list[list[int]]:
    texts = [
        "the quick brown fox",
        "a much longer prompt that spans several kv cache blocks of four tokens each, for sure",
        "hi",
        "what is the capital of france and why is it paris",
    ]
    return [c.tokenizer.encode(t) for t in texts]


def test_mixed_length_batch_equals_unbatched_brute_force(core: EngineCore) -> None:
    ps = prompts(core)
    for i, p in enumerate(ps):
        core.add_request(f"m{i}", p, GREEDY)
    events = run_all(core)
    for i, p in enumerate(ps):
        assert tokens(events[f"m{i}"]) == brute_force_greedy(core, p, GREEDY.max_tokens)
        assert events[f"m{i}"][-1].finish_reason == "length"


def test_prefix_cache_hit_reports_cached_tokens_and_same_output(core: EngineCore) -> None:
    core.blocks.reset_prefix_cache()
    base = core.tokenizer.encode(
        "shared system prompt: you are a helpful assistant who answers briefly and well"
    )
    first = [*base, *core.tokenizer.encode("question one")]
    second = [*base, *core.tokenizer.encode("another different question")]
    core.add_request("p1", first, GREEDY)
    run_all(core)
    core.add_request("p2", second, GREEDY)
    ev = run_all(core)["p2"]
    common = 0
    while first[common] == second[common]:
        common += 1
    bs = core.block_size
    # Full blocks of the common prefix, never the whole prompt (first written as prompt+output).
    expected = min(common // bs, (len(second) - 1) // bs) * bs
    assert expected >= 2 * bs
    m = ev[-1].metrics
    assert m is not None
    assert m.cached_prompt_tokens == expected
    assert tokens(ev) == brute_force_greedy(core, second, GREEDY.max_tokens)
    assert core.stats().prefix_hit_tokens >= expected


def test_chunked_prefill_and_small_budget_match() -> None:
    c, _ = create_core(tiny_settings(num_kv_blocks=64, block_size=4, max_num_batched_tokens=16))
    p = c.tokenizer.encode(
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
        " seventeen"
    )
    assert len(p) > 16
    c.add_request("c", p, GREEDY)
    assert tokens(run_all(c)["c"]) == brute_force_greedy(c, p, GREEDY.max_tokens)


def test_layout_validation_catches_planted_overflow_and_bad_share() -> None:
    c, _ = create_core(tiny_settings(num_kv_blocks=64, block_size=4, enable_prefix_caching=False))
    a = c.tokenizer.encode("alpha beta gamma delta epsilon zeta eta theta")
    b = c.tokenizer.encode("one two three four five six seven eight nine")
    if len(a) % c.block_size == 0:
        a = a[:-1]  # keep a's last block partly filled
    c.add_request("a", a, GREEDY)
    c.add_request("b", b, GREEDY)
    c.step()
    c.validate()  # the real layout is fine
    ta, tb = c.blocks.tables["a"], c.blocks.tables["b"]
    # Planted overflow: a write one slot past a's length, into its last (partly filled) block.
    assert ta.num_tokens % c.block_size != 0
    ta.blocks[-1].tokens.append(12345)
    with pytest.raises(CheckFailed, match="past its own length"):
        c.validate()
    ta.blocks[-1].tokens.pop()
    c.validate()
    # Planted bad share: b's first block swapped for a's (reference counts kept consistent).
    own = tb.blocks[0]
    tb.blocks[0] = ta.blocks[0]
    ta.blocks[0].ref_count += 1
    own.ref_count -= 1
    c.blocks._free.append(own.block_id)
    with pytest.raises(CheckFailed, match=r"other tokens|different prefixes"):
        c.validate()


def test_seeded_sampling_is_reproducible_regardless_of_batch_mates(core: EngineCore) -> None:
    p = core.tokenizer.encode("tell me a story")
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
    core.add_request("alone", p, params)
    alone = tokens(run_all(core)["alone"])
    core.add_request(
        "x1", core.tokenizer.encode("noise noise"), SamplingParams(max_tokens=5, temperature=1.0)
    )
    core.add_request("crowd", p, params)
    core.add_request("x2", p, SamplingParams(max_tokens=12, temperature=1.0, seed=8, ignore_eos=True))
    ev = run_all(core)
    assert tokens(ev["crowd"]) == alone
    assert tokens(ev["x2"]) != alone


def test_top_k_one_is_greedy(core: EngineCore) -> None:
    p = core.tokenizer.encode("the quick brown fox")
    core.add_request("k1", p, SamplingParams(max_tokens=6, temperature=1.5, top_k=1, seed=3, ignore_eos=True))
    assert tokens(run_all(core)["k1"]) == brute_force_greedy(core, p, 6)


def test_stop_string_truncates_and_is_never_streamed(core: EngineCore) -> None:
    p = core.tokenizer.encode("please write a list of words")
    core.add_request("full", p, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    full = "".join(e.text for e in run_all(core)["full"])
    assert len(full) > 30
    stop = full[len(full) // 2 : len(full) // 2 + 5]
    core.add_request("s", p, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=(stop,)))
    evs = run_all(core)["s"]
    text = "".join(e.text for e in evs)
    assert text == full[: full.find(stop)]
    assert evs[-1].finish_reason == "stop"
    assert all(stop not in e.text for e in evs)


def test_stop_token_id(core: EngineCore) -> None:
    p = core.tokenizer.encode("the quick brown fox")
    want = brute_force_greedy(core, p, 6)
    core.add_request("st", p, SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(want[3],)))
    evs = run_all(core)["st"]
    assert tokens(evs) == want[: want.index(want[3]) + 1]
    assert evs[-1].finish_reason == "stop"


def test_logprobs_and_entropy_match_brute_force(core: EngineCore) -> None:
    p = core.tokenizer.encode("numbers one two")
    core.add_request("lp", p, SamplingParams(max_tokens=3, temperature=0.0, logprobs=True, ignore_eos=True))
    evs = run_all(core)["lp"]
    ids = list(p)
    for ev in evs:
        logp = torch.log_softmax(core.model.dense_logits(torch.tensor(ids))[-1].double(), -1)
        assert ev.token_id is not None and ev.logprob is not None and ev.entropy is not None
        assert abs(ev.logprob - float(logp[ev.token_id])) < 1e-4
        assert abs(ev.entropy - float(-(logp.exp() * logp).sum())) < 1e-3
        ids.append(ev.token_id)


def test_prompt_too_long_and_engine_full() -> None:
    c, _ = create_core(tiny_settings(num_kv_blocks=8, block_size=4))
    assert c.max_model_len == 32  # capped by what the pool holds
    with pytest.raises(PromptTooLong):
        c.limits.check_request(30, SamplingParams(max_tokens=3))
    c.limits.check_request(29, SamplingParams(max_tokens=3))


async def test_out_of_vocabulary_token_is_refused_and_spares_batch_mates() -> None:
    """An id past the embedding table used to fail the whole step, so every in-flight request."""
    c, _ = create_core(tiny_settings(num_kv_blocks=64, block_size=4))
    vocab = c.model.embed.weight.shape[0]  # the table the forward pass indexes
    with pytest.raises(InvalidPrompt, match=f"token id {vocab} at prompt position 1"):
        c.add_request("bad", [5, vocab, 6], GREEDY)
    with pytest.raises(InvalidPrompt):
        c.add_request("neg", [-1], GREEDY)
    good = c.tokenizer.encode("the quick brown fox")
    c.add_request("good", good, GREEDY)
    events = run_all(c)
    assert tokens(events["good"]) == brute_force_greedy(c, good, GREEDY.max_tokens)
    engine = create_engine(tiny_settings())
    await engine.start()
    try:
        with pytest.raises(InvalidPrompt):
            engine.generate("bad", [5, vocab], GREEDY)  # refused at call time, before the step loop
    finally:
        await engine.shutdown()


async def test_engine_full_when_waiting_queue_is_full() -> None:
    engine = create_engine(tiny_settings(max_waiting=0))
    await engine.start()
    try:
        with pytest.raises(EngineFull):
            engine.generate("f", [5, 6, 7], GREEDY)
        with pytest.raises(PromptTooLong):
            engine.generate("g", [5] * 5000, GREEDY)
    finally:
        await engine.shutdown()


async def until(condition, what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` (the engine thread frees blocks on its own schedule) under a generous
    deadline, so a busy CI machine is slow, not failing."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"{what} within {timeout_s:g} s"
        await asyncio.sleep(0.01)


async def test_disconnect_and_abort_free_blocks() -> None:
    engine = create_engine(tiny_settings(num_kv_blocks=64, enable_prefix_caching=False))
    await engine.start()

    def idle() -> bool:
        s = engine.stats()
        return s.kv_blocks_used == 0 and s.running == 0

    try:
        ids = engine.tokenizer.encode("a fairly long prompt to hold some blocks for a while")
        long = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
        # Client disconnect: leave the stream after two events.
        stream = engine.generate("d", ids, long)
        got = 0
        async for _ in stream:
            got += 1
            if got == 2:
                assert engine.core.blocks.num_used > 0
                break
        await stream.aclose()  # type: ignore[attr-defined]
        await until(idle, "blocks freed after the stream was closed")
        # Explicit abort: the stream ends with finish_reason "abort".
        events: list[TokenEvent] = []

        async def consume() -> None:
            async for ev in engine.generate("e", ids, long):
                events.append(ev)

        task = asyncio.create_task(consume())
        await until(lambda: len(events) >= 2, "two events")
        await engine.abort("e")
        await asyncio.wait_for(task, 60)
        assert events[-1].finish_reason == "abort"
        await until(lambda: engine.stats().kv_blocks_used == 0, "blocks freed after abort")
        # Cancelled consumer task (how a server sees a client going away).
        seen: list[TokenEvent] = []

        async def consume_c() -> None:
            async for ev in engine.generate("c", ids, long):
                seen.append(ev)

        task = asyncio.create_task(consume_c())
        await until(lambda: len(seen) >= 2, "two events")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(idle, "blocks freed after the consumer was cancelled")
    finally:
        await engine.shutdown()


def test_random_arrivals_and_aborts_keep_the_layout_valid() -> None:
    """A seeded random mix of arrivals, aborts and steps on a tight pool; every step validated."""
    import random

    rng = random.Random(5)
    c, _ = create_core(
        tiny_settings(num_kv_blocks=24, block_size=4, max_num_seqs=6, max_num_batched_tokens=32)
    )
    base = c.tokenizer.encode("common prefix shared by several of the requests here")
    live: list[str] = []
    finished: set[str] = set()
    for i in range(60):
        r = rng.random()
        if r < 0.3:
            prompt = (base if rng.random() < 0.5 else []) + [
                rng.randrange(2000, 20000) for _ in range(rng.randint(1, 12))
            ]
            c.add_request(f"q{i}", prompt, SamplingParams(max_tokens=rng.randint(1, 10), temperature=0.0))
            live.append(f"q{i}")
        elif r < 0.4 and live:
            ev = c.abort(live.pop(rng.randrange(len(live))))
            assert ev is not None and ev.finish_reason == "abort"
        for ev in c.step():
            if ev.finished:
                finished.add(ev.request_id)
                if ev.request_id in live:
                    live.remove(ev.request_id)
        c.validate()
    run_all(c)
    assert c.blocks.num_used == 0
    assert finished


@pytest.mark.slow
async def test_64_concurrent_requests_finish_with_preemption() -> None:
    # 64 × (≈20 prompt + 12 output) tokens need ~512 blocks of 4; the pool has 48.
    settings = tiny_settings(num_kv_blocks=48, block_size=4, max_num_seqs=32, enable_prefix_caching=True)
    core, _ = create_core(settings)
    # The KV layout is checked after every step; a violation would fail the requests ("error").
    engine = ThreadedAsyncEngine(core, "tiny", settings.max_waiting, validate_every_step=True)
    await engine.start()
    try:
        texts = [f"request number {i} asks about topic {i * 7 % 13} in some detail please" for i in range(64)]
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

        async def one(i: int) -> list[TokenEvent]:
            return [ev async for ev in engine.generate(f"r{i}", engine.tokenizer.encode(texts[i]), params)]

        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(64))), 120)
        assert all(r[-1].finished and r[-1].finish_reason == "length" for r in results)
        assert all(len(tokens(r)) == 12 for r in results)
        assert engine.stats().preemptions > 0
        assert sum(r[-1].metrics.preemptions for r in results if r[-1].metrics) > 0
        # Preempted-and-recomputed requests still produce the brute-force greedy tokens.
        for i in (0, 31, 63):
            assert tokens(results[i]) == brute_force_greedy(
                engine.core, engine.tokenizer.encode(texts[i]), 12
            )
        assert engine.stats().kv_blocks_used == 0
    finally:
        await engine.shutdown()


def test_request_metrics_are_consistent() -> None:
    c, loaded = create_core(tiny_settings(num_kv_blocks=64, block_size=16, enable_prefix_caching=False))
    p = c.tokenizer.encode("measure this prompt of a modest number of tokens, twenty or so of them in all")
    c.add_request("m", p, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    m = run_all(c)["m"][-1].metrics
    assert m is not None
    cfg = loaded.config
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * (cfg.hidden_size // cfg.num_heads) * 4  # fp32
    blocks = -(-len(p) // 16)
    assert m.prompt_tokens == len(p) and m.output_tokens == 5 and m.cached_prompt_tokens == 0
    assert m.prefill_kv_bytes == blocks * 16 * per_token
    assert not m.peak_measured and m.prefill_peak_bytes >= m.prefill_kv_bytes
    assert 0 < m.prefill_ms <= m.ttft_ms <= m.e2e_ms
    assert m.tpot_ms == pytest.approx((m.e2e_ms - m.ttft_ms) / 4)
    assert m.device == "cpu" and m.preemptions == 0


def test_injected_slowdown_waits_after_every_step_in_proportion_and_changes_no_token(
    core: EngineCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--inject-slowdown``: the same tokens, and after every step a wait of (f − 1) × that step's own
    time (the clock is a counter here, so the test times nothing: each reading advances 10 ms)."""
    slow, _ = create_core(tiny_settings(num_kv_blocks=128, block_size=4, inject_slowdown=2.5))
    prompt = prompts(core)[0]
    core.add_request("r", prompt, GREEDY)
    expected = tokens(run_all(core)["r"])
    waits: list[float] = []
    ticks = iter(range(10**6))
    monkeypatch.setattr("harness.target.engine.core.time.sleep", waits.append)
    monkeypatch.setattr("harness.target.engine.core.time.perf_counter", lambda: next(ticks) * 0.01)
    slow.add_request("r", prompt, GREEDY)
    events: list[TokenEvent] = []
    steps = 0
    while slow.has_work():
        events += slow.step()
        steps += 1
    assert tokens(events) == expected
    assert len(waits) == steps  # one wait per step, prefill and decode alike
    # Each step reads the clock at its start, once when it samples and once at its end: 20 ms of
    # step, so a 2.5x step waits 1.5 x 20 ms.
    assert waits == pytest.approx([0.03] * steps)
    assert slow.injected_s == pytest.approx(sum(waits))
    assert core.injected_s == 0.0
