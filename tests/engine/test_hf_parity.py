"""Our loader + model against ``transformers`` on the same checkpoint: logits and greedy text.

The reference is transformers' own ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` reading the same
``save_pretrained`` directory; our side reads it with safetensors + tokenizers only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.target.engine.api import SamplingParams
from harness.target.engine.factory import create_core
from harness.target.engine.loader import load_checkpoint
from harness.target.engine.model import linear, pack_weight

from .conftest import make_checkpoint, tiny_settings

PROMPT = [1, 17, 99, 42, 7, 200, 31, 31, 64, 128, 9, 250, 77, 13, 6, 45, 88, 101, 5, 240, 19]


def hf_model(path: Path) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_packed_linear_matches_dense() -> None:
    """The oneDNN-packed matmul gives F.linear's result at every row count the model uses it at:
    one stream's single row to a long prefill's."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    packed = pack_weight(w)
    if packed is None:
        pytest.skip("this torch build has no oneDNN (mkldnn): the model uses F.linear only")
    for n in (1, 2, 3, 4, 16, 33):
        x = torch.randn(n, 64, generator=g)
        torch.testing.assert_close(linear(x, w, b, packed), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("kind", ["llama", "qwen"])
def test_logits_match_transformers(kind: str, llama_dir: Path, qwen_dir: Path) -> None:
    path = llama_dir if kind == "llama" else qwen_dir
    ours = load_checkpoint(path, torch.device("cpu"), torch.float32).model
    ref = hf_model(path)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = ref(ids.unsqueeze(0)).logits[0]  # [n, V]
    got = ours.dense_logits(ids)
    assert got.shape == want.shape
    assert rel_err(got, want) < 1e-4


def test_llama3_rope_scaling_matches(tmp_path: Path) -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
    }
    path = make_checkpoint(tmp_path / "l3", "llama", rope_parameters=scaling, max_position_embeddings=512)
    ours = load_checkpoint(path, torch.device("cpu"), torch.float32)
    assert ours.config.rope_scaling is not None
    ref = hf_model(path)
    ids = torch.tensor((PROMPT * 6)[:120])
    with torch.no_grad():
        want = ref(ids.unsqueeze(0)).logits[0]
    assert rel_err(ours.model.dense_logits(ids), want) < 1e-4


@pytest.mark.parametrize("kind", ["llama", "qwen"])
def test_greedy_continuation_through_paged_engine(kind: str, llama_dir: Path, qwen_dir: Path) -> None:
    path = llama_dir if kind == "llama" else qwen_dir
    ref = hf_model(path)
    n_new = 24
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([PROMPT]), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False
        )
    want = out[0, len(PROMPT) :].tolist()
    # Block size 4: the 45-token sequence spans 12 blocks, so paging is really exercised.
    # A single stream (one-row matmuls) and four copies decoding together (four rows), both through
    # the oneDNN-packed weights, must give transformers' tokens.
    core, _ = create_core(tiny_settings(model_dir=path, preset=None, block_size=4, num_kv_blocks=64))
    layer = core.model.blocks()[0]
    assert set(layer.packed) == {"qkv", "o", "gate_up", "down"}, "CPU float32: the engine packs its weights"
    assert layer.qkv.weight.numel() == 0, "and the packed form replaces the row-major one"
    for single in (True, False):
        ids = ["a"] if single else ["b", "c", "d", "e"]
        for rid in ids:
            core.add_request(rid, PROMPT, SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True))
        got: dict[str, list[int]] = {rid: [] for rid in ids}
        while core.has_work():
            for ev in core.step():
                if ev.token_id is not None:
                    got[ev.request_id].append(ev.token_id)
            core.validate()
        assert got == dict.fromkeys(ids, want)
