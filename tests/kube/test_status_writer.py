"""The status writer against the API stand-in: conditions, labels, extended resources, Events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kube_api import NODE, Fault, KubeServer

from agent.export.kubestatus import (
    CONFIG_VALID, READY, ClientTransport, EventAggregator, EventSpec, StatusInput, StatusOptions, StatusWriter,
    node_facts,
)
from agent.discover.podmeta import ApiEndpoint, KubeClient


class Clock:
    def __init__(self) -> None:
        self.t = 1_780_000_000.0

    def __call__(self) -> float:
        return self.t


ALL = StatusOptions(events=True, node_conditions=True, node_labels=True, extended_resources=True, config_events=True,
                    series_flush_seconds=30.0)
FACTS = node_facts(license_loss=0.2, avx512=True, rdt=True, rdt_classes=["gold", "bronze"], blockio_classes=[],
                   mode="cgroupfs", closids_free=14, island_cpus=6)
POD = {"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "u-1"}


def status(**over: Any) -> StatusInput:
    base: dict[str, Any] = dict(time=1.0, cycle=1, ready=True, ready_reason="CyclesRunning", ready_message="cycle 1",
                                config_valid=True, config_error="", facts=FACTS, events=())
    return StatusInput(**{**base, **over})


def move(reason: str = "MovedCPUs", pod: dict[str, str] = POD, note: str = "cpuset web: 0-3 -> 4-7") -> EventSpec:
    return EventSpec(namespace=pod["namespace"], regarding=pod, reason=reason, action="Rebalance", note=note)


def writer(kube: KubeServer, tmp_path: Path, options: StatusOptions = ALL) -> tuple[StatusWriter, Clock]:
    token = tmp_path / "token"
    token.write_text("t0ken")
    client = KubeClient(endpoint=ApiEndpoint(host="127.0.0.1", port=kube.port), token_file=str(token),
                        ca_file=str(kube.ca_file), timeout_seconds=2.0)
    clock = Clock()
    return StatusWriter(transport=ClientTransport(client), node=NODE, options=options, clock=clock), clock


def conds(kube: KubeServer) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in kube.store.nodes[NODE]["status"]["conditions"]}


def test_merge_patch_replaces_lists_whole_in_the_stand_in(kube: KubeServer, tmp_path: Path) -> None:
    """Control for the next test: a naive merge patch of conditions wipes the kubelet's."""
    w, _ = writer(kube, tmp_path)
    code, _, _ = w.api.request("PATCH", f"/api/v1/nodes/{NODE}/status", content_type="application/merge-patch+json",
                               body={"status": {"conditions": [{"type": READY, "status": "True"}]}})
    assert code == 200 and set(conds(kube)) == {READY}


def test_conditions_are_set_beside_the_kubelets(kube: KubeServer, tmp_path: Path) -> None:
    w, _ = writer(kube, tmp_path)
    w.offer(status())
    w.sync()
    c = conds(kube)
    assert {"Ready", "MemoryPressure", READY, CONFIG_VALID} <= set(c)
    assert c["Ready"]["reason"] == "KubeletReady"
    assert (c[READY]["status"], c[CONFIG_VALID]["status"], c[CONFIG_VALID]["reason"]) == ("True", "True", "ConfigLoaded")
    patches = [r for r in kube.store.seen if r.method == "PATCH" and r.path.endswith("/status")]
    assert patches[0].content_type == "application/merge-patch+json"
    assert patches[0].body["metadata"]["resourceVersion"] == "1"


def test_a_concurrent_kubelet_update_is_a_conflict_and_the_writer_reads_again(kube: KubeServer, tmp_path: Path) -> None:
    w, _ = writer(kube, tmp_path, StatusOptions(node_conditions=True))
    writes = []

    def kubelet_once(store: Any) -> None:
        if not writes:
            writes.append(1)
            store.kubelet_heartbeat()

    kube.store.after_node_get = kubelet_once
    w.offer(status())
    w.sync()
    codes = [(r.method, r.path.rsplit("/", 1)[-1]) for r in kube.store.seen]
    assert codes == [("GET", NODE), ("PATCH", "status"), ("GET", NODE), ("PATCH", "status")]
    assert w.stats["conflicts"] == 1 and w.last_error == ""
    assert conds(kube)["Ready"]["lastHeartbeatTime"] == "2026-12-01T10:05:00Z"  # the kubelet's write survived
    assert READY in conds(kube)


