"""Ops artifacts: a Grafana dashboard for our metrics, and Istio routing for preheat and A/B traffic.

**Grafana.** :func:`grafana_dashboard` builds a dashboard JSON (schema 39, Prometheus data source
chosen by a template variable, every query filtered by ``job=~"$job"``) with rows for the response
cache (hit rate, fill rate, thermal drift, entries, evictions, errors, lookup latency, Bloom,
write-backs), the server (requests, rejections, TTFT, E2E, in flight) and the engine (batch, queue,
KV usage, prefix-cache hit ratio, preemptions). Every metric a panel queries is checked against the
names our registries really expose (:func:`exposed_metric_names`, from the live metric classes of
``harness/target/cache/metrics.py`` and ``harness/target/server/metrics.py``), so a renamed metric
fails the build, not the dashboard. Latency panels show means (``rate(sum)/rate(count)``) and bucket
heatmaps, not ``histogram_quantile``: Prometheus interpolates inside buckets, which is not the harness's
percentile definition (:mod:`harness.common.stats`).

**Istio.** :func:`render_istio` renders ``templates/istio/virtualservice.yaml.j2`` and
``destinationrule.yaml.j2`` in Jinja's immutable sandbox with ``StrictUndefined``; every value is
inserted as a JSON scalar (valid YAML, so no value can inject YAML). The VirtualService sends
requests carrying ``x-env: preheat`` (:data:`harness.common.headers.PREHEAT`; warmup traffic from
the load stage) to the preheat subset only, and splits everything else across the A/B subsets by
weight; the DestinationRule defines the subsets by pod labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from harness.common.errors import ConfigError
from harness.common.headers import PREHEAT
from harness.common.model import StrictModel

PREHEAT_VALUE = "preheat"
"""The ``x-env`` header value of warmup traffic."""
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "istio"
_METRIC_IN_QUERY = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


# --------------------------------------------------------------------------- Grafana


def exposed_metric_names() -> set[str]:
    """Every sample name ``/metrics`` of ``harness serve --cache`` can expose (from the real classes)."""
    from prometheus_client import CollectorRegistry

    from harness.target.cache.metrics import CacheMetrics
    from harness.target.engine.api import EngineStats
    from harness.target.server.metrics import EngineCollector, ServerMetrics

    reg = CollectorRegistry()
    cache = CacheMetrics(reg)
    cache.bind_gauges(lambda _t: 0.0, lambda _t: 0.0, lambda: 0.0)
    ServerMetrics(reg)
    reg.register(EngineCollector(EngineStats))
    names: set[str] = set()
    for fam in reg.collect():
        names.add(fam.name)
        for s in fam.samples:
            names.add(s.name)
    # Labelled children appear only once used; their families still name every sample kind.
    for fam in reg.collect():
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "histogram":
            names.update({fam.name + "_bucket", fam.name + "_sum", fam.name + "_count"})
    return names


def query_metrics(expr: str) -> set[str]:
    """Metric names selected in a PromQL expression (every selector here has a ``{…}`` matcher)."""
    return set(_METRIC_IN_QUERY.findall(expr))


def _sel(name: str, extra: str = "") -> str:
    return f'{name}{{job=~"$job"{"," + extra if extra else ""}}}'


def _rate(name: str, by: str, extra: str = "") -> str:
    return f"sum by ({by}) (rate({_sel(name, extra)}[$__rate_interval]))"


def _mean(name: str, by: str) -> str:
    return (
        f"sum by ({by}) (rate({_sel(name + '_sum')}[$__rate_interval])) / "
        f"sum by ({by}) (rate({_sel(name + '_count')}[$__rate_interval]))"
    )


@dataclass(frozen=True, slots=True)
class Panel:
    row: str
    title: str
    queries: tuple[tuple[str, str], ...]
    """(PromQL, legend) pairs."""
    unit: str
    kind: str = "timeseries"


_CACHE, _SERVER, _ENGINE = "Response cache", "Server", "Engine"
PANELS: tuple[Panel, ...] = (
    Panel(_CACHE, "Hit rate per tier", ((_sel("cache_hit_rate"), "{{tier}}"),), "percentunit"),
    Panel(
        _CACHE,
        "Requests by cache outcome",
        ((_rate("cache_requests_total", "status"), "{{status}}"),),
        "reqps",
    ),
    Panel(_CACHE, "Fill rate per tier", ((_sel("cache_fill_rate"), "{{tier}}"),), "percentunit"),
    Panel(
        _CACHE,
        "Thermal drift (stddev/mean of lookup latency, 5 min)",
        ((_sel("cache_thermal_drift"), "{{tier}}"),),
        "none",
    ),
    Panel(_CACHE, "Entries per tier", ((_sel("cache_entries"), "{{tier}}"),), "short"),
    Panel(_CACHE, "Evictions per second", ((_rate("cache_evictions_total", "tier"), "{{tier}}"),), "ops"),
    Panel(
        _CACHE,
        "Errors per second (fail-open)",
        (
            (_rate("cache_errors_total", "tier"), "{{tier}}"),
            (_rate("cache_corrupt_values_total", "tier"), "corrupt {{tier}}"),
        ),
        "ops",
    ),
    Panel(
        _CACHE, "Mean lookup latency per tier", ((_mean("cache_lookup_seconds", "tier"), "{{tier}}"),), "s"
    ),
    Panel(
        _CACHE,
        "Lookup latency buckets",
        ((f"sum by (le) (rate({_sel('cache_lookup_seconds_bucket')}[$__rate_interval]))", "{{le}}"),),
        "s",
        "heatmap",
    ),
    Panel(
        _CACHE,
        "Bloom guard",
        (
            (_rate("cache_bloom_intercepts_total", "job"), "intercepted"),
            (_rate("cache_bloom_passes_total", "job"), "passed"),
            (_sel("cache_bloom_fp_rate"), "measured FP rate"),
        ),
        "short",
    ),
    Panel(
        _CACHE,
        "Write-backs by value tier, single-flight merges",
        (
            (_rate("cache_writebacks_total", "value_tier"), "{{value_tier}}"),
            (_rate("cache_singleflight_merges_total", "job"), "merged"),
        ),
        "ops",
    ),
    Panel(
        _SERVER,
        "Requests by status and traffic stage",
        ((_rate("harness_server_requests_total", "status, stage"), "{{status}} {{stage}}"),),
        "reqps",
    ),
    Panel(
        _SERVER,
        "Rejections by reason",
        ((_rate("harness_server_rejections_total", "reason"), "{{reason}}"),),
        "reqps",
    ),
    Panel(
        _SERVER, "Mean TTFT by source", ((_mean("harness_server_ttft_seconds", "source"), "{{source}}"),), "s"
    ),
    Panel(
        _SERVER, "Mean E2E by source", ((_mean("harness_server_e2e_seconds", "source"), "{{source}}"),), "s"
    ),
    Panel(
        _SERVER,
        "In flight, client disconnects",
        (
            (_sel("harness_server_requests_in_flight"), "in flight"),
            (_rate("harness_server_client_disconnects_total", "job"), "disconnects/s"),
        ),
        "short",
    ),
    Panel(
        _ENGINE,
        "Running and waiting requests",
        (
            (_sel("harness_engine_running_requests"), "running"),
            (_sel("harness_engine_waiting_requests"), "waiting"),
        ),
        "short",
    ),
    Panel(
        _ENGINE,
        "KV usage",
        (
            (_sel("harness_engine_kv_usage_ratio"), "used"),
            (
                f"{_sel('harness_engine_kv_blocks_cached')} / {_sel('harness_engine_kv_blocks_total')}",
                "prefix-cache only",
            ),
        ),
        "percentunit",
    ),
    Panel(
        _ENGINE,
        "Prefix-cache token hit ratio",
        (
            (
                f"{_rate('harness_engine_prefix_cache_hit_tokens_total', 'job')} / "
                f"{_rate('harness_engine_prefix_cache_query_tokens_total', 'job')}",
                "hit ratio",
            ),
        ),
        "percentunit",
    ),
    Panel(
        _ENGINE,
        "Mean prefill and queue time",
        (
            (_mean("harness_engine_prefill_seconds", "job"), "prefill"),
            (_mean("harness_engine_queued_seconds", "job"), "queued"),
        ),
        "s",
    ),
    Panel(
        _ENGINE,
        "Preemptions per second",
        ((_rate("harness_engine_preemptions_total", "job"), "preemptions"),),
        "ops",
    ),
)


def grafana_dashboard(title: str = "LLM warmup harness", uid: str = "harness-cache") -> dict[str, Any]:
    """The dashboard JSON; raises :class:`ConfigError` if a panel queries a metric we do not expose."""
    known = exposed_metric_names()
    used = {m for p in PANELS for q, _ in p.queries for m in query_metrics(q)}
    unknown = sorted(used - known)
    if unknown:
        raise ConfigError(f"dashboard panels query metrics nobody exposes: {', '.join(unknown)}")
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    current_row = None
    col = 0
    for p in PANELS:
        row, panel_title, queries, unit, kind = p.row, p.title, p.queries, p.unit, p.kind
        if row != current_row:
            if col:
                y += 8
            panels.append(
                {
                    "type": "row",
                    "id": pid,
                    "title": row,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            pid += 1
            y += 1
            col = 0
            current_row = row
        panels.append(
            {
                "type": kind,
                "id": pid,
                "title": panel_title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * col, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
                if kind == "timeseries"
                else {},
                "targets": [
                    {
                        "refId": chr(ord("A") + i),
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        "expr": expr,
                        "legendFormat": legend,
                        **({"format": "heatmap"} if kind == "heatmap" else {}),
                    }
                    for i, (expr, legend) in enumerate(queries)
                ],
            }
        )
        pid += 1
        col += 1
        if col == 2:
            col = 0
            y += 8
    return {
        "uid": uid,
        "title": title,
        "tags": ["llm", "cache", "harness"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
                {
                    "name": "job",
                    "type": "query",
                    "label": "Job",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(harness_server_requests_total, job)",
                    "includeAll": True,
                    "allValue": ".*",
                    "multi": True,
                    "refresh": 2,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every query expression of a dashboard (panels and the job variable)."""
    out = [t["expr"] for p in dashboard.get("panels", []) for t in p.get("targets", [])]
    return out


