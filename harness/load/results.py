"""Request records: one :class:`RequestRecord` per request, the ``records.jsonl`` file that holds
them, and the definitions computed over them.

A run directory holds ``records.jsonl`` (one :class:`RequestRecord` a line, appended by
:class:`RecordWriter` while the run goes, read back validated by :func:`read_records`) beside
``summary.json`` (:mod:`harness.load.run_summary`, computed from these records when the run ends).
The gates, reports and analyses downstream read these two files and nothing else, so any load
generator that writes them (ours, or a converter from another tool's output) can be gated and
reported.

Times: ``intended_s`` and ``sent_s`` are seconds since the run's epoch, one monotonic origin shared
by every worker of a distributed run. Latencies are milliseconds measured with ``perf_counter`` in
the process that sent the request:

- ``ttft_ms``: from the request being written to the first token of any kind arriving (thinking,
  answer, tool call or refusal: :mod:`harness.load.stream`);
- ``ttfa_ms``: the same, to the first answer, refusal or tool-call token (after the thinking);
- ``ttft_from_intended_ms``: the same, from the time the schedule intended the request to go out,
  so client queueing (every user busy) and a stalled server both show (coordinated omission);
- ``itl_ms``: one inter-token gap per generated token after the first, every kind: a chunk carrying
  ``k`` tokens contributes its gap once and ``k − 1`` zero gaps, so ``len(itl_ms) ==
  completion_tokens − 1``; ``itl_reasoning`` says which gaps were before thinking tokens;
- ``tpot_ms``: (last token − first token) / (completion_tokens − 1);
- ``e2e_ms`` / ``e2e_from_intended_ms``: to the end of the stream, from send or from intent;
- ``lateness_ms`` = ``sent − intended``, split in two: ``queue_wait_ms``, the part spent waiting for a
  free user because every user was busy (the target did not keep up: backpressure, which the
  ``*_from_intended`` latencies rightly include), and the rest, the client's own lateness
  (:attr:`RequestRecord.client_lateness_ms`: the pacer or the user woke late, the client's CPU or
  scheduling), which makes every client-measured latency uncertain by that much.

Over records, this module is the one definition of a request's success (:func:`request_ok`), of a
response-cache and a prefix-cache hit (:func:`cache_hit`, :func:`prefix_hit`; counted with failed
requests as misses by :func:`cache_counts`, :func:`prefix_counts`, :func:`warm_counts` and
:func:`hit_rates`) and of one metric's samples (:func:`metric_values`): the summary, the gates and
the reports all count by them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
import orjson
from pydantic import ConfigDict, Field, TypeAdapter, with_config

from harness.common.headers import CACHE_STATUSES
from harness.common.io import iter_jsonl

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
ObjArray = npt.NDArray[np.object_]
"""Columns of records (the gates' :class:`~harness.gates.runs.RunFrame` holds them so)."""

RECORDS_FILE = "records.jsonl"

LATENCY_FIELDS: tuple[str, ...] = (
    "ttft_ms",
    "ttfa_ms",
    "ttft_from_intended_ms",
    "itl_ms",
    "itl_reasoning_ms",
    "itl_answer_ms",
    "tpot_ms",
    "e2e_ms",
    "e2e_from_intended_ms",
    "lateness_ms",
    "client_lateness_ms",
)
"""Per-request latencies summarized in ``summary.json`` (``itl_ms`` pools every gap of every request,
``itl_reasoning_ms`` / ``itl_answer_ms`` the gaps before thinking / answer tokens;
``client_lateness_ms`` and the two ITL splits are the record's properties of those names)."""
POOLED_FIELDS: tuple[str, ...] = ("itl_ms", "itl_reasoning_ms", "itl_answer_ms")
"""Latencies with many samples per request (one per token)."""
STREAM_LATENCY_FIELDS: tuple[str, ...] = tuple(
    f for f in LATENCY_FIELDS if f not in (*POOLED_FIELDS, "lateness_ms", "client_lateness_ms")
)
"""The per-request latencies a response's stream gives (one number each, ``None`` when absent)."""
KIND_SPLIT_FIELDS: tuple[str, ...] = ("itl_reasoning_ms", "itl_answer_ms")
"""Splits of ``itl_ms`` by token kind: tables leave them out of a run with no thinking (n = 0)."""
TOKEN_FIELDS: tuple[str, ...] = ("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens")
BYTES_FIELDS: tuple[str, ...] = ("prefill_kv_bytes", "prefill_peak_bytes")


def request_ok(status: int, error: str | None) -> bool:
    """The one "request ok" rule: a 2xx answer and no error (a stream cut short or an in-stream error
    is an error even after a 200)."""
    return error is None and 200 <= status < 300


@with_config(ConfigDict(extra="forbid"))
@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it (one line of ``records.jsonl``).

    The one type from the user to the summary: the replay user fills one as its request goes (a slots
    dataclass: cheap to build and set on the send path, no validation there), :class:`RecordWriter`
    writes it once (orjson serializes it natively), and :func:`read_records` reads it back validated
    (the same class through a pydantic ``TypeAdapter``: :meth:`parse`; an unknown field is an error).

    Latency fields are ``None`` when they do not exist for this request (no first token: no TTFT;
    one token: no TPOT), never 0. ``status`` is the HTTP status, or 0 when no response arrived
    (connection refused, reset, timeout); ``error`` then says what happened.
    """

    id: str
    """The corpus record id (several records of a run may share it when the corpus wraps)."""
    stage: str
    """Traffic stage: ``replay``, ``cold``, ``warm``, or a ladder stage name."""
    intended_s: float
    sent_s: float
    lateness_ms: Annotated[float, Field(ge=0.0)]
    """``sent_s − intended_s``, in ms: how late the client was in sending."""
    status: Annotated[int, Field(ge=0)]
    scenario: str | None = None
    queue_wait_ms: Annotated[float | None, Field(ge=0.0)] = None
    """The part of ``lateness_ms`` spent waiting for a free user because every user was busy (target
    backpressure); 0 when a user was free. ``None``: not recorded (files from before it existed)."""
    ttft_ms: float | None = None
    ttft_from_intended_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    e2e_from_intended_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """``usage.prompt_tokens_details.cached_tokens``: prompt tokens the target's prefix cache held."""
    prefill_kv_bytes: int | None = None
    prefill_peak_bytes: int | None = None
    peak_measured: bool | None = None
    """Whether ``prefill_peak_bytes`` was measured (CUDA) rather than estimated; ``None``: not reported."""
    prefill_kv_measured: bool | None = None
    """Whether ``prefill_kv_bytes`` is the target's count of the KV blocks it allocated (our engine's
    block manager; true on a response-cache hit, where the 0 is exact) rather than computed from
    token counts; ``None``: not reported."""
    cache: str | None = None
    """The ``x-cache`` response header (``HIT-L1`` … ``MISS``, ``BYPASS``); ``None`` when absent."""
    bypass: bool = False
    """Sent with ``Cache-Control: no-cache`` (``--bypass-fraction``): what the client asked for. Whether
    the target's cache then missed is ``cache``, so a miss rate is measured, never assumed."""
    mean_entropy: float | None = None
    """Mean output entropy (nats/token) from the target's ``usage.harness.mean_entropy`` (our server;
    on a cache hit, the stored completion's); ``None`` when the target does not report it (vLLM …)."""
    error: str | None = None
    worker: int = 0
    """Index of the worker process that sent it (0 for a single-process run)."""
    tenant: str | None = None
    trace_id: str | None = None
    """The source trace, when the record came from one."""
    token_counting: str | None = None
    """How this response's tokens were counted (:mod:`harness.load.stream`); ``None``: no token."""
    ttfa_ms: float | None = None
    """Time to the first answer, refusal or tool-call token (``ttft_ms`` counts thinking too); ``None``:
    no such token (the response only thought, or failed first)."""
    reasoning_tokens: int | None = None
    """Thinking tokens: ``usage.completion_tokens_details.reasoning_tokens`` when the target reports it,
    else counted the way the run counts tokens (``token_counting``); ``None``: no token was counted."""
    reasoning_source: Literal["usage", "counted"] | None = None
    """Where ``reasoning_tokens`` came from: the target's ``usage`` or the client's count."""
    itl_reasoning: list[tuple[int, int]] = field(default_factory=list)
    """Ranges ``[start, end)`` of ``itl_ms`` whose gap preceded a thinking token (empty: none did)."""
    tool_calls: int = 0
    """Tool calls the response made (``delta.tool_calls``, assembled)."""
    tool_names: list[str] = field(default_factory=list)
    """Their function names, in order."""
    unread_fields: list[str] = field(default_factory=list)
    """Delta fields that carried a value the client does not read: their tokens were neither timed
    nor counted (the summary warns)."""
    tool_results: dict[str, int] | None = None
    """A session turn whose history answered tool calls: how many results were ``recorded`` (the log's,
    for the same call), ``synthetic`` (stated, for a call the log has no result for) and ``log_call``
    (the target answered without the log's call, so the log's call went in the history with its
    results); ``None``: the turn sent no tool results (:mod:`harness.load.sessions`)."""
    session_id: str | None = None
    """The conversation this request is a turn of (session corpora); ``None`` otherwise."""
    turn: int | None = None
    """1-based turn of ``session_id``."""
    history_source: Literal["live", "log"] | None = None
    """Whose answers the sent history held: the target's (``live``) or the corpus log's (``log``)."""
    call: int | None = None
    """1-based call of ``session_id`` in an agent session replayed as its call graph; ``None`` otherwise."""
    depth: int | None = None
    """The call's depth in its graph (0: it waited for no other call)."""
    ready_s: float | None = None
    """When (s from the epoch) the last answer this call waited for ended; for a call that waited
    for none, its session's start. ``intended_s`` is this plus the call's gap; the session's start is
    the least ``ready_s`` of its calls, and a call's wait for its predecessors is the difference."""
    recorded_ms: float | None = None
    """An agent session's call: its duration in the source trace (what production took for it)."""
    blocked_by: int | None = None
    """Not sent: the call (of the same session) that failed, and this call waited for, directly or
    through others. Such a record counts as failed (``error`` names the call)."""

    @property
    def ok(self) -> bool:
        return request_ok(self.status, self.error)

    @property
    def itl_reasoning_ms(self) -> list[float]:
        """The gaps of ``itl_ms`` before thinking tokens."""
        return [g for a, b in self.itl_reasoning for g in self.itl_ms[a:b]]

    @property
    def itl_answer_ms(self) -> list[float]:
        """The gaps of ``itl_ms`` before every other token (answer, refusal, tool call)."""
        if not self.itl_reasoning:
            return self.itl_ms
        out: list[float] = []
        at = 0
        for a, b in self.itl_reasoning:
            out += self.itl_ms[at:a]
            at = b
        return out + self.itl_ms[at:]

    @property
    def client_lateness_ms(self) -> float:
        """The client's own lateness: ``lateness_ms − queue_wait_ms`` (≥ 0). Without a recorded queue
        wait all of it counts as the client's (conservative)."""
        return client_lateness(self.lateness_ms, self.queue_wait_ms)

    @classmethod
    def parse(cls, obj: object) -> RequestRecord:
        """A record from a JSON object (a ``records.jsonl`` line, a test's dict), validated: raises
        pydantic's ``ValidationError`` naming the field."""
        return _RECORD.validate_python(obj)

    def to_dict(self) -> dict[str, Any]:
        """The record's fields as a dict (the JSON object of its line; a worker's message)."""
        return {f: getattr(self, f) for f in RECORD_FIELDS}


_RECORD: TypeAdapter[RequestRecord] = TypeAdapter(RequestRecord)
RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))


