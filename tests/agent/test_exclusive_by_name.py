from agent.wiring import exclusive_by_name
from perfbalance.cpuset import CpuSet
from perfbalance.model import Container, KubeletState


def test_named_container_with_a_kubelet_assignment_is_exclusive():
    kubelet = KubeletState(policy="static", exclusive={("uid-1", "db"): CpuSet.parse("3")})
    cs = [Container(id="a", cgroup="x/a", pod_uid="uid-1", name="db", cpuset=CpuSet.parse("0-7")),
          Container(id="b", cgroup="x/b", pod_uid="uid-1", name="sidecar"),
          Container(id="c", cgroup="x/c", pod_uid="uid-2", name="db")]
    out = {c.id: c.exclusive for c in exclusive_by_name(cs, kubelet)}
    assert out == {"a": True, "b": False, "c": False}


def test_containers_of_a_pod_with_a_found_vmm_are_marked_as_vms():
    from agent.wiring import mark_sandboxed

    cs = [Container(id="a", cgroup="k/pod1/a", pod_uid="uid-1"),
          Container(id="b", cgroup="k/pod1/b", pod_uid="uid-1", sandbox="kata"),
          Container(id="c", cgroup="k/pod2/c", pod_uid="uid-2")]
    out = {c.id: c.sandbox for c in mark_sandboxed(cs, {"uid-1"})}
    assert out == {"a": "vm", "b": "kata", "c": ""}
