"""Prometheus and Grafana: `promtool check config` on the scrape config and its rules, and the Grafana
dashboard checked panel by panel: a datasource that is provisioned, targets whose PromQL parses (through
`promtool check rules`) and reads only metrics Quill exports."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, promql_quill_metrics, quill_sample_names, require_tool

PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), *args], capture_output=True, text=True, timeout=60)


def test_prometheus_config_and_rules_pass_promtool():
    result = promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_alert_rules_read_only_quill_metrics():
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert exprs
    for expr in exprs:
        assert promql_quill_metrics(expr) <= quill_sample_names(), expr


def test_promql_metric_extraction():
    assert promql_quill_metrics('rate(quill_a_total{model=~"quill_b"}[1m]) / quill_c') == {"quill_a_total", "quill_c"}


# ---- Grafana ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def datasource_uids() -> set[str]:
    uids = set()
    for path in (GRAFANA / "provisioning" / "datasources").glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["apiVersion"] == 1
        for ds in doc["datasources"]:
            assert ds["type"] == "prometheus" and ds["url"].startswith("http://prometheus:")
            uids.add(ds["uid"])
    return uids


def test_dashboard_provider_points_at_the_mounted_folder():
    (path,) = (GRAFANA / "provisioning" / "dashboards").glob("*.yaml")
    (provider,) = yaml.safe_load(path.read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards"
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    assert "../grafana/dashboards:/var/lib/grafana/dashboards:ro" in compose["services"]["grafana"]["volumes"]
    assert DASHBOARDS


def panels_of(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out += [panel] + panel.get("panels", [])  # rows may hold collapsed panels
    return [p for p in out if p["type"] != "row"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_panels(path, datasource_uids):
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    panels = panels_of(dashboard)
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    exported = quill_sample_names()
    for panel in panels:
        where = f"panel {panel['title']!r}"
        assert panel["datasource"]["type"] == "prometheus" and panel["datasource"]["uid"] in datasource_uids, where
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), where
        assert panel["targets"], f"{where} has no query"
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] in datasource_uids, where
            used = promql_quill_metrics(target["expr"])
            assert used, f"{where}: {target['expr']} reads no Quill metric"
            assert used <= exported, f"{where}: not exported by Quill: {used - exported}"
    for variable in dashboard["templating"]["list"]:
        assert promql_quill_metrics(variable["definition"]) <= exported


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_covers_the_serving_signals(path):
    exprs = " ".join(t["expr"] for p in panels_of(json.loads(path.read_text())) for t in p["targets"])
    for metric in ("quill_requests_total", "quill_time_to_first_token_seconds_bucket",
                   "quill_inter_token_latency_seconds_bucket", "quill_num_requests_waiting",
                   "quill_cache_usage_ratio", "quill_generation_tokens_total"):
        assert metric in exprs, metric
    assert "histogram_quantile(0.95" in exprs and "histogram_quantile(0.99" in exprs


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_promql_parses(path, tmp_path):
    """Every query, with Grafana's variables filled in, as a recording rule: promtool parses each."""
    exprs = [t["expr"] for p in panels_of(json.loads(path.read_text())) for t in p["targets"]]
    grafana_vars = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h", "$model": ".*"}
    rules = []
    for n, expr in enumerate(exprs):
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"unknown Grafana variable in {expr}"
        rules.append({"record": f"dashboard:query_{n}", "expr": expr})
    rules_file = tmp_path / "dashboard-rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(rules_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(rf"SUCCESS: {len(rules)} rules found", result.stdout)