def test_a_rejected_config_is_a_condition_and_a_warning_on_the_configmap_until_a_good_one_loads(
        kube: KubeServer, tmp_path: Path) -> None:
    w, clock = writer(kube, tmp_path)
    error = "/etc/perfbalance/config.yaml: rebalancer.margin = -1: must be >= 0.0"
    w.offer(status(config_valid=False, config_error=error))
    w.sync()
    c = conds(kube)[CONFIG_VALID]
    assert c["status"] == "False" and c["reason"] == "ConfigRejected" and "rebalancer.margin = -1" in c["message"]
    (ev,) = kube.store.events_for("ConfigMap", "perfbalance-config")
    assert ev["type"] == "Warning" and ev["reason"] == "InvalidConfig" and "rebalancer.margin = -1" in ev["note"]
    assert ev["metadata"]["namespace"] == "perfbalance" and NODE in ev["note"]
    w.offer(status(config_valid=False, config_error=error))  # the same error again: nothing new
    clock.t += 1
    w.sync()
    assert len(kube.store.events_for("ConfigMap", "perfbalance-config")) == 1
    clock.t += 10
    w.offer(status())
    w.sync()
    assert kube.store.events_for("ConfigMap", "perfbalance-config") == []
    c2 = conds(kube)[CONFIG_VALID]
    assert c2["status"] == "True" and c2["lastTransitionTime"] != c["lastTransitionTime"]


def test_labels_annotations_and_extended_resources_describe_the_node(kube: KubeServer, tmp_path: Path) -> None:
    w, clock = writer(kube, tmp_path)
    w.offer(status())
    w.sync()
    node = kube.store.nodes[NODE]
    labels, ann, cap = node["metadata"]["labels"], node["metadata"]["annotations"], node["status"]["capacity"]
    assert labels["perfbalance.io/avx512-license-loss"] == "0.20" and labels["perfbalance.io/rdt"] == "true"
    assert labels["perfbalance.io/mode"] == "cgroupfs" and labels["kubernetes.io/hostname"] == NODE
    assert ann["perfbalance.io/rdt-classes"] == "bronze,gold" and "node.alpha.kubernetes.io/ttl" in ann
    assert cap["perfbalance.io/rdt-free-closids"] == "14" and cap["cpu"] == "4"
    assert node["status"]["allocatable"]["perfbalance.io/avx512-island-cpus"] == "6"
    fewer = node_facts(license_loss=0.0, avx512=False, rdt=False, rdt_classes=[], blockio_classes=[],
                       mode="nri", closids_free=None, island_cpus=0)
    clock.t += 1
    w.offer(status(facts=fewer))
    w.sync()
    node = kube.store.nodes[NODE]
    assert "perfbalance.io/rdt-free-closids" not in node["status"]["capacity"]
    assert node["metadata"]["labels"]["perfbalance.io/mode"] == "nri"


def test_unchanged_status_is_not_rewritten_until_the_resync(kube: KubeServer, tmp_path: Path) -> None:
    w, clock = writer(kube, tmp_path, StatusOptions(node_conditions=True, resync_seconds=60))
    w.offer(status())
    w.sync()
    n = len(kube.store.seen)
    clock.t += 10
    w.sync()
    assert len(kube.store.seen) == n
    clock.t += 60
    w.sync()
    assert len(kube.store.seen) == n + 2  # GET + PATCH: the heartbeat


def test_a_move_is_an_event_on_its_pod(kube: KubeServer, tmp_path: Path) -> None:
    w, _ = writer(kube, tmp_path, StatusOptions(events=True))
    w.offer(status(events=(move(),)))
    w.sync()
    (ev,) = kube.store.events_for("Pod", "web-1")
    assert ev["apiVersion"] == "events.k8s.io/v1" and ev["reason"] == "MovedCPUs" and ev["action"] == "Rebalance"
    assert ev["reportingController"] == "perfbalance.io/agent" and ev["reportingInstance"] == f"perfbalance-{NODE}"
    assert ev["regarding"]["uid"] == "u-1" and ev["note"] == "cpuset web: 0-3 -> 4-7"


