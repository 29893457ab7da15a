"""The Jaeger query client against a local fixture server on 127.0.0.1.

A real Jaeger is not available here, so the server replays the *recorded real responses* of the
Jaeger api_v3 HTTP gateway from ``$HARNESS_REALDATA/jaeger/apiv3/`` byte for byte (and, for v1, the
real ``jaeger/ui_01.json`` trace wrapped in the v1 ``{"data": [...]}`` envelope). It records every
request so the tests can check the parameters the client sent.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from harness.common.errors import InputError, UnavailableError
from harness.traces import read_traces
from harness.traces.readers.jaeger_query import JaegerQueryClient

pytestmark = pytest.mark.realdata


class Replay:
    def __init__(self, realdata: Path, mode: str) -> None:
        self.v3 = realdata / "jaeger/apiv3"
        self.ui01 = (realdata / "jaeger/ui_01.json").read_bytes()
        self.mode = mode  # "v3" (v1 search removed), "v1", "500", "400", "slow"
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.release = threading.Event()
        """Holds "slow" answers until the test is over (no race between a sleep and the client's timeout)."""

    def respond(self, path: str, query: dict[str, str]) -> tuple[int, bytes]:
        self.requests.append((path, query))
        if self.mode == "500":
            return 500, b'{"error": {"message": "storage backend down"}}'
        if self.mode == "400":
            return 400, b'{"data": null, "errors": [{"code": 400, "msg": "parameter service is required"}]}'
        if self.mode == "slow":
            self.release.wait(60)
        if path.startswith("/api/v3/"):
            name = {
                "/api/v3/services": "GetServices.json",
                "/api/v3/operations": "GetOperations.json",
                "/api/v3/traces": "FindTraces.json",
                "/api/v3/traces/00000000000000000000000000000001": "GetTrace.json",
            }.get(path)
            if name is None:
                return 404, b'{"error": {"code": 5, "message": "trace not found"}}'
            return 200, (self.v3 / name).read_bytes()
        if self.mode == "v3":
            return 404, b"404 page not found\n"
        if path == "/api/services":
            return 200, b'{"data": ["service-x", "service-y"], "total": 2}'
        if path == "/api/traces" or path.startswith("/api/traces/"):
            return 200, b'{"data": [' + self.ui01 + b'], "total": 1, "limit": 0, "offset": 0, "errors": null}'
        return 404, b"404 page not found\n"


@pytest.fixture
def server(realdata: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Replay]]:
    replay = Replay(realdata, request.param)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            code, body = replay.respond(parts.path, query)
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # the client under test may have given up already (timeout test)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", replay
    finally:
        replay.release.set()
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("server", ["v3"], indirect=True)
def test_falls_back_to_api_v3(server: tuple[str, Replay]) -> None:
    url, replay = server
    with JaegerQueryClient(url) as client:
        assert client.services() == ["foo"]
        assert client.api == "v3"
        assert client.operations("foo") == ["get_users"]
        hour = 3_600_000_000
        traces = list(
            client.find_traces("foo", operation="op", start_us=0, end_us=3 * hour, min_duration="500ms")
        )
        tr = client.get_trace("1")
    # three one-hour pages, the same trace in each, de-duplicated
    searches = [q for p, q in replay.requests if p == "/api/v3/traces"]
    assert len(searches) == 3
    assert searches[0]["query.service_name"] == "foo" and searches[0]["query.operation_name"] == "op"
    assert searches[0]["query.start_time_min"] == "1970-01-01T00:00:00Z"
    assert searches[2]["query.start_time_max"] == "1970-01-01T03:00:00Z"
    assert searches[0]["query.duration_min"] == "500000us"
    assert len(traces) == 1
    assert traces[0].trace_id == "0" * 31 + "1" and tr.trace_id == traces[0].trace_id
    span = tr.root
    assert (span.span_id, span.operation, span.kind.value, span.error) == (
        "0000000000000002",
        "foobar",
        "server",
        True,
    )


@pytest.mark.parametrize("server", ["v3"], indirect=True)
def test_reader_url_and_missing_trace(server: tuple[str, Replay]) -> None:
    url, _ = server
    traces = list(read_traces(f"{url}/?service=foo&lookback=2h&page=1h&limit=5"))
    assert [t.trace_id for t in traces] == ["0" * 31 + "1"]
    with pytest.raises(InputError, match="not found"):
        list(read_traces(f"{url}/trace/abcdef"))


@pytest.mark.parametrize("server", ["v1"], indirect=True)
def test_v1_api(server: tuple[str, Replay]) -> None:
    url, replay = server
    with JaegerQueryClient(url) as client:
        assert client.services() == ["service-x", "service-y"]
        traces = list(client.find_traces("service-x", tags={"error": "true"}, lookback_s=60, limit=7))
    assert client.api == "auto"
    [(_, q)] = [r for r in replay.requests if r[0] == "/api/traces"]
    assert q["service"] == "service-x" and q["limit"] == "7" and q["tags"] == '{"error":"true"}'
    assert int(q["end"]) - int(q["start"]) == 60_000_000
    assert len(traces) == 1 and len(traces[0].spans) == 5


@pytest.mark.parametrize("server", ["500"], indirect=True)
def test_5xx_is_unavailable(server: tuple[str, Replay]) -> None:
    with (
        pytest.raises(UnavailableError, match="storage backend down"),
        JaegerQueryClient(server[0]) as client,
    ):
        client.services()


@pytest.mark.parametrize("server", ["400"], indirect=True)
def test_4xx_is_input_error(server: tuple[str, Replay]) -> None:
    with (
        pytest.raises(InputError, match="parameter service is required"),
        JaegerQueryClient(server[0]) as client,
    ):
        list(client.find_traces("x"))


@pytest.mark.parametrize("server", ["slow"], indirect=True)
def test_timeout_is_unavailable(server: tuple[str, Replay]) -> None:
    with (
        pytest.raises(UnavailableError, match="timed out"),
        JaegerQueryClient(server[0], timeout_s=0.2) as client,
    ):
        client.services()


def test_connection_refused_is_unavailable() -> None:
    import socket

    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        pytest.raises(UnavailableError, match="cannot reach"),
        JaegerQueryClient(f"http://127.0.0.1:{port}") as c,
    ):
        c.services()


@pytest.mark.parametrize("server", ["v1"], indirect=True)
def test_reader_url_defaults_come_from_settings(
    server: tuple[str, Replay], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HARNESS__TRACES__QUERY_*`` set what a query URL leaves out; the URL's own parameters win."""
    url, replay = server
    monkeypatch.setenv("HARNESS__TRACES__QUERY_LIMIT", "7")
    monkeypatch.setenv("HARNESS__TRACES__QUERY_PAGE_S", "1800")
    list(read_traces(f"{url}/?service=service-x&lookback=2h"))
    searches = [q for p, q in replay.requests if p == "/api/traces"]
    assert len(searches) == 4  # 2 h of look-back in 30-minute pages
    assert {q["limit"] for q in searches} == {"7"}
    replay.requests.clear()
    list(read_traces(f"{url}/?service=service-x&lookback=2h&page=1h&limit=3"))
    searches = [q for p, q in replay.requests if p == "/api/traces"]
    assert len(searches) == 2 and {q["limit"] for q in searches} == {"3"}
    with pytest.raises(InputError, match="timeout"):
        list(read_traces(f"{url}/?service=service-x&timeout=soon"))
