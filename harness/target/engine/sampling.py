"""Next-token selection for a whole step: every request's sampling parameters as per-row tensors.

One call of :meth:`Sampler.sample` handles the ``N`` rows (requests) sampled in a step with the
same few tensor ops, whatever mix of parameters they carry; rows that do not use a step get its
neutral value (bias 0, penalty 1, ``min_p`` 0, no top-k, ``top_p`` above 1). The order is vLLM's:

1. raw statistics of the model's distribution: log-softmax, the entropy, the chosen token's logprob
   and the top-k alternatives are all read from the raw logits (vLLM's default ``raw_logprobs``);
2. ``logit_bias`` (added) and the ``min_tokens`` floor (EOS and stop ids set to ``-inf``);
3. penalties: ``repetition_penalty`` over every token seen in the prompt or the output (as vLLM and
   Hugging Face ``RepetitionPenaltyLogitsProcessor`` apply it), then ``frequency_penalty`` ×
   count and ``presence_penalty`` over the output tokens only (as OpenAI defines them);
4. greedy rows (``temperature`` below :data:`GREEDY_BELOW`) take the argmax here;
5. sampled rows: temperature, ``min_p`` (relative to the top token's probability after
   temperature), top-k, top-p, then one uniform draw per row mapped through the row's cumulative
   distribution.

Steps 2, 3 and 5's filters run only when some row of the step uses them, so a batch of default
greedy requests pays for one max pass and the entropy (log-sum-exp and one weighted sum), sampled
ones for a softmax and a cumulative sum on top.

Penalties need per-request token statistics; :class:`PenaltyState` keeps them on the device as rows
of ``[rows, V]`` tensors that are updated with one scatter per step, so no step rebuilds them from
token lists. A request with a ``seed`` draws from its own ``torch.Generator`` exactly once per
output token, so its continuation does not depend on what else is in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.target.engine.api import SamplingParams


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


class SampledSequence(Protocol):
    """What the sampler reads from a request (``core.Request`` satisfies it)."""

    request_id: str
    params: SamplingParams
    generator: torch.Generator | None
    prompt_ids: list[int]
    output_ids: list[int]


@dataclass(slots=True)
class SampleOutput:
    """One step's choices, one entry per row, as Python values."""

    tokens: list[int]
    logprobs: list[float]
    """The chosen token's logprob under the raw distribution."""
    entropies: list[float]
    """Entropy (nats) of the raw distribution."""
    top_ids: list[list[int]] | None = None
    """Per row the ``max(top_logprobs)`` most likely token ids of the step, most likely first
    (each row keeps only its own ``top_logprobs`` of them); None when no row asked."""
    top_logprobs: list[list[float]] | None = None


GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy (vLLM's threshold): dividing by a tinier one overflows."""

# First guess of how many tokens a top-p head holds (see Sampler.warp).
_TOP_P_FIRST_K = 256


def _uses_penalty(p: SamplingParams) -> bool:
    return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0


class PenaltyState:
    """Penalty statistics of the running requests that use a penalty, as rows of device tensors.

    For the request holding row ``r``: ``offset[r, t]`` is what its frequency and presence
    penalties subtract from token ``t``'s logit (``frequency_penalty`` × count in the output +
    ``presence_penalty`` if it occurs there), ``in_output[r, t]`` whether ``t`` occurs in the
    output, and ``seen[r, t]`` whether it occurs in the prompt or the output (what the repetition
    penalty covers). A step's chosen tokens update all three with one scatter each, so a step reads
    them with one gather and one subtraction. A request gets a row when first sampled and gives it
    back when it finishes or is preempted; a row is (re)built from the request's token lists when
    acquired, so preemption by recompute needs no special case. Only running requests hold rows, so
    ``max_num_seqs`` rows always suffice; they are allocated on the first penalized request
    (``max_num_seqs`` × V × 6 bytes: 5.6 MiB for 32 × 30522).
    """

    def __init__(self, max_rows: int, vocab: int, device: torch.device) -> None:
        self.max_rows = max_rows
        self.vocab = vocab
        self.device = device
        self.offset = torch.empty(0)  # [rows, V] float32, allocated on first use
        self.in_output = torch.empty(0, dtype=torch.bool)  # [rows, V]
        self.seen = torch.empty(0, dtype=torch.bool)  # [rows, V]
        self.frequency = torch.empty(0)  # [rows] the holder's frequency_penalty
        self.presence = torch.empty(0)  # [rows] the holder's presence_penalty
        self._row: dict[str, int] = {}
        self._free: list[int] = []

    def rows_for(self, seqs: Sequence[SampledSequence]) -> torch.Tensor:
        """Row indices [P] for ``seqs``, acquiring (and filling) rows for those that have none."""
        if self.offset.numel() == 0:
            shape, dev = (self.max_rows, self.vocab), self.device
            self.offset = torch.zeros(shape, device=dev)
            self.in_output = torch.zeros(shape, dtype=torch.bool, device=dev)
            self.seen = torch.zeros(shape, dtype=torch.bool, device=dev)
            self.frequency = torch.zeros(self.max_rows, device=dev)
            self.presence = torch.zeros(self.max_rows, device=dev)
            self._free = list(range(self.max_rows - 1, -1, -1))
        rows = []
        for s in seqs:
            r = self._row.get(s.request_id)
            if r is None:
                r = self._acquire(s)
            rows.append(r)
        return torch.tensor(rows, dtype=torch.long).to(self.device, non_blocking=True)

    def _acquire(self, s: SampledSequence) -> int:
        if not self._free:
            raise RuntimeError("no penalty row free (more sampled requests than max_num_seqs)")
        r = self._free.pop()
        self._row[s.request_id] = r
        p, dev = s.params, self.device
        self.frequency[r] = p.frequency_penalty
        self.presence[r] = p.presence_penalty
        counts = torch.zeros(self.vocab, device=dev)
        if s.output_ids:  # re-acquired after preemption
            out = torch.tensor(s.output_ids, dtype=torch.long, device=dev)
            counts.index_add_(0, out, torch.ones(out.shape, device=dev))
        self.in_output[r] = counts > 0
        self.offset[r] = p.frequency_penalty * counts + p.presence_penalty * self.in_output[r].float()
        self.seen[r] = self.in_output[r]
        # Ids outside the logits (a prompt may hold ids the LM head does not cover) are dropped.
        prompt = torch.tensor(s.prompt_ids, dtype=torch.long, device=dev)
        self.seen[r, prompt[prompt < self.vocab]] = True
        return r

    def record(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Account this step's chosen ``tokens`` [P] of the requests holding ``rows`` [P]."""
        first = ~self.in_output[rows, tokens]  # [P]: presence applies once per token
        add = self.frequency[rows] + self.presence[rows] * first.float()  # [P]
        self.offset.index_put_((rows, tokens), add, accumulate=True)
        self.in_output[rows, tokens] = True
        self.seen[rows, tokens] = True

    def release(self, request_id: str) -> None:
        r = self._row.pop(request_id, None)
        if r is not None:
            self._free.append(r)


class Sampler:
    """Picks one token per row of a step's logits; owns the penalty statistics."""

    def __init__(
        self,
        vocab: int,
        max_rows: int,
        device: torch.device,
        eos_ids: Sequence[int],
        default_generator: torch.Generator,
    ) -> None:
        self.vocab = vocab
        self.device = device
        self.eos_ids = tuple(eos_ids)
        self.default_generator = default_generator
        self.penalties = PenaltyState(max_rows, vocab, device)

    def release(self, request_id: str) -> None:
        """The request finished or was preempted: free its penalty row."""
        self.penalties.release(request_id)

    def _tensor(self, values: Sequence[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def process(self, logits: torch.Tensor, seqs: Sequence[SampledSequence]) -> torch.Tensor:
        """Steps 2 and 3: bias, the ``min_tokens`` floor and penalties. ``logits`` [N, V] float32 is
        not modified; the result is the tensor greedy rows take their argmax of."""
        return self._process(logits, seqs)[0]

    def _process(
        self, logits: torch.Tensor, seqs: Sequence[SampledSequence]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """:meth:`process`, also returning (batch rows [P], penalty-state rows [P]) of the
        penalized requests, for recording the chosen tokens."""
        params = [s.params for s in seqs]
        x = logits
        pen_rows: tuple[torch.Tensor, torch.Tensor] | None = None
        # -- logit_bias: one scatter-add of all rows' (row, token, bias) triples.
        if any(p.logit_bias for p in params):
            rows, toks, vals = [], [], []
            for i, p in enumerate(params):
                for t, b in p.logit_bias:
                    rows.append(i)
                    toks.append(t)
                    vals.append(b)
            x = x.index_put(
                (self._tensor(rows, torch.long), self._tensor(toks, torch.long)),
                self._tensor(vals),
                accumulate=True,
            )
        # -- min_tokens: until the floor, no EOS (unless ignored) and no stop token ids.
        floor = [i for i, s in enumerate(seqs) if len(s.output_ids) < s.params.min_tokens]
        if floor:
            rows, toks = [], []
            for i in floor:
                p = params[i]
                banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_ids))
                for t in banned:
                    if t < self.vocab:
                        rows.append(i)
                        toks.append(t)
            if rows:
                x = x.index_put(
                    (self._tensor(rows, torch.long), self._tensor(toks, torch.long)),
                    torch.tensor(float("-inf"), device=self.device),
                )
        # -- penalties, on the rows that use one.
        pen = [i for i, p in enumerate(params) if _uses_penalty(p)]
        if pen:
            state = self.penalties
            state_rows = state.rows_for([seqs[i] for i in pen])  # [P]
            pen_idx = self._tensor(pen, torch.long)  # [P]
            every_row = len(pen) == len(params)
            xp = x if every_row else x.index_select(0, pen_idx)  # [P, V]
            reps = [params[i].repetition_penalty for i in pen]
            if any(r != 1.0 for r in reps):
                rep = self._tensor(reps).unsqueeze(1)  # [P, 1]
                seen = state.seen.index_select(0, state_rows)  # [P, V]
                # Seen tokens: positive logits divided by the penalty, negative ones multiplied.
                scale = torch.where(xp > 0, 1.0 / rep, rep)  # [P, V]
                xp = torch.where(seen, xp * scale, xp)
            xp = xp - state.offset.index_select(0, state_rows)  # frequency and presence
            x = xp if every_row else x.index_copy(0, pen_idx, xp)
            pen_rows = (pen_idx, state_rows)
        return x, pen_rows

    def warp(self, x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """Step 5's filters for sampled rows: temperature, ``min_p``, top-k, top-p.
        ``x`` [S, V] (processed logits of rows with temperature > 0) → logits to sample from."""
        v = x.shape[1]
        x = x / self._tensor([p.temperature for p in params]).unsqueeze(1)  # [S, V]
        if any(p.min_p > 0.0 for p in params):
            min_p = self._tensor([p.min_p for p in params]).unsqueeze(1)  # [S, 1]
            probs = torch.softmax(x, dim=-1)
            # Rows with min_p == 0 get threshold 0: nothing is below it.
            x = x.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
        ks = [p.top_k if 0 < p.top_k < v else 0 for p in params]
        if any(ks):
            k_max = max(ks)
            kth = torch.topk(x, k_max, dim=-1).values  # [S, k_max], descending
            k_idx = self._tensor([max(k, 1) - 1 for k in ks], torch.long).unsqueeze(1)  # [S, 1]
            threshold = kth.gather(1, k_idx)  # [S, 1]: each row's k-th largest logit
            off = self._tensor([k == 0 for k in ks], torch.bool).unsqueeze(1)  # [S, 1]
            # Ties with the k-th logit are kept (as Hugging Face's TopKLogitsWarper does).
            x = x.masked_fill((x < threshold) & ~off, float("-inf"))
        if any(p.top_p < 1.0 for p in params):
            # Rows without top-p get 2: no cumulative mass reaches it, even with rounding.
            top_p = self._tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params]).unsqueeze(1)  # [S, 1]
            probs = torch.softmax(x, dim=-1)  # [S, V]
            # The kept head is usually short: sort only the k most likely tokens, growing k until
            # every row's head is inside (a full sort of [S, V] costs ~40x a softmax on CPU).
            k = min(v, _TOP_P_FIRST_K)
            while True:
                head = torch.topk(probs, k, dim=-1).values  # [S, k], descending
                mass = head.cumsum(dim=-1)  # [S, k]
                if k == v or bool(((mass[:, -1:] >= top_p) | (top_p > 1.0)).all()):
                    break
                k = v if 16 * k >= v else 8 * k  # past half the vocabulary, a full sort is cheaper
            # Keep the smallest head whose mass reaches top_p (the token that crosses it included):
            # its least likely member is the row's threshold.
            keep = (mass - head) < top_p  # [S, k]; the first token always
            threshold = head.masked_fill(~keep, float("inf")).amin(dim=-1, keepdim=True)  # [S, 1]
            threshold = threshold.masked_fill(top_p > 1.0, 0.0)
            x = x.masked_fill(probs < threshold, float("-inf"))
        return x

    def _uniforms(self, seqs: Sequence[SampledSequence]) -> torch.Tensor:
        """One uniform draw in (0, 1] per row [S, 1]: seeded requests from their own generator,
        the others from the engine's, in one call."""
        default = self.default_generator
        own = [s.generator not in (None, default) for s in seqs]
        shared = [i for i, o in enumerate(own) if not o]
        u = torch.empty((len(seqs), 1), device=self.device)
        if shared:
            draws = torch.rand((len(shared), 1), generator=default, device=self.device)
            u[self._tensor(shared, torch.long)] = draws
        for i, s in enumerate(seqs):
            if own[i]:
                u[i] = torch.rand(1, generator=s.generator, device=self.device)
        return 1.0 - u  # torch.rand is [0, 1); a draw of 0 could land on a zero-probability token

    def sample(self, logits: torch.Tensor, seqs: Sequence[SampledSequence]) -> SampleOutput:
        """Pick one token per row of ``logits`` [N, V] (float32, raw) for the requests ``seqs``."""
        n, v = logits.shape
        params = [s.params for s in seqs]
        # 1. Raw statistics (what logprobs and entropy report). One max pass gives the shift and
        # the raw argmax (greedy rows without bias or penalties need nothing else); entropy is
        # log Z − E[x] with Z = Σ exp(x − max): five passes over [N, V] where a log-softmax,
        # an entropy and a separate argmax took seven.
        raw_max, raw_argmax = logits.max(dim=-1, keepdim=True)  # [N, 1]
        e = torch.exp(logits - raw_max)  # [N, V]
        z = e.sum(dim=-1, keepdim=True)  # [N, 1]
        lse = raw_max + z.log()  # [N, 1]: log-sum-exp of the raw logits
        entropy = lse.squeeze(1) - (e * logits).sum(dim=-1) / z.squeeze(1)  # [N]
        k_top = max(p.top_logprobs for p in params)
        top: tuple[torch.Tensor, torch.Tensor] | None = None
        if k_top > 0:
            vals, ids = torch.topk(logits, min(k_top, v), dim=-1)  # [N, k_top]
            top = (vals - lse, ids)
        # 2–3. Bias, floor, penalties.
        x, pen_rows = self._process(logits, seqs)  # [N, V]
        argmax = raw_argmax.squeeze(1) if x is logits else x.argmax(dim=-1)  # [N]
        # 4–5. Greedy rows: argmax. Sampled rows: filters, then inverse-CDF with one draw each.
        sampled = [i for i, p in enumerate(params) if p.temperature >= GREEDY_BELOW]
        if not sampled:
            tokens = argmax
        else:
            all_sampled = len(sampled) == n
            s_idx = self._tensor(sampled, torch.long)  # [S]
            xs = x if all_sampled else x.index_select(0, s_idx)  # [S, V]
            xs = self.warp(xs, [params[i] for i in sampled])
            cdf = torch.softmax(xs, dim=-1).cumsum(dim=-1)  # [S, V]
            u = self._uniforms([seqs[i] for i in sampled])  # [S, 1]
            # First index whose cumulative mass reaches u: always a token of non-zero probability.
            picked = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=v - 1).squeeze(1)  # [S]
            tokens = picked if all_sampled else argmax.index_copy(0, s_idx, picked)
        chosen = logits.gather(1, tokens.unsqueeze(1)) - lse  # [N, 1]
        if pen_rows is not None:
            pen_idx, state_rows = pen_rows
            self.penalties.record(state_rows, tokens.index_select(0, pen_idx))
        out = SampleOutput(tokens.tolist(), chosen.squeeze(1).tolist(), entropy.tolist())
        if top is not None:
            out.top_logprobs, out.top_ids = top[0].tolist(), top[1].tolist()
        return out
