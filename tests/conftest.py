"""Shared pytest fixtures: real data location, a repository root, a scratch run directory."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
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


@pytest.fixture
def sigint_heard() -> Iterator[None]:
    """Children started during the test get SIGINT at its default, as from a terminal.

    A suite started in the background (``nohup make test &``, ``cmd &`` in a CI script) runs with
    SIGINT ignored, and a child inherits that: the SIGINT a Ctrl-C test sends would be dropped and the
    test would wait for a run that never stops. A signal this process *catches* is reset to its
    default in an exec'd child, so a handler is installed here for the test's duration.
    """
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
