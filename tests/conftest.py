"""Shared pytest fixtures: real data location, a repository root, a scratch run directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def realdata() -> Path:
    """The real public data folder from ``$HARNESS_REALDATA``.

    Skips (with the reason) where it is not set; CI sets it and ``.ci/run`` fails when it is missing,
    so in CI these tests always run.
    """
    value = os.environ.get("HARNESS_REALDATA")
    if not value:
        if os.environ.get("CI"):
            pytest.fail("HARNESS_REALDATA is not set in CI")
        pytest.skip("HARNESS_REALDATA is not set: real-data tests need ../shared/realdata")
    path = Path(value)
    if not (path / "MANIFEST.tsv").is_file():
        pytest.fail(f"HARNESS_REALDATA={value} has no MANIFEST.tsv")
    return path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT
