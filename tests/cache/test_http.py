"""End to end over HTTP: a real ``harness serve --preset tiny --cache`` subprocess on a free port.

Covers what only the whole path shows: the ``x-cache`` statuses a client sees (MISS, HIT-L1,
HIT-L2 after an L1 flush, HIT-L3 for a paraphrase, BYPASS), tenant isolation through
``X-Tenant-ID`` (a completion preloaded for one tenant is never served to another, at L1/L2 or
L3), Redis failure (SIGSTOP and SIGKILL of the server's embedded Redis, whose pid the stats
report) and the ``harness cache`` CLI against the admin endpoints. Expected texts come from the
engine itself (asked with ``Cache-Control: no-cache``) or from the preload file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.server.conftest import ServerProc, harness_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with harness_server(tmp_path_factory.mktemp("cache-http"), "--cache") as srv:
        yield srv


def post(srv: ServerProc, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    base = {"max_tokens": 6, "temperature": 0}
    return httpx.post(srv.url + path, json=base | body, headers=headers, timeout=60)


def chat_body(q: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": q}], **kw}


def text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


def stats(srv: ServerProc) -> dict[str, Any]:
    r = httpx.get(srv.url + "/cache/stats", timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "cache", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_x_cache_statuses(server: ServerProc) -> None:
    body = {"prompt": "statuses over http"}
    truth = text(post(server, "/v1/completions", body, **{"Cache-Control": "no-cache"}))
    r = post(server, "/v1/completions", body)
    assert r.headers["x-cache"] == "MISS" and text(r) == truth
    key = r.headers["x-cache-key"]
    r = post(server, "/v1/completions", body)
    assert r.headers["x-cache"] == "HIT-L1" and text(r) == truth and r.headers["x-cache-key"] == key
    flushed = cli("flush", "--tier", "l1", "--url", server.url)
    assert flushed.returncode == 0, flushed.stderr
    assert orjson.loads(flushed.stdout)["dropped"]["l1"] >= 1
    r = post(server, "/v1/completions", body)
    assert r.headers["x-cache"] == "HIT-L2" and text(r) == truth
    r = post(server, "/v1/completions", body | {"temperature": 0.9})  # sampled, no seed
    assert r.headers["x-cache"] == "BYPASS"
    r = post(server, "/v1/completions", body, **{"Cache-Control": "no-cache"})
    assert r.headers["x-cache"] == "BYPASS"


def test_paraphrase_hits_l3_and_tenants_stay_isolated(server: ServerProc, tmp_path: Path) -> None:
    q, para = "What is the capital of France?", "Which city is the capital of France?"
    preload = tmp_path / "preload.jsonl"
    lines = [
        chat_body(q, max_tokens=6, temperature=0) | {"completion": "SECRET-OF-ALPHA", "tenant": "alpha"},
        {"prompt": "a shared prompt", "max_tokens": 6, "temperature": 0}
        | {"completion": "ALPHA-ONLY", "tenant": "alpha"},
    ]
    preload.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    done = cli("preload", str(preload), "--url", server.url)
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["stored"] == 2
    r = post(server, "/v1/chat/completions", chat_body(para), **{"X-Tenant-ID": "alpha"})
    assert r.headers["x-cache"] == "HIT-L3" and text(r) == "SECRET-OF-ALPHA"
    for tenant in ({"X-Tenant-ID": "beta"}, {}):  # another tenant, and the default one (no header)
        r = post(server, "/v1/chat/completions", chat_body(para), **tenant)
        assert r.headers["x-cache"] == "MISS" and text(r) != "SECRET-OF-ALPHA"
        # May now hit this tenant's own entry for the paraphrase (L3), never alpha's.
        r = post(server, "/v1/chat/completions", chat_body(q), **tenant)
        assert text(r) != "SECRET-OF-ALPHA"
        r = post(server, "/v1/completions", {"prompt": "a shared prompt"}, **tenant)
        assert r.headers["x-cache"] == "MISS" and text(r) != "ALPHA-ONLY"
    r = post(server, "/v1/completions", {"prompt": "a shared prompt"}, **{"X-Tenant-ID": "alpha"})
    assert r.headers["x-cache"].startswith("HIT-") and text(r) == "ALPHA-ONLY"


def test_cli_stats_and_errors(server: ServerProc, tmp_path: Path) -> None:
    out = cli("stats", "--url", server.url, "--json")
    assert out.returncode == 0, out.stderr
    data = orjson.loads(out.stdout)
    assert set(data["tiers"]) == {"l1", "l2", "l3"}
    table = cli("stats", "--url", server.url)
    assert table.returncode == 0 and "l2" in table.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"no_prompt": 1}\n')
    res = cli("preload", str(bad), "--url", server.url)
    assert res.returncode == 3 and "bad.jsonl:2" in res.stderr
    sampled = tmp_path / "sampled.jsonl"  # would never be served: reported per line, nothing generated
    sampled.write_text('{"prompt": "a sampled one", "temperature": 0.9, "max_tokens": 4}\n')
    res = cli("preload", str(sampled), "--url", server.url)
    report = orjson.loads(res.stdout)
    assert (report["stored"], report["generated"], report["failed"]) == (0, 0, 1), res.stdout
    assert "never served from the cache" in report["errors"][0]["error"]
    assert cli("flush", "--tier", "l7", "--url", server.url).returncode == 3
    drained = cli("drain", "--url", server.url)
    assert drained.returncode == 0 and orjson.loads(drained.stdout) == {"pending": 0}, drained.stderr
    assert cli("stats", "--url", "http://127.0.0.1:9").returncode == 5


@pytest.fixture
def lean_server(tmp_path: Path) -> Iterator[ServerProc]:
    """Without L3 (faster start), with a short L2 budget and no Redis restarts, for the Redis
    failure tests (Redis stays down once killed)."""
    env = {
        "HARNESS__CACHE__L3_ENABLED": "false",
        "HARNESS__CACHE__L2_OP_TIMEOUT_S": "0.3",
        "HARNESS__CACHE__BREAKER_RESET_S": "0.5",
        "HARNESS__CACHE__REDIS_RESTART": "false",
    }
    with harness_server(tmp_path, "--cache", env=env) as srv:
        yield srv


def metric_value(srv: ServerProc, name: str) -> float:
    for line in httpx.get(srv.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is not in /metrics")


def test_killed_redis_is_restarted_and_counted_in_metrics(tmp_path: Path) -> None:
    """The server's embedded Redis, killed for real, comes back (its supervisor restarts it) and
    L2 serves again. The wait is on the server's own restart counter, with a generous deadline."""
    env = {"HARNESS__CACHE__L3_ENABLED": "false"}
    with harness_server(tmp_path, "--cache", env=env) as srv:
        body = {"prompt": "served again after a restart"}
        assert post(srv, "/v1/completions", body).headers["x-cache"] == "MISS"
        assert metric_value(srv, "cache_redis_restarts_total") == 0
        pid = stats(srv)["tiers"]["l2"]["embedded_pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while metric_value(srv, "cache_redis_restarts_total") < 1:
            assert time.monotonic() < deadline, "the embedded Redis was not restarted within 60 s"
            time.sleep(0.05)
        l2 = stats(srv)["tiers"]["l2"]
        assert l2["embedded_pid"] not in (None, pid) and l2["embedded_restarts"] == 1
        httpx.post(srv.url + "/cache/flush?tier=l1", timeout=10)
        r = post(srv, "/v1/completions", body)
        assert r.headers["x-cache"] == "MISS"  # no persistence by default: the entry died with Redis
        assert httpx.post(srv.url + "/cache/drain", timeout=120).json() == {"pending": 0}
        httpx.post(srv.url + "/cache/flush?tier=l1", timeout=10)
        assert post(srv, "/v1/completions", body).headers["x-cache"] == "HIT-L2"


def errors_l2(srv: ServerProc) -> float:
    metrics = httpx.get(srv.url + "/metrics", timeout=10).text
    for line in metrics.splitlines():
        if line.startswith('cache_errors_total{tier="l2"}'):
            return float(line.split()[-1])
    return 0.0


def test_redis_stopped_then_killed_requests_still_served(lean_server: ServerProc) -> None:
    srv = lean_server
    pid = stats(srv)["tiers"]["l2"]["embedded_pid"]
    assert isinstance(pid, int)
    body = {"prompt": "served through a redis failure"}
    truth = text(post(srv, "/v1/completions", body, **{"Cache-Control": "no-cache"}))
    assert post(srv, "/v1/completions", body).headers["x-cache"] == "MISS"
    drained = httpx.post(srv.url + "/cache/drain", timeout=120)  # the L2 write-back
    assert drained.status_code == 200, drained.text
    os.kill(pid, signal.SIGSTOP)
    try:
        httpx.post(srv.url + "/cache/flush?tier=l1", timeout=10)
        # The server gives up on the frozen Redis after its 0.3 s budget; the client's 60 s
        # timeout only turns a hang into a failure (no stopwatch: the machine may be busy).
        r = post(srv, "/v1/completions", body)
        assert r.status_code == 200 and r.headers["x-cache"] == "MISS" and text(r) == truth
        assert errors_l2(srv) >= 1
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(0.7)  # past breaker_reset_s (a lower bound, not a wait for work): the next request probes
    httpx.post(srv.url + "/cache/flush?tier=l1", timeout=10)
    r = post(srv, "/v1/completions", body)
    assert r.headers["x-cache"] in {"HIT-L2", "MISS"}  # MISS only if the probe landed elsewhere
    os.kill(pid, signal.SIGKILL)
    before = errors_l2(srv)
    for i in range(3):
        r = post(srv, "/v1/completions", {"prompt": f"after the kill {i}"})
        assert r.status_code == 200 and r.headers["x-cache"] == "MISS"
    httpx.post(srv.url + "/cache/flush?tier=l1", timeout=10)
    r = post(srv, "/v1/completions", body)
    assert r.status_code == 200 and text(r) == truth
    assert errors_l2(srv) > before
    assert stats(srv)["tiers"]["l2"]["errors"] >= 2
    # An L2 flush cannot be done without Redis: a 503 naming it, not a 500 with a traceback.
    r = httpx.post(srv.url + "/cache/flush?tier=l2", timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "cache_unavailable"
