"""Anomaly attribution: which tier, tenant or scenario moved HitRate, FillRate or ThermalDrift, and why.

Input is a time series of our metrics: scrapes of ``/metrics`` in ``server_metrics.jsonl``'s format
(each line's ``series``: what a load run against ``harness serve`` writes, and what ``harness analysis
scrape`` writes with the same scraper, :class:`harness.load.telemetry.Scraper`; the ``{ts, text}``
lines that command wrote before are still read), or a Prometheus server's HTTP query API
(``/api/v1/query_range``). Each series is reduced to one value per scrape interval: a gauge's value,
a counter's increase per second, a histogram's mean (Δsum / Δcount), every difference by the one
counter rule (:func:`harness.common.prometheus.counter_increase`: a reset counts from 0). Against a
**baseline window** (default: the first quarter of the time span) every series of the **test
window** gets a deviation ``z = (observed mean − baseline mean) / scale`` with
``scale = max(baseline stddev, 5 % of the baseline mean, a per-metric floor)``; a deviation in the
harmful direction with ``|z| ≥ z_min`` (default 3) is an anomaly.

Symptoms (:data:`SYMPTOMS`): ``HitRate`` down (``cache_hit_rate``), ``FillRate`` either way
(``cache_fill_rate``), ``ThermalDrift`` up (``cache_thermal_drift``). Causes (:data:`CAUSES`): errors
(``cache_errors_total``, server 5xx), evictions (``cache_evictions_total``) and latency spikes
(mean ``cache_lookup_seconds``, TTFT, E2E), all up.

The tree (:class:`AnomalyReport`, stable JSON, version 1): root → dimension (``tier``, ``tenant``,
``scenario``, ``stage``: whichever labels the anomalous series carry) → value (``tier=l2``) →
symptom → leaf causes found under the same label value. Nodes are scored by the largest ``|z|``
below them; siblings with a symptom below them come first, then by score, so the first path from
the root is the likeliest explanation of a symptom. Anomalous causes with no symptom under the
same label value are leaves of the value node (errors that did not move the cache).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from harness.common.auth import Credentials
from harness.common.errors import InputError, UnavailableError
from harness.common.io import check_input_file, iter_jsonl, jsonl_lines, parse_jsonl_line
from harness.common.model import StrictModel
from harness.common.prometheus import counter_increase, parse_exposition
from harness.load.server_metrics import (
    METRICS_PATH,
    SERVER_METRICS_FILE,
    ServerSample,
    read_server_metrics,
)
from harness.load.telemetry import Scraper

if TYPE_CHECKING:
    import httpx

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
"""(metric sample name, sorted label pairs)."""
Samples = list[tuple[float, float]]
Kind = Literal["gauge", "counter", "histogram"]
Direction = Literal["up", "down", "both"]

DIMENSIONS: tuple[str, ...] = ("tier", "tenant", "scenario", "stage")
TARGET_LABELS = frozenset({"job", "instance"})
REL_FLOOR = 0.05


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """How to read one metric and which way is bad."""

    name: str
    """Exposed family name (counters without ``_total`` added here; see ``sample``)."""
    kind: Kind
    bad: Direction
    floor: float
    """Smallest scale of a deviation (units of the per-interval value)."""
    label: str
    """Human name of the node."""
    match: tuple[tuple[str, str], ...] = ()
    """Label prefixes a series must carry (``(("status", "5"),)``: status 5xx)."""

    def sample_names(self) -> tuple[str, ...]:
        if self.kind == "counter":
            return (self.name if self.name.endswith("_total") else self.name + "_total",)
        if self.kind == "histogram":
            return (self.name + "_sum", self.name + "_count")
        return (self.name,)


SYMPTOMS: dict[str, MetricSpec] = {
    "HitRate": MetricSpec("cache_hit_rate", "gauge", "down", 0.01, "HitRate"),
    "FillRate": MetricSpec("cache_fill_rate", "gauge", "both", 0.01, "FillRate"),
    "ThermalDrift": MetricSpec("cache_thermal_drift", "gauge", "up", 0.05, "ThermalDrift"),
}
CAUSES: dict[str, MetricSpec] = {
    "cache errors": MetricSpec("cache_errors_total", "counter", "up", 0.01, "errors"),
    "server errors": MetricSpec(
        "harness_server_requests_total", "counter", "up", 0.01, "errors", (("status", "5"),)
    ),
    "evictions": MetricSpec("cache_evictions_total", "counter", "up", 0.1, "evictions"),
    "lookup latency": MetricSpec("cache_lookup_seconds", "histogram", "up", 1e-4, "latency spike"),
    "ttft": MetricSpec("harness_server_ttft_seconds", "histogram", "up", 1e-3, "latency spike"),
    "e2e": MetricSpec("harness_server_e2e_seconds", "histogram", "up", 1e-3, "latency spike"),
}


def metric_names() -> list[str]:
    """Every sample name the tree reads (for a Prometheus query or a check)."""
    return sorted({n for spec in (*SYMPTOMS.values(), *CAUSES.values()) for n in spec.sample_names()})


# --------------------------------------------------------------------------- the JSON schema


class Window(StrictModel):
    start: float
    """Seconds on the input's time axis: unix seconds for ``harness analysis scrape`` and a Prometheus
    query, the run's seconds (``t_s``) for a load run's ``server_metrics.jsonl``."""
    end: float


class Deviation(StrictModel):
    """One series' move from the baseline to the test window."""

    metric: str
    labels: dict[str, str]
    kind: Kind
    baseline: float
    observed: float
    delta: float
    z: float
    direction: Literal["up", "down"]


