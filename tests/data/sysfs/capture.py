"""Copy the sysfs files agent/discover/sysfs.py reads from a live host into a fixture tree.

    python tests/data/sysfs/capture.py /sys tests/data/sysfs/thismachine

Only the files the topology reader needs are copied (no symlink farms, no memory blocks).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

PATTERNS = (
    "devices/system/cpu/online", "devices/system/cpu/possible", "devices/system/cpu/present",
    "devices/system/cpu/offline", "devices/system/cpu/isolated",
    "devices/system/cpu/cpu*/online",
    "devices/system/cpu/cpu*/topology/physical_package_id",
    "devices/system/cpu/cpu*/topology/die_id",
    "devices/system/cpu/cpu*/topology/core_id",
    "devices/system/cpu/cpu*/topology/thread_siblings_list",
    "devices/system/cpu/cpu*/topology/core_siblings_list",
    "devices/system/cpu/cpu*/cache/index*/level",
    "devices/system/cpu/cpu*/cache/index*/type",
    "devices/system/cpu/cpu*/cache/index*/size",
    "devices/system/cpu/cpu*/cache/index*/id",
    "devices/system/cpu/cpu*/cache/index*/shared_cpu_list",
    "devices/system/cpu/cpu*/cpufreq/base_frequency",
    "devices/system/node/online", "devices/system/node/possible",
    "devices/system/node/has_cpu", "devices/system/node/has_memory",
    "devices/system/node/node*/cpulist", "devices/system/node/node*/meminfo",
)


def capture(src: str, dst: str) -> int:
    n = 0
    for pattern in PATTERNS:
        for path in sorted(glob.glob(os.path.join(src, pattern))):
            rel = os.path.relpath(path, src)
            out = os.path.join(dst, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            try:
                shutil.copyfile(path, out)
            except OSError as e:
                print(f"skip {rel}: {e.strerror}", file=sys.stderr)
                continue
            n += 1
    return n


if __name__ == "__main__":
    print(capture(sys.argv[1], sys.argv[2]), "files")
