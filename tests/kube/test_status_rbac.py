"""The kustomize RBAC for control-plane status grants exactly the verbs the writer uses."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kube_api import NODE, KubeServer
from test_status_writer import move, status, writer

from agent.export.kubestatus import NodeWatch, StatusOptions

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPONENT = {"events": "status-events", "node_conditions": "status-node", "extended_resources": "status-node",
             "node_labels": "status-node-labels", "config_events": "status-config-events"}
Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def used(kube: KubeServer, tmp_path: Path, option: str) -> set[Grant]:
    """Every (group, resource, verb) the writer needs with `option` alone, over a scenario that
    takes every path: a first sync, a repeated move (series), a rejected then a good config."""
    w, clock = writer(kube, tmp_path, StatusOptions(**{option: True}, series_flush_seconds=1))
    for i, valid in enumerate([True, True, False, True]):
        w.offer(status(events=(move(),), config_valid=valid, config_error="" if valid else "c.yaml: a = 1: bad"))
        w.sync()
        clock.t += 100
    if option.startswith(("node_", "extended_")):  # the node options watch the Node too
        kube.store.watch.put("END")
        NodeWatch(transport=w.api, node=NODE, writer=w, timeout_seconds=5).run_once()
    out = set()
    for r in kube.store.seen:
        verb = {"GET": "get", "POST": "create", "PATCH": "patch", "DELETE": "delete"}[r.method]
        if r.path == "/api/v1/nodes":
            out.add(("", "nodes", "watch"))
        elif r.path.startswith("/apis/events.k8s.io/"):
            out.add(("events.k8s.io", "events", verb))
        else:
            out.add(("", "nodes/status" if r.path.endswith("/status") else "nodes", verb))
    return out


def granted(component: str) -> tuple[set[Grant], set[str]]:
    grants, kinds = set(), set()
    for doc in yaml.safe_load_all((DEPLOY / "components" / component / "rbac.yaml").read_text()):
        kinds.add(doc["kind"])
        for rule in doc.get("rules", []):
            grants |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return grants, kinds


@pytest.mark.parametrize("component", sorted(set(COMPONENT.values())))
def test_each_component_grants_exactly_what_its_options_use(kube: KubeServer, tmp_path: Path, component: str) -> None:
    need: set[Grant] = set()
    for option in [o for o, c in COMPONENT.items() if c == component]:
        kube.store.seen.clear()
        need |= used(kube, tmp_path, option)
    grants, _ = granted(component)
    assert need and grants == need


def test_config_events_are_namespaced_and_the_base_role_still_only_reads_pods() -> None:
    assert granted("status-config-events")[1] == {"Role", "RoleBinding"}
    base = [d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d["kind"] == "ClusterRole"]
    assert [r["resources"] for r in base[0]["rules"]] == [["pods"]]


def test_components_render_with_the_base(tmp_path: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (its kustomize renders the overlay)")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(DEPLOY, overlay)
    comps = ", ".join(f"{rel}/components/{c}" for c in sorted(set(COMPONENT.values())))
    (overlay / "kustomization.yaml").write_text(
        f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{rel}]\ncomponents: [{comps}]\n")
    done = subprocess.run(["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(overlay)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names = set(re.findall(r"name: (perfbalance-status-[a-z-]+)", done.stdout))
    assert names == {f"perfbalance-status-{c}" for c in ("events", "node", "node-labels", "config-events")}
