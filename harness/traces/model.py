"""The normalized trace model every reader produces and every later stage consumes.

Two families of input meet here:

* distributed traces (Jaeger, OTLP) become :class:`Span` objects grouped into a :class:`Trace`;
* LLM request traces (Mooncake, Azure, BurstGPT, Splitwise) become :class:`RequestEvent` objects.

Cold paths extracted from traces also become :class:`RequestEvent` objects (one per cold path), so
the corpus and load stages see one request type whatever the source. Scenario classes and arrival
schedules are written to disk as :class:`ScenarioSet` JSON and :class:`ScheduleEntry` JSONL.

The per-span and per-request types are slotted frozen dataclasses because readers stream millions
of them; the on-disk documents that users hand back to us (scenarios, schedules) are pydantic
models with ``extra="forbid"`` so a typo is an error, not a silently ignored field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import Field

from harness.common.model import StrictModel
from harness.common.stats import Distribution

TagValue = str | int | float | bool


class SpanKind(StrEnum):
    """OpenTelemetry span kinds (Jaeger's ``span.kind`` tag maps onto the same names)."""

    UNSPECIFIED = "unspecified"
    INTERNAL = "internal"
    SERVER = "server"
    CLIENT = "client"
    PRODUCER = "producer"
    CONSUMER = "consumer"


class RefType(StrEnum):
    """How a span relates to another: a synchronous child or a causally-following span."""

    CHILD_OF = "CHILD_OF"
    FOLLOWS_FROM = "FOLLOWS_FROM"


@dataclass(frozen=True, slots=True)
class SpanRef:
    """A reference from one span to another (possibly in another trace)."""

    ref_type: RefType
    trace_id: str
    span_id: str


@dataclass(frozen=True, slots=True)
class Span:
    """One timed operation.

    IDs are normalized: lowercase hex left-padded to 16 (span) or 32 (trace) characters; IDs that
    are not hex are kept verbatim as opaque strings. Times are integer microseconds since the epoch
    when the source gave an epoch, otherwise since an arbitrary origin (``Trace.epoch_known``).
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    """The CHILD_OF parent if any, else the first reference's span, else ``None``."""
    service: str
    operation: str
    start_us: int
    duration_us: int
    kind: SpanKind = SpanKind.UNSPECIFIED
    references: tuple[SpanRef, ...] = ()
    tags: dict[str, TagValue] = field(default_factory=dict)
    """The span's own tags / attributes; process / resource attributes stay in ``resource``."""
    resource: dict[str, TagValue] = field(default_factory=dict)
    error: bool = False
    """Status error, ``error=true`` tag, or an HTTP 5xx / non-OK gRPC code."""

    @property
    def end_us(self) -> int:
        return self.start_us + self.duration_us

    @property
    def duration_ms(self) -> float:
        return self.duration_us / 1000.0


@dataclass(slots=True)
class Trace:
    """The spans of one trace, with the tree built by the reader.

    ``children`` maps a span id to its child span ids in start order. ``roots`` lists spans with no
    resolvable parent (normally one; orphans whose parent is missing are re-attached under the
    earliest root and listed in ``warnings``).
    """

    trace_id: str
    spans: dict[str, Span]
    children: dict[str, list[str]]
    roots: list[str]
    warnings: list[str] = field(default_factory=list)
    source: str = ""
    """File (or URL) the trace came from, for error messages and provenance."""
    epoch_known: bool = True

    @property
    def root(self) -> Span:
        return self.spans[self.roots[0]]

    @property
    def services(self) -> set[str]:
        return {s.service for s in self.spans.values()}

    @property
    def start_us(self) -> int:
        return min(s.start_us for s in self.spans.values())

    @property
    def duration_us(self) -> int:
        return max(s.end_us for s in self.spans.values()) - self.start_us


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """One LLM request as recorded by production, whatever the source format.

    ``arrival_s`` is the offset from the first request of the source (seconds, ≥ 0).
    ``prefix_block_ids`` are the ids of the fixed-size token blocks the prompt starts with
    (Mooncake ``hash_ids``; ``block_size`` tokens each): two requests that share a leading run of
    ids share that many prompt tokens, which the corpus turns into shared prefix text.
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    prefix_block_ids: tuple[int, ...] = ()
    block_size: int | None = None
    service: str | None = None
    operation: str | None = None
    tenant: str | None = None
    tags: dict[str, TagValue] = field(default_factory=dict)
    source_trace_id: str | None = None
    source: str = ""
    """Format name and file, e.g. ``mooncake:/data/trace.jsonl``."""
    line: int | None = None
    """Line (JSONL) or row (CSV) the event came from."""
    failed: bool = False
    """The source marks the request as failed (BurstGPT: response tokens 0)."""


# --------------------------------------------------------------------------- on-disk documents


class ScenarioClass(StrictModel):
    """One cold-start scenario class: a cluster of cold paths with the same shape."""

    id: int = Field(ge=0)
    name: str
    """Human-readable, derived from the dominant service path and operation."""
    weight: float = Field(ge=0.0, le=1.0)
    """Share of cold paths in this class; weights of a set sum to 1."""
    size: int = Field(ge=0)
    service_path: list[str]
    """The dominant service path signature (entry service → … → first-hop service)."""
    operations: dict[str, float] = Field(default_factory=dict)
    """Operation name → share within the class."""
    latency_ms: Distribution
    input_tokens: Distribution | None = None
    output_tokens: Distribution | None = None
    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    examples: list[str] = Field(default_factory=list)
    """Example source trace ids."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Dominant categorical tags (e.g. ``gen_ai.request.model``), free for templates to use."""


class ScenarioSet(StrictModel):
    """The ``scenarios.json`` document written by ``harness traces scenarios``."""

    version: Literal[1] = 1
    k: int = Field(ge=1)
    threshold_ms: float
    sources: list[str] = Field(default_factory=list)
    classes: list[ScenarioClass]


class ScheduleEntry(StrictModel):
    """One line of a schedule JSONL: when to send a request, relative to the run start."""

    offset_s: float = Field(ge=0.0)
    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    prefix_block_ids: list[int] = Field(default_factory=list)
    scenario: str | None = None
    source_trace_id: str | None = None
    tenant: str | None = None


class ColdPathRecord(StrictModel):
    """One line of the cold-path JSONL written by ``harness traces coldpaths``.

    ``read_requests`` reads these files back as :class:`RequestEvent` objects (format ``coldpaths``):
    arrival from ``start_us``, tokens from the ``gen_ai.usage.*`` sums (0 when unknown, with
    ``tokens_known`` false in the event's tags).
    """

    kind: Literal["coldpath"] = "coldpath"
    trace_id: str
    entry_span_id: str
    hop_span_id: str
    start_us: int
    epoch_known: bool = True
    latency_ms: float = Field(ge=0.0)
    """Duration of the first-hop span."""
    service_path: list[str]
    """Services from the entry span down to the first hop, consecutive repeats collapsed."""
    service: str
    operation: str
    protocol: str
    """``http``, ``grpc``, ``genai`` or ``other`` (whichever the hop was admitted as)."""
    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    cache_read_tokens: int | None = Field(default=None, ge=0)
    error: bool = False
    tenant: str | None = None
    model: str | None = None
    """``gen_ai.request.model`` of the first LLM call below the hop, if any."""
    span_count: int = Field(default=1, ge=1)
    """Spans in the hop's subtree (the hop included)."""
    source: str = ""