class AnomalyNode(StrictModel):
    """A node of the attribution tree."""

    id: str
    """Path from the root, e.g. ``tier/tier=l2/HitRate/evictions``; stable across runs."""
    level: Literal["root", "dimension", "value", "symptom", "cause"]
    name: str
    dimension: str | None = None
    value: str | None = None
    score: float
    """Largest ``|z|`` in the subtree."""
    symptoms: int = 0
    """Symptom nodes in the subtree (this one included)."""
    deviation: Deviation | None = None
    """Set on symptom and cause nodes."""
    children: list[AnomalyNode] = Field(default_factory=list)


class AnomalyReport(StrictModel):
    """``harness analysis anomaly --json`` (schema version 1)."""

    schema_version: Literal[1] = 1
    source: str
    baseline: Window
    window: Window
    z_min: float
    series: int
    """Series examined."""
    anomalies: int
    root: AnomalyNode


# --------------------------------------------------------------------------- inputs


def series_from_samples(samples: Iterable[ServerSample]) -> dict[SeriesKey, Samples]:
    """Time series of every sample the tree reads, from the ``series`` of ``server_metrics.jsonl``
    lines (a load run's against ``harness serve``, or ``harness analysis scrape``'s), in any order."""
    wanted = set(metric_names())
    series: dict[SeriesKey, Samples] = {}
    for s in sorted(samples, key=lambda s: s.t_s):
        for v in s.series:
            if v.name in wanted:
                series.setdefault((v.name, tuple(sorted(v.labels.items()))), []).append((s.t_s, v.value))
    return series


class Scrape(StrictModel):
    """One line of the scrapes JSONL that ``harness analysis scrape`` wrote before it wrote
    ``server_metrics.jsonl``'s lines: a ``/metrics`` body and when it was taken. Still read."""

    ts: float
    """Unix seconds."""
    text: str


def series_from_scrapes(scrapes: Iterable[Scrape]) -> dict[SeriesKey, Samples]:
    """Time series of every sample the tree reads, from ``{ts, text}`` scrapes in any order."""
    wanted = metric_names()
    series: dict[SeriesKey, Samples] = {}
    for sc in sorted(scrapes, key=lambda s: s.ts):
        for sample in parse_exposition(sc.text, wanted):
            if math.isfinite(sample.value):  # as the scraper keeps them: a NaN gauge says nothing
                series.setdefault((sample.name, sample.labels), []).append((sc.ts, sample.value))
    return series


