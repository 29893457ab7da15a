"""Build a model: a random-init preset, or a Hugging Face Llama/Qwen2 checkpoint directory on disk.

Checkpoints are read with ``safetensors`` only (no pickle, no hub): ``config.json`` (model_type
``llama`` or ``qwen2``), ``model.safetensors`` or a sharded ``model.safetensors.index.json``,
``tokenizer.json``, optional ``tokenizer_config.json`` (chat template, BOS/EOS) and
``generation_config.json`` (EOS ids). A missing file or field is a :class:`ConfigError` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from harness.common.errors import ConfigError
from harness.common.registry import Registry
from harness.target.engine.model import ModelConfig, Transformer, init_random, rope_pair_order
from harness.target.engine.tokenizer import HFTokenizer, checkpoint_tokenizer, preset_tokenizer

PRESETS: Registry[ModelConfig] = Registry("engine preset")
"""Random-init architectures; vocab 30522 is the MiniLM tokenizer's."""

PRESETS.register("tiny")(
    ModelConfig(
        vocab_size=30522, hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2,
        intermediate_size=1024, rope_theta=10000.0, max_position_embeddings=2048,
    )
)  # fmt: skip
PRESETS.register("small")(
    ModelConfig(
        vocab_size=30522, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4,
        intermediate_size=2048, rope_theta=10000.0, max_position_embeddings=4096,
    )
)  # fmt: skip
PRESETS.register("qwen2-0.5b")(
    ModelConfig(
        vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
        intermediate_size=4864, rope_theta=1000000.0, max_position_embeddings=32768,
        qkv_bias=True, tie_word_embeddings=True, model_type="qwen2",
    )
)  # fmt: skip


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: HFTokenizer
    name: str
    config: ModelConfig


def build_preset(name: str, seed: int, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    cfg = PRESETS.get(name)
    tok = preset_tokenizer()
    torch.manual_seed(seed)
    # device="meta", not a `with torch.device("meta")` block: that imports torch._dynamo (~2 s).
    model = Transformer(cfg, device="meta").to_empty(device="cpu")
    init_random(model, seed)
    model = model.to(device=device, dtype=dtype).eval()
    # The qwen2-0.5b shape has 151936 ids but the tokenizer only 30522: never emit the others.
    model.vocab_limit = min(cfg.vocab_size, tok.vocab_size)
    return LoadedModel(model, tok, name, cfg)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"missing {path.name}", file=path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"not valid JSON: {exc}", file=path) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", file=path)
    return data


