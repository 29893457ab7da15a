"""The ``vllm`` tests: a real vLLM (CPU build) serving SmolLM2-135M-Instruct, the model named ``smollm2``.

They run where ``HARNESS_VLLM_URL`` names such a server (``bench/vllm.sh serve``; docs/ci.md "Other
targets") and skip saying so elsewhere. They do not start one themselves: vLLM is 3.5 GB and takes
about four minutes to start on 2 cores, which no test run (and never CI) should pay for unasked.
``HARNESS_VLLM_MODEL`` (default: the checkpoint ``bench/vllm.sh`` serves) gives the tokenizer the
token-counting test compares against.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

VLLM_MODEL_NAME = "smollm2"
"""``--served-model-name`` of ``bench/vllm.sh serve``."""


@pytest.fixture(scope="session")
def vllm_url() -> str:
    url = os.environ.get("HARNESS_VLLM_URL", "").rstrip("/")
    if not url:
        pytest.skip("HARNESS_VLLM_URL is not set: start vLLM with `make vllm && bench/vllm.sh serve`")
    try:
        resp = httpx.get(url + "/v1/models", timeout=30)
    except httpx.HTTPError as exc:
        pytest.fail(f"HARNESS_VLLM_URL={url} does not answer: {exc}")
    ids = [m["id"] for m in resp.json()["data"]]
    if VLLM_MODEL_NAME not in ids:
        pytest.fail(f"HARNESS_VLLM_URL={url} serves {ids}, not {VLLM_MODEL_NAME!r} (bench/vllm.sh serve)")
    return url


@pytest.fixture(scope="session")
def vllm_tokenizer() -> Path:
    """The served checkpoint's ``tokenizer.json``."""
    from harness.target.engine.weights import checkpoint_dir

    path = Path(os.environ.get("HARNESS_VLLM_MODEL") or checkpoint_dir("smollm2")) / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"no {path}: set HARNESS_VLLM_MODEL to the checkpoint vLLM serves")
    return path
