"""Thread ids of a container or a process: resctrl assigns threads, not processes.

resctrl's `tasks` file takes task (thread) ids and a process's threads are separate tasks, so
writing only a PID would leave every other thread in the old group (resctrl.rst: "tasks: ...
writing a task id"). These readers list every thread: `cgroup.threads` on cgroup v2 (every TID in
the cgroup), the v1 `tasks` file, or /proc/<pid>/task for one process. Roots are passed in.
"""

from __future__ import annotations

import errno
import os

from perfbalance.errors import ContainerGone

_CANDIDATES = (("unified", "cgroup.threads"), ("", "cgroup.threads"), ("cpuset", "tasks"),
               ("pids", "tasks"), ("cpu,cpuacct", "tasks"), ("memory", "tasks"))


def parse_tids(text: str) -> list[int]:
    return sorted({int(t) for t in text.split() if t.isdigit()})


def cgroup_tids(cgroup_root: str, rel: str) -> list[int]:
    """Every thread in the cgroup `rel` (relative to the cgroup root, no controller prefix)."""
    for hierarchy, name in _CANDIDATES:
        path = os.path.join(cgroup_root, hierarchy, rel.strip("/"), name)
        try:
            with open(path, "rb") as f:
                return parse_tids(f.read().decode())
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EOPNOTSUPP):
                raise ContainerGone(rel, f"{path}: {e.strerror}") from None
    raise ContainerGone(rel, f"no cgroup.threads or tasks file under {cgroup_root}")


def process_tids(procfs: str, pid: int) -> list[int]:
    """Every thread of process `pid` from <procfs>/<pid>/task."""
    try:
        return sorted(int(t) for t in os.listdir(os.path.join(procfs, str(pid), "task")) if t.isdigit())
    except OSError as e:
        raise ContainerGone(str(pid), f"process {pid}: {e.strerror}") from None
