"""The batched sampler against references computed on the same logits.

References: Hugging Face ``transformers`` logits processors (``SequenceBiasLogitsProcessor``,
``MinNewTokensLengthLogitsProcessor``, ``RepetitionPenaltyLogitsProcessor``,
``TemperatureLogitsWarper``, ``MinPLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``) and,
for OpenAI's presence / frequency penalties that transformers does not have, plain torch. Each
reference runs on one request at a time; the sampler runs every request of a step in one batch
with mixed parameters. Engine-level tests then check the same rules through :class:`EngineCore`
against a brute-force greedy decode (no KV cache, no batching) with the reference processors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import torch
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from harness.target.engine.api import SamplingParams, TokenEvent
from harness.target.engine.core import EngineCore
from harness.target.engine.factory import create_core
from harness.target.engine.sampling import Sampler, make_generator

from .conftest import tiny_settings

V = 1000
EOS = 2
CPU = torch.device("cpu")


@dataclass
class Seq:
    """A request as the sampler sees it."""

    request_id: str
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


def make_sampler(seed: int = 0, rows: int = 16) -> Sampler:
    return Sampler(V, rows, CPU, [EOS], make_generator(seed, CPU))


def random_logits(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((n, V), generator=g) * 3.0  # [n, V]


def random_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    # Few distinct ids, so tokens repeat (frequency counts above 1) and penalties matter.
    return torch.randint(3, 40, (n,), generator=g).tolist()


def reference_processed(logits: torch.Tensor, seq: Seq, eos: Sequence[int] = (EOS,)) -> torch.Tensor:
    """One request's logits [V] after bias, the min_tokens floor and penalties, in vLLM's order."""
    p = seq.params
    ids = torch.tensor([seq.prompt_ids + seq.output_ids])  # [1, L]: what transformers calls input_ids
    x = logits.clone().unsqueeze(0)  # [1, V]
    if p.logit_bias:
        x = SequenceBiasLogitsProcessor([[[t], b] for t, b in p.logit_bias])(ids, x)
    banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos))
    if p.min_tokens and banned:
        x = MinNewTokensLengthLogitsProcessor(len(seq.prompt_ids), p.min_tokens, banned)(ids, x)
    if p.repetition_penalty != 1.0:
        x = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, x)
    # OpenAI's penalties (not in transformers): over the output tokens only.
    out = torch.tensor(seq.output_ids, dtype=torch.long)
    counts = torch.bincount(out, minlength=logits.shape[-1]).float()  # [V]
    x = x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
    return x[0]


def reference_warped(processed: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, min_p, top-k, top-p of one sampled request (transformers' warpers)."""
    ids = torch.zeros((1, 1), dtype=torch.long)
    x = TemperatureLogitsWarper(p.temperature)(ids, processed.clone().unsqueeze(0))
    if p.min_p > 0:
        x = MinPLogitsWarper(p.min_p)(ids, x)
    if p.top_k > 0:
        x = TopKLogitsWarper(p.top_k)(ids, x)
    if p.top_p < 1.0:
        x = TopPLogitsWarper(p.top_p)(ids, x)
    return x[0]


def _label(p: SamplingParams) -> str:
    """The fields that differ from the defaults, as a test id."""
    default = SamplingParams()
    return ",".join(f"{k}={getattr(p, k)}" for k in p.__slots__ if getattr(p, k) != getattr(default, k))


