"""The replay user's connection: one keep-alive HTTP/1.1 connection, the request head written as bytes.

A replay user sends one request at a time, so it owns one connection (a geventhttpclient
``ConnectionPool`` of size 1: connect, keep alive, reconnect after the server closed it, TLS through
``SSLConnectionPool`` with the run's :class:`~harness.common.auth.Credentials`). The request head is
built here as one string and written with the body in a single ``sendall``; the response is
geventhttpclient's own streaming ``HTTPSocketPoolResponse``, read line by line by the user.

Why not ``HTTPClient.request``: it merges the headers into a case-insensitive ``Headers`` object
twice and checks each one with regular expressions on every call. With the ten or so headers a
coloured, traced request carries, that was the largest part of the replay user's own CPU per
request (profiled), more than the bare ``FastHttpUser`` it is compared with spends in total. Here the
values are checked once, as a block, for what would let a value smuggle a header or a request
(CR, LF, NUL); the names are the harness's own or were checked when the options were read.

A POST is never retried: as geventhttpclient does (RFC 9110 §9.2.2), a request that may have reached
the server is not sent twice. A connection broken while sending is read for an early answer (a 401
to a large body), else the error is the record's.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Mapping

import gevent.socket
from geventhttpclient.connectionpool import ConnectionPool, SSLConnectionPool
from geventhttpclient.response import HTTPSocketPoolResponse
from geventhttpclient.url import URL

from harness.common.auth import Credentials
from harness.load.client import base_path

_FORBIDDEN = str.maketrans("", "", "\r\n\0")
_BROKEN_WHILE_SENDING = (errno.ECONNRESET, errno.EPIPE)


class HeaderValueError(ValueError):
    """A header value holds a line break or NUL (from a corpus field): the request is not sent."""


class Connection:
    """One user's keep-alive connection to the target."""

    def __init__(
        self, base_url: str, creds: Credentials, *, connection_timeout: float, network_timeout: float
    ) -> None:
        url = URL(base_url)
        default_port = 443 if url.scheme == "https" else 80
        host, port = url.host, url.port or default_port
        if url.scheme == "https":
            self.pool: ConnectionPool = SSLConnectionPool(
                host, port, host, port, insecure=creds.insecure,
                ssl_context_factory=creds.ssl_context_factory(), size=1,
                connection_timeout=connection_timeout, network_timeout=network_timeout,
            )  # fmt: skip
        else:
            self.pool = ConnectionPool(
                host, port, host, port, size=1, connection_timeout=connection_timeout,
                network_timeout=network_timeout,
            )  # fmt: skip
        shown = f"[{host}]" if ":" in host else host
        self.host_header = shown if port == default_port else f"{shown}:{port}"
        self.prefix = base_path(base_url)
        """A base URL with a path (``http://gw/llm``) puts it before every request's path."""

    def warm(self) -> None:
        """Open the connection now (before the run's epoch), so the first request does not pay the
        TCP (and TLS) handshake; a target that is down is reported by the first request instead."""
        with contextlib.suppress(OSError):
            self.pool.return_socket(self.pool.get_socket())

    def head(self, path: str, headers: Mapping[str, str], body_length: int) -> bytes:
        """The request line and headers of a POST with a body of ``body_length`` bytes."""
        values = "".join(headers.values())
        if len(values.translate(_FORBIDDEN)) != len(values):  # one check for all of them
            bad = next(k for k, v in headers.items() if v != v.translate(_FORBIDDEN))
            raise HeaderValueError(f"the value of header {bad!r} holds a line break or NUL")
        fields = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n{fields}"
            f"Content-Length: {body_length}\r\n\r\n"
        ).encode("latin-1")

    def post(self, path: str, headers: Mapping[str, str], body: bytes) -> HTTPSocketPoolResponse:
        """Send one POST; its response, streaming (the caller reads it and calls ``release()``)."""
        data = self.head(path, headers, len(body)) + body
        sock = self.pool.get_socket()
        try:
            sock.sendall(data)
        except gevent.socket.error as exc:
            if exc.errno not in _BROKEN_WHILE_SENDING:
                self.pool.release_socket(sock)
                raise
            # Broken while sending: the server may have answered early and closed; read that answer
            # (the response releases the socket whether or not there is one).
        return HTTPSocketPoolResponse(sock, self.pool, method="POST")

    def close(self) -> None:
        self.pool.close()
