"""Where the host's filesystems are: every reader takes its root from here, never a literal path."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class HostPaths:
    sysfs: str = "/sys"
    procfs: str = "/proc"
    cgroup: str = "/sys/fs/cgroup"
    tracefs: str = "/sys/kernel/tracing"
    modules: str = "/lib/modules"
    kubelet: str = "/var/lib/kubelet"
    run_dir: str = "/run/perfbalance"
    headers_search: tuple[str, ...] = ("/usr/src",)
