"""The watch on this Node: what we wrote is written again as soon as it is lost; the watch
resumes after a clean end or a broken connection and starts over after 410 Gone."""

from __future__ import annotations

import copy
from pathlib import Path

from kube_api import NODE, KubeServer
from test_status_writer import ALL, status, writer

from agent.export.kubestatus import READY, NodeWatch


def setup(kube: KubeServer, tmp_path: Path) -> tuple[NodeWatch, object]:
    w, clock = writer(kube, tmp_path, ALL)
    w.offer(status())
    w.sync()
    return NodeWatch(transport=w.api, node=NODE, writer=w, timeout_seconds=5), clock


def modified(kube: KubeServer, drop: str = "") -> dict[str, object]:
    node = copy.deepcopy(kube.store.nodes[NODE])
    if drop == "resources":
        node["status"]["capacity"] = {k: v for k, v in node["status"]["capacity"].items() if "perfbalance" not in k}
    if drop == "condition":
        node["status"]["conditions"] = [c for c in node["status"]["conditions"] if c["type"] != READY]
    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 100)
    return {"type": "MODIFIED", "object": node}


def test_lost_extended_resources_are_written_again_at_once(kube: KubeServer, tmp_path: Path) -> None:
    watch, clock = setup(kube, tmp_path)
    writes = len(kube.store.seen)
    kube.store.watch.put(modified(kube))  # control: nothing of ours lost, nothing scheduled
    kube.store.watch.put(modified(kube, drop="resources"))  # e.g. the kubelet re-registered
    kube.store.watch.put("END")
    assert watch.run_once() == "closed"
    assert watch.stats["events"] == 2
    watch.writer.sync()  # same clock: only the watch can have made this sync write
    assert len(kube.store.seen) > writes
    assert kube.store.watch_queries[0]["fieldSelector"] == [f"metadata.name={NODE}"]


def test_an_unchanged_node_schedules_no_rewrite(kube: KubeServer, tmp_path: Path) -> None:
    watch, _ = setup(kube, tmp_path)
    writes = len(kube.store.seen)
    kube.store.watch.put(modified(kube))
    kube.store.watch.put("END")
    watch.run_once()
    watch.writer.sync()
    assert [r.path for r in kube.store.seen[writes:]] == [f"/api/v1/nodes/{NODE}", "/api/v1/nodes"]  # GET, watch


def test_a_broken_watch_resumes_from_the_last_resource_version(kube: KubeServer, tmp_path: Path) -> None:
    watch, _ = setup(kube, tmp_path)
    ev = modified(kube, drop="condition")
    kube.store.watch.put(ev)
    kube.store.watch.put("BREAK")
    assert watch.run_once() == "broken" and watch.stats["broken"] == 1
    rv = ev["object"]["metadata"]["resourceVersion"]  # type: ignore[index]
    kube.store.watch.put("END")
    assert watch.run_once() == "closed"
    assert kube.store.watch_queries[-1]["resourceVersion"] == [rv]


def test_410_gone_starts_over_from_a_fresh_get(kube: KubeServer, tmp_path: Path) -> None:
    watch, _ = setup(kube, tmp_path)
    kube.store.watch.put("GONE")
    assert watch.run_once() == "gone" and watch.resource_version == ""
    gets = sum(1 for r in kube.store.seen if r.path == f"/api/v1/nodes/{NODE}")
    kube.store.watch.put("END")
    watch.run_once()
    assert sum(1 for r in kube.store.seen if r.path == f"/api/v1/nodes/{NODE}") == gets + 1
    assert kube.store.watch_queries[-1]["resourceVersion"] == [kube.store.nodes[NODE]["metadata"]["resourceVersion"]]
