"""Next-token selection for a batch: greedy rows in one argmax, sampled rows each with its own RNG.

A request with a ``seed`` gets its own ``torch.Generator`` that draws exactly one sample per output
token, so its continuation does not depend on what else is in the batch. Logprob and entropy,
when asked for, describe the model's raw distribution (temperature 1, no top-k/top-p filtering).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.engine.api import SamplingParams


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to one row of logits [V] (float32)."""
    x = logits / params.temperature
    v = x.shape[-1]
    if 0 < params.top_k < v:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Keep the smallest head whose mass reaches top_p (the token that crosses it included).
        drop = (probs.cumsum(-1) - probs) >= params.top_p
        drop[0] = False
        x = x.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return x


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
) -> list[int]:
    """Pick one token per row of ``logits`` [N, V] (float32)."""
    n = logits.shape[0]
    greedy = [i for i in range(n) if params[i].temperature <= 0.0]
    out = [0] * n
    if greedy:
        rows = logits if len(greedy) == n else logits[greedy]
        for i, t in zip(greedy, rows.argmax(-1).tolist(), strict=True):
            out[i] = int(t)
    for i in range(n):
        p = params[i]
        if p.temperature <= 0.0:
            continue
        probs = torch.softmax(filter_logits(logits[i], p), dim=-1)
        out[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return out


def logprob_entropy(logits: torch.Tensor, tokens: Sequence[int]) -> tuple[list[float], list[float]]:
    """Logprob of each chosen token and the entropy (nats) of each row's distribution."""
    logp = torch.log_softmax(logits, dim=-1)  # [N, V]
    idx = torch.tensor(list(tokens), device=logits.device).unsqueeze(1)
    chosen = logp.gather(1, idx).squeeze(1)
    ent = -(logp.exp() * logp).nan_to_num().sum(-1)
    return chosen.tolist(), ent.tolist()
