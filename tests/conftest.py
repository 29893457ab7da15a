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


LONG_FIRST = (
    "tests/test_demo.py",
    "tests/analysis/test_live_load.py",
    "tests/gates/test_capacity_live.py",
    "tests/gates/test_paired.py",
    "tests/load/test_auth_replay.py",
    "tests/gates/test_until_precision.py",
)
"""Modules of the longest tests (minutes, not seconds), started first."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first: ``make test`` runs the suite on two xdist workers, and a worker
    handed a 3-minute test last would run it alone while the other idles. A stable sort: the rest
    keeps the collection order, and both workers compute the same order (xdist requires it)."""
    rank = {module: i for i, module in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
