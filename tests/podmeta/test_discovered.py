"""From cgroups to named containers: discovery on a cgroup v2 tree, then enrich via the API."""

from __future__ import annotations

import hashlib
from pathlib import Path

from podmeta_api import NODE, FakeApi

from agent.discover.containers import discover
from agent.discover.podmeta import KubeClient, PodMetadata
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.model import KubeletState

CG = {"cgroup.procs": "", "cpu.weight": "100\n", "cpu.max": "max 100000\n",
      "memory.max": "max\n", "memory.current": "0\n", "cpuset.cpus.effective": "0-1\n",
      "cpuset.mems.effective": "0\n"}


def cid(name: str, runtime: str) -> str:
    return hashlib.sha256((name + runtime).encode()).hexdigest()


def mk(root: Path, rel: str) -> None:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    for name, text in CG.items():
        (d / name).write_text(text)


def tree(tmp: Path) -> Path:
    """systemd driver: a Burstable containerd pod, a Guaranteed CRI-O pod, a pod the API lacks."""
    root = tmp / "pbtest-podmeta-cg"
    mk(root, "")
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    web = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f2b6c1e_8a4d_4b7e_9c15_2d6e0a1b7f93.slice"
    pg = "kubepods.slice/kubepods-poda9e04c27_51b3_4f0d_8e62_7b3c9d18e4f5.slice"
    gone = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod99999999_8888_7777_6666_555555555555.slice"
    mk(root, f"{web}/cri-containerd-{cid('nginx', 'containerd')}.scope")
    mk(root, f"{web}/cri-containerd-{cid('metrics-sidecar', 'containerd')}.scope")
    mk(root, f"{pg}/crio-{cid('postgres', 'cri-o')}.scope")
    mk(root, f"{pg}/crio-conmon-{cid('postgres', 'cri-o')}.scope")
    mk(root, f"{gone}/cri-containerd-{'a' * 64}.scope")
    return root


def test_discovered_containers_get_their_kubernetes_names(api: FakeApi, client: KubeClient, tmp_path: Path):
    found = discover(Cgroupfs(root=str(tree(tmp_path))), kubernetes=True, globs=(), kubelet=KubeletState())
    assert all(c.namespace == "" for c in found)
    meta = PodMetadata(source=client, node=NODE)
    named = {(c.namespace, c.pod, c.name, c.qos) for c in meta.enrich(found)}
    assert named == {
        ("shop", "web-7d9f8b6c5-x2k4p", "nginx", "burstable"),
        ("shop", "web-7d9f8b6c5-x2k4p", "metrics-sidecar", "burstable"),
        ("db", "postgres-0", "postgres", "guaranteed"),
        ("", "", "", "besteffort"),  # its pod is not in the API's list: left as discovered
    }
    assert len(api.seen) == 1
