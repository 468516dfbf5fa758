"""Discovery from fake cgroup trees: naming table, QoS, estimation, kubelet matching, hostile names."""

from __future__ import annotations

from pathlib import Path

import pytest

import fakecg
from agent.discover import containers as d
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError
from perfbalance.model import KubeletState

UID = "6c2e0d4a-1111-4b5c-9d7e-0123456789ab"
UID_ = UID.replace("-", "_")
CID = "a" * 64
CID2 = "b" * 64


def v1_container(root: Path, rel: str, *, cpus: str = "0-3", shares: int = 1024, quota: int = -1,
                 mem_limit: int = 9223372036854771712, mem_used: int = 4096) -> None:
    fakecg.mkcg(root, rel, {
        "cpuset": {"cpuset.cpus": cpus, "cpuset.mems": "0", "cpuset.effective_cpus": cpus,
                   "cpuset.effective_mems": "0", "cgroup.procs": ""},
        "cpu": {"cpu.shares": str(shares), "cpu.cfs_quota_us": str(quota), "cpu.cfs_period_us": "100000"},
        "memory": {"memory.limit_in_bytes": str(mem_limit), "memory.usage_in_bytes": str(mem_used)},
    })


def v2_container(root: Path, rel: str, *, cpus: str = "0-3", weight: int = 100, cpu_max: str = "max 100000",
                 mem_max: str = "max", mem_cur: int = 0) -> None:
    fakecg.mkcg(root, rel, {"": {"cpuset.cpus": "", "cpuset.cpus.effective": cpus, "cpuset.mems.effective": "0",
                                 "cpu.weight": str(weight), "cpu.max": cpu_max, "memory.max": mem_max,
                                 "memory.current": str(mem_cur), "cgroup.procs": ""}})


def scan(root: Path, kubelet: KubeletState = KubeletState(), globs: tuple[str, ...] = ()) -> dict[str, object]:
    cs = d.discover(Cgroupfs(root=str(root)), kubernetes=True, globs=globs, kubelet=kubelet)
    return {c.id: c for c in cs}


