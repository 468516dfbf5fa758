"""The NRI plugin against a real containerd 1.7 (Debian 13's), driven through CRI like a kubelet.

The policy here is a fixed table (container name -> cpus) so that each test shows one protocol
behaviour; the agent's own placement policy is tested in test_placement_nri.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import pytest

from agent.nri.client import Backoff, NriClient
from agent.nri.model import Ctr, Placement, Pod, View

pytestmark = [pytest.mark.root, pytest.mark.slow]


class TablePolicy:
    def __init__(self, cpus: Mapping[str, str]) -> None:
        self.cpus = dict(cpus)
        self.synchronized: list[View] = []
        self.keep = False

    def on_synchronize(self, view: View) -> Mapping[str, Placement]:
        self.synchronized.append(view)
        return {}

    def on_create(self, pod: Pod, ctr: Ctr, view: View) -> Placement | None:
        return Placement(cpus=self.cpus[ctr.name]) if ctr.name in self.cpus else None

    def on_update(self, pod: Pod, ctr: Ctr, ours: Placement) -> Placement | None:
        return ours if self.keep else None

    def on_start(self, pod: Pod, ctr: Ctr) -> None:
        pass


def allowed(pid: int) -> str:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]
    raise AssertionError("no Cpus_allowed_list")


@pytest.fixture
def plugin(containerd) -> Iterator[tuple[NriClient, TablePolicy]]:  # type: ignore[no-untyped-def]
    policy = TablePolicy({})
    client = NriClient(socket_path=containerd.nri_socket, name="perfbalance", index="10", policy=policy,
                       backoff=Backoff(first=0.2, cap=1.0))
    client.start()
    try:
        assert client.wait_connected(30), client.status
        yield client, policy
    finally:
        client.stop()


def test_not_connected_before_start_says_cgroupfs(containerd) -> None:  # type: ignore[no-untyped-def]
    client = NriClient(socket_path=containerd.nri_socket, name="perfbalance", index="10", policy=TablePolicy({}))
    assert (client.status.path, client.status.connected, client.view) == ("cgroupfs", False, None)


def test_plugin_registers_and_synchronizes_existing_pods(containerd, kubelet) -> None:  # type: ignore[no-untyped-def]
    pod_id, cid, _ = kubelet.run("before-plugin", "app")
    policy = TablePolicy({})
    client = NriClient(socket_path=containerd.nri_socket, name="perfbalance", index="10", policy=policy)
    client.start()
    try:
        assert client.wait_connected(30), client.status
        assert client.status.path == "nri" and client.status.runtime.startswith("containerd 1.7")
        view = client.view
        assert view is not None and view.synchronized
        assert view.containers[cid].name == "app" and view.containers[cid].pod_id == pod_id
        assert view.pods[pod_id].name == "before-plugin" and view.pods[pod_id].namespace == "default"
        assert "never-created" not in {c.name for c in view.containers.values()}
    finally:
        client.stop()


def test_new_container_starts_with_the_cpuset_the_plugin_chose(plugin, kubelet) -> None:  # type: ignore[no-untyped-def]
    client, policy = plugin
    policy.cpus["pinned"] = "1"
    _, _, pid = kubelet.run("placed", "pinned")
    _, _, free_pid = kubelet.run("unplaced", "free")  # control: no placement -> the runtime's default
    assert allowed(pid) == "1"
    assert allowed(free_pid) == "0-1"


def test_move_goes_through_update_containers(plugin, kubelet) -> None:  # type: ignore[no-untyped-def]
    client, policy = plugin
    _, cid, pid = kubelet.run("mover", "app")
    assert allowed(pid) == "0-1"
    assert client.update({cid: Placement(cpus="0")}) == {}
    assert allowed(pid) == "0"
    assert client.view.containers[cid].cpus == "0"


def test_kubelet_update_of_another_container_does_not_undo_a_move(plugin, kubelet) -> None:  # type: ignore[no-untyped-def]
    client, _ = plugin
    _, moved, moved_pid = kubelet.run("moved", "app")
    _, other, other_pid = kubelet.run("other", "app")
    assert client.update({moved: Placement(cpus="1")}) == {}
    kubelet.update_cpuset(other, "0")  # what the CPU manager's reconcile sends, for another container
    assert allowed(other_pid) == "0"  # control: the kubelet's update did apply
    assert allowed(moved_pid) == "1"


def test_kubelet_update_of_a_moved_container_keeps_the_move(plugin, kubelet) -> None:  # type: ignore[no-untyped-def]
    client, policy = plugin
    _, moved, moved_pid = kubelet.run("kept", "app")
    _, free, free_pid = kubelet.run("notours", "app")
    assert client.update({moved: Placement(cpus="1")}) == {}
    policy.keep = True
    kubelet.update_cpuset(moved, "0-1")  # the CPU manager resetting a shared container
    kubelet.update_cpuset(free, "0")  # control: a container we never placed follows the kubelet
    assert allowed(moved_pid) == "1"
    assert allowed(free_pid) == "0"


def test_update_of_unknown_container_is_reported_failed(plugin, kubelet) -> None:  # type: ignore[no-untyped-def]
    client, _ = plugin
    _, cid, pid = kubelet.run("known", "app")
    failed = client.update({"0" * 64: Placement(cpus="0"), cid: Placement(cpus="1")})
    assert list(failed) == ["0" * 64]
    assert allowed(pid) == "1"  # control: the known container in the same call was updated


def test_runtime_restart_loses_nothing_and_falls_back_meanwhile(containerd, kubelet) -> None:  # type: ignore[no-untyped-def]
    policy = TablePolicy({})
    client = NriClient(socket_path=containerd.nri_socket, name="perfbalance", index="10", policy=policy,
                       backoff=Backoff(first=0.2, cap=1.0))
    client.start()
    try:
        assert client.wait_connected(30)
        _, cid, pid = kubelet.run("survivor", "app")
        assert client.update({cid: Placement(cpus="1")}) == {}
        containerd.kill()  # a crash: shims and containers keep running
        deadline = time.monotonic() + 10
        while client.status.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.status.path == "cgroupfs" and client.view is None
        containerd.start()
        assert client.wait_connected(60), client.status
        assert client.status.sessions == 2
        view = client.view
        assert view is not None and cid in view.containers and view.containers[cid].cpus == "1"
        assert allowed(pid) == "1"
    finally:
        client.stop()


def test_plugin_crash_and_restart_resynchronizes(containerd, kubelet) -> None:  # type: ignore[no-untyped-def]
    first = NriClient(socket_path=containerd.nri_socket, name="perfbalance", index="10", policy=TablePolicy({}))
    first.start()
    assert first.wait_connected(30)
    _, cid, pid = kubelet.run("crash", "app")
    assert first.update({cid: Placement(cpus="0")}) == {}
    first.stop()  # the connection drops as it does when the agent dies
    second = NriClient(socket_path=containerd.nri_socket, name="perfbalance", index="10", policy=TablePolicy({}))
    second.start()
    try:
        assert second.wait_connected(30), second.status
        assert second.view.containers[cid].cpus == "0"
        assert allowed(pid) == "0"
    finally:
        second.stop()
