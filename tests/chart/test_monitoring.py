"""The chart's Prometheus and Grafana objects read the series the operator exports, in PromQL's shape.

No Prometheus or promtool runs here: the PrometheusRule is checked against the fields this chart sets
(``schemas.PROMETHEUS_RULE``), each expression's tokens, brackets, functions and range selectors against PromQL's
(``schemas.promql_shape``), and every metric it reads against what ``gym_operator.metrics`` registers; the dashboard
against Grafana's dashboard JSON structure (panels, grid positions, targets, template variables).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tests.chart import schemas

pytestmark = pytest.mark.k8s

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "dashboards" / "gym-checkpoint.json"
ON = {
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True, "checkpointIntervalSeconds": 1800, "missedIntervals": 4},
        "dashboard": {"enabled": True},
    }
}


def exported() -> set[str]:
    """Every series name the operator's registry exposes (histograms' _bucket/_sum/_count, counters' _total)."""
    pytest.importorskip("kopf")
    from gym_operator.metrics import OperatorMetrics

    names = set()
    for family in OperatorMetrics().registry.collect():
        names.add(family.name)
        names |= {sample.name for sample in family.samples}
        if family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_off_by_default(render: Any) -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert not [d for d in render() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]


def test_the_alert_rules_read_exported_series_in_promql_shape(render: Any) -> None:
    docs = render(ON)
    rule = of_kind(docs, "PrometheusRule")
    schemas.validate(rule)
    rules = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(rules) == {"GymCheckpointMissed", "GymCheckpointTransactionsFailing", "GymCheckpointOperatorNoLeader"}
    names = exported()
    for alert in rules.values():
        read = schemas.promql_shape(alert["expr"])
        assert read and set(read) <= names, (alert["alert"], read)
        assert 'release="demo"' in alert["expr"]
    missed = rules["GymCheckpointMissed"]["expr"]
    assert missed.endswith("> 7200")  # 4 intervals of 1800 s
    assert "gym_operator_last_successful_checkpoint_timestamp_seconds" in missed
    monitor = of_kind(docs, "ServiceMonitor")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    service = services["demo-gym-checkpoint-operator"]
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()


@pytest.mark.parametrize(
    "expr",
    [
        "sum by release (gym_operator_leader)",  # a label list needs brackets
        "summ(gym_operator_leader)",  # no such function
        'max(gym_operator_leader{release="demo"}',  # unclosed
        "rate([5m])",  # a range with no selector
        "gym_operator_leader > ;",
    ],
)
def test_the_promql_check_catches_a_malformed_expression(expr: str) -> None:
    with pytest.raises(AssertionError):
        schemas.promql_shape(expr)


def test_the_dashboard_is_grafana_json_over_exported_series(render: Any) -> None:
    config = next(
        d for d in render(ON) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "demo-gym-checkpoint-dashboard"
    )
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["gym-checkpoint.json"])
    assert dashboard == json.loads(DASHBOARD.read_text())
    assert {"uid", "title", "panels", "templating", "schemaVersion", "time"} <= set(dashboard)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "release"}
    names = exported()
    ids, titles, cells = set(), set(), set()
    for panel in dashboard["panels"]:
        assert panel["type"] in {"timeseries", "stat"} and panel["id"] not in ids
        ids.add(panel["id"])
        titles.add(panel["title"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0
        xs, ys = range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
        area = {(x, y) for x in xs for y in ys}
        assert not area & cells, f"panel {panel['title']} overlaps another"
        cells |= area
        assert panel["targets"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, used
            read = schemas.promql_shape(target["expr"].replace("$__rate_interval", "5m"))
            assert read and set(read) <= names, (panel["title"], read)
    assert {"Pause", "Bytes", "Published time", "Restore time", "Age of the last successful checkpoint"} <= titles
