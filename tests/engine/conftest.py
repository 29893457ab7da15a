"""Engine test fixtures: tiny Hugging Face checkpoints written by ``transformers`` itself.

The checkpoints are built with real ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` classes (random
weights, fixed seed) and saved with ``save_pretrained``; the tokenizer is a small word-level one
built with the ``tokenizers`` library, so nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.target.engine.settings import EngineSettings

# The test machine is small and shared: one intra-op thread avoids OpenMP spin-wait stalls when
# the other core is busy (measured: 100x slower small ops with 2 threads under contention).
torch.set_num_threads(1)

WORDS = ["user", "assistant", *(f"w{i}" for i in range(248))]
VOCAB = 256  # 0: <unk>, 1: <s>, 2: </s>, 3..5 spare, 6..255 words


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "<x1>": 4, "<x2>": 5}
    for i, w in enumerate(WORDS):
        vocab[w] = 6 + i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.add_special_tokens(["<s>", "</s>"])
    # Like Llama's tokenizer.json: BOS is added by the post-processor.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} "
                "{% endfor %}{% if add_generation_prompt %}assistant{% endif %}",
            }
        )
    )


def make_checkpoint(out: Path, kind: str, **overrides: Any) -> Path:
    """Save a random ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` into ``out``."""
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    torch.manual_seed(1234)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    # transformers' init leaves biases at zero; randomize them so the qkv-bias path is tested.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name:
                p.normal_(1.0, 0.1)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2", tie_word_embeddings=True)


def tiny_settings(**kw: Any) -> EngineSettings:
    """The tiny preset on CPU; its step loop a thread of the test's process (``engine.core`` is
    there to look at) unless ``step_loop="process"`` is given."""
    base: dict[str, Any] = dict(
        preset="tiny", device="cpu", dtype="float32", num_kv_blocks=256, block_size=16, step_loop="thread"
    )
    base.update(kw)
    return EngineSettings(**base)
