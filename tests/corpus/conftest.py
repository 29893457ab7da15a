"""Fixtures of the corpus tests: repository paths, the shared MiniLM embedder, an isolated run dir."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates" / "prompts"
FIXTURES = ROOT / "fixtures" / "corpus"


@pytest.fixture(scope="session")
def embedder():
    from harness.common.embeddings import shared_embedder

    return shared_embedder(device="cpu")


@pytest.fixture(autouse=True)
def _run_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # The embedding cache is per session so tests never share state with a developer's .harness.
    monkeypatch.setenv("HARNESS__RUN_DIR", str(tmp_path_factory.getbasetemp() / "run"))
