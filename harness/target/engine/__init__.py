"""Local torch causal-LM engine: Llama/Qwen2 model, paged KV cache, prefix cache, continuous batching."""

from __future__ import annotations
