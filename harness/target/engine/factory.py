"""``create_engine(settings)``: the one way the server and benchmarks get an engine.

:func:`create_core` resolves the device and dtype, loads the preset or checkpoint, sizes the KV pool
from ``kv_cache_bytes`` (or ``num_kv_blocks``) and caps the context length by what the pool holds.
:func:`create_engine` runs that core's step loop where ``settings.step_loop`` says: in a process of
its own (:class:`~harness.target.engine.process.ProcessAsyncEngine`, which calls :func:`create_core`
there) or on a thread of this one (:class:`~harness.target.engine.async_engine.ThreadedAsyncEngine`).
torch is imported only by the functions that load a model: an engine process's front end never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.common.device import resolve_device as common_resolve_device
from harness.common.errors import ConfigError
from harness.target.engine.async_engine import ThreadedAsyncEngine
from harness.target.engine.placement import plan, spin_briefly
from harness.target.engine.settings import EngineSettings

if TYPE_CHECKING:
    import torch

    from harness.target.engine.core import EngineCore
    from harness.target.engine.loader import LoadedModel
    from harness.target.engine.process import ProcessAsyncEngine


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; an unavailable CUDA is a :class:`ConfigError`.

    The rules live in :func:`harness.common.device.resolve_device`, shared with the embedder.
    """
    import torch

    return torch.device(common_resolve_device(name, field="HARNESS__ENGINE__DEVICE"))


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_model(settings: EngineSettings, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    from harness.target.engine.loader import build_preset, load_checkpoint

    if settings.model_dir is not None:
        return load_checkpoint(settings.model_dir, device, dtype, settings.model_name)
    if settings.preset is None:
        raise ConfigError("set a preset or a model directory", field="HARNESS__ENGINE__PRESET")
    loaded = build_preset(settings.preset, settings.seed, device, dtype)
    if settings.model_name:
        loaded.name = settings.model_name
    return loaded


@dataclass
class PoolPlan:
    num_blocks: int
    block_size: int
    max_model_len: int
    kv_bytes_per_token: int


def plan_pool(settings: EngineSettings, loaded: LoadedModel, dtype: torch.dtype) -> PoolPlan:
    """How many KV blocks, and the context length they allow."""
    per_tok = loaded.config.kv_bytes_per_token(dtype)
    bs = settings.block_size
    blocks = settings.num_kv_blocks or settings.kv_cache_bytes // (per_tok * bs)
    if blocks < 2:
        raise ConfigError(
            f"kv_cache_bytes={settings.kv_cache_bytes} holds fewer than 2 blocks of {bs} tokens "
            f"({per_tok} bytes per token)",
            field="HARNESS__ENGINE__KV_CACHE_BYTES",
        )
    max_len = min(loaded.config.max_position_embeddings, blocks * bs)
    if settings.max_model_len is not None:
        max_len = min(settings.max_model_len, blocks * bs)
    return PoolPlan(blocks, bs, max_len, per_tok)


def create_core(settings: EngineSettings) -> tuple[EngineCore, LoadedModel]:
    """The synchronous engine (benchmarks and tests drive it directly)."""
    from harness.target.engine.core import EngineCore

    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    loaded = load_model(settings, device, dtype)
    plan = plan_pool(settings, loaded, dtype)
    core = EngineCore(
        loaded.model,
        loaded.tokenizer,
        device=device,
        dtype=dtype,
        num_blocks=plan.num_blocks,
        block_size=plan.block_size,
        max_model_len=plan.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_caching=settings.enable_prefix_caching,
        prefix_eviction=settings.prefix_eviction,
        seed=settings.seed,
        slowdown=settings.inject_slowdown,
        kv_overalloc=settings.inject_kv_overalloc,
    )
    return core, loaded


def create_engine(settings: EngineSettings) -> ThreadedAsyncEngine | ProcessAsyncEngine:
    """An :class:`~harness.target.engine.api.AsyncEngine` with its model loaded, its step loop where
    ``settings.step_loop`` says (call ``await engine.start()`` before use)."""
    if settings.step_loop == "process":
        from harness.target.engine.process import ProcessAsyncEngine

        return ProcessAsyncEngine(settings)  # its process gets the short spin in its environment
    spin_briefly()  # this process computes: before torch loads here (see placement.SPIN_COUNT)
    core, loaded = create_core(settings)
    placement = plan(settings.bind_cores, settings.cpu_threads)
    return ThreadedAsyncEngine(
        core, settings.model_name or loaded.name, settings.max_waiting, placement=placement
    )
