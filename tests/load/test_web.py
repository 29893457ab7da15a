"""The web UI tab (real Locust with its web UI), and SIGTERM finalizing a run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.load.run_summary import read_summary
from harness.load.runner import free_port
from tests.load.helpers import decided_precision
from tests.load.sse_server import Behaviour, SSEServer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


def test_web_ui_tab_shows_live_percentiles_and_sigterm_finalizes(tmp_path: Path, corpus: Path) -> None:
    port = free_port()
    results = tmp_path / "r"
    with SSEServer(Behaviour(first_token_s=0.02, gap_s=0.005, tokens=4)) as srv:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "replay.py"), "--autostart",
               "--web-host", "127.0.0.1", "--web-port", str(port), "--host", srv.url, "--corpus", str(corpus),
               "--rate", "10", "--duration", "300", "--out", str(results),
               "--start-delay", "0.5"]  # fmt: skip
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            status: dict[str, Any] = {}
            while status.get("requests", 0) < 10:
                assert proc.poll() is None and time.monotonic() < deadline
                with contextlib.suppress(OSError):  # not listening yet
                    status = get(base + "/harness/load")
                time.sleep(0.2)
            assert status["stage"] == "replay" and status["target_rate"] == 10.0
            assert status["metrics"]["ttft_ms"]["p50"] >= 20.0
            assert status["hit_rate"]["MISS"] == 1.0
            stats = get(base + "/stats/requests")
            # Locust's own header and table count each request once: no TTFT/TPOT pseudo-requests.
            assert {e["method"] for e in stats["stats"] if e["name"] != "Aggregated"} == {"POST"}
            tab = next(x for x in stats["extended_stats"] if x["key"] == "harness-load")
            rows = {r["metric"]: r for r in tab["data"]}
            assert float(rows["ttft_ms"]["p50"]) >= 20.0 and rows["stage"]["value"] == "replay"
            assert rows["hit rate MISS"]["value"] == "100.0%"
            page = get(base + "/")
            assert "LLM load" in page and "harness-load" in page
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err.decode()[-2000:]
    s = read_summary(results)
    assert s.interrupted and s.requests >= 10


def test_web_ui_tab_shows_precision_progress_and_the_stop_reason(tmp_path: Path, corpus: Path) -> None:
    port = free_port()
    results = tmp_path / "r"
    with SSEServer(Behaviour(first_token_s=0.02, gap_s=0.005, tokens=4)) as srv:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "replay.py"), "--autostart",
               "--web-host", "127.0.0.1", "--web-port", str(port), "--host", srv.url, "--corpus", str(corpus),
               "--rate", "10", "--max-duration", "300", "--until-precision", "50%",
               "--precision-on", "ttft_ms:50", "--out", str(results),
               "--start-delay", "0.5"]  # fmt: skip
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            status: dict[str, Any] = {}
            while not status.get("stop_reason"):
                assert proc.poll() is None and time.monotonic() < deadline
                with contextlib.suppress(OSError):  # not listening yet
                    status = get(base + "/harness/load")
                time.sleep(0.2)
            rel, n = decided_precision(status["stop_reason"])["ttft_ms P50"]
            assert rel <= 0.5 and n >= status["precision"]["ttft_ms:50"]["min_n"]
            live = status["precision"]["ttft_ms:50"]  # over every record so far, drained ones too
            assert live["n"] >= n and live["met"] == (live["rel_half_width"] <= 0.5)
            stats = get(base + "/stats/requests")
            tab = next(x for x in stats["extended_stats"] if x["key"] == "harness-load")
            rows = {r["metric"]: r for r in tab["data"]}
            assert rows["precision ttft_ms:50"]["value"].endswith("(target ±50.0%)")
            assert rows["stopped"]["value"] == status["stop_reason"]
            while not (results / "summary.json").exists():  # the test ends once in-flight requests drain
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            served = get(base + "/harness/load/summary")  # the finished run's summary, from the UI
            assert served["stop_reason"] == status["stop_reason"]
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    s = read_summary(results)
    assert s.stop_reason == status["stop_reason"] and not s.interrupted
    assert s.requests < 300 * 10