def test_repeats_become_one_event_with_a_series(kube: KubeServer, tmp_path: Path) -> None:
    w, clock = writer(kube, tmp_path, StatusOptions(events=True, series_flush_seconds=30))
    for i in range(50):
        w.offer(status(events=(move(note=f"move {i}"),)))
        w.sync()
        clock.t += 1
    clock.t += 30
    w.sync()
    (ev,) = kube.store.events_for("Pod", "web-1")
    assert ev["series"]["count"] == 50
    posts = [r for r in kube.store.seen if r.method == "POST"]
    patches = [r for r in kube.store.seen if r.method == "PATCH"]
    assert len(posts) == 1 and 1 <= len(patches) <= 3
    other = move(reason="RolledBack")  # control: a different reason is its own Event
    w.offer(status(events=(other,)))
    w.sync()
    assert len(kube.store.events_for("Pod", "web-1")) == 2


def test_a_storm_on_one_object_is_cut_by_the_spam_filter() -> None:
    agg = EventAggregator(window=360.0)
    reasons = [f"Reason{i}" for i in range(40)]
    verdicts = [agg.admit(move(reason=r), 0.0) for r in reasons]
    assert verdicts.count("create") == 25 and verdicts.count("drop") == 15 and agg.dropped == 15
    assert agg.admit(move(reason="Later"), 299.0) == "drop"
    assert agg.admit(move(reason="Later"), 301.0) == "create"  # one token back after 5 minutes
    other = dict(POD, name="web-2", uid="u-2")
    assert agg.admit(move(pod=other), 0.0) == "create"  # per object: another pod is not limited


def test_429_waits_for_retry_after_and_loses_no_event(kube: KubeServer, tmp_path: Path) -> None:
    w, clock = writer(kube, tmp_path, StatusOptions(events=True))
    kube.store.faults.append(Fault(method="POST", path_contains="/events", status=429, headers={"Retry-After": "7"}))
    w.offer(status(events=(move(),)))
    w.sync()
    assert w.stats["throttled"] == 1 and kube.store.events == {}
    n = len(kube.store.seen)
    clock.t += 6
    w.sync()
    assert len(kube.store.seen) == n  # still waiting
    clock.t += 2
    w.sync()
    assert len(kube.store.events_for("Pod", "web-1")) == 1 and w.last_error == ""


@pytest.mark.parametrize("code", [500, 0])
def test_server_errors_and_broken_connections_back_off_exponentially(kube: KubeServer, tmp_path: Path, code: int) -> None:
    w, clock = writer(kube, tmp_path, StatusOptions(node_conditions=True))
    kube.store.faults += [Fault(method="GET", path_contains="/nodes/", status=code) for _ in range(3)]
    w.offer(status())
    waits = []
    for _ in range(3):
        w.sync()
        waits.append(w._not_before - clock.t)
        clock.t = w._not_before
    assert waits == [2.0, 4.0, 8.0] and w.last_error
    w.sync()
    assert READY in conds(kube) and w.last_error == ""


def test_422_is_logged_and_not_retried(kube: KubeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w, clock = writer(kube, tmp_path, StatusOptions(events=True))
    kube.store.faults.append(Fault(method="POST", path_contains="/events", status=422, message="note: Invalid value"))
    pod2 = dict(POD, name="web-2", uid="u-2")
    w.offer(status(events=(move(), move(pod=pod2))))
    w.sync()
    assert [e["regarding"]["name"] for e in kube.store.events.values()] == ["web-2"]
    clock.t += 600
    w.sync()
    assert len([r for r in kube.store.seen if r.method == "POST"]) == 2  # not retried
    assert "HTTP 422 note: Invalid value (not retried)" in caplog.text


def test_nothing_enabled_sends_nothing(kube: KubeServer, tmp_path: Path) -> None:
    w, _ = writer(kube, tmp_path, StatusOptions())
    w.offer(status(events=(move(),), config_valid=False, config_error="x"))
    w.sync()
    assert kube.store.seen == []
    json.dumps(kube.store.nodes)


def test_stopping_says_the_agent_is_not_ready(kube: KubeServer, tmp_path: Path) -> None:
    w, _ = writer(kube, tmp_path, StatusOptions(node_conditions=True))
    w.offer(status())
    w.sync()
    assert conds(kube)[READY]["status"] == "True"  # control
    w.stopping()
    w.sync()
    assert (conds(kube)[READY]["status"], conds(kube)[READY]["reason"]) == ("False", "AgentStopped")
