"""The replay user's request head, written as bytes (harness/load/wire.py): what reaches the target."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.auth import Credentials
from harness.load.results import read_records
from harness.load.runner import LoadSpec, run_locust
from harness.load.wire import Connection, HeaderValueError
from tests.load.sse_server import Behaviour, SSEServer


def conn(url: str) -> Connection:
    return Connection(url, Credentials(), connection_timeout=1, network_timeout=1)


def test_the_head_is_one_request_line_host_headers_and_length() -> None:
    head = conn("http://127.0.0.1:8000").head(
        "/v1/completions", {"X-A": "1", "Accept": "text/event-stream"}, 42
    )
    assert head == (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nX-A: 1\r\nAccept: text/event-stream\r\n"
        b"Content-Length: 42\r\n\r\n"
    )
    assert conn("https://llm.example/").head("/v1/x", {}, 0) == (
        b"POST /v1/x HTTP/1.1\r\nHost: llm.example\r\nContent-Length: 0\r\n\r\n"
    )
    assert conn("http://gw.example:8080/llm/").head("/v1/x", {}, 0).startswith(b"POST /llm/v1/x HTTP/1.1\r\n")


@pytest.mark.parametrize("value", ["acme\r\nX-Injected: 1", "acme\n", "a\rb", "nul\0"])
def test_a_value_that_would_smuggle_a_header_is_refused(value: str) -> None:
    with pytest.raises(HeaderValueError, match="X-Tenant-ID"):
        conn("http://127.0.0.1:8000").head("/v1/x", {"Accept": "*/*", "X-Tenant-ID": value}, 0)


@pytest.mark.slow
def test_a_host_with_a_path_prefixes_every_request(tmp_path: Path, corpus: Path) -> None:
    with SSEServer(Behaviour(tokens=2)) as srv:
        spec = LoadSpec(host=srv.url + "/gw/", corpus=corpus, rate=10, duration=0.5,
                        results_dir=tmp_path / "r", start_delay=0.5)  # fmt: skip
        assert run_locust(spec, timeout_s=120) == 0
        served = srv.requests
    assert len(served) == 5 and {x.path for x in served} == {"/gw/v1/chat/completions"}
    assert all(r.status == 200 for r in read_records(tmp_path / "r"))
