"""The locustfiles ship with the package: ``locust -f`` works from an installed wheel, not only a checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_the_locustfiles_and_locust_loads_them(tmp_path: Path) -> None:
    # Built from a copy, so the checkout gets no build/ directory.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "harness", src / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    # No build isolation: the setuptools of this environment, no index needed.
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run(
        [*pip, "-w", str(wheels), "."],
        cwd=src, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert {"harness/load/locustfiles/replay.py", "harness/load/locustfiles/warmup.py"} <= names
        site = tmp_path / "site"
        zf.extractall(site)  # what installing a pure-Python wheel with --no-deps amounts to
    # A fresh interpreter that imports harness from the unpacked wheel (the dependencies from this
    # environment), away from the checkout: the launcher's locustfile is the wheel's own file, and
    # Locust loads it (``--list`` imports the locustfile and names its users).
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = (
        "import harness; from harness.load.runner import LOCUSTFILES;"
        "print(harness.__file__); print(LOCUSTFILES['replay']); print(LOCUSTFILES['warmup'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    assert all(Path(p).is_relative_to(site) for p in out), out
    assert all(Path(p).is_file() for p in out[1:])
    for locustfile in out[1:]:
        shown = subprocess.run(
            [sys.executable, "-m", "locust", "-f", locustfile, "--list"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert "ReplayUser" in shown.stdout


def test_checkout_locustfiles_are_the_shipped_ones() -> None:
    """The README's ``locust -f locustfiles/replay.py`` (from a checkout) runs the very files the
    package ships and the launcher uses."""
    from harness.load.runner import LOCUSTFILES

    for name, path in LOCUSTFILES.items():
        assert (ROOT / "locustfiles" / f"{name}.py").resolve() == path.resolve()