def client_lateness(lateness_ms: float, queue_wait_ms: float | None) -> float:
    """The client's own part of a lateness (see :attr:`RequestRecord.client_lateness_ms`)."""
    return max(0.0, lateness_ms - (queue_wait_ms or 0.0))


def cache_told(statuses: ObjArray) -> BoolArray:
    """Rows (of an ``x-cache`` column, ``None`` where the response had no header) whose response
    carried an ``x-cache`` header: the denominator of every response-cache hit rate."""
    told: BoolArray = np.asarray(statuses != None, dtype=bool)  # noqa: E711 - elementwise, not identity
    return told


def cache_hit(statuses: ObjArray, status: str | None = None) -> BoolArray:
    """Rows answered by the response cache: with ``x-cache`` ``status`` (``HIT-L1`` …), or, without
    one, any tier (a status starting ``HIT``). The one definition of a response-cache hit: the
    summary's :func:`hit_rates`, the gates' ``hit_rate_*`` and the report's plots count by it."""
    if status is not None:
        exact: BoolArray = np.asarray(statuses == status, dtype=bool)
        return exact
    told = cache_told(statuses)
    out = np.zeros(len(statuses), dtype=bool)
    out[told] = np.char.startswith(statuses[told].astype(str), "HIT")
    return out


def prefix_hit(cached_tokens: FloatArray) -> tuple[BoolArray, BoolArray]:
    """``(reported, hit)``: rows (of a ``cached_tokens`` column, NaN where the target did not report
    it) that reported ``cached_tokens``, and those with ``cached_tokens > 0``: a prefix-cache hit."""
    reported = ~np.isnan(cached_tokens)
    return reported, reported & (np.nan_to_num(cached_tokens) > 0)


