"""``server_metrics.jsonl``: each ``/metrics`` scrape normalised to a line, written, read, summed per phase.

:class:`harness.load.telemetry.Scraper` (the one scraper of the harness) scrapes the target and
appends each scrape with :class:`SampleWriter`; ``summary.json``, the report and the anomaly analysis
read the lines back (:func:`read_server_metrics`, :func:`summarize_samples`). The file:

``server_metrics.jsonl``
    one :class:`ServerSample` a line: ``t_s`` (seconds since the run's epoch, the records' time
    base, so both share an axis), the server kind detected, five normalised values and the raw
    samples they came from (and, for ``harness serve``, its cache's and handlers' ``series`` per
    label set, :attr:`ServerKind.series`); with NVML (:class:`harness.load.telemetry.Nvml`) the local
    GPUs' memory, utilisation and power in the same line (:class:`GpuSample`). Each line is flushed
    as it is written: a crash loses nothing already scraped.

**Server kinds** (:data:`SERVER_KINDS`, a registry): each names the metric families that identify
it and where each normalised value comes from. The kind is detected from the names a scrape holds,
in registry order (:func:`detect_kind`). The normalised values (:func:`normalise`):

``prefix_queries`` / ``prefix_hits`` (counters)
    prompt tokens looked up in / served from the prefix cache; their deltas per phase give the
    server's prefix hit rate (``summary.json``: ``server_metrics``; :func:`phase_of`);
``running`` / ``waiting`` (gauges)
    requests running in the batch / queued;
``kv_usage`` (gauge)
    the KV cache's used share, 0–1.

A kind that does not report a value leaves it ``None`` (llama.cpp counts prompt tokens evaluated,
not looked up: it has no prefix counters; TGI reports no KV usage). Label sets (one per model,
device or data-parallel rank) are summed, except ``kv_usage``, which is averaged.

The text is read by the one exposition parser and the deltas by the one counter rule
(:mod:`harness.common.prometheus`). This module imports neither gevent nor Locust: :func:`normalise`
is used by the warm check too (:mod:`harness.experiments.warmcheck`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import orjson
from pydantic import Field

from harness.common.io import iter_jsonl
from harness.common.model import StrictModel
from harness.common.prometheus import Sample, parse_exposition, total_increase
from harness.common.registry import Registry
from harness.load.run_summary import ServerPhase, ServerTelemetry

SERVER_METRICS_FILE = "server_metrics.jsonl"
METRICS_PATH = "/metrics"

Normalised = Literal["prefix_queries", "prefix_hits", "running", "waiting", "kv_usage"]
NORMALISED: tuple[Normalised, ...] = ("prefix_queries", "prefix_hits", "running", "waiting", "kv_usage")
COUNTERS: tuple[Normalised, ...] = ("prefix_queries", "prefix_hits")


# ------------------------------------------------------------------------------------ server kinds


@dataclass(frozen=True)
class ServerKind:
    """One server's metric names: how to recognise it and where each normalised value comes from."""

    name: str
    detect: tuple[str, ...]
    """Sample names whose presence identifies this kind (any one of them)."""
    sources: dict[Normalised, tuple[str, ...]]
    """Normalised value → the sample names it may come from, first present wins (older releases
    spell some differently)."""
    keep: tuple[str, ...] = ()
    """Further samples kept raw in each line (context, not normalised)."""
    series: tuple[str, ...] = ()
    """Samples kept per label set in each line's ``series`` (``harness analysis anomaly`` reads them:
    which tier, tenant or stage moved)."""
    doc: str = ""
    """Where the names come from."""

    def wanted(self) -> frozenset[str]:
        """Every sample name a line keeps raw."""
        return frozenset(n for names in self.sources.values() for n in names) | frozenset(self.keep)

    def read(self) -> frozenset[str]:
        """Every sample name a scrape of this kind parses."""
        return self.wanted() | frozenset(self.detect) | frozenset(self.series)


