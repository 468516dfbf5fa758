"""The BTF reader that gives runqlat's sched_info method its struct offsets: on blobs whose
layout is known, on broken blobs (one line naming what is wrong), and on this kernel's own BTF
against bpftool's independent reading of it."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

import pytest

from collectors.bpfenv.btf import INT, PTR, Btf, require
from collectors.runqlat import SCHED_SWITCH_ARGS, sched_info_layout
from perfbalance.errors import FeatureUnavailable
from tests.collectors.btf_builder import BtfBuilder, kernel_like

VMLINUX = "/sys/kernel/btf/vmlinux"


def test_offsets_are_summed_through_anonymous_unions_and_typedefs_resolved() -> None:
    layout = sched_info_layout(Btf(kernel_like(), source="test.btf"))
    assert dict(layout.offsets) == {"PB_OFF_LAST_QUEUED": 1048, "PB_OFF_SE_CFS_RQ": 296, "PB_OFF_CFS_RQ_RQ": 312,
                                    "PB_OFF_RQ_CLOCK": 2776, "PB_OFF_CGROUPS": 2376, "PB_OFF_DFL_CGRP": 112,
                                    "PB_OFF_KN": 256, "PB_OFF_KN_ID": 96, "PB_OFF_POPULATED": 236,
                                    "PB_OFF_TGID": 1268}
    btf = Btf(kernel_like())
    assert btf.member("task_struct", "tgid").size == 4  # through typedef pid_t
    assert btf.member("task_struct", "cgroups").kind == PTR
    tid, args = btf.raw_tracepoint("sched_switch")
    assert tid > 0 and tuple(args) == SCHED_SWITCH_ARGS


def test_a_kernel_without_sched_info_is_named_and_nothing_else_guessed() -> None:
    with pytest.raises(FeatureUnavailable, match=r"test.btf: struct task_struct has no member sched_info.last_queued"):
        sched_info_layout(Btf(kernel_like(with_sched_info=False), source="test.btf"))


def test_a_sched_switch_without_prev_state_is_refused() -> None:
    with pytest.raises(FeatureUnavailable, match=re.escape(
            "sched_switch arguments are (bool, struct task_struct *, struct task_struct *), not (bool, "
            "struct task_struct *, struct task_struct *, unsigned int)")):
        sched_info_layout(Btf(kernel_like(prev_state=False)))


def test_a_member_of_another_size_than_the_program_reads_is_refused() -> None:
    btf = Btf(kernel_like(), source="test.btf")
    with pytest.raises(FeatureUnavailable, match=r"test.btf: task_struct.tgid is 4 bytes of kind int, not 8"):
        require(btf.member("task_struct", "tgid"), "task_struct.tgid", size=(8,), kind=(INT,), source="test.btf")


@pytest.mark.parametrize(("blob", "says"), [
    (b"\x00" * 10, "header is 10 bytes"),
    (b"\x34\x12" + kernel_like()[2:], "magic is 0x1234"),
    (kernel_like()[:200], "section bounds"),
])
def test_broken_blobs_are_one_line_naming_the_field_and_value(blob: bytes, says: str) -> None:
    with pytest.raises(FeatureUnavailable) as e:
        Btf(blob, source="broken.btf")
    assert says in str(e.value) and "broken.btf" in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_type_kind_is_named() -> None:
    b = BtfBuilder()
    b.int_("int", 4)
    b.types.append(b"\x00\x00\x00\x00" + (30 << 24).to_bytes(4, "little") + b"\x00\x00\x00\x00")
    with pytest.raises(FeatureUnavailable, match="type 2 kind is 30"):
        Btf(b.blob(), source="x")


def test_a_missing_file_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FeatureUnavailable, match=f"{tmp_path}/vmlinux: No such file"):
        Btf.read(str(tmp_path / "vmlinux"))


@functools.cache
def _bpftool_dump() -> str:
    """bpftool's reading of the kernel's BTF (one dump for every struct asked about)."""
    return subprocess.run(["bpftool", "btf", "dump", "file", VMLINUX], capture_output=True, text=True,
                          check=True).stdout


def _bpftool_members(struct_name: str) -> dict[str, int]:
    """Byte offsets of struct_name's direct members, as bpftool reads the kernel's BTF."""
    out = _bpftool_dump()
    head = re.search(rf"^\[\d+\] STRUCT '{struct_name}' size=\d+ vlen=(\d+)\n", out, re.M)
    assert head, struct_name
    lines = out[head.end():].splitlines()[:int(head.group(1))]
    return {m.group(1): int(m.group(2)) // 8 for line in lines
            if (m := re.match(r"\s+'(\w+)' type_id=\d+ bits_offset=(\d+)", line))}


@pytest.mark.skipif(not os.path.exists(VMLINUX), reason="this kernel has no BTF")
@pytest.mark.skipif(shutil.which("bpftool") is None, reason="bpftool is not installed (scripts/setup.sh installs it)")
def test_this_kernels_offsets_agree_with_bpftool() -> None:
    layout = sched_info_layout(Btf.read(VMLINUX))
    task, sched_info = _bpftool_members("task_struct"), _bpftool_members("sched_info")
    assert layout.offsets["PB_OFF_LAST_QUEUED"] == task["sched_info"] + sched_info["last_queued"]
    assert layout.offsets["PB_OFF_SE_CFS_RQ"] == task["se"] + _bpftool_members("sched_entity")["cfs_rq"]
    assert layout.offsets["PB_OFF_CFS_RQ_RQ"] == _bpftool_members("cfs_rq")["rq"]
    assert layout.offsets["PB_OFF_RQ_CLOCK"] == _bpftool_members("rq")["clock"]
    assert layout.offsets["PB_OFF_CGROUPS"] == task["cgroups"]
    assert layout.offsets["PB_OFF_KN"] == _bpftool_members("cgroup")["kn"]
    assert layout.offsets["PB_OFF_KN_ID"] == _bpftool_members("kernfs_node")["id"]