@pytest.mark.parametrize("rel,qos,runtime", [
    (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope", "burstable", "containerd"),
    (f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope", "besteffort", "crio"),
    (f"kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", "guaranteed", "containerd"),
    (f"kubepods/burstable/pod{UID}/{CID}", "burstable", "containerd"),
    (f"kubepods/pod{UID}/{CID}", "guaranteed", "containerd"),
    (f"kubepods/besteffort/pod{UID}/crio-{CID}.scope", "besteffort", "crio"),
])
def test_naming_table_v1(tmp_path: Path, rel: str, qos: str, runtime: str) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, rel, shares=2 if qos == "besteffort" else 512, quota=100000 if qos == "guaranteed" else -1)
    c = scan(root)[CID]
    assert (c.cgroup, c.qos, c.runtime, c.pod_uid) == (rel, qos, runtime, UID)  # type: ignore[attr-defined]


def test_crio_conmon_is_skipped(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    pod = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
    v1_container(root, f"{pod}/crio-conmon-{CID}.scope")
    v1_container(root, f"{pod}/crio-{CID2}.scope")
    assert list(scan(root)) == [CID2]


def test_crun_container_child_and_crio_exec_child_are_part_of_the_container(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    scope = f"kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope"
    v2_container(root, scope, cpu_max="200000 100000")
    v2_container(root, f"{scope}/container")
    v2_container(root, f"{scope}/exec")
    found = scan(root)
    assert list(found) == [CID] and found[CID].cgroup == scope  # type: ignore[attr-defined]


def test_burstable_estimates_request_from_shares_and_limit_from_quota(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/burstable/pod{UID}/{CID}", shares=256, quota=150000)
    c = scan(root)[CID]
    assert (c.request_mcpu, c.limit_mcpu) == (250, 1500)  # type: ignore[attr-defined]


def test_besteffort_request_is_zero_whatever_the_shares(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/besteffort/pod{UID}/{CID}", shares=2)
    c = scan(root)[CID]
    assert (c.request_mcpu, c.limit_mcpu) == (0, None)  # type: ignore[attr-defined]


def test_guaranteed_request_equals_limit(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/{CID}", shares=2048, quota=200000)
    c = scan(root)[CID]
    assert (c.request_mcpu, c.limit_mcpu) == (2000, 2000)  # type: ignore[attr-defined]


def test_burstable_without_cpu_request_has_zero_request(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/burstable/pod{UID}/{CID}", shares=2)
    assert scan(root)[CID].request_mcpu == 0  # type: ignore[attr-defined]


def test_v2_weight_maps_back_to_request_within_a_weight_step(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    # kubelet: 500m -> shares 512 -> runc weight 1 + 510*9999/262142 = 20
    v2_container(root, f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
                 weight=20, cpu_max="100000 100000")
    c = scan(root)[CID]
    assert abs(c.request_mcpu - 500) <= 26 and c.limit_mcpu == 1000  # type: ignore[attr-defined]


def test_memory_limit_and_usage(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/burstable/pod{UID}/{CID}", mem_limit=256 << 20, mem_used=1 << 20)
    c = scan(root)[CID]
    assert (c.memory_limit_bytes, c.memory_bytes) == (256 << 20, 1 << 20)  # type: ignore[attr-defined]


def test_effective_cpuset_is_reported(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    v2_container(root, f"kubepods/pod{UID}/{CID}", cpus="2-3")
    assert scan(root)[CID].cpuset == CpuSet.parse("2-3")  # type: ignore[attr-defined]


def test_exclusive_container_named_by_matching_cpuset(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/{CID}", cpus="1", shares=1024, quota=100000)
    v1_container(root, f"kubepods/pod{UID}/{CID2}", cpus="0,2-3", shares=1024, quota=100000)
    kl = KubeletState(policy="static", default_cpuset=CpuSet.parse("0,2-3"),
                      exclusive={(UID, "app"): CpuSet([1])})
    found = scan(root, kl)
    assert (found[CID].name, found[CID].exclusive) == ("app", True)  # type: ignore[attr-defined]
    assert (found[CID2].name, found[CID2].exclusive) == ("", False)  # type: ignore[attr-defined]


def test_v1_checkpoint_matches_by_container_id(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/{CID}", cpus="1")
    kl = KubeletState(policy="static", exclusive={("", CID): CpuSet([1])})
    assert scan(root, kl)[CID].exclusive  # type: ignore[attr-defined]


def test_globs_find_generic_containers(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, "perfbalance-demo/avx", shares=1024)
    v1_container(root, "perfbalance-demo/web", shares=2048, quota=50000)
    found = scan(root, globs=("perfbalance-demo/*",))
    assert sorted(found) == ["perfbalance-demo:avx", "perfbalance-demo:web"]
    web = found["perfbalance-demo:web"]
    assert (web.name, web.qos, web.request_mcpu, web.limit_mcpu) == ("web", "unknown", 2000, 500)  # type: ignore[attr-defined]
    assert found["perfbalance-demo:avx"].request_mcpu == 0  # type: ignore[attr-defined]  # default shares: no request


def test_glob_does_not_cross_slashes(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, "demo/a/b")
    assert list(scan(root, globs=("demo/*",))) == ["demo:a"]


@pytest.mark.parametrize("bad", ["../x", "/", "a/**/b", "./a"])
def test_bad_globs_are_parse_errors(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ParseError):
        scan(fakecg.hybrid(tmp_path), globs=(bad,))


def test_hostile_names_are_skipped(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, "demo/ok")
    v1_container(root, "demo/evil\x1b[31m")
    assert list(scan(root, globs=("demo/*",))) == ["demo:ok"]


def test_non_container_names_under_a_pod_are_ignored(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/not-a-container")
    v1_container(root, f"kubepods/podnotauid/{CID}")
    assert scan(root) == {}


def test_kubernetes_off_ignores_kubepods(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/{CID}")
    assert d.discover(Cgroupfs(root=str(root)), kubernetes=False, globs=(), kubelet=KubeletState()) == []


def test_container_with_garbage_file_is_skipped_not_fatal(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/{CID}")
    v1_container(root, f"kubepods/pod{UID}/{CID2}")
    (root / "cpuset" / f"kubepods/pod{UID}/{CID}" / "cpuset.effective_cpus").write_text("zz\n")
    assert list(scan(root)) == [CID2]


def test_container_missing_from_cpu_hierarchy_still_found(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    fakecg.mkcg(root, "demo/x", {"cpuset": {"cpuset.effective_cpus": "1", "cpuset.effective_mems": "0"}})
    c = scan(root, globs=("demo/*",))["demo:x"]
    assert c.cpuset == CpuSet([1]) and c.request_mcpu == 0  # type: ignore[attr-defined]


def test_parse_pod_dir_systemd_converts_underscores() -> None:
    assert d.parse_pod_dir(f"kubepods-burstable-pod{UID_}.slice") == (UID, "burstable")


@pytest.mark.parametrize("name", ["..", "a/b", "x\ny", "", "x" * 300])
def test_check_name_rejects(name: str) -> None:
    with pytest.raises(ParseError):
        d.check_name(name)


class VanishingCgroupfs(Cgroupfs):
    """A container whose cgroup disappears between the directory listing and its file reads."""

    def __init__(self, root: str, vanish: str) -> None:
        super().__init__(root=root)
        self.vanish = vanish

    def try_read(self, rel: str, controller: str | None, name: str) -> str | None:
        if rel == self.vanish:
            from perfbalance.errors import ContainerGone
            raise ContainerGone(rel, "removed by the runtime")
        return super().try_read(rel, controller, name)


def test_container_vanishing_mid_scan_is_skipped(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/{CID}")
    v1_container(root, f"kubepods/pod{UID}/{CID2}")
    cgfs = VanishingCgroupfs(str(root), f"kubepods/pod{UID}/{CID}")
    found = d.discover(cgfs, kubernetes=True, globs=(), kubelet=KubeletState())
    assert [c.id for c in found] == [CID2]


def test_pause_sandbox_is_dropped_when_procfs_given(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/{CID}")
    v1_container(root, f"kubepods/pod{UID}/{CID2}")
    fakecg.mkcg(root, f"kubepods/pod{UID}/{CID}", {"cpuset": {"cgroup.procs": "100\n"}})
    fakecg.mkcg(root, f"kubepods/pod{UID}/{CID2}", {"cpuset": {"cgroup.procs": "200\n"}})
    proc = tmp_path / "proc"
    fakecg.files(proc, "100", {"comm": "pause\n"})
    fakecg.files(proc, "200", {"comm": "nginx\n"})
    found = d.discover(Cgroupfs(root=str(root)), kubernetes=True, globs=(), kubelet=KubeletState(),
                       procfs_root=str(proc))
    assert [c.id for c in found] == [CID2]


def test_same_cgroup_from_kubepods_and_glob_is_reported_once(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/pod{UID}/{CID}")
    found = scan(root, globs=(f"kubepods/pod{UID}/*",))
    assert list(found) == [CID]


@pytest.mark.parametrize("name", ["kubepods-burstable-pod0123456789abcdef0123456789abcdef.slice",
                                  "pod0123456789abcdef0123456789abcdef"])
def test_static_pod_uids_are_32_hex_digits(name):
    from agent.discover.containers import parse_pod_dir

    parsed = parse_pod_dir(name)
    assert parsed is not None and parsed[0] == "0123456789abcdef0123456789abcdef"


def test_only_the_named_containers_are_built_and_the_others_files_are_not_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = fakecg.hybrid(tmp_path)
    v1_container(root, f"kubepods/burstable/pod{UID}/{CID}", cpus="0-1")
    other = f"kubepods/burstable/pod{UID}/{CID2}"
    v1_container(root, other, cpus="2-3")
    fs = Cgroupfs(root=str(root))
    (root / "cpuset" / other / "cpuset.effective_cpus").write_text("not a cpu list")  # read: skipped, logged
    one = d.discover(fs, kubernetes=True, globs=(), kubelet=KubeletState(), only={CID})
    assert [(c.id, str(c.cpuset)) for c in one] == [(CID, "0-1")]
    assert other not in caplog.text
    assert [c.id for c in d.discover(fs, kubernetes=True, globs=(), kubelet=KubeletState())] == [CID]
    assert f"skipping container cgroup {other}" in caplog.text  # control: the full scan reads its files