SERVER_KINDS: Registry[ServerKind] = Registry("server kind")
"""The server kinds, in detection order."""


def _kind(kind: ServerKind) -> None:
    SERVER_KINDS.register(kind.name)(kind)


_kind(
    ServerKind(
        name="harness",
        detect=("harness_engine_running_requests",),
        sources={
            "prefix_queries": ("harness_engine_prefix_cache_query_tokens_total",),
            "prefix_hits": ("harness_engine_prefix_cache_hit_tokens_total",),
            "running": ("harness_engine_running_requests",),
            "waiting": ("harness_engine_waiting_requests",),
            "kv_usage": ("harness_engine_kv_usage_ratio",),
        },
        keep=("harness_engine_preemptions_total", "harness_server_requests_in_flight"),
        # The response cache's and the request handlers' series by tier / tenant / stage / status:
        # what the anomaly attribution reads (harness/target/cache/metrics.py and
        # harness/target/server/metrics.py).
        series=(
            "cache_hit_rate",
            "cache_fill_rate",
            "cache_thermal_drift",
            "cache_errors_total",
            "cache_evictions_total",
            "cache_lookup_seconds_sum",
            "cache_lookup_seconds_count",
            "harness_server_requests_total",
            "harness_server_ttft_seconds_sum",
            "harness_server_ttft_seconds_count",
            "harness_server_e2e_seconds_sum",
            "harness_server_e2e_seconds_count",
        ),
        doc="harness serve (harness/target/server/metrics.py, harness/target/cache/metrics.py)",
    )
)
_kind(
    ServerKind(
        name="vllm",
        detect=("vllm:num_requests_running",),
        sources={
            # V1 engine: counters of tokens; the first V1 releases prefixed them gpu_.
            "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
            "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            "running": ("vllm:num_requests_running",),
            "waiting": ("vllm:num_requests_waiting",),
            # A share 0–1 despite the name; gpu_cache_usage_perc before it.
            "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        },
        keep=("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"),
        doc="https://docs.vllm.ai/en/v0.32.0/usage/metrics/ (vLLM production metrics)",
    )
)
_kind(
    ServerKind(
        name="sglang",
        detect=("sglang:num_running_reqs", "sglang:token_usage"),
        sources={
            # Prompt tokens prefilled, and of them those the radix cache held (cache_source labels
            # device / host / storage: summed).
            "prefix_queries": ("sglang:prompt_tokens_total",),
            "prefix_hits": ("sglang:cached_tokens_total",),
            "running": ("sglang:num_running_reqs",),
            "waiting": ("sglang:num_queue_reqs",),
            "kv_usage": ("sglang:token_usage",),
        },
        keep=("sglang:generation_tokens_total", "sglang:cache_hit_rate"),
        doc="https://docs.sglang.io/references/production_metrics.html (--enable-metrics)",
    )
)
_kind(
    ServerKind(
        name="llamacpp",
        detect=("llamacpp:requests_processing",),
        sources={
            # No prefix counters: prompt_tokens_total counts tokens evaluated, not looked up.
            "running": ("llamacpp:requests_processing",),
            "waiting": ("llamacpp:requests_deferred",),
            "kv_usage": ("llamacpp:kv_cache_usage_ratio",),
        },
        keep=("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:kv_cache_tokens"),
        doc="llama.cpp tools/server/README.md, GET /metrics (llama-server --metrics)",
    )
)
_kind(
    ServerKind(
        name="tgi",
        detect=("tgi_queue_size",),
        sources={"running": ("tgi_batch_current_size",), "waiting": ("tgi_queue_size",)},
        keep=("tgi_request_count",),
        doc="https://huggingface.co/docs/text-generation-inference/reference/metrics",
    )
)


# ------------------------------------------------------------------------------------------ parsing


def known_names() -> frozenset[str]:
    """Every sample name some registered kind detects by or reads."""
    out: set[str] = set()
    for _, kind in SERVER_KINDS.items():
        out |= kind.read()
    return frozenset(out)


def _label_sets(samples: Iterable[Sample]) -> tuple[dict[str, float], dict[str, int]]:
    """Sample name → its values summed over label sets, and how many label sets there were."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for s in samples:
        sums[s.name] = sums.get(s.name, 0.0) + s.value
        counts[s.name] = counts.get(s.name, 0) + 1
    return sums, counts


def detect_kind(names: Iterable[str]) -> ServerKind | None:
    """The first registered kind whose identifying names appear among ``names``."""
    present = set(names)
    for _, kind in SERVER_KINDS.items():
        if any(n in present for n in kind.detect):
            return kind
    return None


class GpuSample(StrictModel):
    """One local GPU as NVML saw it at a scrape."""

    index: int
    name: str | None = None
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: float | None = None
    power_w: float | None = None


class SeriesValue(StrictModel):
    """One sample of a scrape with its labels (a :attr:`ServerKind.series` name)."""

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    value: float


class ServerSample(StrictModel):
    """One line of ``server_metrics.jsonl``: a scrape (or the one record of why scraping stopped)."""

    t_s: float
    """Seconds since the run's epoch (the records' ``sent_s`` base); negative before it. A scrape is
    stamped when its answer arrived (its counters are at most that recent)."""
    kind: str | None = None
    """The server kind detected (:data:`SERVER_KINDS`); ``None`` on an error line or a GPU-only one."""
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    raw: dict[str, float] = Field(default_factory=dict)
    """The samples the normalised values came from, and the kind's ``keep`` ones, as scraped."""
    series: list[SeriesValue] = Field(default_factory=list)
    """The kind's :attr:`ServerKind.series` samples, one per label set (finite values only: a NaN
    gauge says nothing, and JSON has no NaN)."""
    gpu: list[GpuSample] = Field(default_factory=list)
    error: str | None = None
    """Why this scrape gave nothing (recorded once per kind of failure)."""

    def value(self, name: Normalised) -> float | None:
        v: float | None = getattr(self, name)
        return v


