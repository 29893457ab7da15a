"""The load path's one OpenAI client: request headers, the SSE read, the one TTFT rule, typed usage,
and the calls a Locust run makes besides its requests (``GET /v1/models``, ``POST /cache/preload``).

Two transports send requests to a target: the Locust replay user (:mod:`harness.load.user`) and,
outside Locust, the target's client (:class:`harness.load.target.TargetClient`: the warm check's and
the capacity calibration's probes, the admin calls of ``harness run``, ``harness cache …`` and the
analyses). They share everything here and differ only in the socket read: inside Locust the
transport is the user's own keep-alive connection (:mod:`harness.load.wire`, gevent,
monkey-patched); in a command's own process it is ``httpx``, because gevent must never run there.
So this module imports neither gevent nor Locust at module level; the gevent-side helpers import
``geventhttpclient`` when called.

**Tenants and models.** A record's tenant goes as ``X-Tenant-ID`` unless it is the default one
(:func:`tenant_header`); a request names ``--model``, else the first id of the target's
``GET /v1/models`` (:func:`model_ids`), asked once per run.

**The SSE read** (:func:`read_sse`) keeps each ``data:`` line with its ``perf_counter`` arrival time
and stops at ``data: [DONE]``; parsing waits until the stream ended (:mod:`harness.load.stream`),
so work done on one line never delays the timestamp of the next.

**TTFT** is measured from the request being written to the arrival of the first chunk that carries
a token of any kind, thinking included (:attr:`harness.load.stream.StreamTiming.first_token_t`); a
role-only or usage-only chunk before it is not a token. **TTFA** runs to the first answer, refusal
or tool-call token (:attr:`~harness.load.stream.StreamTiming.first_answer_t`). The load user and the
probes both read them from :func:`read_response`, and fill a record's stream fields with
:func:`fill_stream_fields`.

**Usage** is read once per response into :class:`StreamUsage` (our server's ``usage.harness`` as
:class:`~harness.common.openai.HarnessUsage`); consumers never look into the raw ``usage`` dict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from harness.common import headers as H
from harness.common.auth import Credentials
from harness.common.errors import InputError, UnavailableError
from harness.common.io import check_input_file
from harness.common.openai import HarnessUsage
from harness.load.results import RequestRecord
from harness.load.run_summary import target_identity
from harness.load.stream import (
    DATA,
    DONE_LINE,
    NOT_DONE,
    ParsedStream,
    StreamTiming,
    TokenCounting,
    Tokenize,
    parse_lines,
    reported_reasoning_tokens,
    timing,
)

MAX_ERROR_BODY = 2048
"""Bytes of an error response read (the rest is not needed to say what went wrong)."""
ERROR_TEXT = 300
"""Characters of an error response kept in a record or a probe's error."""
IDENTITY_TIMEOUT_S = 5.0
"""How long ``GET /v1/models`` may take; a target that does not answer has no identity, nothing worse."""
MODELS_PATH = "/v1/models"
PRELOAD_PATH = "/cache/preload"
PRELOAD_TIMEOUT_S = 3600.0
"""A preload stores (and may generate) every line before it answers: minutes for a large file."""
PRELOAD_COUNTS = ("lines", "stored", "generated", "failed")


# ------------------------------------------------------------------------------------------ headers


def tenant_header(tenant: str | None) -> dict[str, str]:
    """``X-Tenant-ID`` for a record of ``tenant``: none for the default tenant (or none at all).

    Without the header a server takes the default tenant (ours unkeyed, or keyed with one operator
    ``--api-key``) or the tenant of the API key (ours with ``--api-keys FILE``); other servers ignore
    it. So a default-tenant record says nothing, and a corpus of them replays with any tenant's key;
    a record of another tenant claims it, which a keyed server allows only to that tenant's key
    (403 ``tenant_mismatch`` otherwise, see :data:`TENANT_MISMATCH_HINT`)."""
    if not tenant or tenant == H.DEFAULT_TENANT:
        return {}
    return {H.TENANT: tenant}