# --------------------------------------------------------------------------- Istio


class Subset(StrictModel):
    """One DestinationRule subset: the pods whose labels match, and its share of user traffic."""

    name: str = Field(pattern=_DNS_LABEL)
    labels: dict[str, str]
    weight: int = Field(default=0, ge=0, le=100)


class IstioValues(StrictModel):
    """What the Istio templates are rendered with (``--values FILE.yaml`` or options)."""

    name: str = Field(default="llm-inference", pattern=_DNS_LABEL)
    namespace: str = Field(default="default", pattern=_DNS_LABEL)
    host: str = Field(min_length=1)
    """The service's host (``llm.default.svc.cluster.local``)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    header: str = PREHEAT
    header_value: str = PREHEAT_VALUE
    preheat: Subset = Field(default_factory=lambda: Subset(name="preheat", labels={"version": "preheat"}))
    ab: list[Subset] = Field(
        default_factory=lambda: [
            Subset(name="a", labels={"version": "a"}, weight=90),
            Subset(name="b", labels={"version": "b"}, weight=10),
        ]
    )
    timeout_s: float | None = Field(default=300.0, gt=0.0)
    """Route timeout (LLM streams are long); ``None``: Istio's default."""
    max_ejection_percent: int = Field(default=50, ge=0, le=100)

    @model_validator(mode="after")
    def _check(self) -> IstioValues:
        if not self.ab:
            raise ValueError("at least one A/B subset is needed")
        total = sum(s.weight for s in self.ab)
        if total != 100:
            raise ValueError(f"A/B weights must add up to 100, not {total}")
        names = [self.preheat.name, *(s.name for s in self.ab)]
        if len(set(names)) != len(names):
            raise ValueError(f"subset names must be unique: {names}")
        return self


