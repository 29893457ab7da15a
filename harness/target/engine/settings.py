"""Engine settings (env prefix ``HARNESS__ENGINE__``), shared by ``harness serve`` and the benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

from harness.common.options import Flag
from harness.common.settings import stage_config

SERVE_PANEL = "Engine"
"""``harness serve --help``'s panel of the engine's options: a field with a :class:`Flag` is one
(:func:`harness.common.options.flagged`), its help the field's ``description``."""
FAULTS_PANEL = "Fault injection (never in production)"
Preset = Literal["tiny", "small", "qwen2-0.5b", "smollm2"]


class EngineSettings(BaseSettings):
    """What model to run, where, and how the scheduler and KV cache are sized."""

    model_config = stage_config("engine")

    preset: Annotated[Preset | None, Flag(panel=SERVE_PANEL)] = Field(
        "tiny",
        description="Random-init preset (tiny, small, qwen2-0.5b) or real weights fetched by `make "
        "setup` (smollm2: SmolLM2-135M-Instruct, Apache-2.0, Q4_1 weights as float32); ignored with --model",
    )
    """A random-init architecture (``tiny``, ``small``, ``qwen2-0.5b``; fixed seed) or a real model
    fetched by ``make setup`` (``smollm2``: SmolLM2-135M-Instruct, Apache-2.0, 4-bit Q4_1 weights
    expanded to float32; see :mod:`harness.target.engine.weights`). Ignored when ``model_dir`` is set."""
    model_dir: Annotated[Path | None, Flag(names=("--model",), panel=SERVE_PANEL)] = Field(
        None, description="Hugging Face checkpoint directory (overrides --preset)"
    )
    """A local Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json)."""
    model_name: str | None = None
    """Name served in the API; defaults to the preset name or the directory name."""
    device: Annotated[str, Flag(panel=SERVE_PANEL)] = Field(
        "auto", description="auto (CUDA when present, else CPU), cpu, cuda or cuda:N"
    )
    """``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """``auto``: bfloat16 on CUDA, float32 on CPU."""
    seed: int = 0
    block_size: Annotated[int, Flag(panel=SERVE_PANEL)] = Field(
        default=16, ge=1, le=1024, description="Tokens per KV block"
    )
    num_kv_blocks: int | None = Field(default=None, ge=2)
    """KV blocks in the pool; default: sized from ``kv_cache_bytes``."""
    kv_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    max_model_len: Annotated[int | None, Flag(panel=SERVE_PANEL)] = Field(
        default=None, ge=8, description="Context length cap"
    )
    """Context length; default: the model's own, capped by what the KV pool can hold."""
    max_num_seqs: Annotated[int, Flag(panel=SERVE_PANEL)] = Field(
        default=32, ge=1, description="Requests decoded together"
    )
    max_num_batched_tokens: int = Field(default=2048, ge=16)
    max_waiting: Annotated[int, Flag(panel=SERVE_PANEL)] = Field(
        default=256, ge=0, description="Waiting-queue size before HTTP 429"
    )
    """Waiting-queue capacity; a request beyond it is refused with :class:`EngineFull` (HTTP 429)."""
    enable_prefix_caching: bool = True
    prefix_eviction: str = "lru"
    """Which cached prefix block a new allocation evicts: a name in
    :data:`harness.target.engine.kv_cache.EVICTION_POLICIES`: ``lru`` (least recently used) or
    ``s3fifo`` (scan-resistant: one-off prompts do not push a reused prefix out; a warmup's
    blocks can be registered with a priority). An unknown name fails at engine start, listing
    the known ones."""
    step_loop: Annotated[Literal["process", "thread"], Flag(panel=SERVE_PANEL)] = Field(
        "process",
        description="process (the engine's step loop in a process of its own, fed over a local socket, "
        "as vLLM's engine core) or thread (a thread of the server's process)",
    )
    """Where the scheduler, KV pool and model run (:mod:`harness.target.engine.process`): ``process``
    keeps the server's front end (HTTP, response cache, metrics) out of the engine's interpreter, so
    neither waits on the other's GIL; ``thread`` runs the step loop in the server's process (one
    interpreter, one model load less: tests and one-shot CLI calls)."""
    engine_nice: Annotated[int, Flag(panel=SERVE_PANEL)] = Field(
        default=5,
        ge=0,
        le=19,
        description="How much lower the engine process's CPU priority is than the server's (a Unix "
        "nice increment; 0: the same): the front end's short work (a cache hit, an SSE write) runs "
        "first when both want a core",
    )
    """With ``step_loop="process"``: the engine process lowers its own priority by this much (Unix
    ``nice``) once its model is loaded (loading runs at the server's priority). The server's work is
    short and waited on; the engine's is long. Measured on 2 CPUs (docs/engine.md, *The engine
    process*): at 5, a cache hit while 8 streams decode costs 1.05× a hit on an idle engine (1.86× at
    0), and decode throughput against vLLM is unchanged. Ignored with ``thread`` (one process has one
    priority) and where the OS has no ``nice``."""
    cpu_threads: Annotated[int | None, Flag(panel=SERVE_PANEL)] = Field(
        default=None, ge=1, description="Engine compute threads (default: one per compute CPU)"
    )
    """torch intra-op threads of the engine (``torch.set_num_threads``); default: one per compute CPU
    when ``bind_cores`` binds, else torch's own default (one per core)."""
    bind_cores: Annotated[str, Flag(panel=SERVE_PANEL)] = Field(
        "off",
        description="off, auto (compute on all CPUs but one, the event loop on that one, as "
        "vLLM's CPU build) or a CPU list like 1-3 for the engine's compute threads",
    )
    """Where the engine computes (:mod:`harness.target.engine.placement`): ``off`` (not bound: the OS
    places every thread), ``auto`` (vLLM's CPU default: compute on all CPUs but one, the server's
    event loop on that one) or a CPU list like ``1-3`` (compute there, the front end on the rest).
    Linux only."""
    inject_slowdown: Annotated[float, Flag(panel=FAULTS_PANEL)] = Field(
        default=1.0, ge=1.0, le=100.0,
        description="Every engine step (prefill and decode) takes FACTOR times as long "
        "(1.5 = a 1.5x slower engine), to prove a gate catches a regression. Off: 1.0",
    )  # fmt: skip
    """Fault injection for proving gates (``harness serve --inject-slowdown 1.5``): every engine step,
    prefill and decode, takes this many times as long (the engine waits out the extra after the
    forward pass), like a slower kernel: a code regression whose size is the same on any machine, so a
    gate must catch it anywhere. 1.0: off. Never set in production."""
    inject_kv_overalloc: Annotated[float, Flag(panel=FAULTS_PANEL)] = Field(
        default=0.0, ge=0.0, le=10.0, allow_inf_nan=False,
        description="Every prefill takes ceil((1+F) x the KV blocks it needs), the extra "
        "ones held unused until the request ends (0.2 = 20% more KV bytes per prompt token), to prove a "
        "gate catches a memory regression. Off: 0",
    )  # fmt: skip
    """Fault injection for proving gates (``harness serve --inject-kv-overalloc 0.2``): every prefill
    takes ``ceil((1 + F) × n)`` KV blocks where it needs ``n``, the extra ones held unused until the
    request ends (:mod:`harness.target.engine.kv_cache`), like an allocator bug: ``prefill_kv_bytes`` and
    the gate ``prefill_kv_bytes_per_token_p95`` rise by about F, and the pool holds fewer requests.
    0.0: off. Never set in production."""

    @model_validator(mode="after")
    def _placement(self) -> EngineSettings:
        """A CPU list that cannot be bound fails now, naming the setting, not after the model loaded."""
        from harness.target.engine.placement import plan

        plan(self.bind_cores, self.cpu_threads)
        return self

    @model_validator(mode="after")
    def _real_weights(self) -> EngineSettings:
        """A real-weight preset is its converted checkpoint directory, served under the preset's name.

        Resolved here, not when the model loads, so that ``harness serve`` reports weights that were
        never fetched in milliseconds (before torch is imported or a port is bound), with how to
        fetch them: a :class:`ConfigError`, which pydantic passes through unwrapped.
        """
        from harness.target.engine import weights

        if self.model_dir is None and self.preset is not None and self.preset in weights.SOURCES:
            self.model_dir = weights.require(self.preset)
            if self.model_name is None:
                self.model_name = self.preset
        return self
