"""Cold-path extraction: which call chains of a trace started with a slow, uncached first hop.

Definitions (also in docs/traces.md):

* **entry span**: a root of the trace (normally the one root).
* **hop**: a server span whose service differs from its parent span's service (a request that
  crossed a service boundary). A span without a kind counts when its parent is a client span of
  another service.
* **first hop** (``hops="first"``, the default): the first hop on each path down from the entry
  span; the search does not go below it. ``hops="all"`` treats every hop as the first hop of the
  chain that reaches it (useful for agentic traces whose edge hop is a GraphQL resolver).
* **protocol** of a hop: ``grpc`` if it (or the client span that called it) has ``rpc.*``
  attributes, ``http`` for ``http.*`` / ``url.*``, ``genai`` for ``gen_ai.*``, else ``other``. Only
  hops whose protocol is in ``protocols`` are kept (``any`` keeps all).
* **cold**: hop latency (its span duration) over ``threshold_ms`` and no cache hit, where a cache
  hit is any predicate matching a tag of the hop (``cache_scope="hop"``) or of any span below it
  (``"subtree"``). GenAI prompt caching (``gen_ai.usage.cache_read.input_tokens > 0``) is a hit.

Token counts of a cold path are the sums of ``gen_ai.usage.input_tokens`` / ``output_tokens``
(or the older ``prompt_tokens`` / ``completion_tokens``) over the hop's subtree, ``None`` if absent.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from harness.common.errors import ConfigError
from harness.traces._base import truthy
from harness.traces.model import ColdPathRecord, Span, SpanKind, TagValue, Trace
from harness.traces.settings import DEFAULT_CACHE_HIT, default

PROTOCOLS = ("http", "grpc", "genai", "other")
INPUT_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
OUTPUT_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
CACHE_READ_KEY = "gen_ai.usage.cache_read.input_tokens"
TENANT_KEYS = ("tenant.id", "tenant", "enduser.tenant")

_PRED = re.compile(r"^\s*([^=~>]+?)\s*(?:(=|~|>)\s*(.*?))?\s*$")


@dataclass(frozen=True, slots=True)
class Predicate:
    """One cache-hit test on a tag: truthy, equals, contains, or greater than."""

    key: str
    op: str | None = None
    value: str = ""

    @classmethod
    def parse(cls, text: str) -> Predicate:
        m = _PRED.match(text)
        if m is None or not m.group(1):
            raise ConfigError(
                f"bad cache-hit predicate {text!r}; expected key, key=value, key~text or key>number"
            )
        key, op, value = m.group(1), m.group(2), m.group(3) or ""
        if op == ">":
            try:
                float(value)
            except ValueError:
                raise ConfigError(f"bad cache-hit predicate {text!r}: {value!r} is not a number") from None
        return cls(key, op, value)

    def matches(self, tags: dict[str, TagValue]) -> bool:
        if self.key not in tags:
            return False
        got = tags[self.key]
        if self.op is None:
            return truthy(got)
        if self.op == "=":
            return str(got).strip().lower() == self.value.lower()
        if self.op == "~":
            return self.value.lower() in str(got).lower()
        try:
            return float(got) > float(self.value)
        except (TypeError, ValueError):
            return False


@dataclass(frozen=True, slots=True)
class ColdPathConfig:
    """What makes a cold path; build it with :meth:`build` (its defaults are the traces settings')."""

    threshold_ms: float
    protocols: frozenset[str]
    hops: str
    cache_scope: str
    cache_hit: tuple[Predicate, ...]

    @classmethod
    def build(
        cls,
        *,
        threshold_ms: float | None = None,
        protocols: str | Sequence[str] | None = None,
        hops: str | None = None,
        cache_scope: str | None = None,
        cache_hit: str | Sequence[str] | None = None,
    ) -> ColdPathConfig:
        """Validate and parse; an argument left ``None`` takes the declared default of the
        :class:`~harness.traces.settings.TracesSettings` field of the same name."""
        threshold: float = default("threshold_ms") if threshold_ms is None else threshold_ms
        hops_mode: str = default("hops") if hops is None else hops
        scope: str = default("cache_scope") if cache_scope is None else cache_scope
        if protocols is None:
            protocols = str(default("protocols"))
        protos = [
            p.strip().lower() for p in (protocols.split(",") if isinstance(protocols, str) else protocols)
        ]
        protos = [p for p in protos if p]
        if "any" in protos:
            protos = list(PROTOCOLS)
        bad = [p for p in protos if p not in PROTOCOLS]
        if bad or not protos:
            raise ConfigError(
                f"unknown protocol {bad[0] if bad else '(none)'}; known: {', '.join(PROTOCOLS)}, any"
            )
        if hops_mode not in ("first", "all"):
            raise ConfigError(f"unknown hops mode {hops_mode!r}; known: first, all")
        if scope not in ("hop", "subtree"):
            raise ConfigError(f"unknown cache scope {scope!r}; known: hop, subtree")
        if threshold < 0:
            raise ConfigError("threshold must be ≥ 0 ms")
        if cache_hit is None:
            cache_hit = DEFAULT_CACHE_HIT
        preds = cache_hit.split(",") if isinstance(cache_hit, str) else list(cache_hit)
        return cls(
            threshold_ms=threshold,
            protocols=frozenset(protos),
            hops=hops_mode,
            cache_scope=scope,
            cache_hit=tuple(Predicate.parse(p) for p in preds if p.strip()),
        )


@dataclass(slots=True)
class ColdPathStats:
    traces: int = 0
    hops: int = 0
    cold: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


def protocol_of(span: Span, caller: Span | None) -> str:
    for tags in (span.tags, caller.tags if caller is not None and caller.kind is SpanKind.CLIENT else {}):
        keys = tags.keys()
        if any(k.startswith("rpc.") for k in keys):
            return "grpc"
        if any(k.startswith(("http.", "url.")) for k in keys):
            return "http"
    if any(k.startswith("gen_ai.") for k in span.tags):
        return "genai"
    return "other"


def _is_hop(span: Span, parent: Span) -> bool:
    if span.service == parent.service:
        return False
    if span.kind is SpanKind.SERVER:
        return True
    return span.kind is SpanKind.UNSPECIFIED and parent.kind is SpanKind.CLIENT


def _subtree(trace: Trace, root: str) -> Iterator[Span]:
    stack = [root]
    seen: set[str] = set()
    while stack:
        sid = stack.pop()
        if sid in seen:
            continue
        seen.add(sid)
        yield trace.spans[sid]
        stack.extend(reversed(trace.children.get(sid, ())))


def _sum_tag(spans: Iterable[Span], keys: Sequence[str]) -> int | None:
    total: int | None = None
    for span in spans:
        for key in keys:
            if key in span.tags:
                with contextlib.suppress(TypeError, ValueError):
                    total = (total or 0) + int(float(span.tags[key]))
                break
    return total


def find_hops(trace: Trace, mode: str) -> Iterator[tuple[Span, list[Span]]]:
    """(hop span, path from the entry span to the hop's parent) for each hop the mode selects."""
    for root_id in trace.roots:
        stack: list[tuple[str, list[Span]]] = [(root_id, [])]
        seen: set[str] = set()
        while stack:
            sid, path = stack.pop()
            if sid in seen:
                continue
            seen.add(sid)
            span = trace.spans[sid]
            if path and _is_hop(span, path[-1]):
                yield span, path
                if mode == "first":
                    continue
            for child in reversed(trace.children.get(sid, ())):
                stack.append((child, [*path, span]))


def extract(trace: Trace, config: ColdPathConfig, stats: ColdPathStats | None = None) -> list[ColdPathRecord]:
    """The cold paths of one trace, in hop start order."""
    stats = stats if stats is not None else ColdPathStats()
    stats.traces += 1
    out: list[ColdPathRecord] = []
    for hop, path in find_hops(trace, config.hops):
        stats.hops += 1
        proto = protocol_of(hop, path[-1])
        if proto not in config.protocols:
            stats.rejected[f"protocol {proto} not selected"] += 1
            continue
        if hop.duration_ms <= config.threshold_ms:
            stats.rejected["first hop not over the threshold"] += 1
            continue
        below = list(_subtree(trace, hop.span_id))
        scope = below if config.cache_scope == "subtree" else [hop]
        if any(p.matches(s.tags) for s in scope for p in config.cache_hit):
            stats.rejected["cache hit"] += 1
            continue
        services: list[str] = []
        for s in [*path, hop]:
            if not services or services[-1] != s.service:
                services.append(s.service)
        tenant = next(
            (
                str(s.tags.get(k) or s.resource.get(k))
                for s in (hop, path[0])
                for k in TENANT_KEYS
                if s.tags.get(k) or s.resource.get(k)
            ),
            None,
        )
        model = next(
            (str(s.tags["gen_ai.request.model"]) for s in below if "gen_ai.request.model" in s.tags), None
        )
        cache_read = _sum_tag(below, (CACHE_READ_KEY,))
        out.append(
            ColdPathRecord(
                trace_id=trace.trace_id,
                entry_span_id=path[0].span_id,
                hop_span_id=hop.span_id,
                start_us=hop.start_us,
                epoch_known=trace.epoch_known,
                latency_ms=hop.duration_ms,
                service_path=services,
                service=hop.service,
                operation=hop.operation,
                protocol=proto,
                input_tokens=_sum_tag(below, INPUT_KEYS),
                output_tokens=_sum_tag(below, OUTPUT_KEYS),
                cache_read_tokens=cache_read,
                error=any(s.error for s in below),
                tenant=tenant,
                model=model,
                span_count=len(below),
                source=trace.source,
            )
        )
        stats.cold += 1
    out.sort(key=lambda r: (r.start_us, r.hop_span_id))
    return out
