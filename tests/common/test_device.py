"""The one device resolver: names checked without torch where possible, CUDA checked for real."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.common.device import resolve_device
from harness.common.errors import ConfigError


def test_cpu_and_bad_names() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(" CPU ") == "cpu"
    with pytest.raises(ConfigError) as info:
        resolve_device("tpu", field="HARNESS__X__DEVICE")
    assert info.value.field == "HARNESS__X__DEVICE" and "auto, cpu or cuda" in info.value.message


def test_auto_and_cuda_follow_torch() -> None:
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        assert resolve_device("cuda:0") == "cuda:0"
        with pytest.raises(ConfigError, match="CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(ConfigError, match="not available"):
            resolve_device("cuda")


def test_engine_and_embedder_use_it() -> None:
    from harness.common import embeddings
    from harness.target.engine import factory

    assert embeddings.resolve_device is resolve_device
    assert str(factory.resolve_device("cpu")) == "cpu"
    with pytest.raises(ConfigError) as info:
        factory.resolve_device("npu")
    assert info.value.field == "HARNESS__ENGINE__DEVICE"


def test_cpu_does_not_import_torch() -> None:
    code = (
        "import sys\nfrom harness.common.device import resolve_device\n"
        "assert resolve_device('cpu') == 'cpu'\nprint('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"