def assert_same_logits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(got), torch.isinf(want)), "different tokens masked"
    finite = ~torch.isinf(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ one processor at a time


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(logit_bias=((5, 7.5), (17, -100.0), (999, 0.25))),
        SamplingParams(min_tokens=4),
        SamplingParams(min_tokens=4, stop_token_ids=(9, 11)),
        SamplingParams(min_tokens=4, ignore_eos=True, stop_token_ids=(9,)),
        SamplingParams(min_tokens=2),  # floor already reached: nothing masked
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(repetition_penalty=0.7),  # < 1 rewards repetition
        SamplingParams(frequency_penalty=0.8),
        SamplingParams(presence_penalty=-1.5),
        SamplingParams(frequency_penalty=-0.4, presence_penalty=1.2, repetition_penalty=1.1),
    ],
    ids=_label,
)
def test_processing_matches_transformers(params: SamplingParams) -> None:
    logits = random_logits(1, 1)
    seq = Seq("a", params, random_ids(12, 2), random_ids(3, 3))
    got = make_sampler().process(logits, [seq])
    want = reference_processed(logits[0], seq)
    assert not torch.equal(want, logits[0]) or params.min_tokens == 2  # the case is not a no-op
    assert_same_logits(got[0], want)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, min_p=0.05),
        SamplingParams(temperature=1.0, min_p=0.3),
        SamplingParams(temperature=0.9, top_k=17),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=1.6, min_p=0.02, top_k=50, top_p=0.9),
    ],
)
def test_warping_matches_transformers(params: SamplingParams) -> None:
    logits = random_logits(1, 4)
    got = make_sampler().warp(logits, [params])
    assert_same_logits(got[0], reference_warped(logits[0], params))


@pytest.mark.parametrize("head", [10, 1000, 20000])
def test_top_p_matches_transformers_for_short_and_long_heads(head: int) -> None:
    """Top-p sorts only a growing top-k of the probabilities: a head of 10 tokens is found in the
    first guess, 1000 after one growth, 20000 by the full sort."""
    g = torch.Generator().manual_seed(head)
    vocab = 30522
    logits = torch.randn((2, vocab), generator=g) * 0.1 - 20.0  # [2, V]
    logits[:, :head] += 20.0  # about `head` tokens carry nearly all the mass
    params = [SamplingParams(temperature=1.0, top_p=0.95), SamplingParams(temperature=1.0, top_p=0.5)]
    got = make_sampler().warp(logits, params)
    for i, p in enumerate(params):
        want = reference_warped(logits[i], p)
        assert_same_logits(got[i], want)
        kept = int((~torch.isinf(want)).sum())
        assert 0.3 * head < kept <= head  # the case really has a head of that size


def test_repetition_penalty_covers_prompt_and_output_presence_penalty_only_output() -> None:
    """Which tokens each penalty reads, on hand-made logits."""
    logits = torch.full((1, V), 2.0)
    logits[0, 30] = -2.0
    p = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    # 10 and 30 only in the prompt, 20 twice in the output, 40 nowhere.
    seq = Seq("a", p, prompt_ids=[10, 30], output_ids=[20, 20])
    x = make_sampler().process(logits, [seq])[0]
    assert x[10] == pytest.approx(1.0)  # prompt token: divided by 2, no OpenAI penalty
    assert x[30] == pytest.approx(-4.0)  # negative logit: multiplied by 2
    assert x[20] == pytest.approx(2.0 / 2 - 0.25 * 2 - 0.5)  # output: repetition, frequency, presence
    assert x[40] == pytest.approx(2.0)


# ------------------------------------------------------------------ one batch, mixed parameters


def mixed_batch() -> list[Seq]:
    """Eight requests with different parameters, as one decode step could hold them."""
    specs = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, repetition_penalty=1.4, logit_bias=((7, 3.0),)),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_k=20, seed=11),
        SamplingParams(temperature=1.2, top_p=0.85, frequency_penalty=0.6, min_tokens=5),
        SamplingParams(temperature=1.0, min_p=0.1, presence_penalty=1.0, seed=12),
        SamplingParams(temperature=0.0, min_tokens=9, stop_token_ids=(13,), logit_bias=((EOS, 50.0),)),
        SamplingParams(temperature=0.6, min_p=0.05, top_k=40, top_p=0.9, repetition_penalty=1.2, seed=13),
    ]
    seqs = []
    for i, p in enumerate(specs):
        gen = make_generator(p.seed, CPU) if p.seed is not None else None
        seqs.append(Seq(f"r{i}", p, random_ids(10 + i, 100 + i), random_ids(i, 200 + i), gen))
    return seqs


