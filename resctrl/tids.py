"""Thread ids of a container or a process: resctrl assigns threads, not processes.

resctrl's `tasks` file takes task (thread) ids and a process's threads are separate tasks, so
writing only a PID would leave every other thread in the old group (resctrl.rst: "tasks: ...
writing a task id"). These readers list every thread: `cgroup.threads` on cgroup v2 (every TID in
the cgroup), the v1 `tasks` file, or /proc/<pid>/task for one process. Roots are passed in.
"""

from __future__ import annotations

import errno
import os

from perfbalance.errors import ContainerGone, ParseError
from perfbalance.safefs import SafeTree

# cgroup.threads / tasks: up to pid_max (4194304) ids of at most 8 characters each.
TIDS_MAX_BYTES = 32 << 20

_CANDIDATES = (("unified", "cgroup.threads"), ("", "cgroup.threads"), ("cpuset", "tasks"),
               ("pids", "tasks"), ("cpu,cpuacct", "tasks"), ("memory", "tasks"))


def parse_tids(text: str) -> list[int]:
    return sorted({int(t) for t in text.split() if t.isdigit()})


def cgroup_tids(cgroup_root: str, rel: str) -> list[int]:
    """Every thread in the cgroup `rel` (relative to the cgroup root, no controller prefix).

    Each hierarchy is its own SafeTree: the file is opened without following symlinks and
    without leaving that hierarchy's mount (UnsafePath otherwise), and read bounded.
    """
    for hierarchy, name in _CANDIDATES:
        tree = SafeTree(os.path.join(cgroup_root, hierarchy))
        target = f"{rel.strip('/')}/{name}" if rel.strip("/") else name
        try:
            return parse_tids(_read_list(tree, target))
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EOPNOTSUPP):
                raise ContainerGone(rel, f"{tree.path(target)}: {e.strerror}") from None
    raise ContainerGone(rel, f"no cgroup.threads or tasks file under {cgroup_root}")


def _read_list(tree: SafeTree, target: str) -> str:
    """A thread list, bounded (ParseError naming the file beyond TIDS_MAX_BYTES)."""
    try:
        return tree.read(target, TIDS_MAX_BYTES).decode(errors="replace")
    except OverflowError:
        raise ParseError("thread list", tree.path(target), f"larger than {TIDS_MAX_BYTES} bytes") from None
