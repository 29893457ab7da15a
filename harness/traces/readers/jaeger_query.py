"""A client for a live Jaeger query service (format ``jaeger-query``).

v1 HTTP API: ``/api/services``, ``/api/operations``, ``/api/traces`` (search: service, operation,
tags, start/end in µs or lookback, minDuration, limit) and ``/api/traces/{id}``. api_v3:
``/api/v3/services``, ``/api/v3/operations``, ``/api/v3/traces`` (``query.*`` parameters, RFC 3339
times) and ``/api/v3/traces/{id}``. Newer Jaeger removed the v1 search, so a 404 from a v1 endpoint
switches the client to api_v3 for the rest of its life.

Searches are paged by time window (``page_s``, newest window last) and de-duplicated by trace id, so
a long look-back does not hit the per-query limit in one go. Errors: connection failures, timeouts
and 5xx are :class:`UnavailableError` (exit 5); other 4xx are :class:`InputError` (exit 3) quoting
the server's message.

As a reader, the "path" is a URL: ``http://host:16686/?service=checkout&lookback=2h&limit=50``
(also ``operation``, ``tags`` as JSON, ``minDuration``, ``start`` / ``end`` in µs) or
``http://host:16686/trace/<id>``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson

from harness.common.errors import InputError, UnavailableError
from harness.common.formats import Reader
from harness.traces._base import TRACE_READERS, OnSkip, normalize_id
from harness.traces.model import Trace
from harness.traces.readers.jaeger_json import convert_trace
from harness.traces.readers.otlp_json import document_spans
from harness.traces.tree import build_trace

_UNITS = {
    "us": 1,
    "µs": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}


def parse_duration_us(text: str) -> int:
    """``500ms``, ``2h``, ``90s``, or a bare number of µs → µs."""
    text = text.strip()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(text[: -len(unit)]) * _UNITS[unit])
    if text.isdigit():
        return int(text)
    raise InputError(f"bad duration {text!r}, expected e.g. 500ms, 90s, 2h")


def rfc3339(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, tz=dt.UTC).isoformat().replace("+00:00", "Z")


class JaegerQueryClient:
    """Talks to one Jaeger query service; use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        api: str = "auto",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api = api
        """``auto`` (v1, falling back to v3 on 404), ``v1`` or ``v3``."""
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport)

    def __enter__(self) -> JaegerQueryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ HTTP

    def _get(self, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            resp = self._http.get(path, params=params)
        except httpx.TimeoutException:
            raise UnavailableError(f"Jaeger query timed out: GET {url}", file=url) from None
        except httpx.HTTPError as exc:
            raise UnavailableError(f"cannot reach Jaeger query: {exc}", file=url) from None
        if resp.status_code >= 500:
            raise UnavailableError(
                f"Jaeger query failed with HTTP {resp.status_code}: {_msg(resp)}", file=url
            )
        return resp

    def _json(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            raise InputError(
                f"Jaeger query rejected the request (HTTP {resp.status_code}): {_msg(resp)}",
                file=str(resp.url),
            )
        try:
            return orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            # api_v3 may stream several JSON objects, one per line / chunk.
            try:
                return [orjson.loads(line) for line in resp.content.splitlines() if line.strip()]
            except orjson.JSONDecodeError:
                raise InputError("Jaeger query returned invalid JSON", file=str(resp.url)) from None

    def _v1(self, path: str, params: dict[str, Any] | None = None) -> Any | None:
        """The v1 response body, or ``None`` when v1 is absent (404) and the client falls back to v3."""
        if self.api == "v3":
            return None
        resp = self._get(path, params)
        if resp.status_code == 404 and self.api == "auto" and not _is_trace_not_found(resp):
            self.api = "v3"
            return None
        return self._json(resp)

    # ------------------------------------------------------------------ API

    def services(self) -> list[str]:
        body = self._v1("/api/services")
        if body is not None:
            return [str(s) for s in body.get("data") or []]
        return [str(s) for s in self._json(self._get("/api/v3/services")).get("services") or []]

    def operations(self, service: str) -> list[str]:
        body = self._v1("/api/operations", {"service": service})
        if body is not None:
            return [str(o.get("name") if isinstance(o, dict) else o) for o in body.get("data") or []]
        body = self._json(self._get("/api/v3/operations", {"service": service}))
        return [str(o.get("name")) for o in body.get("operations") or []]

    def get_trace(self, trace_id: str) -> Trace:
        tid = normalize_id(trace_id, 32)
        body = self._v1(f"/api/traces/{tid}")
        if body is not None:
            traces = body.get("data") or []
            if not traces:
                raise InputError(f"trace {tid} not found", file=f"{self.base_url}/api/traces/{tid}")
            return convert_trace(traces[0], self.base_url, None, "data[0].", skip=True, on_skip=_ignore)
        resp = self._get(f"/api/v3/traces/{tid}")
        if resp.status_code == 404:
            raise InputError(f"trace {tid} not found", file=str(resp.url))
        found: list[Trace] = list(self._v3_traces(self._json(resp)))
        if not found:
            raise InputError(f"trace {tid} not found", file=str(resp.url))
        return found[0]

    def find_traces(
        self,
        service: str,
        *,
        operation: str | None = None,
        tags: dict[str, str] | None = None,
        start_us: int | None = None,
        end_us: int | None = None,
        lookback_s: float = 3600.0,
        min_duration: str | None = None,
        limit: int = 100,
        page_s: float = 3600.0,
    ) -> Iterator[Trace]:
        """Traces of ``service`` in ``[start, end)`` (default: the last ``lookback_s``), page by page."""
        end = end_us if end_us is not None else int(time.time() * 1e6)
        start = start_us if start_us is not None else end - int(lookback_s * 1e6)
        if start >= end:
            raise InputError("search window is empty: start must be before end")
        if page_s <= 0:
            raise InputError("page size must be > 0 s")
        seen: set[str] = set()
        lo = start
        while lo < end:
            hi = min(end, lo + int(page_s * 1e6))
            for tr in self._search(
                service, operation=operation, tags=tags, lo=lo, hi=hi, min_duration=min_duration, limit=limit
            ):
                if tr.trace_id not in seen:
                    seen.add(tr.trace_id)
                    yield tr
            lo = hi

    def _search(
        self,
        service: str,
        *,
        operation: str | None,
        tags: dict[str, str] | None,
        lo: int,
        hi: int,
        min_duration: str | None,
        limit: int,
    ) -> Iterator[Trace]:
        params: dict[str, Any] = {"service": service, "start": lo, "end": hi, "limit": limit}
        if operation:
            params["operation"] = operation
        if tags:
            params["tags"] = orjson.dumps(tags).decode()
        if min_duration:
            params["minDuration"] = min_duration
        body = self._v1("/api/traces", params)
        if body is not None:
            for i, obj in enumerate(body.get("data") or []):
                yield convert_trace(obj, self.base_url, None, f"data[{i}].", skip=True, on_skip=_ignore)
            return
        v3: dict[str, Any] = {
            "query.service_name": service,
            "query.start_time_min": rfc3339(lo),
            "query.start_time_max": rfc3339(hi),
            "query.search_depth": limit,
        }
        if operation:
            v3["query.operation_name"] = operation
        if tags:
            v3["query.attributes"] = orjson.dumps(tags).decode()
        if min_duration:
            v3["query.duration_min"] = f"{parse_duration_us(min_duration)}us"
        resp = self._get("/api/v3/traces", v3)
        if resp.status_code == 404:  # api_v3 answers "no traces found" with 404
            return
        yield from self._v3_traces(self._json(resp))

    def _v3_traces(self, body: Any) -> Iterator[Trace]:
        docs = body if isinstance(body, list) else [body]
        by_trace: dict[str, list[Any]] = {}
        warns: dict[str, list[str]] = {}  # per trace: a span's warnings belong to its own trace only
        for doc in docs:
            try:
                for span, span_warns in document_spans(doc):
                    by_trace.setdefault(span.trace_id, []).append(span)
                    warns.setdefault(span.trace_id, []).extend(span_warns)
            except ValueError as exc:
                raise InputError(f"unexpected api_v3 response: {exc}", file=self.base_url) from None
        for tid, spans in by_trace.items():
            yield build_trace(tid, spans, source=self.base_url, warnings=warns[tid])


def _ignore(_err: InputError) -> None:
    """Query responses are server-made; a malformed span there is dropped rather than fatal."""


def _msg(resp: httpx.Response) -> str:
    try:
        body = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return resp.text[:200].strip() or resp.reason_phrase
    if isinstance(body, dict):
        errs = body.get("errors")
        if isinstance(errs, list) and errs and isinstance(errs[0], dict):
            return str(errs[0].get("msg") or errs[0])
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if body.get("message"):
            return str(body["message"])
    return resp.text[:200].strip()


def _is_trace_not_found(resp: httpx.Response) -> bool:
    """v1 answers an unknown trace id with 404 and an ``errors`` body; that is not a missing API."""
    return b"trace not found" in resp.content.lower()


def read(url: str, skip: bool, on_skip: OnSkip) -> Iterator[Trace]:
    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    prefix = path
    trace_id: str | None = None
    if "/trace/" in path:
        prefix, _, trace_id = path.partition("/trace/")
    # URL parameters win over the HARNESS__TRACES__QUERY_* settings, which win over the defaults.
    from harness.common.settings import load_settings
    from harness.traces.settings import TracesSettings

    settings = load_settings(TracesSettings)
    try:
        timeout_s = float(q["timeout"]) if "timeout" in q else settings.query_timeout_s
    except ValueError:
        raise InputError("timeout must be a number of seconds", file=url, field="timeout") from None
    with JaegerQueryClient(base + prefix, timeout_s=timeout_s) as client:
        if trace_id:
            yield client.get_trace(trace_id)
            return
        if "service" not in q:
            raise InputError(
                "a Jaeger query URL needs ?service=NAME (or /trace/ID)", file=url, field="service"
            )
        tags = None
        if q.get("tags"):
            try:
                tags = {str(k): str(v) for k, v in orjson.loads(q["tags"]).items()}
            except (orjson.JSONDecodeError, AttributeError):
                raise InputError("tags must be a JSON object", file=url, field="tags") from None
        try:
            limit = int(q["limit"]) if "limit" in q else settings.query_limit
            start = int(q["start"]) if "start" in q else None
            end = int(q["end"]) if "end" in q else None
        except ValueError:
            raise InputError("limit, start and end must be integers (start/end in µs)", file=url) from None
        lookback = parse_duration_us(q.get("lookback", "1h")) / 1e6
        page = parse_duration_us(q["page"]) / 1e6 if "page" in q else settings.query_page_s
        yield from client.find_traces(
            q["service"],
            operation=q.get("operation"),
            tags=tags,
            start_us=start,
            end_us=end,
            lookback_s=lookback,
            min_duration=q.get("minDuration"),
            limit=limit,
            page_s=page,
        )


def _never(path: object, head: bytes) -> bool:
    return False  # URLs are recognised by scheme in detect_format, never by file content


TRACE_READERS.register("jaeger-query")(
    Reader(
        "jaeger-query",
        "live Jaeger query service (v1 HTTP API or api_v3), given as a URL",
        _never,
        read,
        90,
    )
)
