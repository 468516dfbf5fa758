"""cpu_manager_state: V1-V4, case-insensitive keys, errors naming file and problem, last good kept."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.discover import kubelet
from perfbalance.cpuset import CpuSet

DATA = Path(__file__).resolve().parent.parent / "data" / "kubelet"


def root_with(tmp_path: Path, fixture: str) -> str:
    shutil.copyfile(DATA / fixture, tmp_path / "cpu_manager_state")
    return str(tmp_path)


def test_missing_file_is_policy_none(tmp_path: Path) -> None:
    s = kubelet.read_cpu_manager_state(str(tmp_path))
    assert s.policy == "none" and not s.exclusive


def test_v1_entries_keyed_by_container_id(tmp_path: Path) -> None:
    s = kubelet.read_cpu_manager_state(root_with(tmp_path, "v1-static"))
    assert s.exclusive == {("", "3f9a1c2b4d5e"): CpuSet([1])}
    assert s.default_cpuset == CpuSet.parse("0,2-7")


def test_v2_static_exclusive_by_pod_and_name(tmp_path: Path) -> None:
    s = kubelet.read_cpu_manager_state(root_with(tmp_path, "v2-static"))
    assert s.policy == "static"
    assert s.exclusive == {("6c2e0d4a-1111-4b5c-9d7e-0123456789ab", "app"): CpuSet([1])}


def test_v2_none_policy_has_no_exclusive(tmp_path: Path) -> None:
    s = kubelet.read_cpu_manager_state(root_with(tmp_path, "v2-none"))
    assert s.policy == "none" and s.dedicated() == CpuSet()


def test_v3_pod_entries_merge_and_keys_are_case_insensitive(tmp_path: Path) -> None:
    s = kubelet.read_cpu_manager_state(root_with(tmp_path, "v3-podentries"))
    assert s.default_cpuset == CpuSet.parse("0,3")
    assert s.dedicated() == CpuSet.parse("1-2,4")
    assert s.exclusive[("bbbb-2", "sidecar")] == CpuSet([4])


def test_v4_data_string_is_unwrapped(tmp_path: Path) -> None:
    s = kubelet.read_cpu_manager_state(root_with(tmp_path, "v4-data"))
    assert s.exclusive == {("cccc-3", "app"): CpuSet([1])}


@pytest.mark.parametrize("fixture,problem", [
    ("half-written", "not JSON"),
    ("garbage", "not UTF-8"),
    ("newer-version", "newer than supported"),
    ("bad-cpus", "entries.dddd-4.app"),
])
def test_bad_files_name_file_and_problem(tmp_path: Path, fixture: str, problem: str) -> None:
    root = root_with(tmp_path, fixture)
    with pytest.raises(kubelet.KubeletStateError) as ei:
        kubelet.read_cpu_manager_state(root)
    assert problem in str(ei.value)
    assert os.path.join(root, "cpu_manager_state") in str(ei.value)


def test_empty_file_is_error() -> None:
    with pytest.raises(kubelet.KubeletStateError, match="empty"):
        kubelet.parse_cpu_manager_state("  \n")


def test_json_without_policy_is_error() -> None:
    with pytest.raises(kubelet.KubeletStateError, match="policyName"):
        kubelet.parse_cpu_manager_state('{"foo": 1}')


def test_reader_keeps_last_good_state_on_garbage(tmp_path: Path) -> None:
    reader = kubelet.KubeletStateReader(kubelet_root=root_with(tmp_path, "v2-static"))
    good = reader.read()
    shutil.copyfile(DATA / "half-written", tmp_path / "cpu_manager_state")
    assert reader.read() == good
    assert reader.last_error is not None and reader.errors_total == 1


def test_reader_recovers_when_file_is_whole_again(tmp_path: Path) -> None:
    reader = kubelet.KubeletStateReader(kubelet_root=root_with(tmp_path, "half-written"))
    assert reader.read().policy == "none"
    shutil.copyfile(DATA / "v2-static", tmp_path / "cpu_manager_state")
    assert reader.read().policy == "static" and reader.last_error is None


def test_reader_never_writes_the_file(tmp_path: Path) -> None:
    root = root_with(tmp_path, "v2-static")
    before = (tmp_path / "cpu_manager_state").read_bytes()
    st = os.stat(tmp_path / "cpu_manager_state")
    kubelet.KubeletStateReader(kubelet_root=root).read()
    assert (tmp_path / "cpu_manager_state").read_bytes() == before
    assert os.stat(tmp_path / "cpu_manager_state").st_mtime_ns == st.st_mtime_ns