def stream_headers(
    *,
    stage: str,
    tenant: str | None,
    extra: dict[str, str],
    warmup_id: str | None = None,
    trace_id: str | None = None,
    bypass: bool = False,
) -> dict[str, str]:
    """The headers of one streamed generation request.

    ``tenant`` goes as ``X-Tenant-ID`` unless it is the default one (:func:`tenant_header`).
    ``extra`` (:meth:`Credentials.request_headers`: ``--api-key``, ``--header``) goes last, so that a
    user's header wins. ``bypass`` asks a response cache to pass the request through
    (``Cache-Control: no-cache``). Trace context (``traceparent``) is added by
    :mod:`harness.load.tracing`, which owns the span."""
    hdrs = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "Accept-Encoding": "identity",  # compressed SSE cannot be read line by line
        H.STAGE: stage,
        **tenant_header(tenant),
    }
    if warmup_id is not None:
        hdrs[H.WARMUP_ID] = warmup_id
    if trace_id:
        hdrs[H.TRACE_ID] = trace_id
    if bypass:
        hdrs["Cache-Control"] = "no-cache"
    hdrs.update(extra)
    return hdrs


TENANT_MISMATCH = "tenant_mismatch"
"""The error code of a keyed server whose API key belongs to another tenant than ``X-Tenant-ID``."""
TENANT_MISMATCH_HINT = (
    "with a key file each API key is one tenant: replay each tenant's records with that tenant's "
    "--api-key (a corpus of one tenant: HARNESS__CORPUS__TENANT=T harness corpus build), or give the "
    "server one operator --api-key (no key file), whose holder may name any tenant; records of "
    "tenant 'default' send no X-Tenant-ID and take the key's tenant"
)
"""What to do about a 403 ``tenant_mismatch``: how a corpus's tenants map to a keyed server's keys."""


def http_error(status: int, body: bytes, creds: Credentials) -> str:
    """What a non-200 answer says, for a record or a probe (a server may echo a secret: redacted).
    A 403 ``tenant_mismatch`` adds :data:`TENANT_MISMATCH_HINT`."""
    text = creds.redact(body[:MAX_ERROR_BODY].decode("utf-8", "replace"))
    out = f"HTTP {status}: {text[:ERROR_TEXT]}"
    if status == 403 and TENANT_MISMATCH in text:
        out += f" (hint: {TENANT_MISMATCH_HINT})"
    return out


# ---------------------------------------------------------------------------------------- SSE read


@dataclass(slots=True)
class StreamBody:
    """What :func:`read_sse` kept of one response body: its ``data:`` lines with arrival times."""

    lines: list[tuple[float, bytes]] = field(default_factory=list)
    nbytes: int = 0
    """Bytes read (every line, data or not)."""


def read_sse(
    source: Iterable[bytes], into: StreamBody, clock: Callable[[], float] = time.perf_counter
) -> None:
    """Read an SSE body line by line as it arrives into ``into``, up to ``data: [DONE]``.

    ``source`` yields each line as soon as it is whole (with or without its newline): gevent's
    ``iter(partial(resp.readline, b"\\n"), b"")`` or httpx's ``iter_lines``. Each line is stamped
    the moment it is handed over; nothing else is done with it here. ``into`` is filled in place, so
    a read cut short (the run stopped, the connection reset) keeps what arrived."""
    lines = into.lines
    for line in source:
        t = clock()
        into.nbytes += len(line)
        if line[:5] == DATA:
            lines.append((t, line))
            if line.startswith(DONE_LINE):
                return


# ------------------------------------------------------------------------------------------- usage


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(slots=True, frozen=True)
class StreamUsage:
    """The ``usage`` a response reported (the last one of its stream), typed once.

    Servers differ (vLLM, SGLang, OpenAI, ours): every count is ``None`` when it was not reported
    or not an integer, and ``harness`` is ``None`` unless the server sent a valid ``usage.harness``."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """``prompt_tokens_details.cached_tokens``: prompt tokens the target's prefix cache held."""
    reasoning_tokens: int | None = None
    """``completion_tokens_details.reasoning_tokens``: thinking tokens, when the target counts them."""
    harness: HarnessUsage | None = None

    @classmethod
    def of(cls, usage: dict[str, Any] | None) -> StreamUsage:
        if not usage:
            return cls()
        details = usage.get("prompt_tokens_details")
        raw = usage.get("harness")
        hx: HarnessUsage | None = None
        if isinstance(raw, dict) and raw:
            try:
                hx = HarnessUsage.model_validate(raw)
            except ValidationError:  # another server's "harness" key, or a broken one: not ours to trust
                hx = None
        return cls(
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else None,
            reasoning_tokens=reported_reasoning_tokens(usage),
            harness=hx,
        )


