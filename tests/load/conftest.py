"""Fixtures of the load stage's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.load.helpers import make_corpus


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return make_corpus(tmp_path / "corpus.jsonl", 20)
