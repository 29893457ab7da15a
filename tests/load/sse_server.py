"""A small, controllable OpenAI-compatible SSE server for the load stage's tests.

It runs in a thread of the test process (the Locust process under test is a separate process), does
no per-request work beyond sleeping and writing, and logs what it did with ``perf_counter`` times so
that tests compare the client's measurements against the server's own: when the first token was
written (``first_write - received``) and the gaps between token writes. Behaviour is set per server:

* ``first_token_s``: delay from the request's arrival to the first token;
* ``gap_s``: delay between chunks; ``tokens`` per response; ``tokens_per_chunk``;
* ``usage``: ``"continuous"`` (usage on every chunk when the request asks for it, like vLLM),
  ``"final"`` (only the final usage chunk) or ``"none"``;
* ``stall_request`` / ``stall_s``: the N-th request (0-based) waits ``stall_s`` before its first token;
* ``fail_above_rps``: answer 503 while requests arrive faster than this (over the last 0.5 s);
* every request's headers and body are kept (``requests``) for header assertions; ``POST
  /cache/preload`` is answered like ours (``{"lines", "stored", "generated", "failed"}``), other
  ``/cache/*`` routes and any POST but a completion (``/reset_prefix_cache``) with 404;
* ``fail_markers``: answer 500 to a completion whose body holds one of these texts;
* ``metrics``: answer ``GET /metrics`` as vLLM does, with a prefix cache that counts 5 prompt tokens
  queried per request and 5 hit when the same body came before (else GET answers 501, as a server
  without it does);
* ``models``: answer ``GET /v1/models`` with these ids (an OpenAI model list); ``require_model``:
  answer 400 to a completion body without ``model``, as a server that enforces the OpenAI API does;
* the kinds of its chat tokens: ``reasoning_tokens`` (the first N stream as ``delta.<reasoning_field>``,
  as vLLM's reasoning parsers do), ``think_inline`` (the same N inline in ``content`` between
  ``<think>`` and ``</think>``, as a server without a reasoning parser sends them), ``tool_call``
  (every token is a fragment of one tool call's arguments, the first chunk also carrying the call's
  id and name, ``finish_reason: tool_calls``), ``report_reasoning`` (the final usage carries
  ``completion_tokens_details.reasoning_tokens``).

Times are absolute targets from the request's arrival (no drift across tokens); TCP_NODELAY is on so
that small writes leave at once.
"""

from __future__ import annotations

import itertools
import json
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RATE_WINDOW_S = 0.5
"""``fail_above_rps`` counts the arrivals of the last half second (a short memory: load that drops is
served again soon)."""


@dataclass
class Behaviour:
    first_token_s: float = 0.0
    gap_s: float = 0.0
    tokens: int = 8
    tokens_per_chunk: int = 1
    usage: str = "continuous"
    stall_request: int | None = None
    stall_s: float = 0.0
    fail_above_rps: float | None = None
    preload_s: float = 0.0
    """How long ``POST /cache/preload`` takes to answer (a target generating the entries)."""
    tag_replies: bool = False
    """Every reply's text is unique to its request (``served.reply``): a test can find it in the history
    a later request carries."""
    metrics: bool = False
    x_cache: str | None = "MISS"
    """The ``x-cache`` header of every answer (``None``: none, as vLLM sends)."""
    models: tuple[str, ...] | None = None
    """``GET /v1/models`` lists these ids (``None``: no model list, as before)."""
    require_model: bool = False
    """A completion body without ``model`` is answered 400 (the OpenAI API requires the field)."""
    reasoning_tokens: int = 0
    """Chat: the first N tokens are thinking, streamed in ``delta.<reasoning_field>``."""
    reasoning_field: str = "reasoning_content"
    think_inline: bool = False
    """The thinking tokens go inline in ``content``, wrapped in ``<think>`` … ``</think>``."""
    report_reasoning: bool = False
    """The final usage reports ``completion_tokens_details.reasoning_tokens``."""
    tool_call: str | None = None
    """Chat: answer with one call of this function, every token a fragment of its arguments (the
    first chunk also carries the call's id and name), ``finish_reason: tool_calls``."""
    tool_arguments: str | None = None
    """The call's arguments, cut into ``tokens`` fragments (``None``: ``{"q": " t0 … tN"}``)."""
    tool_only_with_tools: bool = False
    """Call the tool only when the request offers ``tools``; answer text otherwise."""
    fail_markers: tuple[str, ...] = ()
    """A completion whose body holds one of these texts is answered 500 (a failing call among others)."""


