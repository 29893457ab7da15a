"""The anomaly tree on planted deviations, from real metric registries: scraped into
server_metrics.jsonl by the load stage's scraper, as older {ts, text} scrapes, and through a
Prometheus API."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
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
    metric_names,
    read_series,
    scrape_metrics,
    series_from_prometheus,
    series_from_scrapes,
)
from harness.common.auth import Credentials
from harness.common.errors import InputError, UnavailableError
from harness.common.io import write_jsonl
from harness.load.server_metrics import SERVER_KINDS, SampleWriter, normalise
from harness.target.cache.metrics import CacheMetrics
from harness.target.engine.api import EngineStats
from harness.target.server.metrics import EngineCollector, ServerMetrics

T0 = 1_800_000_000.0


def planted_scrapes(n: int = 40, change_at: int = 20) -> list[Scrape]:
    """40 scrapes 5 s apart of a real registry. From scrape 20 on, L2 misses surge (its hit rate
    falls), L2 evicts 50× more, its lookups get 10× slower, and stage "warm" starts failing (503);
    L1, L3 and fill rates stay as they were. The engine's gauges are there as in ``harness serve``."""
    reg = CollectorRegistry()
    reg.register(EngineCollector(EngineStats))
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


def write_server_metrics(path: Path, scrapes: list[Scrape]) -> Path:
    """The scrapes as the load stage's scraper writes them (server_metrics.jsonl)."""
    writer = SampleWriter(path)
    for sc in scrapes:
        writer.write(normalise(sc.text, sc.ts))
    writer.close()
    return path


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
    path = write_server_metrics(tmp_path / "server_metrics.jsonl", planted_scrapes())
    series = read_series(tmp_path)  # a run directory holding it
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


@contextlib.contextmanager
def serving(respond: Callable[[BaseHTTPRequestHandler], tuple[int, bytes]]) -> Iterator[str]:
    """A local HTTP server whose every GET is answered by ``respond(request) -> (status, body)``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body = respond(self)
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

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


@pytest.fixture
def prometheus() -> Iterator[str]:
    """A stand-in for a Prometheus server's query_range API (no Prometheus binary here), serving the
    planted scrapes in Prometheus' JSON format: the parsing and time alignment are what is tested."""
    series = series_from_scrapes(planted_scrapes())

    def respond(req: BaseHTTPRequestHandler) -> tuple[int, bytes]:
        url = urlparse(req.path)
        name = parse_qs(url.query)["query"][0]
        result = [
            {
                "metric": {"__name__": n, **dict(labels), "job": "harness"},
                "values": [[t, str(v)] for t, v in ss],
            }
            for (n, labels), ss in series.items()
            if n == name
        ]
        body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})
        return 200 if url.path == "/api/v1/query_range" else 404, body.encode()

    with serving(respond) as url:
        yield url


def test_prometheus_query_api_gives_the_same_tree(prometheus: str) -> None:
    series: dict[SeriesKey, Samples] = series_from_prometheus(prometheus, T0, T0 + 200, 5.0)
    assert all(dict(labels).get("job") == "harness" for _, labels in series)
    via_api = attribute(series, source=prometheus)
    via_scrapes = attribute(series_from_scrapes(planted_scrapes()), source="scrapes")
    ids = lambda n: [n.id, *(i for c in n.children for i in ids(c))]  # noqa: E731
    assert ids(via_api.root) == ids(via_scrapes.root)


def test_the_scraper_keeps_every_series_the_tree_reads() -> None:
    """The load stage's scraper keeps our server's series per label set by a list of its own (the load
    stage cannot import the analysis): it must hold every name the tree reads."""
    assert set(metric_names()) <= set(SERVER_KINDS.get("harness").series)


def test_older_scrape_files_read_as_the_same_series(tmp_path: Path) -> None:
    scrapes = planted_scrapes()
    legacy = tmp_path / "scrapes.jsonl"
    write_jsonl(legacy, (s.model_dump() for s in scrapes))
    samples = write_server_metrics(tmp_path / "server_metrics.jsonl", scrapes)
    assert read_series(legacy) == read_series(samples) == series_from_scrapes(scrapes)
    other = tmp_path / "other.jsonl"
    other.write_text('{"t": 1, "body": "x"}\n')
    with pytest.raises(InputError) as err:  # neither: named as the format it is not
        read_series(other)
    assert err.value.line == 1 and "expected a server metrics sample" in err.value.message


