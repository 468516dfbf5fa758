"""Which CPUs the kernel has online and possible: the one reader of sysfs CPU lists.

Discovery (the topology), the perf collector (one counter per online CPU) and the BPF arrays
with a slot per possible CPU (the perf events, runqlat's per-CPU state) all read these; sysfs
root passed in.
"""

from __future__ import annotations

import os

from perfbalance.cpuset import CpuSet
from perfbalance.errors import FeatureUnavailable, ParseError
from perfbalance.safefs import read_text

CPU_DIR = "devices/system/cpu"
CPULIST_MAX_BYTES = 64 << 10  # sysfs cpu lists fit in a page; anything bigger is not a cpu list


def read_cpu_list(sysfs: str, name: str) -> CpuSet | None:
    """`<sysfs>/devices/system/cpu/<name>` (online, possible, isolated, ...); None when absent.

    An unparsable or oversized list is a ParseError naming the file."""
    path = os.path.join(sysfs, CPU_DIR, name)
    try:
        text = read_text(path, CPULIST_MAX_BYTES, f"cpu list {name}")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return CpuSet.parse(text, source=path)


def online_cpus(sysfs: str) -> CpuSet:
    """cpu/online; without it, every cpuN directory whose `online` is not 0 (cpu0 often has no
    `online` file: it cannot be offlined). FeatureUnavailable when the directory is unreadable."""
    online = read_cpu_list(sysfs, "online")
    if online is not None:
        return online
    base = os.path.join(sysfs, CPU_DIR)
    try:
        names = os.listdir(base)
    except OSError as e:
        raise FeatureUnavailable("sysfs topology", f"cannot list {base}: {e.strerror}") from None
    ids = [int(n[3:]) for n in names if n.startswith("cpu") and n[3:].isdigit()]
    return CpuSet(i for i in ids if _cpu_online(base, i))


def _cpu_online(base: str, cpu: int) -> bool:
    path = os.path.join(base, f"cpu{cpu}", "online")
    try:
        text = read_text(path, 64, "cpu online file").strip()
    except OSError:
        return True
    if text and not text.isdigit():
        raise ParseError("cpu online file", text, "expected 0 or 1", source=path)
    return not text or int(text) != 0


def possible_cpus(sysfs: str = "/sys") -> int:
    """Highest possible CPU + 1 (the stride of BPF arrays with a slot per CPU); an unparsable list
    raises ParseError."""
    try:
        possible = read_cpu_list(sysfs, "possible")
    except OSError:
        possible = None
    if possible is None:
        return os.cpu_count() or 1
    if not possible:
        raise ParseError("cpu list possible", "", "empty", source=sysfs)
    return max(possible) + 1
