"""The anomaly tree on planted deviations, from real metric registries, scrapes and a Prometheus API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from harness.analysis.anomaly import (
    AnomalyNode,
    AnomalyReport,
    Samples,
    Scrape,
    SeriesKey,
    Window,
    attribute,
    read_scrapes,
    series_from_prometheus,
    series_from_scrapes,
)
from harness.cache.metrics import CacheMetrics
from harness.common.errors import InputError
from harness.common.io import write_jsonl
from harness.server.metrics import ServerMetrics

T0 = 1_800_000_000.0


def planted_scrapes(n: int = 40, change_at: int = 20) -> list[Scrape]:
    """40 scrapes 5 s apart of a real registry. From scrape 20 on, L2 misses surge (its hit rate
    falls), L2 evicts 50× more, its lookups get 10× slower, and stage "warm" starts failing (503);
    L1, L3 and fill rates stay as they were."""
    reg = CollectorRegistry()
    m = CacheMetrics(reg)
    m.bind_gauges(lambda t: {"l1": 0.3, "l2": 0.5, "l3": 0.1}[t], lambda _t: 100.0, lambda: 0.0)
    server = ServerMetrics(reg)
    scrapes = []
    for i in range(n):
        bad = i >= change_at
        for _ in range(8):
            m.hit("l1")
        m.miss("l1")
        for _ in range(1 if bad else 9):
            m.hit("l2")
        for _ in range(9 if bad else 1):
            m.miss("l2")
        for _ in range(5):
            m.hit("l3")
            m.miss("l3")
        m.evictions.labels("l2").inc(50 if bad else 1)
        m.evictions.labels("l1").inc(2)
        for j in range(10):
            m.observe("l1", 1e-5 * (1 + 0.01 * j))
            m.observe("l2", (1e-2 if bad else 1e-3) * (1 + 0.01 * j))
        server.requests.labels("chat.completions", "200", "warm").inc(20)
        server.requests.labels("chat.completions", "503", "warm").inc(10 if bad else 0)
        scrapes.append(Scrape(ts=T0 + 5 * i, text=generate_latest(reg).decode()))
    return scrapes


def first_path(node: AnomalyNode) -> list[str]:
    out = [node.name]
    while node.children:
        node = node.children[0]
        out.append(node.name)
    return out


def find(node: AnomalyNode, name: str) -> AnomalyNode | None:
    if node.name == name:
        return node
    for c in node.children:
        hit = find(c, name)
        if hit is not None:
            return hit
    return None


def test_planted_l2_degradation_is_attributed_to_tier_l2(tmp_path: Path) -> None:
    path = tmp_path / "scrapes.jsonl"
    write_jsonl(path, (s.model_dump() for s in planted_scrapes()))
    series = series_from_scrapes(read_scrapes(path))
    report = attribute(series, source=str(path))
    root = report.root
    assert [c.name for c in root.children] == ["tier", "stage"]
    tier = root.children[0]
    assert [c.name for c in tier.children] == ["tier=l2"]  # L1 and L3 did not move
    l2 = tier.children[0]
    symptoms = {c.name for c in l2.children}
    assert "HitRate" in symptoms and "FillRate" not in symptoms
    hit = next(c for c in l2.children if c.name == "HitRate")
    assert hit.deviation is not None and hit.deviation.direction == "down" and hit.deviation.z <= -3
    causes = {c.name for c in hit.children}
    assert causes == {"evictions: evictions", "latency spike: lookup latency"}
    ev = next(c for c in hit.children if c.name.startswith("evictions"))
    assert ev.deviation is not None
    assert ev.deviation.baseline == pytest.approx(1 / 5) and ev.deviation.observed > 5
    # The 503s of stage "warm" are a cause with no cache symptom under that stage: a leaf of the value.
    stage = root.children[1]
    warm = stage.children[0]
    assert warm.name == "stage=warm" and [c.level for c in warm.children] == ["cause"]
    assert warm.children[0].deviation is not None and warm.children[0].deviation.labels["status"] == "503"
    # Scores order the tree: the first path is the likeliest explanation.
    assert first_path(root)[:3] == ["run", "tier", "tier=l2"]
    assert root.score == max(c.score for c in root.children)
    # Ids are paths, stable across runs.
    assert hit.id == "tier/tier=l2/HitRate"
    assert ev.id == "tier/tier=l2/HitRate/cause:evictions"
    assert AnomalyReport.model_validate_json(report.model_dump_json()) == report


def test_no_deviation_no_anomaly() -> None:
    steady = planted_scrapes(change_at=10_000)
    report = attribute(series_from_scrapes(steady), source="steady")
    assert report.anomalies == 0 and report.root.children == [] and report.root.score == 0.0


def test_windows_and_bad_input() -> None:
    series = series_from_scrapes(planted_scrapes())
    # A baseline inside the bad period sees nothing wrong with a later bad window.
    report = attribute(
        series,
        source="x",
        baseline=Window(start=T0 + 110, end=T0 + 150),
        window=Window(start=T0 + 150, end=T0 + 195),
    )
    assert find(report.root, "HitRate") is None
    with pytest.raises(InputError, match="no samples"):
        attribute({}, source="empty")


def test_json_schema_is_stable() -> None:
    schema = AnomalyReport.model_json_schema()
    assert set(schema["properties"]) == {
        "schema_version", "source", "baseline", "window", "z_min", "series", "anomalies", "root"
    }  # fmt: skip
    node = schema["$defs"]["AnomalyNode"]
    assert set(node["properties"]) == {
        "id", "level", "name", "dimension", "value", "score", "symptoms", "deviation", "children"
    }  # fmt: skip
    assert node["properties"]["level"]["enum"] == ["root", "dimension", "value", "symptom", "cause"]
    assert set(schema["$defs"]["Deviation"]["properties"]) == {
        "metric", "labels", "kind", "baseline", "observed", "delta", "z", "direction"
    }  # fmt: skip


@pytest.fixture
def prometheus() -> Iterator[str]:
    """A stand-in for a Prometheus server's query_range API (no Prometheus binary here), serving the
    planted scrapes in Prometheus' JSON format: the parsing and time alignment are what is tested."""
    series = series_from_scrapes(planted_scrapes())

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = parse_qs(url.query)
            name = q["query"][0]
            result = [
                {
                    "metric": {"__name__": n, **dict(labels), "job": "harness"},
                    "values": [[t, str(v)] for t, v in s],
                }
                for (n, labels), s in series.items()
                if n == name
            ]
            body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})
            self.send_response(200 if url.path == "/api/v1/query_range" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        thread.join(timeout=10)


def test_prometheus_query_api_gives_the_same_tree(prometheus: str) -> None:
    series: dict[SeriesKey, Samples] = series_from_prometheus(prometheus, T0, T0 + 200, 5.0)
    assert all(dict(labels).get("job") == "harness" for _, labels in series)
    via_api = attribute(series, source=prometheus)
    via_scrapes = attribute(series_from_scrapes(planted_scrapes()), source="scrapes")
    ids = lambda n: [n.id, *(i for c in n.children for i in ids(c))]  # noqa: E731
    assert ids(via_api.root) == ids(via_scrapes.root)
