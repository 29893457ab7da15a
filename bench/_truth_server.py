"""A ground-truth SSE server for benchmarks of simultaneous requests: one asyncio loop in a process of
its own, known TTFT and ITL, every reply tagged, a log of what it did.

``tests/load/sse_server.py`` (threads in the test's process) is the tests' ground truth; when several
requests arrive at one instant its threads parse them one after another under one interpreter lock
before each stamps its arrival, so the later ones are answered late (measured: five requests sent
within 0.3 ms were stamped over 1.6–3 ms). Here the request head is read with one C-level
``readuntil`` and the arrival stamped at once; the body is read, the tokens are written at absolute
times from the arrival (``loop.call_at`` precision), and ``perf_counter`` (CLOCK_MONOTONIC: the same
clock in every process) stamps are kept. :class:`TruthServer` starts it and reads its log back.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Served:
    """One request as the server saw it (perf_counter seconds)."""

    session: str
    body: dict[str, Any]
    received: float
    done: float
    reply: str


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cfg: dict[str, Any],
                  log: list[dict[str, Any]]) -> None:  # fmt: skip
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            received = time.perf_counter()
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
            body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))) or b"{}")
            if lines[0].startswith("GET"):
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            n = len(log)
            words = [f" r{n}t{i}" for i in range(cfg["tokens"])]
            for i, w in enumerate(words):
                due = received + cfg["first_token_s"] + i * cfg["itl_s"]
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                chunk = {"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
                data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            done = time.perf_counter()
            end = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(end), end))
            await writer.drain()
            log.append({"session": headers.get("x-session-id", ""), "body": body, "received": received,
                        "done": done, "reply": "".join(words)})  # fmt: skip
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _serve(cfg: dict[str, Any], port: Any, stop: Any, out: Any) -> None:
    async def main() -> None:
        log: list[dict[str, Any]] = []
        server = await asyncio.start_server(lambda r, w: _handle(r, w, cfg, log), "127.0.0.1", 0)
        port.value = server.sockets[0].getsockname()[1]
        while not stop.is_set():
            await asyncio.sleep(0.05)
        server.close()
        out.put(log)

    asyncio.run(main())


class TruthServer:
    """``with TruthServer(first_token_s, itl_s, tokens) as srv:`` — ``srv.url``, then ``srv.requests``."""

    def __init__(self, first_token_s: float, itl_s: float, tokens: int) -> None:
        ctx = mp.get_context("spawn")
        self._port = ctx.Value("i", 0)
        self._stop = ctx.Event()
        self._out: Any = ctx.Queue()
        cfg = {"first_token_s": first_token_s, "itl_s": itl_s, "tokens": tokens}
        self._proc = ctx.Process(target=_serve, args=(cfg, self._port, self._stop, self._out), daemon=True)
        self.requests: list[Served] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port.value}"

    def __enter__(self) -> TruthServer:
        self._proc.start()
        while not self._port.value:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.requests = [Served(**x) for x in self._out.get(timeout=30)]
        self._proc.join(10)
