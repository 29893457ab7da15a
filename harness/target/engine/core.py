"""The synchronous engine: requests, the continuous-batching scheduler and one ``step()``.

Every step (1) gives each running sequence its next chunk (one token when decoding, a prompt chunk
while prefilling), preempting the most recently admitted sequences by recompute when the KV pool
runs out, (2) admits waiting requests FIFO while ``max_num_seqs``, the ``max_num_batched_tokens``
budget and free blocks allow, (3) runs all chunks in ONE forward pass, (4) samples a token for
each sequence whose chunk reached its end and turns it into a :class:`TokenEvent`.

A sequence's state is just its token list and how many of those tokens have K/V in the cache, so
decode, chunked prefill, prefix-cache hits and recompute after preemption are the same code path.
This class is not thread-safe: one :class:`~harness.target.engine.async_engine.StepLoop` drives it from
one thread (of the server's process, or of the engine's own).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from harness.target.engine.api import (
    EngineError,
    EngineStats,
    FinishReason,
    RequestLimits,
    RequestMetrics,
    SamplingParams,
    TokenEvent,
    TopLogprob,
)
from harness.target.engine.kv_cache import BlockManager
from harness.target.engine.model import PrefillSegment, StepBatch, Transformer
from harness.target.engine.sampling import GREEDY_BELOW, Sampler, make_generator
from harness.target.engine.tokenizer import Detokenizer, HFTokenizer


@dataclass(eq=False)
class Request:
    """One generation request and its progress."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float
    use_prefix_cache: bool = True
    """False: served as if the prefix cache were empty, and registers nothing in it (fault injection)."""
    priority: int = 0
    """> 0: a warmup's request; the blocks it registers enter the prefix cache with that priority
    (:meth:`harness.target.engine.kv_cache.BlockManager.allocate`; honoured by ``s3fifo``, not by ``lru``)."""
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)
    """Prompt + output so far (what the cache must hold before the next sample)."""
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    """Characters of ``text`` already sent."""
    detok: Detokenizer | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    first_scheduled: float | None = None
    prefill_done: bool = False
    finished: bool = False
    peak_bytes: int = 0
    """CUDA: the largest per-step peak memory seen while this request was prefilling."""
    prefill_blocks_before: int = 0
    """KV blocks taken by earlier attempts at this prefill, which a preemption before the first
    token freed (the block table that counted them is gone; the blocks were allocated all the same)."""
    entropy_sum: float = 0.0
    """Sum of the per-token entropies so far (for ``RequestMetrics.mean_entropy``)."""
    stop_floor: int = 0
    """Characters of ``text`` produced by the first ``min_tokens`` tokens: a stop string must end
    after them to count (vLLM's rule)."""

    _computed: int = 0
    """Tokens of ``tokens`` whose K/V are in the cache."""


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class EngineCore:
    """Scheduler + model runner over a paged KV cache."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: HFTokenizer,
        *,
        device: torch.device,
        dtype: torch.dtype,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_prefix_caching: bool = True,
        prefix_eviction: str = "lru",
        seed: int = 0,
        slowdown: float = 1.0,
        kv_overalloc: float = 0.0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.cfg = model.cfg
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.blocks = BlockManager(
            num_blocks, block_size, enable_prefix_caching, prefix_eviction, overalloc=kv_overalloc
        )
        """Its ``overalloc`` is the injected regression ``EngineSettings.inject_kv_overalloc`` (0: none)."""
        c = model.cfg
        self.kv_cache = torch.zeros(
            (c.num_layers, 2, num_blocks * block_size, c.num_kv_heads, c.dh), device=device, dtype=dtype
        )  # [layers, K/V, slots, Hkv, Dh]
        self.kv_bytes_per_token = c.kv_bytes_per_token(dtype)
        # What one block holds in the tensor above: layers × K/V × block_size slots × Hkv × Dh elements.
        self.block_bytes = self.kv_cache.nbytes // num_blocks
        self.limits = RequestLimits(max_model_len, c.vocab_size, model.vocab_limit)
        """What a request must fit; the front end checks the same before it posts one."""
        model.rope_tables(max_model_len + 1)
        model.prepack()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.default_generator = make_generator(seed, device)
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.sampler = Sampler(
            model.vocab_limit, max_num_seqs, device, sorted(self.eos_ids), self.default_generator
        )
        self.num_preemptions = 0
        self.num_steps = 0
        self._is_cuda = device.type == "cuda"
        self.slowdown = slowdown
        """Injected regression (``EngineSettings.inject_slowdown``); 1.0: none."""
        self.injected_s = 0.0
        """Seconds waited so far to inject it (tests and logs check the injection is what it says)."""

    # ---- requests -------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        use_prefix_cache: bool = True,
        priority: int = 0,
    ) -> Request:
        """Queue a request. ``use_prefix_cache=False``, ``priority``: see :meth:`AsyncEngine.generate`."""
        self.limits.check_request(len(prompt_ids), params)
        self.limits.check_prompt(prompt_ids)
        if request_id in self.requests:
            raise EngineError(f"request id {request_id!r} is already in use")
        req = Request(request_id, list(prompt_ids), params, time.perf_counter(), use_prefix_cache, priority)
        req.tokens = list(prompt_ids)
        req.detok = Detokenizer(self.tokenizer, req.prompt_ids)
        req.metrics.prompt_tokens = len(prompt_ids)
        req.metrics.device = str(self.device)
        if params.temperature >= GREEDY_BELOW:
            req.generator = (
                make_generator(params.seed, self.device)
                if params.seed is not None
                else self.default_generator
            )
        self.requests[request_id] = req
        self.waiting.append(req)
        return req

    def abort(self, request_id: str) -> TokenEvent | None:
        """Drop a request wherever it is and free its blocks; returns its final event."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        if req in self.running:
            self.running.remove(req)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        return self._finish(req, "abort", None)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling -----------------------------------------------------------------------------
    def _preempt(self, req: Request) -> None:
        """Free a running request's blocks; it goes back to the front of the queue to be recomputed."""
        self.running.remove(req)
        if not req.prefill_done:
            req.prefill_blocks_before += self.blocks.tables[req.request_id].taken
        self.blocks.free(req.request_id)
        self.sampler.release(req.request_id)
        req._computed = 0
        req.metrics.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _extra_room(self, req: Request) -> int:
        """The most blocks the injected over-allocation may add to ``req``'s allocation: what an
        otherwise empty pool has left once the request holds every block of its longest life
        (prompt + ``max_tokens``). Without this cap a request near the pool's size would never be
        admitted, or would preempt itself at every step for ever; with it, a request alone in the
        pool always runs to the end, and only such near-pool-size requests get less than F extra."""
        return self.blocks.num_blocks - self.blocks.blocks_for(len(req.prompt_ids) + req.params.max_tokens)

    def _schedule(self) -> list[tuple[Request, int]]:
        """Pick this step's (request, chunk length) pairs, decodes first."""
        budget = self.max_num_batched_tokens
        chosen: list[tuple[Request, int]] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(len(req.tokens) - req._computed, budget)
            while not self.blocks.can_append(req.request_id, n):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            if req not in self.running:
                break  # preempted itself: everything after it was preempted too
            self.blocks.ensure_capacity(req.request_id, req._computed + n)
            chosen.append((req, n))
            budget -= n
            i += 1
        # Admit new (or preempted) requests between decode steps.
        watermark = max(1, self.blocks.num_blocks // 100) if self.running else 0
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            use_cache = req.use_prefix_cache
            room = self._extra_room(req)
            if not self.blocks.can_admit(
                req.tokens, reserve=watermark, use_prefix_cache=use_cache, max_extra=room
            ):
                break
            self.waiting.popleft()
            cached = self.blocks.allocate(
                req.request_id, req.tokens, req.priority, use_prefix_cache=use_cache, max_extra=room
            )
            req._computed = cached
            if req.first_scheduled is None:
                req.first_scheduled = time.perf_counter()
                req.metrics.queued_ms = (req.first_scheduled - req.arrival) * 1e3
                req.metrics.cached_prompt_tokens = cached
            n = min(len(req.tokens) - cached, budget)
            self.running.append(req)
            chosen.append((req, n))
            budget -= n
        decodes = [c for c in chosen if c[1] == 1]
        prefills = [c for c in chosen if c[1] > 1]
        return decodes + prefills

    # ---- the step -------------------------------------------------------------------------------
    def _build_batch(
        self, chosen: list[tuple[Request, int]]
    ) -> tuple[torch.Tensor, torch.Tensor, StepBatch, list[int]]:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        last_rows: list[int] = []
        dec_tables: list[list[int]] = []
        dec_lens: list[int] = []
        segs: list[PrefillSegment] = []
        blocks = self.blocks
        for req, n in chosen:
            start = req._computed
            table = blocks.tables[req.request_id]
            row0 = len(ids)
            ids.extend(req.tokens[start : start + n])
            pos.extend(range(start, start + n))
            if n == 1:
                slots.append(table.blocks[start // bs].block_id * bs + start % bs)
                dec_tables.append([b.block_id for b in table.blocks[: blocks.blocks_for(start + 1)]])
                dec_lens.append(start + 1)
            else:
                slots.extend(blocks.slots_for(req.request_id, start, n))
                seg = PrefillSegment(start=row0, length=n, context=start + n)
                if start > 0:
                    nb = blocks.blocks_for(start + n)
                    seg.block_table = torch.tensor(
                        [b.block_id for b in table.blocks[:nb]], dtype=torch.long
                    ).to(self.device, non_blocking=True)
                    q_pos = torch.arange(start, start + n).unsqueeze(1)  # [n, 1]
                    k_pos = torch.arange(nb * bs).unsqueeze(0)  # [1, nb·bs]
                    seg.mask = (k_pos <= q_pos).to(self.device, non_blocking=True)
                segs.append(seg)
            if start + n == len(req.tokens):
                last_rows.append(len(ids) - 1)
        dev = self.device
        batch = StepBatch(
            block_size=bs,
            slot_mapping=torch.tensor(slots, dtype=torch.long).to(dev, non_blocking=True),
            num_decode=len(dec_tables),
            prefills=segs,
        )
        if dec_tables:
            width = max(len(t) for t in dec_tables)
            padded = [t + [0] * (width - len(t)) for t in dec_tables]
            batch.decode_tables = torch.tensor(padded, dtype=torch.long).to(dev, non_blocking=True)
            lens = torch.tensor(dec_lens, dtype=torch.long)
            mask = torch.arange(width * bs).unsqueeze(0) < lens.unsqueeze(1)  # [Bd, L]
            batch.decode_mask = mask.view(len(dec_tables), 1, 1, width * bs).to(dev, non_blocking=True)
        input_ids = torch.tensor(ids, dtype=torch.long).to(dev, non_blocking=True)
        positions = torch.tensor(pos, dtype=torch.long).to(dev, non_blocking=True)
        return input_ids, positions, batch, last_rows

    @torch.inference_mode()
    def step(self) -> list[TokenEvent]:
        """Run one scheduler step and forward pass; returns the events it produced."""
        chosen = self._schedule()
        if not chosen:
            return []
        self.num_steps += 1
        started = time.perf_counter()
        prefilling = [r for r, _ in chosen if not r.prefill_done]
        base_mem = 0
        if prefilling and self._is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            base_mem = torch.cuda.memory_allocated(self.device)
        input_ids, positions, batch, last_rows = self._build_batch(chosen)
        hidden = self.model(input_ids, positions, self.kv_cache, batch)  # [T, D]
        sampled_reqs = [r for r, n in chosen if r._computed + n == len(r.tokens)]
        for req, n in chosen:
            self.blocks.record_written(req.request_id, req.tokens, req._computed + n)
            req._computed += n
        if prefilling and self._is_cuda:
            # Peak over this step, above what was allocated when it began (weights, KV pool);
            # a chunked prefill keeps the largest of its steps.
            peak = torch.cuda.max_memory_allocated(self.device) - base_mem
            for req in prefilling:
                req.peak_bytes = max(req.peak_bytes, peak)
        events: list[TokenEvent] = []
        if sampled_reqs:
            rows = torch.tensor(last_rows, dtype=torch.long, device=self.device)
            logits = self.model.logits(hidden.index_select(0, rows))  # [N, V] float32
            out = self.sampler.sample(logits, sampled_reqs)
            now = time.perf_counter()
            for j, req in enumerate(sampled_reqs):
                if not req.prefill_done:
                    self._note_prefill(req, now)
                p = req.params
                top: list[TopLogprob] | None = None
                if p.top_logprobs and out.top_ids is not None and out.top_logprobs is not None:
                    ids = out.top_ids[j][: p.top_logprobs]
                    assert req.detok is not None
                    # The text each alternative would have added here: decoded before the chosen
                    # token moves the detokenizer on.
                    texts = req.detok.peek(ids)
                    top = [
                        TopLogprob(t, text, lp)
                        for t, text, lp in zip(ids, texts, out.top_logprobs[j], strict=False)
                    ]
                req.entropy_sum += out.entropies[j]
                ev = self._emit(req, out.tokens[j], now)
                ev.entropy = out.entropies[j]
                if p.logprobs:
                    ev.logprob = out.logprobs[j]
                ev.top_logprobs = top
                events.append(ev)
        if self.slowdown > 1.0:
            # Stretch the step as a slower kernel would, by waiting (not spinning: the load generator
            # beside a co-located target must not lose CPU to it), so the regression is the same size
            # on any machine: (f − 1) × this step's own time.
            extra = (self.slowdown - 1.0) * (time.perf_counter() - started)
            self.injected_s += extra
            time.sleep(extra)
        return events

    def _note_prefill(self, req: Request, now: float) -> None:
        req.prefill_done = True
        m = req.metrics
        # The blocks the block manager handed this request for its prompt, counted where it took
        # them (at admission and in every chunk's step; over-allocated ones included, as they are
        # gone from the pool all the same); the next token's block comes later.
        taken = req.prefill_blocks_before + self.blocks.tables[req.request_id].taken
        m.prefill_kv_bytes, m.prefill_kv_measured = taken * self.block_bytes, True
        start = req.first_scheduled or req.arrival
        m.prefill_ms = (now - start) * 1e3
        m.ttft_ms = (now - req.arrival) * 1e3
        if self._is_cuda:
            m.prefill_peak_bytes, m.peak_measured = req.peak_bytes, True
        else:
            m.prefill_peak_bytes = self.estimate_prefill_bytes(
                len(req.tokens) - m.cached_prompt_tokens, len(req.tokens)
            )
            m.peak_measured = False

    def estimate_prefill_bytes(self, new_tokens: int, context: int) -> int:
        """CPU estimate of a prefill's peak memory, weights excluded: the KV it writes plus the
        largest live activations of one layer (hidden, qkv, gate/up, attention scores) and the
        float32 logits of its last token."""
        c = self.cfg
        elt = torch.empty((), dtype=self.dtype).element_size()
        kv = self.blocks.blocks_for(new_tokens) * self.block_size * self.kv_bytes_per_token
        per_tok = 2 * c.hidden_size + (c.num_heads + 2 * c.num_kv_heads) * c.dh + 3 * c.intermediate_size
        scores = c.num_heads * new_tokens * context * 4
        return kv + new_tokens * per_tok * elt + scores + self.model.vocab_limit * 4

    def _emit(self, req: Request, tok: int, now: float) -> TokenEvent:
        p = req.params
        req.output_ids.append(tok)
        req.tokens.append(tok)
        finish: FinishReason | None = None
        # EOS and stop ids cannot be sampled below min_tokens (the sampler masks them).
        if (tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            finish = "stop"
        else:
            assert req.detok is not None
            req.text += req.detok.add(tok)
            if len(req.output_ids) <= p.min_tokens:
                req.stop_floor = len(req.text)
            elif p.stop:
                window = max(len(s) for s in p.stop)
                lo = max(0, req.emitted - window)
                cut = -1
                for s in p.stop:
                    # Only a match that ends after the min_tokens floor counts.
                    k = req.text.find(s, max(lo, req.stop_floor - len(s) + 1))
                    if k >= 0 and (cut < 0 or k < cut):
                        cut = k
                if cut >= 0:
                    req.text = req.text[:cut]
                    finish = "stop"
        if finish is None and len(req.output_ids) >= p.max_tokens:
            finish = "length"
        if finish is not None:
            if req in self.running:
                self.running.remove(req)
            return self._finish(req, finish, tok, now)
        end = len(req.text) - (_held_back(req.text, p.stop) if p.stop else 0)
        text = req.text[req.emitted : end] if end > req.emitted else ""
        req.emitted = max(req.emitted, end)
        return TokenEvent(req.request_id, tok, text)

    def _finish(
        self, req: Request, reason: FinishReason, tok: int | None, now: float | None = None
    ) -> TokenEvent:
        now = now if now is not None else time.perf_counter()
        req.finished = True
        self.blocks.free(req.request_id)
        self.sampler.release(req.request_id)
        self.requests.pop(req.request_id, None)
        m = req.metrics
        m.output_tokens = len(req.output_ids)
        # One entropy per output token: each was sampled from a distribution the step measured.
        m.mean_entropy = req.entropy_sum / m.output_tokens if m.output_tokens else None
        m.e2e_ms = (now - req.arrival) * 1e3
        if m.output_tokens > 1:
            m.tpot_ms = (m.e2e_ms - m.ttft_ms) / (m.output_tokens - 1)
        text = req.text[req.emitted :] if reason != "abort" else ""
        req.emitted = len(req.text)
        return TokenEvent(req.request_id, tok, text, finished=True, finish_reason=reason, metrics=m)

    def reset_prefix_cache(self) -> int:
        """Empty the prefix cache (see :meth:`BlockManager.reset_prefix_cache`); returns the number
        of cached blocks freed. Call it between steps, on the thread that steps."""
        return self.blocks.reset_prefix_cache()

    # ---- introspection --------------------------------------------------------------------------
    def validate(self) -> None:
        """Check the KV layout against every running request's tokens (see BlockManager.validate)."""
        self.blocks.validate((r.request_id, r.tokens) for r in self.running)

    def stats(self) -> EngineStats:
        b = self.blocks
        return EngineStats(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_blocks_total=b.num_blocks,
            kv_blocks_used=b.num_used,
            kv_blocks_cached=b.num_cached_free,
            prefix_query_tokens=b.prefix_query_tokens,
            prefix_hit_tokens=b.prefix_hit_tokens,
            preemptions=self.num_preemptions,
            steps=self.num_steps,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            extra={
                "block_size": float(self.block_size),
                "kv_bytes_per_token": float(self.kv_bytes_per_token),
                "max_model_len": float(self.max_model_len),
            },
        )