@dataclass
class Served:
    """What the server did for one request (perf_counter seconds)."""

    index: int
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received: float
    status: int = 200
    writes: list[float] = field(default_factory=list)
    """Times each content chunk was written."""
    reply: str = ""
    """The text written (every content chunk's, joined)."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """The tool calls written (assistant-message shape: id, type, function name and arguments)."""
    done: float | None = None
    """Just before the stream's end (``[DONE]`` and the last chunk) was written: the earliest moment a
    client can have seen the response end. Stamped before the write, not after it, so that a server
    thread descheduled between the write and the stamp cannot make a client look early."""

    @property
    def first_token_ms(self) -> float | None:
        return (self.writes[0] - self.received) * 1000.0 if self.writes else None

    @property
    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000.0 for a, b in zip(self.writes, self.writes[1:], strict=False)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def do_POST(self) -> None:
        received = time.perf_counter()
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        srv = self.server
        if self.path == "/cache/preload":
            time.sleep(srv.behaviour.preload_s)
            lines = [x for x in raw.splitlines() if x.strip()]
            with srv.lock:
                srv.preloads.append(raw)
            out = json.dumps(
                {"lines": len(lines), "stored": len(lines), "generated": 0, "failed": 0}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        if self.path.startswith("/cache/") or not self.path.endswith("/completions"):
            self._answer(404, b'{"detail": "Not Found"}')  # no response cache, no KV reset
            return
        body = json.loads(raw or b"{}")
        b = srv.behaviour
        if b.require_model and not body.get("model"):
            with srv.lock:
                srv.requests.append(
                    Served(len(srv.requests), self.path, dict(self.headers.items()), body, received, 400)
                )
            refusal = {"message": "you must provide a model parameter", "type": "invalid_request_error",
                       "param": "model", "code": None}  # fmt: skip
            self._answer(400, json.dumps({"error": refusal}).encode())
            return
        with srv.lock:
            srv.prefix_queries += 5
            srv.prefix_hits += 5 if raw in srv.seen else 0
            srv.seen.add(raw)
            served = Served(len(srv.requests), self.path, dict(self.headers.items()), body, received)
            srv.requests.append(served)
            srv.arrivals.append(received)
            while srv.arrivals and srv.arrivals[0] < received - RATE_WINDOW_S:
                srv.arrivals.popleft()
            busy = b.fail_above_rps is not None and len(srv.arrivals) > b.fail_above_rps * RATE_WINDOW_S
        if any(m.encode() in raw for m in b.fail_markers):
            served.status = 500
            self._answer(500, b'{"error": {"message": "failed on purpose", "type": "server_error"}}')
            return
        if busy:
            served.status = 503
            out = b'{"error": {"message": "overloaded", "type": "server_error"}}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        chat = self.path.endswith("/chat/completions")
        opts = body.get("stream_options") or {}
        continuous = b.usage == "continuous" and bool(opts.get("continuous_usage_stats"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        if b.x_cache is not None:
            self.send_header("x-cache", b.x_cache)
        self.end_headers()
        start = received + b.first_token_s
        if b.stall_request is not None and served.index == b.stall_request:
            start += b.stall_s
        sent = 0
        i = 0
        calling = chat and b.tool_call is not None and (bool(body.get("tools")) or not b.tool_only_with_tools)
        fragments = _fragments(b, served.index) if calling else []
        if calling:
            args = "".join(fragments)
            served.calls.append({"id": f"call_{served.index}", "type": "function",
                                 "function": {"name": b.tool_call, "arguments": args}})  # fmt: skip
        thinking = b.reasoning_tokens if chat and not calling else 0
        while sent < b.tokens:
            k = min(b.tokens_per_chunk, b.tokens - sent)
            tag = f"r{served.index}." if b.tag_replies else "t"
            words = [f" {tag}{sent + j}" for j in range(k)]
            delta: dict[str, Any] = {}
            if calling:
                call: dict[str, Any] = {
                    "index": 0,
                    "function": {"arguments": "".join(fragments[sent : sent + k])},
                }
                if sent == 0:
                    call.update(id=f"call_{served.index}", type="function")
                    call["function"]["name"] = b.tool_call
                delta["tool_calls"] = [call]
            else:
                think = "".join(w for j, w in enumerate(words) if sent + j < thinking)
                text = "".join(w for j, w in enumerate(words) if sent + j >= thinking)
                if think and b.think_inline:
                    text = (
                        ("<think>" if sent == 0 else "")
                        + think
                        + ("</think>" if sent + k >= thinking else "")
                        + text
                    )
                elif think:
                    delta[b.reasoning_field] = think
                if text:
                    delta["content"] = text
                    served.reply += text
            choice: dict[str, Any] = (
                {"index": 0, "delta": delta, "finish_reason": None}
                if chat
                else {"index": 0, "text": "".join(words), "finish_reason": None}
            )
            if not chat:
                served.reply += "".join(words)
            sent += k
            if sent == b.tokens:
                choice["finish_reason"] = "tool_calls" if calling else "length"
            chunk: dict[str, Any] = {
                "id": "x",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0,
                "model": "test",
                "choices": [choice],
            }
            if continuous:
                chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": sent, "total_tokens": 5 + sent}
            data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            due = start + i * b.gap_s
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self._chunk(data)
            served.writes.append(time.perf_counter())
            i += 1
        if b.usage != "none" and opts.get("include_usage"):
            usage = {"prompt_tokens": 5, "completion_tokens": b.tokens, "total_tokens": 5 + b.tokens,
                     "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
            if b.report_reasoning:
                usage["completion_tokens_details"] = {"reasoning_tokens": thinking}
            obj = "chat.completion.chunk" if chat else "text_completion"
            final = {"id": "x", "object": obj, "created": 0, "model": "test", "choices": [], "usage": usage}
            self._chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
        served.done = time.perf_counter()
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _answer(self, status: int, out: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:
        srv = self.server
        if self.path == "/v1/models" and srv.behaviour.models is not None:
            with srv.lock:
                srv.gets.append(dict(self.headers.items()))
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in srv.behaviour.models
            ]
            self._answer(200, json.dumps({"object": "list", "data": data}).encode())
            return
        if not srv.behaviour.metrics:
            self.send_error(501, f"Unsupported method ({self.command!r})")
            return
        if self.path != "/metrics":
            self._answer(404, b'{"detail": "Not Found"}')
            return
        with srv.lock:
            q, h = srv.prefix_queries, srv.prefix_hits
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="test"} 0.0\n'
            "# TYPE vllm:prefix_cache_queries_total counter\n"
            f'vllm:prefix_cache_queries_total{{model_name="test"}} {q}\n'
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            f'vllm:prefix_cache_hits_total{{model_name="test"}} {h}\n'
        )
        self._answer(200, text.encode(), "text/plain; version=0.0.4")


def _fragments(b: Behaviour, index: int) -> list[str]:
    """A tool call's arguments cut into ``b.tokens`` fragments, one per token."""
    if b.tool_arguments is None:
        words = [f" t{j}" for j in range(b.tokens)]
        return ['{"q": "' + words[0], *words[1:-1], words[-1] + '"}'] if b.tokens > 1 else ['{"q": " t0"}']
    text = b.tool_arguments
    assert len(text) >= b.tokens, "tool_arguments shorter than tokens"
    bounds = [round(j * len(text) / b.tokens) for j in range(b.tokens + 1)]
    return [text[x:y] for x, y in itertools.pairwise(bounds)]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that quits mid-request (the end of a Locust run) is not a server error

    def __init__(self, behaviour: Behaviour) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour
        self.lock = threading.Lock()
        self.requests: list[Served] = []
        self.arrivals: deque[float] = deque()
        self.preloads: list[bytes] = []
        self.gets: list[dict[str, str]] = []
        """The headers of every ``GET /v1/models``."""
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.seen: set[bytes] = set()


