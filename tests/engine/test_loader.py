"""Checkpoint loading errors, tokenizer set-up, chat templates, presets and the engine CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from harness.common.errors import ConfigError
from harness.target.engine.cli import app
from harness.target.engine.loader import PRESETS, load_checkpoint
from harness.target.engine.tokenizer import minilm_tokenizer_path, preset_tokenizer

CPU = torch.device("cpu")


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("remove", "named"),
    [
        ("model.safetensors", "model.safetensors"),
        ("tokenizer.json", "tokenizer.json"),
        ("config.json", "config.json"),
    ],
)
def test_missing_file_is_config_error_naming_it(
    llama_dir: Path, tmp_path: Path, remove: str, named: str
) -> None:
    d = copy_dir(llama_dir, tmp_path / "m")
    (d / remove).unlink()
    with pytest.raises(ConfigError) as exc:
        load_checkpoint(d, CPU, torch.float32)
    assert exc.value.file is not None and exc.value.file.endswith(named)


def test_missing_config_field_is_named(llama_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(llama_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as exc:
        load_checkpoint(d, CPU, torch.float32)
    assert exc.value.field == "hidden_size"


def test_unsupported_model_type(llama_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(llama_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="gpt2"):
        load_checkpoint(d, CPU, torch.float32)


def test_sharded_checkpoint_and_missing_shard(llama_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    d = copy_dir(llama_dir, tmp_path / "m")
    tensors = load_file(str(d / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for fname, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(d / fname))
    (d / "model.safetensors").unlink()
    wmap = {k: f for f, keys in shards.items() for k in keys}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    sharded = load_checkpoint(d, CPU, torch.float32)
    single = load_checkpoint(llama_dir, CPU, torch.float32)
    ids = torch.tensor([1, 5, 9, 13, 200])
    assert torch.equal(sharded.model.dense_logits(ids), single.model.dense_logits(ids))
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConfigError) as exc:
        load_checkpoint(d, CPU, torch.float32)
    assert exc.value.file is not None and exc.value.file.endswith("model-00002-of-00002.safetensors")


def test_checkpoint_tokenizer_chat_template_and_eos(llama_dir: Path) -> None:
    tok = load_checkpoint(llama_dir, CPU, torch.float32).tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "w1 w2"}])
    assert text == "<s>user w1 w2 assistant"
    assert tok.eos_token_id == 2  # from generation_config.json / tokenizer_config.json
    # The rendered prompt already starts with BOS: it is not added twice.
    assert tok.encode(text)[:2] == [1, tok.token_to_id("user")]
    assert tok.encode("w1 w2") == [1, tok.token_to_id("w1"), tok.token_to_id("w2")]


def test_chat_template_is_sandboxed(llama_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(llama_dir, tmp_path / "m")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_checkpoint(d, CPU, torch.float32).tokenizer
    from jinja2.exceptions import SecurityError

    with pytest.raises(SecurityError):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_preset_tokenizer_has_no_bert_specials_padding_or_truncation() -> None:
    tok = preset_tokenizer()
    raw = json.loads(minilm_tokenizer_path().read_text())
    assert raw["padding"] is not None and raw["truncation"]["max_length"] == 128  # what we switch off
    ids = tok.encode("hello world")
    vocab = raw["model"]["vocab"]
    assert ids == [vocab["hello"], vocab["world"]]  # no [CLS]/[SEP], no [PAD] to 128
    long_ids = tok.encode("word " * 300)
    assert len(long_ids) == 300  # not truncated to 128
    assert tok.eos_token_id == vocab["[SEP]"]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|user|> hi\n<|assistant|> "


def test_preset_sizes() -> None:
    tiny = PRESETS.get("tiny")
    assert 15e6 < tiny.num_parameters() < 25e6
    q = PRESETS.get("qwen2-0.5b")
    assert (q.hidden_size, q.num_layers, q.num_heads, q.num_kv_heads, q.intermediate_size, q.vocab_size) == (
        896, 24, 14, 2, 4864, 151936,
    )  # fmt: skip


def test_vocab_larger_than_tokenizer_is_masked() -> None:
    """qwen2-0.5b has 151936 ids but the MiniLM tokenizer 30522: logits only cover decodable ids.

    Uses a scaled-down qwen2-shaped config (same vocab) rather than the 0.5 B preset, to stay fast.
    """
    from dataclasses import replace

    from harness.target.engine.model import Transformer, init_random

    cfg = replace(PRESETS.get("qwen2-0.5b"), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                  intermediate_size=64)  # fmt: skip
    m = Transformer(cfg)
    init_random(m, 0)
    m.vocab_limit = preset_tokenizer().vocab_size
    logits = m.dense_logits(torch.tensor([100, 200, 300]))
    assert logits.shape == (3, 30522)


def test_cli_generate_and_info(llama_dir: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["info", "--model", str(llama_dir), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # K+V · layers · kv heads · head dim · fp32
    res = runner.invoke(
        app, ["generate", "--model", str(llama_dir), "w1 w2 w3", "--max-tokens", "5", "--ignore-eos"]
    )
    assert res.exit_code == 0, res.output
    words = res.stdout.split()
    assert len(words) == 5 and all(w.startswith("w") or w.startswith("<") for w in words)


def test_cli_generate_too_long_is_a_one_line_input_error(llama_dir: Path, capsys) -> None:
    from harness.cli import main

    max_pos = json.loads((llama_dir / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(SystemExit) as exc:
        main(["engine", "generate", "--model", str(llama_dir), "w1", "--max-tokens", str(max_pos + 1)])
    assert exc.value.code == 3
    err = capsys.readouterr().err
    assert "--max-tokens" in err and "Traceback" not in err


def test_cli_missing_model_dir_exit_code(tmp_path: Path) -> None:
    from harness.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["engine", "info", "--model", str(tmp_path / "nope")])
    assert exc.value.code == 4