def read_series(path: str | Path) -> dict[SeriesKey, Samples]:
    """Time series of every sample the tree reads from a ``server_metrics.jsonl`` (or a run directory
    holding one), or from an older ``harness analysis scrape`` file of ``{ts, text}`` lines (told
    apart by its first line)."""
    p = Path(path)
    if p.is_dir():
        p = p / SERVER_METRICS_FILE
    with check_input_file(p, allow_empty=True).open("rb") as fh:
        first = next(jsonl_lines(fh), None)
    if first is not None and set(parse_jsonl_line(first[1], first[0], file=p)) == {"ts", "text"}:
        return series_from_scrapes(s for _, s in iter_jsonl(p, Scrape, expected="a scrape ({ts, text})"))
    return series_from_samples(read_server_metrics(p))


def scrape_metrics(
    url: str,
    creds: Credentials,
    out: str | Path,
    *,
    every_s: float,
    count: int,
    warn: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Scrape a ``harness serve``'s ``/metrics`` ``count`` times, ``every_s`` apart, into ``out`` in
    ``server_metrics.jsonl``'s format, by the load stage's scraper (:class:`Scraper`, blocking) with
    ``creds``; ``t_s`` is unix seconds. ``url`` is the server's base URL or its ``/metrics`` URL.
    Returns the scrapes written. Each line is flushed as written, so an interruption keeps what was
    scraped. A target that cannot be scraped at the first try, or not any more (no ``/metrics``,
    refused credentials, not our server's names), is an :class:`UnavailableError`; a later failure
    that may pass (a timeout) is warned about and the next scrape goes on schedule."""
    host = url.rstrip("/").removesuffix(METRICS_PATH)
    scraper = Scraper(host, creds, Path(out), interval_s=every_s, now=time.time, warn=warn, blocking=True)
    try:
        for i in range(count):
            t0 = time.monotonic()
            scraper.scrape()
            if scraper.server_off or not any(s.kind is not None for s in scraper.samples):
                raise UnavailableError(f"cannot scrape {scraper.url}: {scraper.first_error}", field="--url")
            if i + 1 < count:
                sleep(max(0.0, every_s - (time.monotonic() - t0)))
    finally:
        scraper.close()
    return sum(s.kind is not None for s in scraper.samples)


def series_from_prometheus(
    base_url: str,
    start: float,
    end: float,
    step_s: float,
    *,
    creds: Credentials | None = None,
    transport: httpx.BaseTransport | None = None,
) -> dict[SeriesKey, Samples]:
    """Time series of every sample the tree reads from a Prometheus server's ``query_range`` API
    (with ``creds``' request headers and TLS policy: a Prometheus behind a gateway wants a key)."""
    import httpx

    creds = creds or Credentials()
    series: dict[SeriesKey, Samples] = {}
    with httpx.Client(
        timeout=30.0, transport=transport, headers=creds.request_headers(), verify=creds.httpx_verify()
    ) as client:
        for name in metric_names():
            try:
                resp = client.get(
                    base_url.rstrip("/") + "/api/v1/query_range",
                    params={"query": name, "start": start, "end": end, "step": step_s},
                )
                resp.raise_for_status()
                doc = resp.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise UnavailableError(
                    creds.redact(f"Prometheus query for {name} failed: {exc}"), field="--prometheus"
                ) from None
            if doc.get("status") != "success":
                raise UnavailableError(f"Prometheus refused the query for {name}: {doc.get('error')}")
            for res in doc.get("data", {}).get("result", []):
                labels = {k: str(v) for k, v in res.get("metric", {}).items() if k != "__name__"}
                key = (name, tuple(sorted(labels.items())))
                series[key] = [(float(t), float(v)) for t, v in res.get("values", [])]
    return series


# --------------------------------------------------------------------------- deviations


def _intervals(samples: Samples, kind: Kind) -> list[tuple[float, float]]:
    """Per-interval values (time at the interval's end): gauge values, counter increase per second."""
    if kind == "gauge":
        return list(samples)
    out: list[tuple[float, float]] = []
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t1 <= t0:
            continue
        out.append((t1, counter_increase(v0, v1) / (t1 - t0)))
    return out


def _histogram_means(sums: Samples, counts: Samples) -> list[tuple[float, float]]:
    by_t = dict(counts)
    pairs = [(t, s, by_t[t]) for t, s in sums if t in by_t]
    out: list[tuple[float, float]] = []
    for (_, s0, c0), (t1, s1, c1) in itertools.pairwise(pairs):
        dc, ds = counter_increase(c0, c1), counter_increase(s0, s1)
        if dc > 0:
            out.append((t1, ds / dc))
    return out


def _deviation(
    *,
    name: str,
    labels: dict[str, str],
    kind: Kind,
    values: list[tuple[float, float]],
    base: Window,
    win: Window,
    floor: float,
) -> Deviation | None:
    b = np.asarray([v for t, v in values if base.start <= t <= base.end], dtype=np.float64)
    o = np.asarray([v for t, v in values if win.start < t <= win.end], dtype=np.float64)
    if b.size == 0 or o.size == 0:
        return None
    bm, om = float(b.mean()), float(o.mean())
    scale = max(float(b.std()), REL_FLOOR * abs(bm), floor)
    z = (om - bm) / scale
    return Deviation(
        metric=name,
        labels=labels,
        kind=kind,
        baseline=bm,
        observed=om,
        delta=om - bm,
        z=z,
        direction="up" if om >= bm else "down",
    )


def _matches(labels: dict[str, str], spec: MetricSpec) -> bool:
    return all(labels.get(k, "").startswith(prefix) for k, prefix in spec.match)


def deviations(
    series: dict[SeriesKey, Samples], specs: dict[str, MetricSpec], base: Window, win: Window
) -> list[tuple[str, MetricSpec, Deviation]]:
    """(spec name, spec, deviation) of every series of ``specs`` present in ``series``."""
    out: list[tuple[str, MetricSpec, Deviation]] = []
    for spec_name, spec in specs.items():
        if spec.kind == "histogram":
            sum_name, count_name = spec.sample_names()
            for (name, labels), samples in series.items():
                if name != sum_name:
                    continue
                counts = series.get((count_name, labels))
                lab = dict(labels)
                if counts is None or not _matches(lab, spec):
                    continue
                values = _histogram_means(samples, counts)
                d = _deviation(
                    name=spec.name,
                    labels=lab,
                    kind="histogram",
                    values=values,
                    base=base,
                    win=win,
                    floor=spec.floor,
                )
                if d is not None:
                    out.append((spec_name, spec, d))
            continue
        (sample_name,) = spec.sample_names()
        for (name, labels), samples in series.items():
            lab = dict(labels)
            if name != sample_name or not _matches(lab, spec):
                continue
            values = _intervals(samples, spec.kind)
            d = _deviation(
                name=spec.name,
                labels=lab,
                kind=spec.kind,
                values=values,
                base=base,
                win=win,
                floor=spec.floor,
            )
            if d is not None:
                out.append((spec_name, spec, d))
    return out


def _harmful(spec: MetricSpec, d: Deviation, z_min: float) -> bool:
    if abs(d.z) < z_min:
        return False
    return spec.bad in ("both", d.direction)


# --------------------------------------------------------------------------- the tree


def _label_str(labels: dict[str, str], skip: str) -> str:
    # Target labels a Prometheus server adds (job, instance) say where, not what: not in node ids.
    rest = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != skip and k not in TARGET_LABELS)
    return f"{{{rest}}}" if rest else ""


def attribute(
    series: dict[SeriesKey, Samples],
    *,
    source: str,
    baseline: Window | None = None,
    window: Window | None = None,
    z_min: float = 3.0,
    dimensions: Sequence[str] = DIMENSIONS,
) -> AnomalyReport:
    """Build the attribution tree of ``series`` (default windows: first quarter vs the rest)."""
    times = [t for samples in series.values() for t, _ in samples]
    if not times:
        raise InputError("no samples of the cache or server metrics in the input", file=source)
    t_min, t_max = min(times), max(times)
    base = baseline or Window(start=t_min, end=t_min + (t_max - t_min) / 4.0)
    win = window or Window(start=base.end, end=t_max)
    if base.end <= base.start or win.end <= win.start:
        raise InputError("the baseline and test windows must each span some time", field="baseline")
    symptoms = [(n, s, d) for n, s, d in deviations(series, SYMPTOMS, base, win) if _harmful(s, d, z_min)]
    causes = [(n, s, d) for n, s, d in deviations(series, CAUSES, base, win) if _harmful(s, d, z_min)]

    def groups(
        items: list[tuple[str, MetricSpec, Deviation]],
    ) -> dict[tuple[str, str], list[tuple[str, MetricSpec, Deviation]]]:
        out: dict[tuple[str, str], list[tuple[str, MetricSpec, Deviation]]] = {}
        for item in items:
            labels = item[2].labels
            dims = [d for d in dimensions if d in labels] or ["all"]
            for dim in dims:
                out.setdefault((dim, labels.get(dim, "*")), []).append(item)
        return out

    sym_groups, cause_groups = groups(symptoms), groups(causes)
    dim_nodes: dict[str, list[AnomalyNode]] = {}
    for dim, value in sorted(set(sym_groups) | set(cause_groups)):
        base_id = f"{dim}/{dim}={value}"
        cause_leaves = [
            AnomalyNode(
                id=f"{base_id}/cause:{name}{_label_str(d.labels, dim)}",
                level="cause",
                name=f"{spec.label}: {name}",
                dimension=dim,
                value=value,
                score=abs(d.z),
                deviation=d,
            )
            for name, spec, d in cause_groups.get((dim, value), [])
        ]
        children: list[AnomalyNode] = []
        for name, _, d in sym_groups.get((dim, value), []):
            sid = f"{base_id}/{name}{_label_str(d.labels, dim)}"
            leaves = [
                leaf.model_copy(update={"id": f"{sid}/{leaf.id.rsplit('/', 1)[1]}"}) for leaf in cause_leaves
            ]
            children.append(
                AnomalyNode(
                    id=sid,
                    level="symptom",
                    name=name,
                    dimension=dim,
                    value=value,
                    score=max([abs(d.z), *(leaf.score for leaf in leaves)]),
                    symptoms=1,
                    deviation=d,
                    children=_sorted(leaves),
                )
            )
        if not children:
            children = cause_leaves
        dim_nodes.setdefault(dim, []).append(
            AnomalyNode(
                id=base_id,
                level="value",
                name=f"{dim}={value}",
                dimension=dim,
                value=value,
                score=max(c.score for c in children),
                symptoms=sum(c.symptoms for c in children),
                children=_sorted(children),
            )
        )
    dims = [
        AnomalyNode(
            id=dim,
            level="dimension",
            name=dim,
            dimension=dim,
            score=max(v.score for v in values),
            symptoms=sum(v.symptoms for v in values),
            children=_sorted(values),
        )
        for dim, values in dim_nodes.items()
    ]
    root = AnomalyNode(
        id="",
        level="root",
        name="run",
        score=max((d.score for d in dims), default=0.0),
        symptoms=sum(d.symptoms for d in dims),
        children=_sorted(dims),
    )
    return AnomalyReport(
        source=source,
        baseline=base,
        window=win,
        z_min=z_min,
        series=len(series),
        anomalies=len(symptoms) + len(causes),
        root=root,
    )


def _sorted(nodes: list[AnomalyNode]) -> list[AnomalyNode]:
    # Explanations of a symptom first, then the strongest deviation.
    return sorted(
        nodes, key=lambda n: (n.symptoms == 0, -n.score if math.isfinite(n.score) else -math.inf, n.id)
    )


def render_tree(node: AnomalyNode, depth: int = 0, max_depth: int = 6) -> list[str]:
    """The tree as indented text lines (for the terminal)."""
    dev = node.deviation
    what = f"  ({dev.baseline:.4g} → {dev.observed:.4g}, z={dev.z:+.1f})" if dev is not None else ""
    lines = [f"{'  ' * depth}{node.name}  [score {node.score:.1f}]{what}"]
    if depth < max_depth:
        for child in node.children:
            lines += render_tree(child, depth + 1, max_depth)
    return lines
