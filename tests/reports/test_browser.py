"""The report in a real browser: Debian's headless ``chromium`` opens it offline, the screenshot is not
blank, and the page logs nothing to the console (no JavaScript error, no failed resource load).

Skips, saying why, where ``chromium`` is not installed (``apt-get install -y chromium``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.gates import Baseline, Gate, ResultSet, judge
from harness.reports import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
    ),
]
CONSOLE = re.compile(r":CONSOLE[^\]]*\]\s*(.*)")


def screenshot(page: Path, out: Path, profile: Path, height: int = 2400) -> list[str]:
    """Open ``page`` headless, save a screenshot to ``out``; return the console messages it logged."""
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        f"--window-size=1400,{height}",
        f"--screenshot={out}",
        page.resolve().as_uri(),
    ]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # chromium refuses to run as root with its sandbox
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert out.is_file(), f"chromium wrote no screenshot (exit {res.returncode}): {res.stderr[-2000:]}"
    return [m.group(1) for m in CONSOLE.finditer(res.stderr)]


def not_blank(png: Path) -> tuple[float, int]:
    """Share of non-white pixels and number of distinct colours."""
    img = np.asarray(Image.open(png).convert("RGB"))
    ink = float((img.min(axis=2) < 235).mean())
    colours = len(np.unique(img.reshape(-1, 3), axis=0))
    return ink, colours


def test_console_detector_sees_a_planted_error(tmp_path: Path) -> None:
    """The check below can fail: a page that throws is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!doctype html><p>x</p><script>console.error("planted"); throw new Error("boom")</script>'
    )
    messages = screenshot(bad, tmp_path / "bad.png", tmp_path / "profile", height=300)
    assert any("planted" in m for m in messages) and any("boom" in m for m in messages), messages


def test_report_renders_in_chromium(paired: list[ResultSet], tmp_path: Path) -> None:
    gates = Baseline(
        schema_version=1, name="browser", gates=[Gate(metric="tpot_p95", threshold=4.6, rel_tolerance=0.15)]
    )
    files = write_report(paired, tmp_path / "report.html", gate=judge(gates, paired))
    shot = tmp_path / "report.png"
    messages = screenshot(files.html, shot, tmp_path / "profile")
    assert messages == [], f"the report logged to the console: {messages}"
    ink, colours = not_blank(shot)
    assert ink > 0.05 and colours > 50, (ink, colours)
    keep = os.environ.get("HARNESS_KEEP_SCREENSHOT")
    if (
        keep
    ):  # for looking at it: HARNESS_KEEP_SCREENSHOT=/tmp/report.png pytest tests/reports/test_browser.py
        shutil.copy(shot, keep)
