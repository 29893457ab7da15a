"""Shared pytest fixtures (real data location, repository root, SIGINT for children) and the order in
which pytest-xdist workers take test files."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LONGEST_FIRST = (
    "tests/experiments/test_capacity_live.py",
    "tests/experiments/test_paired.py",
    "tests/load/test_replay.py",
    "tests/analysis/test_live_load.py",
    "tests/load/test_distributed.py",
)
"""The test files that take longest (a whole file is one unit of work under ``--dist loadfile``),
longest first, measured on a quiet 2-core machine: 156, 67, 50, 48 and 41 s (2026-12-02). The
demo's test (610–751 s alone in CI, 2026-12-07), the documented CI job's (285–312 s) and the A/B
test's (94–100 s) are marked ``alone`` and run after the rest, one at a time (the Makefile). A worker that
picks a long file last would run on alone for minutes after the other has finished, so under xdist
these files are handed out first. A stale list costs wall time,
never correctness: every other file keeps its collection order."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, put :data:`LONGEST_FIRST`'s files at the front, in that order.

    Each worker collects and reorders the same way (the controller requires identical collections),
    and ``--dist loadfile --no-loadscope-reorder`` (the Makefile's) hands files out in the resulting
    order; without ``--no-loadscope-reorder`` xdist would put the files with most tests first. A
    single-process run keeps pytest's order, which puts fast failures first.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    late = len(LONGEST_FIRST)
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], late))


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


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    """The real-weight preset's checkpoint; the test skips, saying how to fetch it, where it is not
    (`make setup` fetches it, so CI runs these tests)."""
    from harness.target.engine import weights

    if not weights.is_fetched("smollm2"):
        pytest.skip(
            f"SmolLM2 weights not fetched in {weights.checkpoint_dir('smollm2')} "
            "(`make setup` fetches them; `harness engine fetch smollm2`)"
        )
    return weights.checkpoint_dir("smollm2")


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
