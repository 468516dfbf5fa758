"""The class parts of NRI placement that need no runtime: the QoS of a pod being created, the
container the class rules see at CreateContainer, and that a failing class decision never fails
a container's creation or start."""

from __future__ import annotations

import logging

import pytest

from agent.discover.podmeta import EnrichOptions
from agent.nri.metadata import container_of, qos_of
from agent.nri.model import Ctr, Placement, Pod, View
from agent.nri.placement import AdmitPolicy
from perfbalance.model import KubeletState

UID = "0f4c2a3e-1b2d-4e5f-8a9b-0c1d2e3f4a5b"


@pytest.mark.parametrize("parent, qos", [
    (f"/kubepods/burstable/pod{UID}", "burstable"),
    (f"/kubepods/besteffort/pod{UID}", "besteffort"),
    (f"/kubepods/pod{UID}", "guaranteed"),
    (f"kubepods-burstable-pod{UID.replace('-', '_')}.slice", "burstable"),
    (f"kubepods-pod{UID.replace('-', '_')}.slice", "guaranteed"),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice",
     "besteffort"),
    ("/some/other/parent", "unknown"),
    ("", "unknown"),
])
def test_qos_of_the_pods_cgroup_parent(parent: str, qos: str) -> None:
    assert qos_of(parent) == qos


def pod(**annotations: str) -> Pod:
    return Pod(id="sandbox", name="web", uid=UID.upper(), namespace="shop", annotations=annotations,
               cgroup_parent=f"/x/kubepods/besteffort/pod{UID}")


def test_the_container_at_creation_has_its_pods_class_annotations_names_and_qos() -> None:
    options = EnrichOptions(annotation_prefixes=("blockio.perfbalance.io/class",))
    c = container_of(pod(**{"blockio.perfbalance.io/class": "slow", "other.io/x": "y"}),
                     Ctr(id="c1", pod_id="sandbox", name="main"), options)
    assert (c.id, c.name, c.pod, c.namespace, c.qos, c.pod_uid) == ("c1", "main", "web", "shop", "besteffort", UID)
    assert dict(c.annotations) == {"blockio.perfbalance.io/class": "slow"}  # only allowed keys


def test_handed_over_classes_are_set_without_a_snapshot_and_none_otherwise() -> None:
    policy = AdmitPolicy(snapshot=lambda: None, kubelet=KubeletState,
                         classes=lambda p, c: {"blockio": "slow"} if p.annotations else {})
    ctr = Ctr(id="c1", pod_id="sandbox", name="main")
    assert policy.on_create(pod(k="v"), ctr, View()) == Placement(blockio_class="slow")
    assert policy.on_create(pod(), ctr, View()) is None  # control: nothing to hand over


def test_a_failing_class_decision_fails_neither_creation_nor_start(caplog: pytest.LogCaptureFixture) -> None:
    def boom(p: Pod, c: Ctr) -> dict[str, str]:
        raise RuntimeError("bug")

    policy = AdmitPolicy(snapshot=lambda: None, kubelet=KubeletState, classes=boom,
                         started=lambda p, c: boom(p, c) and None)
    ctr = Ctr(id="c1", pod_id="sandbox", name="main")
    with caplog.at_level(logging.ERROR):
        assert policy.on_create(pod(), ctr, View()) is None
        policy.on_start(pod(), ctr)
    assert "left to the agent" in caplog.text and "left to the next cycle" in caplog.text


@pytest.fixture
def node(tmp_path):  # type: ignore[no-untyped-def]
    """A ClassNode with block-I/O classes slow and bulk on a cgroup-v2 root offering io."""
    from agent.act.classnode import ClassNode
    from agent.config import parse_config
    from perfbalance.cgroupfs import Cgroupfs
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset io memory\n")
    cfg = parse_config(f"agent: {{run_dir: {tmp_path}}}\nblockio:\n  classes:\n"
                       "    slow: {devices: [{path: /dev/vda, write_bps: 1000}]}\n"
                       "    bulk: {devices: [{path: /dev/vda, read_bps: 1000}]}\n"
                       "  qos_classes: {besteffort: bulk}\n", source="t.yaml", node="n")
    return ClassNode(cfg, Cgroupfs(root=str(root)))


def test_only_classes_the_runtime_knows_are_handed_over(node) -> None:  # type: ignore[no-untyped-def]
    options = EnrichOptions(annotation_prefixes=("blockio.perfbalance.io/class",))
    ctr = Ctr(id="c1", pod_id="sandbox", name="main")
    slow = container_of(pod(**{"blockio.perfbalance.io/class": "slow"}), ctr, options)
    plain = container_of(pod(), ctr, options)  # besteffort: the QoS default "bulk"
    assert node.at_creation(slow, {"blockio": ("slow",)}) == {"blockio": "slow"}
    assert node.at_creation(plain, {"blockio": ("slow",)}) == {}  # "bulk" not listed: the agent's
    assert node.at_creation(plain, {"blockio": ("slow", "bulk")}) == {"blockio": "bulk"}
    assert node.at_creation(slow, {"blockio": ()}) == {}  # nothing listed: nothing handed over
    assert node.at_creation(slow, {"rdt": ("slow",)}) == {}  # RDT not in use here
    bad = container_of(pod(**{"blockio.perfbalance.io/class": "gold"}), ctr, options)
    assert node.at_creation(bad, {"blockio": ("gold",)}) == {}  # not a configured class: never sent


def test_a_container_started_before_the_first_discovery_waits_for_it(node) -> None:  # type: ignore[no-untyped-def]
    """The previous run's checkpoint is taken back at the first discovery; admitting (and
    saving) before would overwrite it."""
    from perfbalance.model import Container
    assert not node.ready
    assert node.admit([Container(id="c1", cgroup="gone/c1", qos="besteffort")]) == []
    assert node.manager.class_of("blockio", "c1") == ""


def test_runtime_names_that_name_no_class_are_said_once(node) -> None:  # type: ignore[no-untyped-def]
    assert node.unknown_names({"blockio": ("slow",), "rdt": ()}) == []  # control
    (line,) = node.unknown_names({"blockio": ("slow", "gld"), "rdt": ()})
    assert line == "blockio_classes: gld never handed to the runtime (configured: bulk, slow)"
    (line,) = node.unknown_names({"rdt": ("gold",)})
    assert line.startswith("rdt_classes: gold never handed to the runtime (rdt classes not in use")


def test_only_containers_a_class_rule_concerns_are_looked_up_at_start(tmp_path, node) -> None:  # type: ignore[no-untyped-def]
    options = EnrichOptions(annotation_prefixes=("blockio.perfbalance.io/class",))
    ctr = Ctr(id="c1", pod_id="sandbox", name="main")
    assert node.wants_class(container_of(pod(), ctr, options))  # besteffort: QoS default "bulk"
    burstable = Pod(id="sandbox", name="web", uid=UID, namespace="shop", cgroup_parent=f"/kubepods/burstable/pod{UID}")
    assert not node.wants_class(container_of(burstable, ctr, options))  # no rule for it
    bad = Pod(id="sandbox", name="web", uid=UID, namespace="shop", cgroup_parent=f"/kubepods/burstable/pod{UID}",
              annotations={"blockio.perfbalance.io/class": "gold"})
    assert node.wants_class(container_of(bad, ctr, options))  # its bad annotation is reported