def test_counters_across_a_server_restart_count_from_zero() -> None:
    """An eviction counter that restarts (the server did) gives the rate since the restart, by the one
    counter rule, not a negative rate or a spike of the whole counter."""
    from harness.analysis.anomaly import CAUSES, deviations

    key: SeriesKey = ("cache_evictions_total", (("tier", "l2"),))
    values = [(0.0, 100.0), (10.0, 110.0), (20.0, 5.0), (30.0, 15.0)]
    ((_, _, d),) = deviations(
        {key: values},
        {"evictions": CAUSES["evictions"]},
        Window(start=0.0, end=10.0),
        Window(start=10.0, end=30.0),
    )
    assert d.baseline == pytest.approx(1.0) and d.observed == pytest.approx((0.5 + 1.0) / 2)


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, list[str | None]]]:
    """A ``/metrics`` that wants a bearer token, serving the planted scrapes one by one; the
    Authorization header of every GET is recorded."""
    texts = iter([sc.text for sc in planted_scrapes(n=6, change_at=3)])
    seen: list[str | None] = []

    def respond(req: BaseHTTPRequestHandler) -> tuple[int, bytes]:
        seen.append(req.headers.get("Authorization"))
        if req.path != "/metrics":
            return 404, b""
        if req.headers.get("Authorization") != "Bearer s3cret":
            return 401, b""
        return 200, next(texts).encode()

    with serving(respond) as url:
        yield url, seen


def test_scrape_sends_the_credentials_and_writes_server_metrics(
    metrics_server: tuple[str, list[str | None]], tmp_path: Path
) -> None:
    url, seen = metrics_server
    out = tmp_path / "server_metrics.jsonl"
    warned: list[str] = []
    n = scrape_metrics(
        url + "/metrics", Credentials(admin_token="s3cret"), out, every_s=0.0, count=6,
        warn=warned.append, sleep=lambda _s: None,
    )  # fmt: skip
    assert n == 6 and warned == [] and seen == ["Bearer s3cret"] * 6
    from harness.load.server_metrics import read_server_metrics

    lines = list(read_server_metrics(out))
    assert [s.kind for s in lines] == ["harness"] * 6
    assert all(s.series for s in lines) and lines[0].t_s > 1e9  # unix seconds
    series = read_series(out)
    hit = series[("cache_hit_rate", (("tier", "l2"),))]
    # The gauge is cumulative: 27 of 30 lookups hit by the third scrape, 28 of 40 by the fourth.
    assert [v for _, v in hit][2:4] == [pytest.approx(0.9), pytest.approx(0.7)]


def test_scrape_refused_or_absent_is_unavailable(
    metrics_server: tuple[str, list[str | None]], tmp_path: Path
) -> None:
    url, seen = metrics_server
    with pytest.raises(UnavailableError, match="answered 401") as err:
        scrape_metrics(url, Credentials(), tmp_path / "a.jsonl", every_s=0.0, count=3, warn=lambda _: None)
    assert err.value.field == "--url" and seen == [None]  # not asked again
    with pytest.raises(UnavailableError, match="Connect"):
        scrape_metrics(
            "http://127.0.0.1:9", Credentials(), tmp_path / "b.jsonl", every_s=0.0, count=3,
            warn=lambda _: None,
        )  # fmt: skip


def test_the_scrape_command_takes_the_credentials_options(
    metrics_server: tuple[str, list[str | None]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import main

    url, seen = metrics_server
    out = tmp_path / "m.jsonl"
    args = ["analysis", "scrape", "--url", url, "-o", str(out), "--every-s", "0", "--count", "2"]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--admin-token", "s3cret"])
    assert exc.value.code == 0 and seen == ["Bearer s3cret"] * 2
    assert "wrote 2 scrapes" in capsys.readouterr().err
    assert len(read_series(out)[("cache_hit_rate", (("tier", "l1"),))]) == 2
    with pytest.raises(SystemExit) as exc:
        main([*args, "--header", "Authorization: Bearer wrong"])
    assert exc.value.code == 5 and "answered 401" in capsys.readouterr().err
