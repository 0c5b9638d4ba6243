"""The shipped Grafana dashboard and Prometheus alerting rules (``deploy/``): every metric
they query is one ``/metrics`` really exports, the dashboard is importable Grafana JSON, and
the rules load and fire as their unit test says (with ``promtool``, which ``make test``
installs with ``scripts/ensure-promtool``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from poisonq import Broker, ManualClock
from tests.server.conftest import AUTH, record

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "poisonq.json"
RULES = DEPLOY / "prometheus" / "poisonq-alerts.yml"
RULES_TEST = DEPLOY / "prometheus" / "poisonq-alerts.test.yml"

# PromQL words that are not metric names: aggregations, functions (followed by "(" anyway),
# and the keywords that stand alone.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
_KEYWORDS |= {"and", "or", "unless"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects, read loosely: strings, label matchers,
    ranges and grouping clauses are cut out, and what is left that is a name and not a
    function call or a keyword is a metric."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = re.findall(r"(?<![\w$])([a-zA-Z_:][\w:]*)\b(?!\s*\()", expr)
    return {name for name in names if name not in _KEYWORDS}


def test_metric_names_are_read_loosely_but_right() -> None:
    expr = (
        'sum by (queue, reason) (rate(poisonq_a_total{queue=~"$queue", x="by (y)"}[5m]))'
        " / on (queue) group_left (subqueue) poisonq_b > 0 and poisonq_c offset 5m"
    )
    assert metric_names(expr) == {"poisonq_a_total", "poisonq_b", "poisonq_c"}


def exported_metrics(client: TestClient) -> set[str]:
    """The sample names of a real scrape of a store with a queue and dead letters."""
    answer = client.get("/metrics", headers=AUTH)
    assert answer.status_code == 200
    return {s.name for f in text_string_to_metric_families(answer.text) for s in f.samples}


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_metric_the_dashboard_and_alerts_query_is_exported(
    client: TestClient, broker: Broker, clock: ManualClock, dead: dict[str, list[int]]
) -> None:
    record(broker, clock, "orders", "nightly", [2])  # a pipeline's metrics need a batch
    exported = exported_metrics(client)
    exprs = dashboard_exprs() + [rule["expr"] for rule in rules()]
    for expr in exprs:
        used = metric_names(expr)
        assert used, f"no metric found in {expr!r}"
        assert used <= exported, f"{sorted(used - exported)} not in /metrics, used by {expr!r}"
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    for variable in variables:
        queried = re.findall(r"label_values\((\w+)", variable["definition"])
        assert set(queried) <= exported, variable["definition"]


def test_the_dashboard_is_importable_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    # Imported through Grafana's "Import dashboard", which asks for this data source.
    [source] = dashboard["__inputs"]
    assert (source["type"], source["pluginId"]) == ("datasource", "prometheus")
    data_source = {"type": "prometheus", "uid": f"${{{source['name']}}}"}
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    for panel in panels:
        assert panel["type"] in {"timeseries", "stat", "table"} and panel["title"], panel
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["datasource"] == data_source, panel["title"]
        targets = panel["targets"]
        assert targets, f"panel {panel['title']!r} queries nothing"
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        assert all(t["expr"].strip() for t in targets), panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"] == data_source


def test_the_rules_file_has_the_alerts_it_promises() -> None:
    found = {rule["alert"]: rule for rule in rules()}
    expected = {
        "PoisonqDeadLetterQueueGrowing",
        "PoisonqQueueNotReceiving",
        "PoisonqLockExpiriesRising",
        "PoisonqPipelineStalled",
    }
    assert set(found) == expected
    for rule in found.values():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (scripts/ensure-promtool installs it)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60
    )


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_the_alerts_fire_as_their_unit_test_says() -> None:
    tested = promtool("test", "rules", RULES_TEST.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