def _among(told: BoolArray, ok: BoolArray) -> BoolArray:
    """``told`` plus the requests that failed, where the target reports the signal at all: a failed
    request was not served from a cache, so it counts as a miss (an erroring target then shows a lower
    hit rate, and fails a hit-rate gate, instead of shrinking the sample it is judged on)."""
    if not told.any():
        return told
    among: BoolArray = told | ~ok
    return among


def cache_counts(statuses: ObjArray, status: str | None, ok: BoolArray) -> tuple[int, int]:
    """``(rows, among)``: :func:`cache_hit` rows (a hit only when the request succeeded), among
    :func:`cache_told` rows and the failed requests (misses); the share is their ratio."""
    rows = cache_hit(statuses, status)
    if status is None or status.startswith("HIT"):
        rows = rows & ok
    return int(rows.sum()), int(_among(cache_told(statuses), ok).sum())


def prefix_counts(cached_tokens: FloatArray, ok: BoolArray) -> tuple[int, int]:
    """``(hits, among)`` of :func:`prefix_hit`, failed requests counted as misses."""
    reported, hit = prefix_hit(cached_tokens)
    return int((hit & ok).sum()), int(_among(reported, ok).sum())


def warm_counts(statuses: ObjArray, cached_tokens: FloatArray, ok: BoolArray) -> tuple[int, int]:
    """``(warm, among)``: requests served warm (a response-cache or a prefix-cache hit) among those
    where the target reported either (an ``x-cache`` header or ``cached_tokens``), and the failed ones."""
    reported, prefix = prefix_hit(cached_tokens)
    told = _among(cache_told(statuses) | reported, ok)
    warm = (cache_hit(statuses) | prefix) & ok
    return int(warm[told].sum()), int(told.sum())


