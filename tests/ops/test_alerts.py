"""Alert rules: promtool unit tests, the PrometheusRule twin, and names the exporter really emits."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import ops_synth as s
import pytest
import yaml
from prometheus_client import generate_latest

from agent.export.prometheus import make_registry
from ops_servers import PROMTOOL

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "alerts" / "perfbalance.rules.yaml"
PROMRULE = REPO / "deploy" / "prometheusrule.yaml"
UNIT_TESTS = Path(__file__).resolve().parent / "alerts_test.yaml"
pytestmark = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")
ALERTS = {"PerfbalanceRebalanceStorm", "PerfbalanceHighRollbackRate", "PerfbalanceAvx512Contamination",
          "PerfbalanceMemoryBandwidthSaturated", "PerfbalanceCollectorDown", "PerfbalanceConfigInvalid",
          "PerfbalanceClosidsNearlyExhausted", "PerfbalanceRmidsNearlyExhausted", "PerfbalanceAgentAbsent"}


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_rules_file_is_valid_for_prometheus() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass_as_committed() -> None:
    # What a Prometheus user runs: the committed file against the committed rules, unmodified
    # (promtool compares labels and rendered annotations).
    done = promtool("test", "rules", str(UNIT_TESTS.relative_to(REPO)), cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_firing_case_pins_its_annotations() -> None:
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for t in case["alert_rule_test"]:
            for alert in t["exp_alerts"]:
                assert {"summary", "description", "runbook"} <= set(alert.get("exp_annotations", {})), case["name"]


def test_every_alert_has_a_unit_test() -> None:
    tested = {t["alertname"] for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert {r["alert"] for r in rules()} == tested


def test_the_required_alerts_exist() -> None:
    assert ALERTS <= {r["alert"] for r in rules()}


def test_every_alert_has_severity_summary_and_runbook() -> None:
    for r in rules():
        assert r["labels"]["severity"] in {"info", "warning", "critical"}
        assert r["annotations"]["summary"] and r["annotations"]["runbook"].startswith("docs/alerts.md#")


def test_runbook_anchors_exist_in_docs() -> None:
    doc = (REPO / "docs" / "alerts.md").read_text()
    anchors = {"#" + re.sub(r"[^a-z0-9-]", "", h.lower().replace(" ", "-")) for h in re.findall(r"^#+ (.+)$", doc, re.M)}
    for r in rules():
        assert r["annotations"]["runbook"].removeprefix("docs/alerts.md") in anchors, r["alert"]


def test_prometheusrule_carries_the_same_groups() -> None:
    manifest = yaml.safe_load(PROMRULE.read_text())
    assert manifest["kind"] == "PrometheusRule" and manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_rules_use_only_metrics_the_exporter_emits() -> None:
    st = s.state()
    st.extra["mqtt"] = {"configured": 1}
    st.collector_errors_total["resctrl"] += 1
    exposed = set(re.findall(r"^(perfbalance_[a-z0-9_]+)", generate_latest(make_registry(st, bandwidth_peak=1e10)).decode(), re.M))
    for r in rules():
        for name in re.findall(r"\bperfbalance_[a-z0-9_]+", r["expr"]):
            assert name in exposed, f"{r['alert']} uses {name}"


def test_prometheusrule_is_generated_from_the_rules_file() -> None:
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_prometheusrule", REPO / "deploy" / "alerts" / "make_prometheusrule.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert PROMRULE.read_text() == module.render(RULES.read_text())