class SSEServer:
    """``with SSEServer(Behaviour(...)) as srv: srv.url`` — serves in a background thread."""

    def __init__(self, behaviour: Behaviour | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self._srv = _Server(behaviour or Behaviour())
        self._scheme = "http"
        if tls is not None:  # HTTPS with the given server context (a test's self-signed certificate)
            self._srv.socket = tls.wrap_socket(self._srv.socket, server_side=True)
            self._scheme = "https"
        self._thread = threading.Thread(
            target=self._srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._srv.server_address[:2]
        return f"{self._scheme}://{host}:{port}"

    @property
    def requests(self) -> list[Served]:
        with self._srv.lock:
            return list(self._srv.requests)

    @property
    def preloads(self) -> list[bytes]:
        return list(self._srv.preloads)

    @property
    def model_lists(self) -> int:
        """How many times ``GET /v1/models`` was answered."""
        with self._srv.lock:
            return len(self._srv.gets)

    def __enter__(self) -> SSEServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._srv.shutdown()
        self._srv.server_close()


if __name__ == "__main__":  # manual use: python tests/load/sse_server.py
    import sys

    with SSEServer(Behaviour(first_token_s=0.05, gap_s=0.01, tokens=16)) as s:
        print(s.url, flush=True)
        sys.stdin.read()