def record_columns(records: Sequence[RequestRecord]) -> tuple[ObjArray, FloatArray, BoolArray]:
    """The ``x-cache``, ``cached_tokens`` and success columns of ``records`` (``None`` / NaN where
    absent)."""
    statuses = np.empty(len(records), dtype=object)
    statuses[:] = [r.cache for r in records]
    cached = np.asarray(
        [math.nan if r.cached_tokens is None else r.cached_tokens for r in records], dtype=np.float64
    )
    ok = np.asarray([r.ok for r in records], dtype=bool)
    return statuses, cached, ok


def hit_rates(records: Iterable[RequestRecord]) -> dict[str, float]:
    """Share of requests per ``x-cache`` status, ``any`` hit, and ``prefix`` (``cached_tokens > 0``),
    failed requests counted as misses: :func:`cache_counts` and :func:`prefix_counts`, exactly what the
    gates' ``hit_rate_*`` metrics count."""
    statuses, cached, ok = record_columns(list(records))
    out: dict[str, float] = {}
    hits, among = cache_counts(statuses, None, ok)
    if among:
        out = {status: cache_counts(statuses, status, ok)[0] / among for status in CACHE_STATUSES}
        out["any"] = hits / among
    hits, among = prefix_counts(cached, ok)
    if among:
        out["prefix"] = hits / among
    return out


def metric_values(records: Iterable[RequestRecord], name: str) -> list[float]:
    """The samples of one metric over ``records`` (``itl_ms`` pools every gap)."""
    out: list[float] = []
    for r in records:
        value = getattr(r, name)
        if isinstance(value, list):
            out.extend(value)
        elif value is not None:
            out.append(float(value))
    return out


class RecordWriter:
    """Appends records to ``records.jsonl`` as they complete; :meth:`flush` makes them visible.

    Records are serialized with orjson, which writes a dataclass natively (the hot path validates
    nothing; :func:`read_records` validates every line on the way back in). The
    caller flushes at least once a second (the load stage runs a ticker), so a crash loses at most
    the last second and a reader tailing the file sees the run progress.
    """

    def __init__(self, path: str | Path, *, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("ab" if append else "wb")
        self.count = 0

    def write(self, record: RequestRecord) -> None:
        self._fh.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
        self.count += 1

    def write_many(self, records: Iterable[RequestRecord]) -> None:
        for record in records:
            self.write(record)

    def flush(self) -> None:
        if not self._fh.closed:
            self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()


def read_records(run_dir: str | Path) -> Iterator[RequestRecord]:
    """Stream the validated records of a run directory (or a ``records.jsonl`` path): the one reader
    of ``records.jsonl`` (through :func:`harness.common.io.iter_jsonl`). An empty file is a run with
    no requests, not an error.

    The NaN rule: the ``NaN`` / ``Infinity`` literals (which Python's json module writes, and so may
    a converter from another tool) are read as the non-finite floats they stand for. A measurement
    that is not a number is a broken measurement: the gates see it and refuse to judge the metric it
    is in, naming it (:attr:`harness.gates.runs.RunFrame.nonfinite`). Rejecting the line would make
    the whole run unreadable for one sample; reading it as "absent" would let a percentile silently
    drop it. (Our writer never produces one: orjson writes no NaN literal.)"""
    p = Path(run_dir)
    if p.is_dir():
        p = p / RECORDS_FILE
    for _, record in iter_jsonl(p, _RECORD, expected="a request record", allow_empty=True, nonfinite=True):
        yield record
