"""The Grafana dashboard shipped in deploy/grafana (issue 31) queries only series that oriond and orion-controller
export: every metric name in its expressions is one of host_agent/agent_metrics.py's or controller/metrics.py's
(a counter with prometheus_client's `_total`), so a renamed metric cannot leave a panel silently empty."""
from __future__ import annotations

import json
import re

from tests.processes import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "orion-vgpu.json"
SOURCES = (REPO / "host_agent" / "agent_metrics.py", REPO / "controller" / "metrics.py")


def exported() -> set[str]:
    """The series names the two programs' sources declare."""
    names: set[str] = set()
    for source in SOURCES:
        text = source.read_text()
        for kind, name in re.findall(r'\b(Counter|Gauge|CounterMetricFamily|GaugeMetricFamily)\(\s*"(orion_\w+)"',
                                     text):
            names.add(f"{name}_total" if kind.startswith("Counter") else name)
    return names


def expressions(node: object) -> list[str]:
    if isinstance(node, dict):
        return [node["expr"]] if "expr" in node else [e for value in node.values() for e in expressions(value)]
    if isinstance(node, list):
        return [e for value in node for e in expressions(value)]
    return []


def test_every_panel_queries_a_series_the_programs_export() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = expressions(dashboard["panels"])
    assert len(exprs) >= 8
    names = exported()
    assert {"orion_sessions", "orion_records_total", "orion_controller_etcd_up"} <= names  # the reading works
    queried = {name for expr in exprs for name in re.findall(r"\borion_\w+", expr)}
    assert queried <= names, f"queried but not exported: {sorted(queried - names)}"
    assert any(name.startswith("orion_controller_") for name in queried)
    assert any(not name.startswith("orion_controller_") for name in queried)  # both programs' panels
