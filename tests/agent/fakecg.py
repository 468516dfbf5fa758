"""Builders of fake cgroup trees (plain files) for layout and parsing tests.

Real cgroup behaviour (the kernel refusing writes, effective sets) is tested on the real
hierarchies in test_*_real.py; these trees only exercise path logic and parsing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def files(base: Path, rel: str, content: Mapping[str, str]) -> Path:
    d = base / rel if rel else base
    d.mkdir(parents=True, exist_ok=True)
    for name, text in content.items():
        (d / name).write_text(text)
    return d


def v2(tmp: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root = tmp / "cg-v2"
    files(root, "", {"cgroup.controllers": controllers + "\n", "cgroup.subtree_control": "",
                     "cgroup.procs": "1\n", "cpuset.cpus.effective": "0-3\n",
                     "cpuset.mems.effective": "0\n"})
    return root


def v1(tmp: Path, *, comount: bool = True) -> Path:
    """v1 with cpu,cpuacct co-mounted (plus symlinks), cpuset, memory and name=systemd."""
    root = tmp / "cg-v1"
    root.mkdir(parents=True, exist_ok=True)
    if comount:
        files(root, "cpu,cpuacct", {"cgroup.procs": "", "cpu.shares": "1024\n"})
        os.symlink("cpu,cpuacct", root / "cpu")
        os.symlink("cpu,cpuacct", root / "cpuacct")
    else:
        files(root, "cpu", {"cgroup.procs": "", "cpu.shares": "1024\n"})
        files(root, "cpuacct", {"cgroup.procs": "", "cpuacct.usage": "0\n"})
    files(root, "cpuset", {"cgroup.procs": "", "cpuset.cpus": "0-3\n", "cpuset.mems": "0\n",
                           "cpuset.effective_cpus": "0-3\n", "cpuset.effective_mems": "0\n"})
    files(root, "memory", {"cgroup.procs": ""})
    files(root, "systemd", {"cgroup.procs": ""})
    return root


def hybrid(tmp: Path) -> Path:
    root = v1(tmp, comount=False)
    files(root, "unified", {"cgroup.controllers": "\n", "cgroup.procs": "", "cpu.stat": ""})
    return root


def mkcg(root: Path, rel: str, per_hierarchy: Mapping[str, Mapping[str, str]]) -> None:
    """Create cgroup `rel` in the named hierarchy dirs ('' = root itself for v2)."""
    for h, content in per_hierarchy.items():
        files(root / h if h else root, rel, content)