@dataclass(slots=True)
class StreamOutcome:
    """One response body, read: what went wrong in it, its usage and its token timings."""

    error: str | None
    """An in-stream error, a token counting mode the stream does not support, or :data:`NOT_DONE`."""
    usage: StreamUsage
    timing: StreamTiming | None
    """``None`` when the forced token counting mode does not apply (``error`` says so)."""
    parsed: ParsedStream | None = None

    def text(self) -> str:
        """The answer's text (joined only when asked: a session's live history needs it); thinking and
        tool calls are not part of it."""
        return self.parsed.answer_text() if self.parsed is not None else ""

    def message(self) -> dict[str, Any]:
        """The answer as the assistant message a client sends back in its history: ``content`` and the
        assembled ``tool_calls`` (thinking is not sent back, as OpenAI and vLLM document)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text()}
        calls = self.parsed.tool_calls if self.parsed is not None else []
        if calls:
            msg["tool_calls"] = [c.message() for c in calls]
            if not msg["content"]:
                msg["content"] = None
        return msg


def read_response(
    lines: Sequence[tuple[float, bytes]], counting: TokenCounting, tokenize: Tokenize | None = None
) -> StreamOutcome:
    """Parse the kept lines of one stream and time its tokens (after the stream ended)."""
    parsed = parse_lines(lines)
    error = f"in-stream error: {parsed.error}" if parsed.error else None
    tm: StreamTiming | None
    try:
        tm = timing(parsed, counting, tokenize)
    except ValueError as exc:
        error = error or str(exc)
        tm = None
    if error is None and not parsed.done:
        error = NOT_DONE
    return StreamOutcome(error=error, usage=StreamUsage.of(parsed.usage), timing=tm, parsed=parsed)


def fill_stream_fields(rec: RequestRecord, out: StreamOutcome, sent: float, intended: float) -> None:
    """Fill ``rec``'s fields that one read response gives: usage, token timings from ``sent`` and
    ``intended`` (perf_counter times), thinking, tool calls. The one place a record learns them."""
    rec.error = rec.error or out.error
    usage = out.usage
    rec.prompt_tokens = usage.prompt_tokens
    rec.cached_tokens = usage.cached_tokens
    hx = usage.harness
    if hx is not None:
        rec.prefill_kv_bytes = hx.prefill_kv_bytes
        rec.prefill_peak_bytes = hx.prefill_peak_bytes
        rec.peak_measured = hx.peak_measured
        rec.prefill_kv_measured = hx.prefill_kv_measured
        rec.mean_entropy = hx.mean_entropy
    tm = out.timing
    if tm is not None:
        rec.token_counting = tm.mode
        if tm.first_token_t is not None:
            rec.ttft_ms = (tm.first_token_t - sent) * 1000.0
            rec.ttft_from_intended_ms = (tm.first_token_t - intended) * 1000.0
        if tm.first_answer_t is not None:
            rec.ttfa_ms = (tm.first_answer_t - sent) * 1000.0
        rec.itl_ms = tm.itl_ms
        rec.itl_reasoning = tm.itl_reasoning
        rec.tpot_ms = tm.tpot_ms
        rec.completion_tokens = tm.completion_tokens if tm.mode else usage.completion_tokens
        if tm.mode is not None:
            rec.reasoning_tokens, rec.reasoning_source = tm.reasoning_tokens, "counted"
    if usage.reasoning_tokens is not None:
        rec.reasoning_tokens, rec.reasoning_source = usage.reasoning_tokens, "usage"
    parsed = out.parsed
    if parsed is not None:
        if parsed.tool_calls:
            rec.tool_calls = len(parsed.tool_calls)
            rec.tool_names = [c.name for c in parsed.tool_calls]
        if parsed.unread:
            rec.unread_fields = sorted(parsed.unread)


# ------------------------------------------------------------------------------------ admin calls


@dataclass(frozen=True)
class PreloadCall:
    """``POST /cache/preload`` of a file (an admin call) from a Locust process (``--preload`` of a
    load run, a plan's preload), whose answer :meth:`answer` reads: the run was asked to preload, so
    every answer but 200 is an error naming the file. Outside Locust the same call is
    :meth:`harness.load.target.TargetClient.cache_preload`, where a 404 (no response cache) is
    :class:`~harness.load.target.NotExposed` and ``harness run`` skips the preload."""

    file: Path
    body: bytes
    headers: dict[str, str]

    @classmethod
    def of(cls, path: Path, creds: Credentials) -> PreloadCall:
        body = check_input_file(path).read_bytes()
        return cls(path, body, {**creds.admin_headers(), "Content-Type": "application/x-ndjson"})

    def answer(self, status: int, body: bytes, creds: Credentials) -> dict[str, Any]:
        """The server's JSON answer; an :class:`InputError` naming the file for any other status
        (never showing a secret)."""
        if status != 200:
            shown = creds.redact(body[:ERROR_TEXT].decode("utf-8", "replace"))
            hint = "the admin routes need --admin-token" if status in (401, 403) else None
            raise InputError(f"{PRELOAD_PATH} answered {status}: {shown}", file=self.file, hint=hint)
        data = orjson.loads(body)
        if not isinstance(data, dict):
            raise InputError(f"{PRELOAD_PATH} answered 200 without a JSON object", file=self.file)
        return data


def model_ids(models_answer: Any) -> list[str]:
    """The model ids a ``GET /v1/models`` answer lists, in its order (``[]``: none, or not an OpenAI
    model list). The first is the model a request without ``--model`` names."""
    data = models_answer.get("data") if isinstance(models_answer, dict) else None
    if not isinstance(data, list):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]


def preload_counts(answer: dict[str, Any]) -> dict[str, int]:
    """The counts of a preload answer (``lines``, ``stored``, ``generated``, ``failed``)."""
    return {k: int(answer[k]) for k in PRELOAD_COUNTS if k in answer}


# ----------------------------------------------------------------- the gevent side (Locust processes)


def base_path(url: str) -> str:
    """The path of a base URL (``http://gw/llm/`` → ``/llm``) that every request's path follows, as
    httpx's ``base_url`` and Locust's ``--host`` treat it."""
    from urllib.parse import urlsplit

    return urlsplit(url).path.rstrip("/")


def gevent_client(host: str, creds: Credentials, *, network_timeout: float, connection_timeout: float) -> Any:
    """A one-off ``geventhttpclient`` client for ``host`` with the run's TLS policy (Locust processes
    only: it needs gevent's monkey-patching, which Locust applies)."""
    from geventhttpclient import HTTPClient
    from geventhttpclient.url import URL

    return HTTPClient.from_url(
        URL(host),
        network_timeout=network_timeout,
        connection_timeout=connection_timeout,
        insecure=creds.insecure,
        ssl_context_factory=creds.ssl_context_factory(),
    )


def fetch_models(host: str, creds: Credentials) -> Any:
    """The target's ``GET /v1/models`` answer (its JSON) from a Locust process; ``None`` when it does
    not answer 200 with JSON (never raises: the model list is context, or a default for ``model``; a
    run does not depend on it)."""
    try:
        client = gevent_client(
            host, creds, network_timeout=IDENTITY_TIMEOUT_S, connection_timeout=IDENTITY_TIMEOUT_S
        )
        try:
            resp = client.get(base_path(host) + MODELS_PATH, headers=creds.request_headers())
            body = resp.read()
        finally:
            client.close()
        return orjson.loads(body) if resp.status_code == 200 else None
    except Exception:  # any failure (refused, timeout, not JSON) leaves it unknown
        return None


def fetch_identity(host: str, creds: Credentials) -> dict[str, Any] | None:
    """The target's :func:`~harness.load.run_summary.target_identity` from ``GET /v1/models``; ``None`` when
    it does not answer (never raises: an identity is context, the run does not depend on it)."""
    return target_identity(fetch_models(host, creds))


def preload(host: str, path: Path, creds: Credentials) -> dict[str, int]:
    """``POST /cache/preload`` from a Locust process (``--preload``); the server's counts. Any answer
    but 200 is an error naming the file: the run was asked to preload it."""
    call = PreloadCall.of(path, creds)
    try:
        client = gevent_client(host, creds, network_timeout=PRELOAD_TIMEOUT_S, connection_timeout=10)
        resp = client.post(base_path(host) + PRELOAD_PATH, body=call.body, headers=call.headers)
        text = resp.read()
        client.close()
    except OSError as exc:
        raise UnavailableError(creds.redact(f"cannot reach {host} for {PRELOAD_PATH}: {exc}")) from None
    return preload_counts(call.answer(resp.status_code, text, creds))
