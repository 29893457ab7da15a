"""CUDA runs of the engine (skipped, with the reason, on a machine without CUDA)."""

from __future__ import annotations

import pytest
import torch

from harness.target.engine.api import RequestMetrics, SamplingParams
from harness.target.engine.factory import create_core

from .conftest import tiny_settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; this machine has none"),
]


def test_cuda_paged_batch_matches_brute_force_fp32() -> None:
    core, _ = create_core(tiny_settings(device="cuda", dtype="float32", block_size=8))
    prompts = [
        core.tokenizer.encode(t) for t in ("short one", "a somewhat longer prompt with more words in it")
    ]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.add_request(str(i), p, params)
    got: dict[str, list[int]] = {}
    metrics = {}
    while core.has_work():
        for ev in core.step():
            if ev.token_id is not None:
                got.setdefault(ev.request_id, []).append(ev.token_id)
            if ev.metrics is not None:
                metrics[ev.request_id] = ev.metrics
        core.validate()
    for i, p in enumerate(prompts):
        ids = list(p)
        for _ in range(6):
            ids.append(int(core.model.dense_logits(torch.tensor(ids), last_only=True)[-1].argmax()))
        assert got[str(i)] == ids[len(p) :]
        m = metrics[str(i)]
        assert m.peak_measured and m.prefill_peak_bytes > 0 and m.device.startswith("cuda")


def test_cuda_auto_dtype_is_bfloat16_and_sampling_runs() -> None:
    core, _ = create_core(tiny_settings(device="auto", dtype="auto"))
    assert core.device.type == "cuda" and core.dtype == torch.bfloat16
    core.add_request(
        "s", core.tokenizer.encode("hello"), SamplingParams(max_tokens=5, temperature=0.8, seed=1)
    )
    evs = []
    while core.has_work():
        evs += core.step()
    assert evs[-1].finished


def test_cuda_sampler_mixed_batch_matches_cpu_and_is_reproducible() -> None:
    from harness.target.engine.sampling import Sampler, make_generator

    from .test_sampling import EOS, Seq, V, assert_same_logits, make_sampler, mixed_batch, random_logits

    cuda = torch.device("cuda")
    seqs = mixed_batch()
    logits = random_logits(len(seqs), 5)
    want = make_sampler().process(logits, seqs)
    want_greedy = [int(want[i].argmax()) for i, s in enumerate(seqs) if s.params.temperature <= 0]

    def on_cuda() -> list[int]:
        sampler = Sampler(V, 16, cuda, [EOS], make_generator(0, cuda))
        gpu_seqs = [
            Seq(s.request_id, s.params, s.prompt_ids, list(s.output_ids), None)
            if s.params.seed is None
            else Seq(
                s.request_id, s.params, s.prompt_ids, list(s.output_ids), make_generator(s.params.seed, cuda)
            )
            for s in seqs
        ]
        assert_same_logits(sampler.process(logits.to(cuda), gpu_seqs).cpu(), want)
        return sampler.sample(logits.to(cuda), gpu_seqs).tokens

    first = on_cuda()
    assert [first[i] for i, s in enumerate(seqs) if s.params.temperature <= 0] == want_greedy
    assert all(not torch.isinf(want[i, t]) for i, t in enumerate(first))  # drawn from the support
    assert on_cuda() == first  # same seeds, same draws


def test_cuda_engine_greedy_with_penalties_matches_brute_force() -> None:
    from .test_sampling import PENALIZED, brute_force, toks

    core, _ = create_core(tiny_settings(device="cuda", dtype="float32", block_size=8))
    p = core.tokenizer.encode("the the the the quick brown fox")
    core.add_request("pen", p, PENALIZED)
    evs = []
    while core.has_work():
        evs += core.step()
    assert toks(evs) == brute_force(core, p, PENALIZED)


def test_cuda_prefill_kv_is_the_block_managers_count_and_the_peak_is_still_measured() -> None:
    """On CUDA too, ``prefill_kv_bytes`` is the blocks the pool handed out during the prefill times
    a block's bytes (bfloat16 here), and the peak is CUDA's measurement, larger for a longer chunk."""
    core, _ = create_core(
        tiny_settings(device="cuda", dtype="bfloat16", block_size=16, max_num_batched_tokens=64)
    )
    assert core.block_bytes == 16 * core.kv_bytes_per_token
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)

    def prefill(rid: str, prompt: list[int]) -> tuple[RequestMetrics, int]:
        before = core.blocks.blocks_taken
        core.add_request(rid, prompt, params)
        taken: int | None = None
        metrics: RequestMetrics | None = None
        while core.has_work():
            for ev in core.step():
                if taken is None and ev.token_id is not None:
                    taken = core.blocks.blocks_taken - before
                metrics = ev.metrics or metrics
            core.validate()
        assert metrics is not None and taken is not None
        return metrics, taken

    short, short_blocks = prefill("short", list(range(1000, 1017)))  # 17 tokens: 2 blocks
    long, long_blocks = prefill("long", list(range(2000, 2300)))  # 300 tokens in chunks of 64: 19 blocks
    assert (short_blocks, long_blocks) == (2, 19)
    for m, blocks in ((short, short_blocks), (long, long_blocks)):
        assert m.prefill_kv_measured and m.prefill_kv_bytes == blocks * core.block_bytes
        assert m.peak_measured and m.prefill_peak_bytes > 0 and m.device.startswith("cuda")
    assert long.prefill_peak_bytes > short.prefill_peak_bytes
