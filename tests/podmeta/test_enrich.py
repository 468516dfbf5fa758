"""enrich(): pod facts onto discovered containers (pure; pod objects from captured fixtures)."""

from __future__ import annotations

import hashlib
import json

import pytest
from podmeta_api import pod, pod_list

from agent.config import parse_config
from agent.discover.podmeta import (EnrichOptions, PodInfo, container_id, enrich, options_from_config,
                           parse_pod, parse_pod_list)
from perfbalance.errors import ParseError
from perfbalance.model import Container

WEB_UID = "3f2b6c1e-8a4d-4b7e-9c15-2d6e0a1b7f93"
PG_UID = "a9e04c27-51b3-4f0d-8e62-7b3c9d18e4f5"
KATA_UID = "c4d81f0a-6e2b-4a97-b3d5-19f0e7a6c2b8"
VIRT_UID = "e7b3a915-0c4f-4d2e-8a61-5f9c3b2d7e40"


def cid(name: str, runtime: str) -> str:
    """The ids the fixtures were written with (sha256 of name + runtime)."""
    return hashlib.sha256((name + runtime).encode()).hexdigest()


def found(uid: str, name: str, runtime: str = "containerd", *, qos: str = "burstable") -> Container:
    """A container as discovery builds it from cgroups: ids, QoS, no names."""
    return Container(id=cid(name, runtime), pod_uid=uid, qos=qos,
                     runtime="crio" if runtime == "cri-o" else runtime,
                     cgroup=f"kubepods.slice/pod{uid}/{cid(name, runtime)}")


@pytest.fixture
def pods() -> dict[str, PodInfo]:
    return dict(parse_pod_list(pod_list(), source="fixture").pods)


def test_burstable_containerd_container_gets_names_namespace_and_annotations(pods):
    (c,) = enrich([found(WEB_UID, "nginx")], pods)
    assert (c.namespace, c.pod, c.name) == ("shop", "web-7d9f8b6c5-x2k4p", "nginx")
    assert c.annotations == {"rdt.perfbalance.io/class": "gold", "perfbalance.io/profile": "latency"}
    assert c.sandbox == ""


def test_crio_container_id_matched_without_its_scheme(pods):
    (c,) = enrich([found(PG_UID, "postgres", "cri-o", qos="guaranteed")], pods)
    assert (c.namespace, c.pod, c.name) == ("db", "postgres-0", "postgres")
    assert c.annotations == {"rdt.perfbalance.io/class.container.postgres": "silver"}


def test_init_container_named_from_init_container_statuses(pods):
    (c,) = enrich([found(WEB_UID, "init-config")], pods)
    assert c.name == "init-config"


def test_ephemeral_container_named_from_ephemeral_container_statuses():
    raw = pod("burstable-containerd")
    raw["status"]["ephemeralContainerStatuses"] = [
        {"name": "debugger-x7", "containerID": "containerd://" + "e" * 64, "state": {"running": {}}}]
    pods = {WEB_UID: parse_pod(raw)}
    (c,) = enrich([Container(id="e" * 64, pod_uid=WEB_UID, cgroup="x", qos="burstable")], pods)
    assert c.name == "debugger-x7"


def test_kata_runtime_class_marks_the_sandbox(pods):
    (c,) = enrich([found(KATA_UID, "worker")], pods)
    assert (c.sandbox, c.namespace, c.name) == ("kata", "sandboxed", "worker")


def test_kata_pattern_is_configurable(pods):
    (c,) = enrich([found(KATA_UID, "worker")], pods,
                  options=EnrichOptions(kata_runtime_classes="^gvisor$"))
    assert c.sandbox == ""


def test_kubevirt_virt_launcher_label_marks_every_container_of_the_pod(pods):
    out = enrich([found(VIRT_UID, "compute"), found(VIRT_UID, "guest-console-log")], pods)
    assert [(c.name, c.sandbox) for c in out] == [("compute", "kubevirt"), ("guest-console-log", "kubevirt")]


