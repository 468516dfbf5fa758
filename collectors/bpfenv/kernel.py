"""The running kernel: its release and whether it is at least each version our programs need.

Our BPF programs use tracepoint fields and helpers (and, for runqlat's sched_info method, struct
offsets taken from the running kernel's BTF, never from headers), so what matters is the
*running* kernel's features, checked here as minimum versions ("at least X", not
"exactly X"). The release is read from procfs, so a container sees the host's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from perfbalance.errors import ParseError
from perfbalance.host import HostPaths
from perfbalance.safefs import read_text


@dataclass(frozen=True, kw_only=True, order=True)
class KernelVersion:
    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True, kw_only=True)
class Requirement:
    feature: str
    minimum: KernelVersion
    used_for: str


# Minimum kernel versions of what our programs use (kernel git history / bcc docs/kernel-versions.md).
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(feature="tracepoint programs", minimum=KernelVersion(major=4, minor=7), used_for="all programs"),
    Requirement(feature="bpf_perf_event_read_value", minimum=KernelVersion(major=4, minor=15), used_for="PMU attribution"),
    Requirement(feature="bpf_get_current_cgroup_id", minimum=KernelVersion(major=4, minor=18), used_for="cgroup keys (else per-pid keys)"),
    Requirement(feature="BPF_MAP_LOOKUP_BATCH", minimum=KernelVersion(major=5, minor=6), used_for="batched map reads (else iteration)"),
    Requirement(feature="BPF_ENABLE_STATS", minimum=KernelVersion(major=5, minor=8), used_for="bench: ns per event"),
)

_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def parse_release(text: str) -> KernelVersion:
    """`6.18.44-fc-v595` -> 6.18.44."""
    m = _RELEASE.match(text.strip())
    if not m:
        raise ParseError("kernel release", text, "expected MAJOR.MINOR[.PATCH][-suffix]")
    return KernelVersion(major=int(m[1]), minor=int(m[2]), patch=int(m[3] or 0))


def check_kernel(version: KernelVersion) -> dict[str, dict[str, Any]]:
    """Each requirement: whether the running kernel is at least its minimum."""
    return {r.feature: {"ok": version >= r.minimum, "minimum": f">= {r.minimum.major}.{r.minimum.minor}",
                        "used_for": r.used_for} for r in REQUIREMENTS}


def kernel_ok(version: KernelVersion, feature: str) -> bool:
    return any(r.feature == feature and version >= r.minimum for r in REQUIREMENTS)


OSRELEASE_MAX_BYTES = 256  # /proc/sys/kernel/osrelease: __NEW_UTS_LEN is 64


def running_release(host: HostPaths) -> str:
    """The running kernel's release (from procfs, so a container sees the host's)."""
    try:
        return read_text(os.path.join(host.procfs, "sys/kernel/osrelease"), OSRELEASE_MAX_BYTES,
                         "kernel release file").strip()
    except OSError:
        return os.uname().release