def normalise(text: str, t_s: float, kind: ServerKind | None = None) -> ServerSample:
    """One scrape's text as a :class:`ServerSample` (``kind`` detected when not given). Raises
    ``ValueError`` for text that is not an exposition, :class:`UnknownServer` for one with none of
    the known names."""
    samples = parse_exposition(text, kind.read() if kind else known_names())
    sums, counts = _label_sets(samples)
    kind = kind or detect_kind(sums)
    if kind is None:
        raise UnknownServer(
            f"{METRICS_PATH} holds none of the known servers' names "
            f"({', '.join(name for name, _ in SERVER_KINDS.items())})"
        )
    values: dict[str, float | None] = {}
    for field, names in kind.sources.items():
        name = next((n for n in names if n in sums), None)
        if name is None:
            values[field] = None
        elif field == "kv_usage":
            values[field] = sums[name] / counts[name]
        else:
            values[field] = sums[name]
    raw = {n: sums[n] for n in sorted(kind.wanted()) if n in sums}
    series = [
        SeriesValue(name=s.name, labels=dict(s.labels), value=s.value)
        for s in samples
        if s.name in kind.series and math.isfinite(s.value)
    ]
    return ServerSample(t_s=round(t_s, 4), kind=kind.name, raw=raw, series=series, **values)


class UnknownServer(ValueError):
    """The target's ``/metrics`` answers, but with none of the registered kinds' names."""


# ------------------------------------------------------------------------------------------ writing