def test_unknown_pod_leaves_the_container_unchanged(pods):
    c = found("00000000-1111-2222-3333-444444444444", "nginx")
    assert enrich([c], pods) == [c]


def test_container_without_pod_uid_is_unchanged(pods):
    c = Container(id="perfbalance-demo:avx", name="avx", cgroup="perfbalance-demo/avx")
    assert enrich([c], pods) == [c]


def test_container_missing_from_statuses_still_gets_pod_facts(pods):
    c = Container(id="f" * 64, pod_uid=WEB_UID, cgroup="x", qos="burstable")
    (out,) = enrich([c], pods)
    assert (out.pod, out.namespace, out.name) == ("web-7d9f8b6c5-x2k4p", "shop", "")


def test_qos_taken_from_status_only_when_the_cgroup_path_did_not_give_it(pods):
    unknown, known = found(PG_UID, "postgres", "cri-o", qos="unknown"), found(WEB_UID, "nginx", qos="besteffort")
    a, b = enrich([unknown, known], pods)
    assert (a.qos, b.qos) == ("guaranteed", "besteffort")


def test_only_annotations_with_allowed_prefixes_are_copied(pods):
    (c,) = enrich([found(VIRT_UID, "compute")], pods)
    assert c.annotations == {}  # kubevirt.io/*, kubectl.kubernetes.io/* are not ours


def test_annotation_value_over_the_limit_is_dropped_not_cut(pods):
    (c,) = enrich([found(WEB_UID, "nginx")], pods, options=EnrichOptions(max_annotation_value_bytes=4))
    assert c.annotations == {"rdt.perfbalance.io/class": "gold"}  # "latency" (7 bytes) is too long


def test_annotation_count_is_bounded():
    raw = pod("burstable-containerd")
    raw["metadata"]["annotations"] = {f"perfbalance.io/k{i:03d}": "v" for i in range(500)}
    (c,) = enrich([found(WEB_UID, "nginx")], {WEB_UID: parse_pod(raw)},
                  options=EnrichOptions(max_annotations=8))
    assert len(c.annotations) == 8


def test_custom_resctrl_annotation_is_always_let_through():
    config = parse_config("resctrl: {annotation: example.com/rdt}\nkubernetes: {annotation_prefixes: [perfbalance.io/]}",
                          source="t", node="n")
    raw = pod("burstable-containerd")
    raw["metadata"]["annotations"]["example.com/rdt"] = "gold"
    (c,) = enrich([found(WEB_UID, "nginx")], {WEB_UID: parse_pod(raw)}, options=options_from_config(config))
    assert c.annotations == {"example.com/rdt": "gold", "perfbalance.io/profile": "latency"}


def test_static_pod_found_by_its_mirror_annotation():
    raw = pod("guaranteed-crio")
    raw["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "0f3c6b7e2d9a41c58e7b6a5d4c3b2a19"
    body = json.dumps({"kind": "PodList", "items": [raw]}).encode()
    pods = parse_pod_list(body, source="t").pods
    (c,) = enrich([Container(id="1", pod_uid="0f3c6b7e2d9a41c58e7b6a5d4c3b2a19", cgroup="x")], pods)
    assert c.pod == "postgres-0"


def test_container_id_schemes():
    assert [container_id(s) for s in ("containerd://ab", "cri-o://cd", "docker://ef", "gh")] == ["ab", "cd", "ef", "gh"]


def test_pod_without_uid_is_skipped_with_a_reason():
    raw = pod("kata-qemu")
    del raw["metadata"]["uid"]
    body = json.dumps({"kind": "PodList", "items": [raw, pod("guaranteed-crio")]}).encode()
    got = parse_pod_list(body, source="t")
    assert set(got.pods) == {PG_UID}
    assert "uid" in got.skipped[0] and "missing" in got.skipped[0]


def test_pod_list_that_is_not_json_is_a_parse_error():
    with pytest.raises(ParseError, match="not JSON"):
        parse_pod_list(b"<html>oops</html>", source="t")