def config_from_hf(raw: dict[str, Any], path: Path) -> ModelConfig:
    """Our :class:`ModelConfig` from a Hugging Face ``config.json`` (transformers 4.x or 5.x keys)."""
    mtype = raw.get("model_type")
    if mtype not in ("llama", "qwen2"):
        raise ConfigError(
            f"unsupported model_type {mtype!r}; expected 'llama' or 'qwen2'", file=path, field="model_type"
        )

    def need(key: str) -> Any:
        if key not in raw:
            raise ConfigError(f"missing field {key!r}", file=path, field=key)
        return raw[key]

    # transformers 5 moved rope_theta/rope_scaling into "rope_parameters".
    rope = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in ("default", "llama3"):
            raise ConfigError(f"unsupported rope scaling {kind!r}", file=path, field="rope_scaling")
        if kind == "default":
            scaling = None
    theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
    heads = int(need("num_attention_heads"))
    return ModelConfig(
        vocab_size=int(need("vocab_size")),
        hidden_size=int(need("hidden_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        intermediate_size=int(need("intermediate_size")),
        head_dim=int(raw.get("head_dim") or 0),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=dict(scaling) if scaling else None,
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        qkv_bias=True if mtype == "qwen2" else bool(raw.get("attention_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", mtype == "qwen2")),
        model_type=str(mtype),
    )


def _weight_files(model_dir: Path) -> list[Path]:
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        wmap = _read_json(index).get("weight_map")
        if not isinstance(wmap, dict):
            raise ConfigError("missing field 'weight_map'", file=index, field="weight_map")
        files = [model_dir / str(f) for f in sorted(set(wmap.values()))]
        for f in files:
            if not f.is_file():
                raise ConfigError(f"missing shard {f.name} listed in the index", file=f)
        return files
    raise ConfigError(
        "missing model.safetensors (or model.safetensors.index.json); only safetensors checkpoints are read",
        file=single,
    )


def _hf_name_map(cfg: ModelConfig) -> dict[str, tuple[str, int, int]]:
    """HF tensor name → (our parameter name, row offset, rows) for fused q/k/v and gate/up."""
    dh = cfg.dh
    q, kv, ffn = cfg.num_heads * dh, cfg.num_kv_heads * dh, cfg.intermediate_size
    out: dict[str, tuple[str, int, int]] = {
        "model.embed_tokens.weight": ("embed.weight", 0, -1),
        "model.norm.weight": ("norm.weight", 0, -1),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ("lm_head.weight", 0, -1)
    for i in range(cfg.num_layers):
        hf, me = f"model.layers.{i}.", f"layers.{i}."
        out[hf + "input_layernorm.weight"] = (me + "input_norm.weight", 0, -1)
        out[hf + "post_attention_layernorm.weight"] = (me + "post_norm.weight", 0, -1)
        out[hf + "self_attn.o_proj.weight"] = (me + "o.weight", 0, -1)
        out[hf + "mlp.down_proj.weight"] = (me + "down.weight", 0, -1)
        out[hf + "mlp.gate_proj.weight"] = (me + "gate_up.weight", 0, ffn)
        out[hf + "mlp.up_proj.weight"] = (me + "gate_up.weight", ffn, ffn)
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            out[hf + f"self_attn.q_proj.{kind}"] = (me + f"qkv.{kind}", 0, q)
            out[hf + f"self_attn.k_proj.{kind}"] = (me + f"qkv.{kind}", q, kv)
            out[hf + f"self_attn.v_proj.{kind}"] = (me + f"qkv.{kind}", q + kv, kv)
    return out


def load_checkpoint(
    model_dir: Path, device: torch.device, dtype: torch.dtype, name: str | None = None
) -> LoadedModel:
    """Load a Llama/Qwen2 checkpoint directory; raises :class:`ConfigError` naming what is missing."""
    from safetensors import safe_open

    if not model_dir.is_dir():
        raise ConfigError("model directory does not exist", file=model_dir)
    cfg_path = model_dir / "config.json"
    cfg = config_from_hf(_read_json(cfg_path), cfg_path)
    files = _weight_files(model_dir)
    tok = checkpoint_tokenizer(model_dir)

    model = Transformer(cfg, device="meta").to_empty(device=device).to(dtype)
    params = dict(model.named_parameters())
    mapping = _hf_name_map(cfg)
    order = rope_pair_order(cfg.dh)
    filled: dict[str, int] = {}
    with torch.no_grad():
        for f in files:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for key in st.keys():  # noqa: SIM118 - safe_open is not a dict
                    if key not in mapping:
                        if key == "lm_head.weight" and cfg.tie_word_embeddings:
                            continue
                        if key.endswith("rotary_emb.inv_freq"):
                            continue
                        raise ConfigError(f"unexpected tensor {key!r}", file=f, field=key)
                    target, off, rows = mapping[key]
                    t = st.get_tensor(key)
                    p = params[target]
                    dst = p if rows < 0 else p.narrow(0, off, rows)
                    if tuple(dst.shape) != tuple(t.shape):
                        raise ConfigError(
                            f"tensor {key!r} has shape {tuple(t.shape)}, expected {tuple(dst.shape)}",
                            file=f,
                            field=key,
                        )
                    if key.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
                        t = t.view(-1, cfg.dh, *t.shape[1:])[:, order].reshape(t.shape)
                    dst.copy_(t.to(dtype))
                    filled[target] = filled.get(target, 0) + (t.shape[0] if rows >= 0 else p.shape[0])
    for pname, p in params.items():
        if filled.get(pname, 0) != p.shape[0]:
            hf = sorted(k for k, (t, _, _) in mapping.items() if t == pname)
            raise ConfigError(
                f"missing tensor(s) {', '.join(hf)}", file=model_dir, field=hf[0] if hf else pname
            )
    model.eval()
    model.vocab_limit = min(cfg.vocab_size, max(tok.vocab_size, 1))
    return LoadedModel(model, tok, name or model_dir.name, replace(cfg))