def load_values(path: str | Path) -> dict[str, Any]:
    """A YAML/JSON mapping of :class:`IstioValues` fields."""
    from harness.common.io import read_yaml

    return read_yaml(path, expected="a mapping of Istio values")


def render_istio(values: IstioValues, templates: str | Path | None = None) -> dict[str, str]:
    """``{"virtualservice.yaml": …, "destinationrule.yaml": …}`` rendered from the templates."""
    import json

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    root = Path(templates) if templates is not None else TEMPLATES
    if not root.is_dir():
        raise ConfigError("Istio template directory not found", file=root)
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.FileSystemLoader(str(root)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    # A JSON scalar is a valid YAML scalar: values can never break out of their field.

    def as_scalar(value: object) -> str:
        return json.dumps(value, ensure_ascii=False)

    env.filters["q"] = as_scalar
    ctx = values.model_dump()
    out: dict[str, str] = {}
    for name in ("virtualservice.yaml", "destinationrule.yaml"):
        try:
            out[name] = env.get_template(name + ".j2").render(**ctx)
        except jinja2.TemplateError as exc:
            raise ConfigError(f"cannot render {name}: {exc}", file=root / (name + ".j2")) from None
    return out


def check_istio(docs: dict[str, str]) -> list[dict[str, Any]]:
    """Parse rendered YAML and check the fields Istio needs; returns the parsed documents."""
    import yaml

    parsed: list[dict[str, Any]] = []
    for name, text in docs.items():
        for doc in yaml.safe_load_all(text):
            if not isinstance(doc, dict):
                continue
            for field in ("apiVersion", "kind", "metadata", "spec"):
                if field not in doc:
                    raise ConfigError(f"rendered {name} lacks '{field}'", file=name, field=field)
            parsed.append(doc)
    return parsed


def write_outputs(outputs: dict[str, str], out_dir: str | Path) -> list[Path]:
    """Write rendered files atomically into ``out_dir``."""
    from harness.common.io import atomic_write

    paths: list[Path] = []
    for name, text in outputs.items():
        path = Path(out_dir) / name
        with atomic_write(path) as fh:
            fh.write(text)
        paths.append(path)
    return paths