def test_mixed_batch_rows_equal_their_unbatched_references() -> None:
    seqs = mixed_batch()
    logits = random_logits(len(seqs), 5)
    sampler = make_sampler()
    processed = sampler.process(logits, seqs)
    sampled = [i for i, s in enumerate(seqs) if s.params.temperature > 0]
    warped = sampler.warp(processed[sampled], [seqs[i].params for i in sampled])
    for j, i in enumerate(sampled):
        want = reference_warped(reference_processed(logits[i], seqs[i]), seqs[i].params)
        assert_same_logits(warped[j], want)
    for i, s in enumerate(seqs):
        assert_same_logits(processed[i], reference_processed(logits[i], s))
    # Row 6 is under its min_tokens floor: the +50 bias on EOS does not get EOS through.
    assert torch.isinf(processed[6, EOS]) and torch.isinf(processed[6, 13])


def test_mixed_batch_sample_draws_each_row_from_its_reference_distribution() -> None:
    """Greedy rows take the argmax; each sampled row is the inverse CDF of its own reference
    distribution at its own draw: seeded rows from their own generator, the others in row order
    from the engine's generator."""
    seqs = mixed_batch()
    logits = random_logits(len(seqs), 6)
    sampler = make_sampler(seed=99)
    shared = make_generator(99, CPU)  # replays the engine generator's draws
    own = {s.request_id: make_generator(s.params.seed, CPU) for s in seqs if s.params.seed is not None}
    shared_rows = [s for s in seqs if s.params.temperature > 0 and s.params.seed is None]
    shared_draws = dict(
        zip(
            [s.request_id for s in shared_rows],
            (1 - torch.rand((len(shared_rows), 1), generator=shared)).flatten().tolist(),
            strict=True,
        )
    )
    expected = []
    for i, s in enumerate(seqs):
        processed = reference_processed(logits[i], s)
        if s.params.temperature <= 0:
            expected.append(int(processed.argmax()))
            continue
        u = shared_draws.get(s.request_id)
        if u is None:
            u = float(1 - torch.rand(1, generator=own[s.request_id]))
        cdf = torch.softmax(reference_warped(processed, s.params), -1).cumsum(-1)
        expected.append(int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])]))))
    out = sampler.sample(logits, seqs)
    assert out.tokens == expected
    logp = torch.log_softmax(logits.double(), -1)
    for i, t in enumerate(out.tokens):
        assert out.logprobs[i] == pytest.approx(float(logp[i, t]), abs=1e-4)
        assert out.entropies[i] == pytest.approx(float(-(logp[i].exp() * logp[i]).sum()), abs=1e-3)


def test_sampling_frequencies_follow_the_distribution() -> None:
    """4000 rows of one small distribution sampled in one call: the frequencies match it."""
    logits = torch.full((4000, V), -1e4)
    logits[:, :6] = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, 0.5])
    seqs = [Seq(f"f{i}", SamplingParams(temperature=1.0), [5]) for i in range(4000)]
    tokens = torch.tensor(make_sampler(seed=3, rows=1).sample(logits, seqs).tokens)
    freq = torch.bincount(tokens, minlength=V)[:6].double() / 4000
    want = torch.softmax(logits[0, :6].double(), -1)
    assert int(torch.bincount(tokens, minlength=V)[6:].sum()) == 0
    assert float((freq - want).abs().max()) < 0.03


def test_top_logprobs_are_the_raw_top_k_per_row() -> None:
    logits = random_logits(3, 8)
    seqs = [
        Seq("a", SamplingParams(temperature=0.0, top_logprobs=5, repetition_penalty=1.5), [4, 5]),
        Seq("b", SamplingParams(temperature=1.0, top_logprobs=20), [4]),
        Seq("c", SamplingParams(temperature=0.0), [4]),
    ]
    out = make_sampler().sample(logits, seqs)
    assert out.top_ids is not None and out.top_logprobs is not None
    logp = torch.log_softmax(logits, -1)
    for i in range(3):
        vals, ids = torch.topk(logp[i], 20)
        assert out.top_ids[i] == ids.tolist()  # most likely first; each row keeps its own k
        torch.testing.assert_close(torch.tensor(out.top_logprobs[i]), vals)


