"""The chart's Grafana dashboard (issue 31, item 5): shipped as a ConfigMap Grafana's sidecar
loads, behind a value; every panel's query parses (promtool) and names only series that
gpuwarden, kube-state-metrics or DCGM export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from gpuwarden.node.agent import AgentConfig, NodeAgent
from gpuwarden.node.fake import FakeNvml
from gpuwarden.node.metrics import agent_registry
from gpuwarden.node.procfs import ProcFs
from gpuwarden.webhook.metrics import Metrics

from .support import CHART, FULLNAME, NAMESPACE, template
from .test_promtool import rendered_groups, run_promtool

DASHBOARD = CHART / "files" / "dashboard.json"
# Grafana's own variables, given values that make each query plain PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1d", "$tenant": ".*"}
# kube-state-metrics' series (kube_*) and DCGM exporter's (DCGM_FI_*).
OTHER_EXPORTERS = re.compile(r"(kube_|DCGM_FI_)[A-Za-z0-9_]+")
PROMQL_WORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or"}
    | {"unless", "offset", "inf", "nan"}
)


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries() -> dict[str, list[str]]:
    """Panel title -> its queries (rows have none)."""
    return {
        panel["title"]: [target["expr"] for target in panel["targets"]]
        for panel in dashboard()["panels"]
        if panel.get("targets")
    }


def plain(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def series_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers left once strings, label matchers,
    ranges and grouping lists are removed, and not called as functions."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        after = text[match.end() :].lstrip()
        if not after.startswith("(") and match[0].lower() not in PROMQL_WORDS:
            names.add(match[0])
    return names


def exported(registry: CollectorRegistry) -> set[str]:
    """The series names a registry's families expose."""
    names = set()
    for family in registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
        }.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def gpuwarden_series() -> set[str]:
    agent = NodeAgent(AgentConfig(node_name="n"), FakeNvml(), None, ProcFs(Path("/nonexistent")))
    recorded = {
        rule["record"]
        for group in rendered_groups()
        for rule in group["rules"]  # type: ignore[attr-defined]
        if "record" in rule
    }
    return exported(Metrics().registry) | exported(agent_registry(agent)) | recorded


def test_the_dashboard_has_the_panels_the_issue_asks_for() -> None:
    titles = list(panel_queries())
    for wanted in (
        "GPUs allocated and busy per tenant",
        "Idle GPU-hours in the time range",
        "Admissions per tenant and profile",
        "Denials per tenant and profile",
        "Admission latency",
        "Cap violations",
        "Serving certificate expires in",
    ):
        assert wanted in titles


def test_every_query_parses(tmp_path: Path) -> None:
    queries = [plain(expr) for exprs in panel_queries().values() for expr in exprs]
    rules = [{"record": f"dashboard:query_{n}", "expr": expr} for n, expr in enumerate(queries)]
    (tmp_path / "dashboard.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    result = run_promtool("check", "rules", "dashboard.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_every_query_names_only_series_someone_exports() -> None:
    known = gpuwarden_series()
    assert "gpuwarden_admission_requests_total" in known  # the registries were read
    assert "gpuwarden_node_idle_actions_total" in known
    assert "gpuwarden:tenant_gpus_allocated" in known
    assert series_names('sum by (ns) (rate(a_total{x="b(c)"}[5m])) / b:c') == {"a_total", "b:c"}
    unknown = {
        (title, name)
        for title, exprs in panel_queries().items()
        for expr in exprs
        for name in series_names(plain(expr))
        if name not in known and not OTHER_EXPORTERS.fullmatch(name)
    }
    assert unknown == set()
    [tenant] = [v for v in dashboard()["templating"]["list"] if v["name"] == "tenant"]
    assert tenant["query"] == "label_values(gpuwarden:tenant_gpus_allocated, tenant)"


def test_the_chart_ships_it_for_grafanas_sidecar_only_when_asked() -> None:
    names = [cm["metadata"]["name"] for cm in template().all("ConfigMap")]
    assert f"{FULLNAME}-dashboard" not in names
    sets = {"monitoring.grafanaDashboard.enabled": "true"}
    shipped = template(sets=sets).one("ConfigMap", f"{FULLNAME}-dashboard")
    assert shipped["metadata"]["namespace"] == NAMESPACE
    assert shipped["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(shipped["data"]["gpuwarden.json"]) == dashboard()
    moved = template(sets={**sets, "monitoring.grafanaDashboard.namespace": "monitoring"}).one(
        "ConfigMap", f"{FULLNAME}-dashboard"
    )
    assert moved["metadata"]["namespace"] == "monitoring"
