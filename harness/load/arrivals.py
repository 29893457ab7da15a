"""What to send and when: the request table and the arrival plan of an open-loop run.

A run replays a corpus (``harness corpus build``) at times taken from one of three sources:

* a schedule (``harness traces schedule``): entry ``i`` is sent at ``offset_s / speedup``; its
  request is the corpus record of the same source trace if there is one, else the next record of
  its scenario, else the next record of the corpus (cycling, so a short corpus serves a long trace);
* the corpus's own ``arrival_offset_s`` (records built from a trace carry it);
* a rate (``--rate`` or a ladder stage): constant spacing or a Poisson process, record ``g`` of the
  global arrival sequence being ``corpus[g mod len]``.

Request bodies are serialized once, here, so the hot path only writes bytes. Times are seconds
from the run's epoch. A distributed run gives each worker a deterministic share: for a schedule, by
affinity (the record's session, else its prefix group, else its id — a session's turns stay on one
worker, in order); for a rate, by interleaving (worker ``k`` of ``n`` sends global arrivals
``k, k+n, k+2n …``, which keeps the aggregate spacing exact).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import orjson

from harness.common.errors import ConfigError
from harness.common.headers import DEFAULT_TENANT
from harness.common.openai import Endpoint
from harness.corpus.model import CorpusRecord
from harness.load.stream import TokenCounting
from harness.traces.model import ScheduleEntry

ApiChoice = Literal["auto", "chat", "completions"]
ArrivalProcess = Literal["constant", "poisson"]
SeedPolicy = Literal["keep", "drop"]
"""``--seed-policy``: send each record's sampling ``seed`` as it is, or leave it out."""
PATHS: dict[Endpoint, str] = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One prepared request: where it goes and the exact bytes of its body."""

    id: str
    path: str
    body: bytes
    scenario: str | None
    tenant: str
    trace_id: str | None
    affinity: str
    """Key that keeps related requests (a session's turns) on one worker."""


_ENDPOINTS: dict[ApiChoice, Endpoint | None] = {
    "auto": None,
    "chat": "chat.completions",
    "completions": "completions",
}


def prepare_requests(
    records: Iterable[CorpusRecord],
    *,
    api: ApiChoice = "auto",
    model: str | None = None,
    max_tokens_cap: int | None = None,
    token_counting: TokenCounting = "auto",
    seed_policy: SeedPolicy = "keep",
) -> list[RequestSpec]:
    """Serialize every corpus record's streaming request body once (:meth:`CorpusRecord.to_request`).

    Streams ask for the final ``usage`` and, unless counting says otherwise, vLLM's per-chunk
    ``continuous_usage_stats`` (servers that do not know it ignore it or, if strict, should be run
    with ``--token-counting final-usage``); ``logprobs`` counting asks for logprobs.
    ``seed_policy="drop"`` leaves every record's sampling ``seed`` out: vLLM's CPU build (0.32) raises
    ``CPU Generator does not use offset`` for a seeded request during chunked prefill and its engine
    dies. Dropping it changes what is asked (a seeded draw becomes an unseeded one; a response cache
    does not serve unseeded draws at temperature > 0, :func:`is_sampled`), so ``keep`` is the default.
    """
    endpoint = _ENDPOINTS[api]
    out: list[RequestSpec] = []
    for rec in records:
        ep, body = rec.to_request(endpoint, model=model, max_tokens_cap=max_tokens_cap, stream=True)
        if seed_policy == "drop":
            body.pop("seed", None)
        opts: dict[str, Any] = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        if token_counting in ("auto", "usage"):
            opts["continuous_usage_stats"] = True
        body["stream_options"] = opts
        if token_counting == "logprobs":
            body["logprobs"] = True if ep == "chat.completions" else 1
        session = (
            rec.session.session_id
            if rec.session is not None
            else rec.variables.session.session_id
            if rec.variables is not None
            else None
        )
        out.append(
            RequestSpec(
                id=rec.id,
                path=PATHS[ep],
                body=orjson.dumps(body),
                scenario=rec.scenario,
                tenant=rec.tenant,
                trace_id=rec.provenance.source_trace_id,
                affinity=session or rec.prefix_group or rec.id,
            )
        )
    if not out:
        raise ConfigError("the corpus has no records")
    return out


def preload_line(
    rec: CorpusRecord,
    *,
    api: ApiChoice = "auto",
    model: str | None = None,
    max_tokens_cap: int | None = None,
) -> dict[str, Any]:
    """The ``POST /cache/preload`` line that warms the entry a replay of ``rec`` will look up.

    The same body :func:`prepare_requests` sends (endpoint, model, capped ``max_tokens``, every
    sampling field: the cache keys on them), without streaming, plus ``tenant`` when it is not the
    default one (the replay sends it as ``X-Tenant-ID``). No ``completion``: the server generates it.
    Give the options the replay will run with, or the entries will not be hit.
    """
    _, body = rec.to_request(_ENDPOINTS[api], model=model, max_tokens_cap=max_tokens_cap, stream=False)
    if rec.tenant and rec.tenant != DEFAULT_TENANT:
        body["tenant"] = rec.tenant
    return body


def is_sampled(body: dict[str, Any]) -> bool:
    """A random draw: ``temperature`` > 0 (OpenAI's default is 1) and no ``seed``. Response caches
    do not serve these by default (ours answers ``BYPASS`` unless ``HARNESS__CACHE__CACHE_SAMPLED``),
    so preloading them warms nothing the replay will hit."""
    temperature = body.get("temperature", 1.0)
    return bool(temperature is None or temperature > 0) and body.get("seed") is None


INV_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
"""Step of the bypass sequence: the golden ratio's fractional part (the most evenly spreading step)."""


def bypass_offset(seed: int) -> float:
    """The bypass sequence's start in [0, 1) for ``seed`` (the same in every process)."""
    digest = hashlib.blake2b(f"bypass:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def bypasses(seq: int, fraction: float, offset: float) -> bool:
    """Whether arrival ``seq`` of the run's global sequence is sent with ``Cache-Control: no-cache``.

    A Weyl sequence, ``frac(offset + seq · φ⁻¹) < fraction``: deterministic per arrival (every worker
    of a distributed run decides alike), not periodic (so not tied to ``seq mod len(corpus)``, which
    picks the corpus record), and of low discrepancy: any run of ``n`` consecutive arrivals holds
    ``fraction · n`` bypasses to within a few, where independent coin flips would be off by
    ``√(n · f · (1 − f))``. Short stages therefore get the share they asked for.
    """
    if fraction <= 0.0:
        return False
    return (offset + seq * INV_GOLDEN) % 1.0 < fraction


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request the pacer releases: at ``intended_s``, the request ``requests[request]``."""

    seq: int
    """Position in the run's global arrival sequence (unique across workers)."""
    intended_s: float
    request: int
    trace_id: str | None = None
    scenario: str | None = None
    stage: str | None = None
    """Stage label override (ladder); ``None``: the run's ``--stage``."""


def stable_slot(key: str, n: int) -> int:
    """Worker slot of ``key`` among ``n``: the same in every process (unlike ``hash``), and well mixed
    (CRC-32 is linear: keys that differ in one character, ``g0`` … ``g3``, can all land on one slot)."""
    if n <= 1:
        return 0
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % n


def _cut(arrivals: list[Arrival], duration_s: float | None, max_requests: int | None) -> list[Arrival]:
    if duration_s is not None:
        arrivals = [a for a in arrivals if a.intended_s < duration_s]
    if max_requests is not None:
        arrivals = arrivals[:max_requests]
    return arrivals


def from_schedule(
    entries: Sequence[ScheduleEntry],
    requests: Sequence[RequestSpec],
    *,
    speedup: float = 1.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> list[Arrival]:
    """Arrivals of a schedule, each matched to a request (see the module docstring)."""
    if speedup <= 0:
        raise ConfigError("speedup must be > 0", field="speedup")
    by_trace = {r.trace_id: i for i, r in enumerate(requests) if r.trace_id}
    by_scenario: dict[str, list[int]] = {}
    for i, r in enumerate(requests):
        if r.scenario is not None:
            by_scenario.setdefault(r.scenario, []).append(i)
    next_in: dict[str | None, int] = {}
    out: list[Arrival] = []
    for seq, e in enumerate(entries):
        if e.source_trace_id is not None and e.source_trace_id in by_trace:
            idx = by_trace[e.source_trace_id]
        else:
            pool = by_scenario.get(e.scenario) if e.scenario is not None else None
            key = e.scenario if pool else None
            k = next_in.get(key, 0)
            next_in[key] = k + 1
            idx = pool[k % len(pool)] if pool else k % len(requests)
        trace = e.source_trace_id or requests[idx].trace_id
        out.append(Arrival(seq, e.offset_s / speedup, idx, trace, e.scenario or requests[idx].scenario))
    out.sort(key=lambda a: a.intended_s)
    return _cut(out, duration_s, max_requests)


def from_corpus_offsets(
    records: Sequence[CorpusRecord],
    requests: Sequence[RequestSpec],
    *,
    speedup: float = 1.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> list[Arrival] | None:
    """Arrivals at the corpus records' own ``arrival_offset_s``; ``None`` when some record has none."""
    if any(r.arrival_offset_s is None for r in records):
        return None
    if speedup <= 0:
        raise ConfigError("speedup must be > 0", field="speedup")
    out = [
        Arrival(i, (r.arrival_offset_s or 0.0) / speedup, i, requests[i].trace_id, requests[i].scenario)
        for i, r in enumerate(records)
    ]
    out.sort(key=lambda a: a.intended_s)
    return _cut(out, duration_s, max_requests)


def share(arrivals: Sequence[Arrival], requests: Sequence[RequestSpec], slot: int, n: int) -> list[Arrival]:
    """The arrivals worker ``slot`` of ``n`` sends, by request affinity."""
    if n <= 1:
        return list(arrivals)
    return [a for a in arrivals if stable_slot(requests[a.request].affinity, n) == slot]


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of constant offered rate: ``rate`` requests/s (all workers) in ``[start_s, end_s)``."""

    start_s: float
    end_s: float
    rate: float
    stage: str | None = None


class ArrivalSource(Protocol):
    """Where a pacer takes arrivals from, in intended-time order."""

    def peek(self) -> float | None:
        """The next arrival's intended time (``inf`` while paused, ``None`` when there are no more)."""
        ...

    def pop(self) -> Arrival: ...

    def finish(self) -> None:
        """Produce no more arrivals."""
        ...


class RateArrivals:
    """Arrivals at piecewise-constant rates: a ``--rate`` run, or the ladder's stages (replaceable).

    Worker ``slot`` of ``n`` produces global arrivals ``slot, slot+n, …``. Constant: each segment's
    aggregate arrivals are evenly spaced at ``1/rate`` from its start. Poisson: each worker draws
    exponential gaps at ``rate/n`` (seeded by ``seed`` and slot); the superposition is Poisson at
    ``rate``. Between segments (rate 0, or after the last one of a non-final list) the source is
    paused; :meth:`set_segments` replaces what is left (a ladder rollback), :meth:`finish` ends it.
    """

    def __init__(
        self,
        n_requests: int,
        *,
        process: ArrivalProcess = "constant",
        slot: int = 0,
        n: int = 1,
        seed: int = 0,
    ) -> None:
        self.n_requests = n_requests
        self.process = process
        self.slot = slot
        self.n = max(1, n)
        self._rng = np.random.default_rng([seed, slot])
        self._segments: list[Segment] = []
        self._final = False
        self._finished = False
        self._k = 0  # this worker's arrivals in the current segment
        self._next: float | None = None
        self._count = 0  # this worker's arrivals in the run (for the global sequence number)

    def set_segments(self, segments: Sequence[Segment], *, final: bool = True) -> None:
        """Replace every future arrival by ``segments`` (in time order); ``final``: end after them."""
        if self._finished:
            return
        self._segments = [s for s in segments if s.end_s > s.start_s]
        self._final = final
        self._k = 0
        self._next = self._first_of_head()

    def _first_of_head(self) -> float | None:
        while self._segments:
            seg = self._segments[0]
            if seg.rate > 0:
                t = self._time_in(seg, None)
                if t < seg.end_s:
                    return t
            self._segments.pop(0)
            self._k = 0
        return None

    def _time_in(self, seg: Segment, prev: float | None) -> float:
        if self.process == "constant":
            return seg.start_s + (self._k * self.n + self.slot) / seg.rate
        gap = float(self._rng.exponential(self.n / seg.rate))
        return (seg.start_s if prev is None else prev) + gap

    @property
    def segment(self) -> Segment | None:
        """The segment the next arrival belongs to."""
        return self._segments[0] if self._segments else None

    def finish(self) -> None:
        self._finished = True
        self._segments = []
        self._next = None

    def peek(self) -> float | None:
        """The next arrival's intended time; ``inf`` while paused; ``None`` once finished."""
        if self._next is None:
            return None if (self._final or self._finished) else math.inf
        return self._next

    def pop(self) -> Arrival:
        t = self._next
        seg = self.segment
        if t is None or seg is None:
            raise RuntimeError("pop() on a paused or finished arrival process")
        seq = self._count * self.n + self.slot
        self._count += 1
        a = Arrival(seq, t, seq % self.n_requests, stage=seg.stage)
        self._k += 1
        nxt = self._time_in(seg, t)
        if nxt >= seg.end_s:
            self._segments.pop(0)
            self._k = 0
            self._next = self._first_of_head()
        else:
            self._next = nxt
        return a


class ListArrivals:
    """A fixed, sorted arrival list as a pacer source."""

    def __init__(self, arrivals: Sequence[Arrival]) -> None:
        self._items = list(arrivals)
        self._i = 0

    def __len__(self) -> int:
        return len(self._items)

    def peek(self) -> float | None:
        return self._items[self._i].intended_s if self._i < len(self._items) else None

    def pop(self) -> Arrival:
        a = self._items[self._i]
        self._i += 1
        return a

    def finish(self) -> None:
        self._i = len(self._items)
