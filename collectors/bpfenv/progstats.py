"""Run time and run count of loaded BPF programs (for `bench collect`: ns per event)."""

from __future__ import annotations

import ctypes
import os

from perfbalance.safefs import read_text

FDINFO_MAX_BYTES = 64 << 10  # /proc/self/fdinfo/<fd> of a BPF program: a dozen lines


def bpf_syscall(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> tuple[int, int]:
    """bpf(2) with `attr` (a union bpf_attr buffer): (return value, errno). The syscall is 321 on
    x86_64 and 280 in the generic table (arm64, riscv64)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = int(libc.syscall(321 if os.uname().machine == "x86_64" else 280, cmd, attr, ctypes.c_uint(len(attr))))
    return ret, ctypes.get_errno()


def bpf_stats_enable() -> int:
    """BPF_ENABLE_STATS (5.8+): run_time_ns/run_cnt counted while the returned fd is open.

    Returns -1 when the kernel refuses; callers may then fall back to kernel.bpf_stats_enabled.
    """
    BPF_ENABLE_STATS, BPF_STATS_RUN_TIME = 32, 0
    attr = ctypes.create_string_buffer(128)
    ctypes.c_uint32.from_buffer(attr, 0).value = BPF_STATS_RUN_TIME
    return bpf_syscall(BPF_ENABLE_STATS, attr)[0]


def parse_fdinfo(text: str) -> dict[str, str]:
    """/proc/<pid>/fdinfo/<fd> of a BPF program: prog_id, run_time_ns, run_cnt, ..."""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def prog_stats(procfs: str, fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a loaded program of this process."""
    info = parse_fdinfo(read_text(os.path.join(procfs, "self", "fdinfo", str(fd)), FDINFO_MAX_BYTES,
                                   "BPF program fdinfo"))
    return int(info.get("run_time_ns", 0)), int(info.get("run_cnt", 0))