def test_penalty_state_counts_across_steps_and_rebuilds_after_release() -> None:
    sampler = make_sampler(rows=2)
    p = SamplingParams(temperature=1.0, frequency_penalty=1.0, seed=4)
    seq = Seq("a", p, [3, 4], generator=make_generator(4, CPU))
    for step in range(6):
        logits = random_logits(1, 300 + step)
        want = reference_processed(logits[0], seq)
        assert_same_logits(sampler.process(logits, [seq])[0], want)
        seq.output_ids.append(sampler.sample(logits, [seq]).tokens[0])
        if step == 2:
            sampler.release("a")  # preempted: the row is rebuilt from output_ids next time
    other = Seq("b", SamplingParams(presence_penalty=0.5), [7], [8, 8])
    both = sampler.process(random_logits(2, 400), [seq, other])
    assert_same_logits(both[1], reference_processed(random_logits(2, 400)[1], other))


# ------------------------------------------------------------------ through the engine


@pytest.fixture(scope="module")
def core() -> EngineCore:
    c, _ = create_core(tiny_settings(num_kv_blocks=128, block_size=4))
    return c


def run_all(c: EngineCore) -> dict[str, list[TokenEvent]]:
    events: dict[str, list[TokenEvent]] = {}
    while c.has_work():
        for ev in c.step():
            events.setdefault(ev.request_id, []).append(ev)
        c.validate()
    return events


def toks(evs: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in evs if e.token_id is not None]


def brute_force(c: EngineCore, prompt: list[int], params: SamplingParams) -> list[int]:
    """Greedy decode recomputing the whole sequence each token, through the reference processors."""
    eos = sorted(c.eos_ids)
    seq = Seq("ref", params, list(prompt))
    for _ in range(params.max_tokens):
        logits = c.model.dense_logits(torch.tensor(seq.prompt_ids + seq.output_ids), last_only=True)[0].cpu()
        tok = int(reference_processed(logits, seq, eos).argmax())
        seq.output_ids.append(tok)
        if tok in eos and not params.ignore_eos:
            break
    return seq.output_ids


PENALIZED = SamplingParams(
    max_tokens=10,
    temperature=0.0,
    repetition_penalty=1.5,
    frequency_penalty=0.5,
    presence_penalty=0.3,
    logit_bias=((2000, 1.0),),
    ignore_eos=True,
)


