"""Grafana and Istio outputs parse and carry what they must; every panel queries a metric we expose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.analysis.deploy import (
    PANELS,
    IstioValues,
    Panel,
    check_istio,
    dashboard_queries,
    exposed_metric_names,
    grafana_dashboard,
    query_metrics,
    render_istio,
)
from harness.common.errors import ConfigError
from harness.common.headers import PREHEAT


def test_every_panel_queries_metrics_that_exist() -> None:
    dash = json.loads(json.dumps(grafana_dashboard()))  # JSON-serializable as written
    known = exposed_metric_names()
    # What the server really exposes, read from the live classes, not a list kept by hand.
    assert {"cache_hit_rate", "cache_fill_rate", "cache_thermal_drift", "cache_evictions_total"} <= known
    assert {"harness_server_ttft_seconds_sum", "harness_engine_kv_usage_ratio"} <= known
    queries = dashboard_queries(dash)
    assert len(queries) >= len(PANELS)
    for q in queries:
        used = query_metrics(q)
        assert used, q
        assert used <= known, (q, used - known)
    for fam in ("cache_hit_rate", "cache_fill_rate", "cache_thermal_drift"):
        assert any(fam in q for q in queries)
    for p in dash["panels"]:
        assert {"type", "id", "title", "gridPos"} <= set(p)
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "job"}
    assert not any("histogram_quantile" in q for q in queries)


def test_a_panel_on_a_missing_metric_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.analysis import deploy

    assert query_metrics('rate(cache_hitz_total{job=~"$job"}[5m]) / cache_hit_rate{tier="l1"}') == {
        "cache_hitz_total",
        "cache_hit_rate",
    }
    bad = (*PANELS, Panel("Response cache", "typo", (('cache_hitz_total{job=~"$job"}', "x"),), "short"))
    monkeypatch.setattr(deploy, "PANELS", bad)
    with pytest.raises(ConfigError, match="cache_hitz_total"):
        deploy.grafana_dashboard()


def _docs(values: IstioValues) -> dict[str, dict]:
    parsed = check_istio(render_istio(values))
    return {d["kind"]: d for d in parsed}


def test_istio_routes_preheat_by_header_and_splits_ab() -> None:
    docs = _docs(IstioValues(host="llm.prod.svc.cluster.local", namespace="prod", port=8000))
    vs, dr = docs["VirtualService"], docs["DestinationRule"]
    assert vs["apiVersion"].startswith("networking.istio.io/") and dr["apiVersion"] == vs["apiVersion"]
    assert vs["metadata"] == {
        "name": "llm-inference",
        "namespace": "prod",
        "labels": {"app.kubernetes.io/managed-by": "harness"},
    }
    assert vs["spec"]["hosts"] == ["llm.prod.svc.cluster.local"]
    preheat, ab = vs["spec"]["http"]
    assert preheat["match"] == [{"headers": {PREHEAT: {"exact": "preheat"}}}]
    assert [r["destination"]["subset"] for r in preheat["route"]] == ["preheat"]
    assert "match" not in ab  # everything else
    assert [(r["destination"]["subset"], r["weight"]) for r in ab["route"]] == [("a", 90), ("b", 10)]
    assert all(r["destination"]["port"]["number"] == 8000 for r in ab["route"])
    assert dr["spec"]["host"] == vs["spec"]["hosts"][0]
    subsets = {s["name"]: s["labels"] for s in dr["spec"]["subsets"]}
    assert subsets == {"preheat": {"version": "preheat"}, "a": {"version": "a"}, "b": {"version": "b"}}
    routed = {r["destination"]["subset"] for rule in vs["spec"]["http"] for r in rule["route"]}
    assert routed == set(subsets)


def test_istio_values_are_checked_and_cannot_inject_yaml() -> None:
    with pytest.raises(ValueError, match="add up to 100"):
        IstioValues(host="h", ab=[{"name": "a", "labels": {"v": "a"}, "weight": 60}])
    with pytest.raises(ValueError, match="unique"):
        IstioValues(host="h", ab=[{"name": "preheat", "labels": {"v": "a"}, "weight": 100}])
    with pytest.raises(ValueError):
        IstioValues(host="h", name="Not_A_DNS_Label")
    nasty = 'llm"\n  evil: true\n# '
    docs = _docs(IstioValues(host=nasty, preheat={"name": "warm", "labels": {"tier": "x: y\n- z"}}))
    vs = docs["VirtualService"]
    assert vs["spec"]["hosts"] == [nasty] and "evil" not in vs["spec"]
    assert {s["name"]: s["labels"] for s in docs["DestinationRule"]["spec"]["subsets"]}["warm"] == {
        "tier": "x: y\n- z"
    }


def test_rendered_files_are_yaml_documents(tmp_path: Path) -> None:
    from harness.analysis.deploy import write_outputs

    paths = write_outputs(render_istio(IstioValues(host="h", timeout_s=None)), tmp_path)
    for p in paths:
        doc = yaml.safe_load(p.read_text())
        assert {"apiVersion", "kind", "metadata", "spec"} <= set(doc)
        assert "timeout" not in json.dumps(doc)
