"""A decoder-only transformer of the Llama / Qwen2 family in plain torch, reading a paged KV cache.

One forward call runs a whole engine step: every running sequence's tokens flattened into one
batch of ``T`` tokens. Decode tokens (one per sequence) come first, then prefill chunks. Each
layer writes its new keys/values into the paged cache at ``slot_mapping`` and attends:

* decode tokens: all of them at once, gathering each sequence's cache blocks by its block table
  (padded to the longest; a boolean mask hides the padding). Grouped-query attention is done by
  folding the query heads of one KV group into the query-length axis, so K/V are never repeated.
* prefill chunks: one SDPA call each; causal over the chunk's own K/V when nothing is cached
  before it, else over the gathered cache blocks with an offset causal mask (prefix-cache hits,
  chunked prefill, recompute after preemption).

Shapes: ``T`` tokens in the step, ``D`` hidden, ``H`` query heads, ``Hkv`` KV heads, ``Dh`` head dim,
``Bd`` decode sequences, ``NB`` blocks in the pool, ``bs`` block size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters (names follow Hugging Face's Llama/Qwen2 configs)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    head_dim: int = 0
    """0: hidden_size // num_heads."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    """``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` or None."""
    max_position_embeddings: int = 2048
    qkv_bias: bool = False
    tie_word_embeddings: bool = True
    model_type: str = "llama"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dh(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    def num_parameters(self) -> int:
        d, dh = self.hidden_size, self.dh
        attn = d * dh * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.qkv_bias:
            attn += dh * (self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + d

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """2 (K and V) · layers · KV heads · head dim · bytes per element."""
        elt = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.dh * elt


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [Dh/2], with Llama-3 style frequency-dependent scaling when configured."""
    dh = cfg.dh
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))
    sc = cfg.rope_scaling
    if sc and sc.get("rope_type", sc.get("type")) == "llama3":
        factor = float(sc["factor"])
        low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old_len = float(sc["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        # Long wavelengths (low frequencies) are slowed by `factor`, short ones kept, the middle
        # band interpolated smoothly between the two.
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


@dataclass
class PrefillSegment:
    """One prefill chunk inside the step's flattened tokens."""

    start: int
    """Offset of the chunk's first token in the step's ``T`` tokens."""
    length: int
    """Tokens in the chunk (the queries)."""
    context: int
    """Tokens of this sequence in the cache once the chunk is written (cached prefix + chunk)."""
    block_table: torch.Tensor | None = None
    """[nb] blocks covering ``context``; None when ``context == length`` (attend to the fresh K/V)."""
    mask: torch.Tensor | None = None
    """[length, nb·bs] bool, True where a query may attend (causal with offset, no padding)."""


@dataclass
class StepBatch:
    """Attention metadata of one step, built once by the engine and shared by every layer."""

    block_size: int
    slot_mapping: torch.Tensor
    """[T] cache slot (block · bs + offset) each token's K/V is written to."""
    num_decode: int
    decode_tables: torch.Tensor | None = None
    """[Bd, maxB] block tables of the decode sequences, padded with block 0."""
    decode_mask: torch.Tensor | None = None
    """[Bd, 1, 1, maxB·bs] bool, True for a sequence's real tokens; None when none is padded."""
    prefills: list[PrefillSegment] = field(default_factory=list)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Like HF: normalise in fp32, cast back, then scale.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


PACK_BATCH_HINT = 16
"""The batch size oneDNN is told to expect when it lays out a packed weight: a decode step's rows.
Any row count works with any layout; this one measured as fast as the exact size at 1–16 rows."""


def pack_weight(w: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked layout of a [out, in] float32 CPU weight, or None where it does not apply.

    Why: at every row count of a decode step, 1 to 16, ``F.linear`` (MKL sgemm over the row-major
    weight) runs 1.2–3.4× slower than oneDNN's matmul over a weight reordered once into its own
    blocked layout (SmolLM2's shapes, 30 distinct weights a layer type so none stays in cache, one
    and two threads: docs/benchmarks.md "Engine matmuls, F.linear vs packed"). vLLM's CPU build does
    the same. The packed copy *replaces* the row-major one (:meth:`Block.prepack`): no doubled weights.
    """
    mkldnn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    if w.device.type != "cpu" or w.dtype != torch.float32 or not mkldnn:
        return None
    with torch.no_grad():
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_BATCH_HINT)
    return packed


def linear(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, packed: torch.Tensor | None
) -> torch.Tensor:
    """x [N, in] @ w [out, in]ᵀ (+ b) → [N, out], through the packed copy of ``w`` when there is one
    (then ``w`` may be released: only the packed copy is read)."""
    if packed is None:
        return F.linear(x, w, b)
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
    return out


def release(w: torch.Tensor) -> nn.Parameter:
    """An empty stand-in for a weight whose packed form replaced it (same dtype and device): the
    row-major copy's memory goes back; reading it afterwards is a bug that fails loudly (no rows)."""
    return nn.Parameter(w.new_empty((0, w.shape[1])), requires_grad=False)


def rope_pair_order(dh: int) -> torch.Tensor:
    """Row order that turns HF's half-split RoPE layout into adjacent (re, im) pairs.

    HF rotates dimension i with i + Dh/2; we store q/k projection rows so that those two sit side by
    side (i → 2i, i + Dh/2 → 2i + 1). q·k is unchanged (q and k are permuted alike) and RoPE becomes
    one complex multiply. ``weight.view(heads, Dh, D)[:, order]`` converts HF → ours.
    """
    half = torch.arange(dh // 2)
    return torch.stack((half, half + dh // 2), dim=1).flatten()


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, Dh] with (re, im) pairs adjacent; freqs: complex [T, 1, Dh/2] → rotated x."""
    T, heads, dh = x.shape
    xc = torch.view_as_complex(x.float().reshape(T, heads, dh // 2, 2))  # [T, heads, Dh/2] complex
    return torch.view_as_real(xc * freqs).flatten(-2).to(x.dtype)  # [T, heads, Dh]


class Block(nn.Module):
    """One transformer layer: pre-norm GQA attention and a pre-norm SwiGLU MLP, both residual."""

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.h, self.hkv, self.dh = cfg.num_heads, cfg.num_kv_heads, cfg.dh
        self.q_size, self.kv_size = self.h * self.dh, self.hkv * self.dh
        d, dev = cfg.hidden_size, device
        self.input_norm = RMSNorm(d, cfg.rms_norm_eps, dev)
        # q, k and v projections fused into one matrix (one matmul per layer instead of three).
        self.qkv = nn.Linear(d, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias, device=dev)
        self.o = nn.Linear(self.q_size, d, bias=False, device=dev)
        self.post_norm = RMSNorm(d, cfg.rms_norm_eps, dev)
        # gate and up projections fused likewise; the first half is the gate.
        self.gate_up = nn.Linear(d, 2 * cfg.intermediate_size, bias=False, device=dev)
        self.down = nn.Linear(cfg.intermediate_size, d, bias=False, device=dev)
        self.ffn = cfg.intermediate_size
        self.scale = 1.0 / math.sqrt(self.dh)
        self.packed: dict[str, torch.Tensor] = {}
        """oneDNN-packed forms of the four weights (:meth:`prepack`); empty: plain ``F.linear``."""

    def prepack(self) -> None:
        """Pack the linear weights for CPU float32 matmuls, releasing each row-major weight its
        packed form replaces (its module keeps ``in_features`` / ``out_features``; the weight
        becomes an empty tensor). Once only: a packed layer has nothing left to pack."""
        if self.packed:
            return
        for name, mod in (("qkv", self.qkv), ("o", self.o), ("gate_up", self.gate_up), ("down", self.down)):
            p = pack_weight(mod.weight)
            if p is not None:
                self.packed[name] = p
                mod.weight = release(mod.weight)

    def forward(
        self,
        x: torch.Tensor,  # [T, D]
        freqs: torch.Tensor,  # [T, 1, Dh/2] complex
        k_cache: torch.Tensor,  # [NB·bs, Hkv, Dh]
        v_cache: torch.Tensor,  # [NB·bs, Hkv, Dh]
        batch: StepBatch,
    ) -> torch.Tensor:
        T = x.shape[0]
        pk = self.packed
        # Plain matmuls on the weights, not module calls: fewer Python layers per token.
        qkv = linear(self.input_norm(x), self.qkv.weight, self.qkv.bias, pk.get("qkv"))  # [T, (H + 2·Hkv)·Dh]
        qk = apply_rope(qkv[:, : self.q_size + self.kv_size].view(T, self.h + self.hkv, self.dh), freqs)
        q = qk[:, : self.h]  # [T, H, Dh]
        k = qk[:, self.h :]  # [T, Hkv, Dh]
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.hkv, self.dh)  # [T, Hkv, Dh]
        k_cache.index_copy_(0, batch.slot_mapping, k)
        v_cache.index_copy_(0, batch.slot_mapping, v)
        outs: list[torch.Tensor] = []
        nd = batch.num_decode
        if nd:
            outs.append(self._decode_attention(q[:nd], k_cache, v_cache, batch))  # [Bd, H·Dh]
        for seg in batch.prefills:
            outs.append(
                self._prefill_attention(q, k, v, k_cache, v_cache, seg, batch.block_size)
            )  # [n, H·Dh]
        attn = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)  # [T, H·Dh]
        x = x + linear(attn, self.o.weight, None, pk.get("o"))  # [T, D]
        gu = linear(self.post_norm(x), self.gate_up.weight, None, pk.get("gate_up"))  # [T, 2·F]
        act = F.silu(gu[:, : self.ffn]) * gu[:, self.ffn :]  # [T, F]
        return x + linear(act, self.down.weight, None, pk.get("down"))  # [T, D]

    def _decode_attention(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch
    ) -> torch.Tensor:
        assert batch.decode_tables is not None
        bd, tables = q.shape[0], batch.decode_tables
        g = self.h // self.hkv
        kb = k_cache.view(-1, batch.block_size, self.hkv, self.dh)  # [NB, bs, Hkv, Dh]
        vb = v_cache.view(kb.shape)
        # index_select, not kb[tables]: advanced indexing is ~50x slower here on CPU.
        flat = tables.view(-1)
        L = tables.shape[1] * batch.block_size
        k = kb.index_select(0, flat).view(bd, L, self.hkv, self.dh).transpose(1, 2)  # [Bd, Hkv, L, Dh]
        v = vb.index_select(0, flat).view(bd, L, self.hkv, self.dh).transpose(1, 2)  # [Bd, Hkv, L, Dh]
        # The g query heads sharing one KV head become g query rows of that head.
        qg = q.view(bd, self.hkv, g, self.dh)  # [Bd, Hkv, g, Dh]
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=batch.decode_mask, scale=self.scale)
        return o.reshape(bd, self.q_size)  # [Bd, H·Dh]

    def _prefill_attention(  # noqa: PLR0917
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        seg: PrefillSegment,
        bs: int,
    ) -> torch.Tensor:
        s, n = seg.start, seg.length
        qs = q[s : s + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, Dh]
        if seg.block_table is None:
            ks = k[s : s + n].transpose(0, 1).unsqueeze(0)  # [1, Hkv, n, Dh]
            vs = v[s : s + n].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale, enable_gqa=True)
        else:
            kb = k_cache.view(-1, bs, self.hkv, self.dh)  # [NB, bs, Hkv, Dh]
            vb = v_cache.view(kb.shape)
            ks = (
                kb.index_select(0, seg.block_table).flatten(0, 1).transpose(0, 1).unsqueeze(0)
            )  # [1, Hkv, nb·bs, Dh]
            vs = vb.index_select(0, seg.block_table).flatten(0, 1).transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=seg.mask, scale=self.scale, enable_gqa=True
            )  # [1, H, n, Dh]
        return o[0].transpose(0, 1).reshape(n, self.q_size)


class Transformer(nn.Module):
    """Embedding → layers → final norm → (tied) LM head, over a paged KV cache."""

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None) -> None:
        """``device="meta"`` builds without allocating (then ``to_empty`` + load or init)."""
        super().__init__()
        self.cfg = cfg
        # An explicit weight skips nn.Embedding's own init (which on "meta" imports torch._dynamo).
        self.embed = nn.Embedding(
            cfg.vocab_size,
            cfg.hidden_size,
            _weight=torch.empty(cfg.vocab_size, cfg.hidden_size, device=device),
        )
        self.layers = nn.ModuleList(Block(cfg, device) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device)
        self.lm_head: nn.Linear | None = (
            None
            if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device)
        )
        self.vocab_limit = cfg.vocab_size
        """Logits are computed for ids below this only (ids the tokenizer cannot decode are masked)."""
        self._rope: torch.Tensor | None = None
        self.packed_head: torch.Tensor | None = None

    def prepack(self) -> None:
        """oneDNN-packed forms of every linear weight and the LM head (see :func:`pack_weight`),
        replacing the row-major ones; a no-op off CPU float32. The engine calls it once the weights
        are loaded. A tied LM head is the embedding table, which the lookup still reads: that one
        weight is held twice (a [V, D] table, 113 MB for SmolLM2)."""
        for layer in self.blocks():
            layer.prepack()
        if self.packed_head is None:
            self.packed_head = pack_weight(self.head_weight().contiguous())
            if self.packed_head is not None and self.lm_head is not None:
                self.lm_head.weight = release(self.lm_head.weight)

    def rope_tables(self, max_len: int) -> None:
        """Precompute the rotations e^(i·pos·θ_j) [max_len, 1, Dh/2] (complex64) on the model's device."""
        inv = rope_inv_freq(self.cfg)  # [Dh/2] float64
        pos = torch.arange(max_len, dtype=torch.float64)
        angles = torch.outer(pos, inv)  # [max_len, Dh/2]
        freqs = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)
        self._rope = freqs.unsqueeze(1).to(self.embed.weight.device).contiguous()

    def blocks(self) -> list[Block]:
        """The layers, typed (``nn.ModuleList`` items are plain ``Module`` to a type checker)."""
        return [b for b in self.layers if isinstance(b, Block)]

    def head_weight(self) -> torch.Tensor:
        w = self.embed.weight if self.lm_head is None else self.lm_head.weight  # [V, D]
        return w[: self.vocab_limit]

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_cache: torch.Tensor,  # [layers, 2, NB·bs, Hkv, Dh]
        batch: StepBatch,
    ) -> torch.Tensor:
        """Hidden states [T, D] after the final norm; the caller picks rows for :meth:`logits`."""
        if self._rope is None:
            raise RuntimeError("call rope_tables() before forward()")
        freqs = self._rope.index_select(0, positions)  # [T, 1, Dh/2] complex
        x = F.embedding(input_ids, self.embed.weight)  # [T, D]
        for i, layer in enumerate(self.layers):
            x = layer(x, freqs, kv_cache[i, 0], kv_cache[i, 1], batch)
        out: torch.Tensor = self.norm(x)
        return out

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: [N, D] → float32 logits [N, vocab_limit]."""
        out: torch.Tensor = linear(h, self.head_weight(), None, self.packed_head).float()
        return out

    @torch.inference_mode()
    def dense_logits(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits [n, vocab_limit] of every position of one sequence [n], without the engine (a
        throw-away one-block cache); for tests and quick checks."""
        n = int(input_ids.shape[0])
        w = self.embed.weight
        if self._rope is None or self._rope.shape[0] < n:
            self.rope_tables(max(n, self.cfg.max_position_embeddings))
        cache = torch.zeros(
            (self.cfg.num_layers, 2, n, self.cfg.num_kv_heads, self.cfg.dh), device=w.device, dtype=w.dtype
        )  # [layers, 2, n, Hkv, Dh]
        pos = torch.arange(n, device=w.device)
        batch = StepBatch(block_size=n, slot_mapping=pos, num_decode=0, prefills=[PrefillSegment(0, n, n)])
        if n == 1:
            batch = StepBatch(
                block_size=1,
                slot_mapping=pos,
                num_decode=1,
                decode_tables=torch.zeros((1, 1), dtype=torch.long, device=w.device),
            )
        h = self(input_ids.to(w.device), pos, cache, batch)  # [n, D]
        return self.logits(h[-1:] if last_only else h)


def init_random(model: Transformer, seed: int) -> None:
    """Deterministic init: ones for norms, normal σ=0.02 for everything else, biases included (a
    zero bias would leave the qkv-bias path of a preset untested)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