def test_engine_greedy_with_penalties_matches_brute_force(core: EngineCore) -> None:
    p = core.tokenizer.encode("the the the the quick brown fox")
    core.add_request("plain", p, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    core.add_request("pen", p, PENALIZED)
    ev = run_all(core)
    assert toks(ev["pen"]) == brute_force(core, p, PENALIZED)
    assert toks(ev["pen"]) != toks(ev["plain"])  # the penalties changed the output


def test_engine_penalties_survive_preemption() -> None:
    """A tight pool preempts (recomputes) requests mid-decode; their penalty rows are rebuilt."""
    c, _ = create_core(tiny_settings(num_kv_blocks=20, block_size=4, max_num_seqs=6))
    texts = [f"request {i} repeats words words words about topic {i}" for i in range(6)]
    prompts = [c.tokenizer.encode(t) for t in texts]
    for i, p in enumerate(prompts):
        c.add_request(f"p{i}", p, PENALIZED)
    ev = run_all(c)
    assert c.num_preemptions > 0
    for i, p in enumerate(prompts):
        assert toks(ev[f"p{i}"]) == brute_force(c, p, PENALIZED)


def test_engine_min_tokens_floor_masks_eos(core: EngineCore) -> None:
    p = core.tokenizer.encode("stop as soon as you can")
    eos = sorted(core.eos_ids)[0]
    eager = SamplingParams(max_tokens=20, temperature=0.0, logit_bias=((eos, 100.0),))
    core.add_request("eager", p, eager)
    core.add_request("floor", p, SamplingParams(**{**_fields(eager), "min_tokens": 6}))
    core.add_request(
        "floor-sampled", p, SamplingParams(**{**_fields(eager), "min_tokens": 6, "temperature": 1.0})
    )
    ev = run_all(core)
    assert toks(ev["eager"]) == [eos]
    for rid in ("floor", "floor-sampled"):
        out = toks(ev[rid])
        assert len(out) == 7 and eos not in out[:6] and out[6] == eos  # EOS first possible at 7
        assert ev[rid][-1].finish_reason == "stop"
        assert ev[rid][-1].metrics is not None and ev[rid][-1].metrics.output_tokens == 7


def _fields(p: SamplingParams) -> dict[str, object]:
    return {k: getattr(p, k) for k in p.__slots__}


def test_engine_min_tokens_ignores_stop_strings_ending_before_the_floor(core: EngineCore) -> None:
    p = core.tokenizer.encode("please write a list of words")
    base = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    core.add_request("full", p, base)
    full_evs = run_all(core)["full"]
    texts = [e.text for e in full_evs]
    full = "".join(texts)
    # A stop string that first occurs early; the floor lies after that occurrence.
    stop = next(t.strip() for t in texts[1:] if len(t.strip()) >= 2)
    first = full.find(stop)
    k = next(i for i in range(1, len(texts) + 1) if len("".join(texts[:i])) >= first + len(stop))
    floor_chars = len("".join(texts[:k]))
    core.add_request("plain-stop", p, SamplingParams(**{**_fields(base), "stop": (stop,)}))
    core.add_request("floored", p, SamplingParams(**{**_fields(base), "stop": (stop,), "min_tokens": k}))
    ev = run_all(core)
    assert "".join(e.text for e in ev["plain-stop"]) == full[:first]
    later = full.find(stop, max(0, floor_chars - len(stop) + 1))
    got = "".join(e.text for e in ev["floored"])
    if later >= 0:  # a later occurrence ends after the floor: cut there
        assert got == full[:later] and ev["floored"][-1].finish_reason == "stop"
    else:
        assert got == full and ev["floored"][-1].finish_reason == "length"
    assert len(got) > first


def test_engine_top_logprobs_and_mean_entropy(core: EngineCore) -> None:
    p = core.tokenizer.encode("numbers one two three")
    params = SamplingParams(max_tokens=5, temperature=0.0, logprobs=True, top_logprobs=4, ignore_eos=True)
    core.add_request("top", p, params)
    evs = run_all(core)["top"]
    ids = list(p)
    entropies = []
    for ev in evs:
        logp = torch.log_softmax(core.model.dense_logits(torch.tensor(ids), last_only=True)[0].double(), -1)
        assert ev.token_id is not None and ev.top_logprobs is not None and ev.entropy is not None
        assert [t.token_id for t in ev.top_logprobs] == torch.topk(logp, 4).indices.tolist()
        for t in ev.top_logprobs:
            assert t.logprob == pytest.approx(float(logp[t.token_id]), abs=1e-4)
            assert t.text  # every alternative has a visible name
        # Greedy: the chosen token is the first alternative, and its text is what was emitted.
        assert ev.top_logprobs[0].token_id == ev.token_id
        if ev.text:
            assert ev.top_logprobs[0].text == ev.text
        entropies.append(ev.entropy)
        ids.append(ev.token_id)
    m = evs[-1].metrics
    assert m is not None and m.mean_entropy == pytest.approx(sum(entropies) / len(entropies))


def test_engine_refuses_out_of_range_parameters(core: EngineCore) -> None:
    from harness.target.engine.api import EngineError

    vocab = core.model.vocab_limit
    for bad in (
        SamplingParams(max_tokens=4, min_tokens=5),
        SamplingParams(logit_bias=((vocab, 1.0),)),
        SamplingParams(repetition_penalty=0.0),
        SamplingParams(top_logprobs=21),
    ):
        with pytest.raises(EngineError):
            core.add_request("bad", [5, 6], bad)
    assert not core.has_work()


def test_tiny_temperature_is_greedy() -> None:
    """Dividing by a temperature near 0 would overflow to inf and NaN; below 1e-5 is greedy (vLLM)."""
    logits = random_logits(2, 9) * 1e3
    seqs = [Seq("t", SamplingParams(temperature=1e-30), [4]), Seq("u", SamplingParams(temperature=1e-7), [4])]
    assert make_sampler().sample(logits, seqs).tokens == logits.argmax(-1).tolist()
