"""Prometheus metrics of ``harness serve``, all in one :class:`CollectorRegistry` the app owns.

Two kinds live here. Request metrics (counts by endpoint and status, rejections by reason, TTFT,
TPOT, prefill time and KV bytes) are observed by the request handlers. Engine state (running and
waiting requests, KV blocks, prefix-cache tokens) is read from ``engine.stats()`` at scrape time by
:class:`EngineCollector`, so a scrape always shows the engine as it is now and idle servers pay
nothing. The response cache registers its own metrics in the same registry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from harness.target.engine.api import EngineStats

# Latency buckets from sub-millisecond (cache hits) to a minute (a long CPU prefill).
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_TPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_BYTES_BUCKETS = tuple(float(4**i * 1024) for i in range(12))  # 1 KiB … 4 GiB


class EngineCollector(Collector):
    """Engine gauges and counters computed from one ``stats()`` snapshot per scrape."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        labels = ["device"]
        dev = [s.device]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(dev, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(dev, value)
            return c

        yield gauge("harness_engine_running_requests", "Requests in the running batch.", s.running)
        yield gauge("harness_engine_waiting_requests", "Requests in the waiting queue.", s.waiting)
        yield gauge("harness_engine_kv_blocks_used", "KV blocks referenced by requests.", s.kv_blocks_used)
        yield gauge("harness_engine_kv_blocks_total", "KV blocks in the pool.", s.kv_blocks_total)
        yield gauge(
            "harness_engine_kv_blocks_cached",
            "KV blocks held only by the prefix cache (evictable).",
            s.kv_blocks_cached,
        )
        yield gauge("harness_engine_kv_usage_ratio", "kv_blocks_used / kv_blocks_total.", s.kv_usage)
        yield counter(
            "harness_engine_prefix_cache_query_tokens",
            "Prompt tokens looked up in the prefix cache.",
            s.prefix_query_tokens,
        )
        yield counter(
            "harness_engine_prefix_cache_hit_tokens",
            "Prompt tokens found in the prefix cache.",
            s.prefix_hit_tokens,
        )
        yield counter("harness_engine_preemptions", "Requests preempted (recomputed).", s.preemptions)
        yield counter("harness_engine_steps", "Engine scheduler steps.", s.steps)
        for key, value in sorted(s.extra.items()):
            safe = "".join(ch if ch.isalnum() else "_" for ch in key)
            yield gauge(f"harness_engine_{safe}", f"Engine statistic {key}.", value)


class ServerMetrics:
    """The request-side metrics; ``stage`` labels are capped so a client cannot explode cardinality."""

    def __init__(self, registry: CollectorRegistry, max_stage_labels: int = 64) -> None:
        self.registry = registry
        self._max_stages = max_stage_labels
        self._stages: set[str] = set()
        self._lock = threading.Lock()
        self.requests = Counter(
            "harness_server_requests",
            "HTTP requests by endpoint, status code and X-Traffic-Stage.",
            ["endpoint", "status", "stage"],
            registry=registry,
        )
        self.rejections = Counter(
            "harness_server_rejections",
            "Refused requests by reason (too_long, bad_request, unsupported, body_too_large, queue_full, …).",
            ["reason"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "harness_server_requests_in_flight", "Requests being handled now.", registry=registry
        )
        self.disconnects = Counter(
            "harness_server_client_disconnects",
            "Requests aborted because the client went away.",
            registry=registry,
        )
        self.ttft = Histogram(
            "harness_server_ttft_seconds",
            "Time from request arrival to the first output text, by source (engine or cache).",
            ["endpoint", "source"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "harness_server_tpot_seconds",
            "Engine's mean time per output token after the first.",
            ["endpoint"],
            buckets=_TPOT_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "harness_server_e2e_seconds",
            "Time from request arrival to the last byte of the answer.",
            ["endpoint", "source"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.prefill = Histogram(
            "harness_engine_prefill_seconds",
            "Engine prefill time per request.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.queued = Histogram(
            "harness_engine_queued_seconds",
            "Time a request waited before its prefill.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.prefill_kv_bytes = Histogram(
            "harness_engine_prefill_kv_bytes",
            "KV cache bytes allocated by a request's prefill.",
            buckets=_BYTES_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "harness_server_prompt_tokens", "Prompt tokens of served requests.", ["source"], registry=registry
        )
        self.output_tokens = Counter(
            "harness_server_output_tokens", "Output tokens of served requests.", ["source"], registry=registry
        )
        self.fault_active = Gauge(
            "harness_server_fault_injection_active",
            "1 for each fault injection this server runs with (slowdown, error_rate, cache_miss_rate, "
            "kv_overalloc), 0 for the others: its answers carry a regression on purpose.",
            ["kind"],
            registry=registry,
        )
        self.injected_faults = Counter(
            "harness_server_injected_faults",
            "Generation requests a fault injection hit, by kind (error, cache-miss).",
            ["kind"],
            registry=registry,
        )

    def stage_label(self, stage: str | None) -> str:
        if not stage:
            return "none"
        with self._lock:
            if stage in self._stages:
                return stage
            if len(self._stages) < self._max_stages:
                self._stages.add(stage)
                return stage
        return "other"
