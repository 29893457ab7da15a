"""A streaming OpenAI-compatible test server of known capacity, for ``harness capacity``'s tests.

It serves at most ``slots`` streams at once, each holding its slot for ``hold_s`` (first token after
``first_token_s``, the rest spread evenly up to ``hold_s``), so its capacity is ``slots / hold_s``
requests/s. What happens to a request that finds every slot busy is the ``mode``:

* ``"queue"``: it waits for a slot (a server with an internal queue: latency explodes past capacity);
* ``"collapse"``: the server falls over: it answers 503 to that request and to every request in the
  next ``collapse_s`` seconds (errors jump from none to most: a cliff).

``error_share`` makes it a target that errors: that share of the completion requests is answered
``500`` at once, spread evenly and deterministically (with 0.25 every 4th request, counted from the
first), whatever the load; the rest are served as above. :attr:`CapacityServer.errored` counts them.

Times are absolute targets from when the slot was taken, so the hold does not drift with the
machine's load. Paths other than the two completion endpoints answer 404 (the target then exposes
no cache level and no model list, like a bare inference server).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal


@dataclass(frozen=True)
class Capacity:
    slots: int = 4
    hold_s: float = 0.5
    first_token_s: float = 0.02
    tokens: int = 5
    mode: Literal["queue", "collapse"] = "queue"
    collapse_s: float = 2.0
    error_share: float = 0.0
    """This share of the completion requests is answered 500 (evenly: the k-th request errs when
    ``floor(k · share)`` grows)."""

    @property
    def rps(self) -> float:
        return self.slots / self.hold_s


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _plain(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._plain(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._plain(404, b'{"error": "not found"}')
            return
        srv = self.server
        c = srv.capacity
        with srv.lock:
            srv.count += 1
            k = srv.count
        if math.floor(k * c.error_share) > math.floor((k - 1) * c.error_share):
            srv.errored += 1
            self._plain(500, b'{"error": {"message": "injected", "type": "server_error"}}')
            return
        if c.mode == "collapse":
            now = time.monotonic()
            with srv.lock:
                down = now < srv.down_until
                got = not down and srv.slots.acquire(blocking=False)
                if not got and not down:
                    srv.down_until = now + c.collapse_s
            if not got:
                srv.rejected += 1
                self._plain(503, b'{"error": {"message": "overloaded", "type": "server_error"}}')
                return
        else:
            srv.slots.acquire()
        try:
            self._stream(json.loads(raw or b"{}"), time.perf_counter())
        finally:
            srv.slots.release()

    def _stream(self, body: dict[str, Any], start: float) -> None:
        c = self.server.capacity
        chat = self.path.endswith("/chat/completions")
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        gap = (c.hold_s - c.first_token_s) / max(1, c.tokens - 1)
        for i in range(c.tokens):
            delay = start + c.first_token_s + i * gap - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            text = f" t{i}"
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if i == c.tokens - 1 else None}
            choice.update({"delta": {"content": text}} if chat else {"text": text})
            chunk: dict[str, Any] = {
                "id": "x",
                "object": "chunk",
                "created": 0,
                "model": "test",
                "choices": [choice],
            }
            if continuous:
                chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": i + 1, "total_tokens": 6 + i}
            data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        done = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that quits mid-stream (the end of a probe) is not a server error

    def __init__(self, capacity: Capacity) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.capacity = capacity
        self.slots = threading.Semaphore(capacity.slots)
        self.lock = threading.Lock()
        self.down_until = 0.0
        self.rejected = 0
        self.count = 0
        self.errored = 0


class CapacityServer:
    """``with CapacityServer(Capacity(slots=4, hold_s=0.5)) as srv: srv.url`` (8 requests/s)."""

    def __init__(self, capacity: Capacity) -> None:
        self._srv = _Server(capacity)
        self._thread = threading.Thread(
            target=self._srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._srv.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def rejected(self) -> int:
        return self._srv.rejected

    @property
    def errored(self) -> int:
        """Requests answered 500 for ``error_share``."""
        return self._srv.errored

    def __enter__(self) -> CapacityServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._srv.shutdown()
        self._srv.server_close()