class SampleWriter:
    """Appends :class:`ServerSample` lines, each flushed as written (a crash loses nothing scraped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[bytes] = path.open("wb")

    def write(self, sample: ServerSample) -> None:
        if self._fh.closed:
            return
        empty = {name for name in ("gpu", "series") if not getattr(sample, name)}
        doc = sample.model_dump(exclude_none=True, exclude=empty or None)
        self._fh.write(orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE))
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


# ------------------------------------------------------------------------------- per-phase deltas


def counter_delta(points: Sequence[tuple[float, float]], start_s: float, end_s: float) -> float | None:
    """How much a counter grew over ``[start_s, end_s]`` from its scrapes ``(t_s, value)`` (in time
    order): from the last scrape at or before the start (the first one after it when none is before)
    to the last at or before the end, by the one rule of :func:`harness.common.prometheus.total_increase`
    (a reset counts from 0). ``None`` with fewer than two scrapes in reach."""
    if not points:
        return None
    before = [i for i, (t, _) in enumerate(points) if t <= start_s]
    first = before[-1] if before else 0
    upto = [i for i, (t, _) in enumerate(points) if t <= end_s]
    last = upto[-1] if upto else -1
    if last <= first:
        return None
    return total_increase([v for _, v in points[first : last + 1]])


def phase_of(samples: Sequence[ServerSample], name: str, start_s: float, end_s: float) -> ServerPhase:
    """One phase's counter deltas and gauge maxima over ``[start_s, end_s]`` (±inf: open ends)."""

    def points(field: Normalised) -> list[tuple[float, float]]:
        return [(s.t_s, v) for s in samples if (v := s.value(field)) is not None]

    queries = counter_delta(points("prefix_queries"), start_s, end_s)
    hits = counter_delta(points("prefix_hits"), start_s, end_s)
    inside = [s for s in samples if start_s <= s.t_s <= end_s and s.kind is not None]

    def peak(field: Normalised) -> float | None:
        vals = [v for s in inside if (v := s.value(field)) is not None]
        return max(vals) if vals else None

    rate = hits / queries if queries and hits is not None else None
    return ServerPhase(
        name=name,
        started_s=start_s if math.isfinite(start_s) else None,
        ended_s=end_s if math.isfinite(end_s) else None,
        scrapes=len(inside),
        prefix_queries=queries,
        prefix_hits=hits,
        prefix_hit_rate=rate,
        running_max=peak("running"),
        waiting_max=peak("waiting"),
        kv_usage_max=peak("kv_usage"),
    )


def summarize_samples(
    samples: Sequence[ServerSample],
    phases: Sequence[tuple[str, float, float]],
    *,
    interval_s: float,
    scrapes: int,
    failed: int,
    error: str | None,
    gpu: bool,
) -> ServerTelemetry:
    """The run's :class:`ServerTelemetry`: the whole run and each phase."""
    kind = next((s.kind for s in samples if s.kind is not None), None)
    return ServerTelemetry(
        file=SERVER_METRICS_FILE,
        kind=kind,
        interval_s=interval_s,
        scrapes=scrapes,
        failed=failed,
        error=error,
        gpu=gpu,
        total=phase_of(samples, "run", -math.inf, math.inf),
        phases=[phase_of(samples, name, a, b) for name, a, b in phases],
    )


def run_phases(
    stage: str, stages: Sequence[tuple[str, float, float]] | None
) -> list[tuple[str, float, float]]:
    """A run's phases for the deltas: a ladder's stages (the last one open-ended, so that requests
    answered after its verdict count), else the whole run under its stage label."""
    if not stages:
        return [(stage, -math.inf, math.inf)]
    out = [(n, a, b) for n, a, b in stages]
    name, a, _ = out[-1]
    out[-1] = (name, a, math.inf)
    return out


# ------------------------------------------------------------------------------------------ reading


def read_server_metrics(run_dir: str | Path) -> Iterator[ServerSample]:
    """The validated lines of a run's ``server_metrics.jsonl`` (or of that file); an empty file (a run
    that ended before its first scrape) is no lines."""
    p = Path(run_dir)
    if p.is_dir():
        p = p / SERVER_METRICS_FILE
    for _, sample in iter_jsonl(p, ServerSample, expected="a server metrics sample", allow_empty=True):
        yield sample
