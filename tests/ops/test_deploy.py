"""deploy/: manifests valid for Kubernetes, the config valid for the agent, the pieces consistent."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import ops_synth as s
import pytest
import yaml
from prometheus_client import generate_latest

from agent.config import parse_config
from agent.export.prometheus import make_registry
from agent.export.http import parse_listen
from ops_servers import PROMTOOL

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.30"
CRDS = {"ServiceMonitor", "PrometheusRule"}  # no schema in kubernetes-validate: structure checked below


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def docs() -> list[dict[str, Any]]:
    out = []
    for name in kustomization()["resources"]:
        out.extend(d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d)
    return out


def one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs() if d["kind"] == kind]
    return doc


def agent_container() -> dict[str, Any]:
    (c,) = one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c


def config_text() -> str:
    return one("ConfigMap")["data"]["config.yaml"]


def test_kustomization_lists_existing_files_and_everything_it_needs() -> None:
    k = kustomization()
    for name in k["resources"] + [f for g in k["configMapGenerator"] for f in g["files"]]:
        assert (DEPLOY / name).is_file(), name
    kinds = {d["kind"] for d in docs()}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet",
            "Service", "ServiceMonitor", "PrometheusRule"} <= kinds


@pytest.mark.parametrize("doc", [d for d in docs() if d["kind"] not in CRDS], ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_validates_against_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_operator_resources_have_the_expected_structure(kind: str) -> None:
    doc = one(kind)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["metadata"]["namespace"] == "perfbalance" and doc["metadata"]["name"] == "perfbalance"
    assert isinstance(doc["spec"], dict)


def test_servicemonitor_scrapes_the_service_port_by_name() -> None:
    sm, svc = one("ServiceMonitor"), one("Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    assert all(e["path"] == "/metrics" for e in sm["spec"]["endpoints"])


def test_service_selects_the_agent_and_keeps_not_ready_pods() -> None:
    svc, ds = one("Service"), one("DaemonSet")
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["publishNotReadyAddresses"] is True and svc["spec"]["clusterIP"] == "None"


def test_everything_lives_in_the_perfbalance_namespace() -> None:
    for d in docs():
        if d["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            assert d["metadata"]["namespace"] == "perfbalance", d["kind"]
    assert kustomization()["namespace"] == "perfbalance"


def test_rbac_only_reads_pods() -> None:
    (rule,) = one("ClusterRole")["rules"]
    assert rule["resources"] == ["pods"] and set(rule["verbs"]) == {"get", "list", "watch"}
    binding = one("ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == one("DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]


def test_daemonset_runs_on_every_node_with_host_pid_and_node_critical_priority() -> None:
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in spec["tolerations"]


def test_daemonset_drops_all_capabilities_and_justifies_each_added_one() -> None:
    sc = agent_container()["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["privileged"] is False
    text = (DEPLOY / "daemonset.yaml").read_text()
    for cap in sc["capabilities"]["add"]:
        m = re.search(rf"^\s*- {cap}\s+#\s*(\S.{{20,}})$", text, re.M)
        assert m, f"capability {cap} has no justification comment"
    assert "SYS_PTRACE" not in sc["capabilities"]["add"]


def test_daemonset_mounts_the_host_paths_it_needs() -> None:
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in agent_container()["volumeMounts"]}
    assert {"/sys/fs/cgroup", "/sys/fs/resctrl", "/sys/kernel/tracing", "/lib/modules", "/usr/src",
            "/var/lib/kubelet"} <= set(host.values())
    kubelet = next(n for n, p in host.items() if p == "/var/lib/kubelet")
    assert mounts[kubelet]["readOnly"] is True
    for name, path in host.items():
        if path in ("/sys/fs/cgroup", "/sys/fs/resctrl"):
            assert not mounts[name].get("readOnly", False), f"{path} must be writable"


def test_daemonset_probes_health_and_readiness_on_the_metrics_port() -> None:
    c = agent_container()
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]


def test_daemonset_passes_the_node_name() -> None:
    env = {e["name"]: e for e in agent_container()["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_config_mount_path_matches_the_agent_arguments() -> None:
    c = agent_container()
    config_arg = c["args"][c["args"].index("--config") + 1]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert config_arg == f"{mounts['config']}/config.yaml"


def test_config_is_valid_for_the_default_node_and_every_override() -> None:
    text = config_text()
    nodes = list(yaml.safe_load(text).get("nodes", {})) + ["some-other-node"]
    for node in nodes:
        parse_config(text, source="deploy/configmap.yaml", node=node)


def test_per_node_overrides_apply() -> None:
    cfg = parse_config(config_text(), source="deploy/configmap.yaml", node="example-gpu-node-1")
    assert cfg.rebalancer.enabled is False
    assert parse_config(config_text(), source="x", node="other").rebalancer.enabled is True


def test_config_paths_match_the_mounts() -> None:
    cfg = parse_config(config_text(), source="deploy/configmap.yaml", node="n")
    mounts = {m["mountPath"] for m in agent_container()["volumeMounts"]}
    for path in (cfg.host.cgroup_root, cfg.host.kubelet_root, cfg.host.tracefs_root, cfg.host.modules_root,
                 cfg.agent.run_dir, cfg.host.sysfs_root):
        assert path in mounts, path


def test_listen_port_matches_the_container_and_service_ports() -> None:
    cfg = parse_config(config_text(), source="deploy/configmap.yaml", node="n")
    port = parse_listen(cfg.metrics.listen)[1]
    assert {p["containerPort"] for p in agent_container()["ports"]} == {port}
    assert {p["port"] for p in one("Service")["spec"]["ports"]} == {port}


def test_containerfile_builds_on_debian_with_bcc() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert re.search(r"^FROM \S*debian:", text, re.M)
    assert "python3-bpfcc" in text and "--system-site-packages" in text


# -- Grafana ------------------------------------------------------------------------------------

def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana" / "perfbalance-dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def concrete(expr: str) -> str:
    return expr.replace("$instance", ".*").replace("$__rate_interval", "5m").replace("$__range", "1h")


def test_dashboard_panels_have_unique_ids_and_a_datasource_variable() -> None:
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and d["uid"]
    assert {v["name"] for v in d["templating"]["list"]} >= {"datasource", "instance"}


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")
def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr{i}", "expr": concrete(e)} for i, e in enumerate(dashboard_exprs())]}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(rules))
    done = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "r.yaml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_uses_only_metrics_the_exporter_emits() -> None:
    st = s.state()
    st.extra["mqtt"] = {"configured": 1}
    st.action_errors_total["EINVAL"] += 1
    st.collector_errors_total["cgroup"] += 1
    exposed = set(re.findall(r"^(perfbalance_[a-z0-9_]+)", generate_latest(make_registry(st, bandwidth_peak=1e10)).decode(), re.M))
    for expr in dashboard_exprs():
        for name in re.findall(r"\bperfbalance_[a-z0-9_]+", expr):
            assert name in exposed, name
