"""Which BPF map keys belong to which container, and which still name something alive."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from perfbalance.errors import ParseError, PerfbalanceError
from perfbalance.safefs import read_text

PROC_CGROUP_MAX_BYTES = 64 << 10  # /proc/<pid>/cgroup: one line per hierarchy


class KeyMaps:
    """One KeyMap per key kind for the BPF collectors of an agent, so that they walk the
    containers' cgroups once per cycle, not once each."""

    def __init__(self, cgroupfs: Any, *, procfs: str = "/proc") -> None:
        self.cgroupfs, self.procfs = cgroupfs, procfs
        self._maps: dict[bool, KeyMap] = {}

    def get(self, *, pid_keys: bool) -> KeyMap:
        if pid_keys not in self._maps:
            self._maps[pid_keys] = KeyMap(self.cgroupfs, pid_keys=pid_keys, procfs=self.procfs)
        return self._maps[pid_keys]


class KeyMap:
    """Map keys (v2 cgroup ids, or process ids on v1-only hosts) -> (container id, path).

    A container's cgroup id covers its descendants too (crun's `container/` child, CRI-O's
    `exec`): one stat plus one getdents per directory, since readdir returns each child's
    inode, which is its cgroup id; a leaf cgroup (st_nlink 2 on kernfs) is not listed at all. In pid mode, keys are the processes listed in the container's
    cgroups; map keys not found that way are looked up in /proc/<pid>/cgroup. `path` is what
    must exist for the key to be alive (the cgroup directory, or /proc/<pid>).
    """

    def __init__(self, cgroupfs: Any, *, pid_keys: bool, procfs: str = "/proc", max_depth: int = 4,
                 refresh_cycles: int = 10) -> None:
        self.cgroupfs, self.pid_keys, self.procfs, self.max_depth = cgroupfs, pid_keys, procfs, max_depth
        self.refresh_cycles = max(1, refresh_cycles)
        self._cycle = 0
        self._cache: dict[str, tuple[int, list[tuple[int, str]]]] = {}  # rel -> (expiry cycle, keys)
        self._last: tuple[object, dict[int, tuple[str, str]]] | None = None  # (cycle's signature, walk)

    def build(self, containers: Sequence[Any], map_keys: Iterable[int] = (), *,
              now: float | None = None) -> dict[int, tuple[str, str]]:
        """Keys -> (container id, path). Collectors that share this KeyMap and call it with the
        same `now` and containers (one agent cycle) share one walk; the result is read-only."""
        sig = None if now is None else (now, [(c.id, c.cgroup) for c in containers])
        if sig is not None and self._last is not None and self._last[0] == sig:
            walked = self._last[1]
        else:
            walked = self._walk(containers)
            self._last = None if sig is None else (sig, walked)
        return self._by_pid(containers, map_keys, dict(walked)) if self.pid_keys else walked

    def _walk(self, containers: Sequence[Any]) -> dict[int, tuple[str, str]]:
        self._cycle += 1
        out: dict[int, tuple[str, str]] = {}
        for c in containers:
            try:
                keys = self._pids(c.cgroup) if self.pid_keys else self._cached_ids(c.cgroup)
            except (OSError, PerfbalanceError):
                continue  # vanished between discovery and now: normal churn
            for k, path in keys:
                out.setdefault(k, (c.id, path))
        live = {c.cgroup for c in containers}
        for rel in [r for r in self._cache if r not in live]:
            del self._cache[rel]
        return out

    def _by_pid(self, containers: Sequence[Any], map_keys: Iterable[int],
                out: dict[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
        """Map keys (pids) not listed in the containers' cgroups, looked up in /proc/<pid>/cgroup."""
        by_cgroup = {c.cgroup.strip("/"): c.id for c in containers}
        for k in map_keys:
            try:
                cid = None if k in out else container_of_pid(self.procfs, k, by_cgroup)
            except ParseError:
                continue  # a /proc/<pid>/cgroup beyond its bound: not attributable
            if cid:
                out[k] = (cid, os.path.join(self.procfs, str(k)))
        return out

    def _cached_ids(self, rel: str) -> list[tuple[int, str]]:
        """Cgroup ids change only when a cgroup is re-created; re-walk each container every
        `refresh_cycles` cycles, staggered so that the cost spreads over cycles."""
        hit = self._cache.get(rel)
        if hit is not None and hit[0] > self._cycle:
            return hit[1]
        keys = self._ids(rel)
        stagger = 0 if hit is not None else hash(rel) % self.refresh_cycles
        self._cache[rel] = (self._cycle + self.refresh_cycles - stagger, keys)
        return keys

    def _ids(self, rel: str) -> list[tuple[int, str]]:
        top = self.cgroupfs.dir(rel, None)
        st = os.stat(top)
        out = [(st.st_ino, top)]
        if st.st_nlink == 2:
            return out  # kernfs keeps st_nlink = 2 + subdirectories: a leaf cgroup, nothing to list
        stack = [(top, 0)]
        while stack:
            path, depth = stack.pop()
            if depth >= self.max_depth:
                continue
            with os.scandir(path) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        out.append((e.inode(), e.path))
                        stack.append((e.path, depth + 1))
        return out

    def _pids(self, rel: str) -> list[tuple[int, str]]:
        return [(pid, os.path.join(self.procfs, str(pid))) for pid in self.cgroupfs.pids(rel, recursive=True)]


def stale_keys(before: Mapping[int, tuple[str, str]], now: Mapping[int, tuple[str, str]]) -> list[int]:
    """Keys that belonged to a container last cycle and whose cgroup (or process) is gone."""
    return [k for k, (_, path) in before.items() if k not in now and not os.path.exists(path)]


# A sweep of what is alive starts every SWEEP_PERIOD_CYCLES cycles and visits at most
# SWEEP_BUDGET cgroups per cycle (about 6 us each on kernfs: one fstatat per child directory, plus
# an open and a getdents for the few that have children), so a node with 3000 cgroups costs one
# ~20 ms cycle in five, and a larger one spreads its sweep over several cycles.
SWEEP_PERIOD_CYCLES = 5
SWEEP_BUDGET = 2000


class LiveKeys:
    """Which map keys still name something that exists: a bounded, resumable sweep.

    Keys are v2 cgroup ids (the directory's inode, which readdir returns for free) or, in pid
    mode, process ids (one listing of procfs). A sweep takes the map's keys at its start as
    candidates and reports those it did not find alive when it ends. That is exact, not a
    heuristic: cgroup ids are never reused, and a cgroup alive from the start to the end of the
    sweep is always seen, because its ancestors cannot be removed while it exists, and a
    directory is descended into whenever its link count says it has subdirectories (kernfs keeps
    st_nlink = 2 + subdirectories; other filesystems' 1 or >2 are descended too). Live cgroups
    that no container owns (system services, pods created and removed between two discoveries)
    are thereby told apart from dead ones without being deleted and re-inserted every cycle.
    """

    def __init__(self, cgroupfs: Any, *, pid_keys: bool, procfs: str = "/proc",
                 period: int = SWEEP_PERIOD_CYCLES, budget: int = SWEEP_BUDGET) -> None:
        self.cgroupfs, self.pid_keys, self.procfs = cgroupfs, pid_keys, procfs
        self.period, self.budget = max(1, period), max(1, budget)
        self.sweeps = 0  # completed sweeps (for tests and `bench collect`)
        self._cycle = 0
        self._last_start: int | None = None
        self._running = False
        self._candidates: set[int] = set()
        self._seen: set[int] = set()
        self._stack: list[str] = []

    def step(self, keys: Iterable[int]) -> set[int]:
        """One cycle: start a sweep when due, advance it by at most `budget` cgroups, and when it
        completes return the candidates it did not find alive (else an empty set)."""
        self._cycle += 1
        if not self._running:
            if self._last_start is not None and self._cycle - self._last_start < self.period:
                return set()
            try:
                self._begin(keys)
            except (OSError, PerfbalanceError):
                self._running = False  # no v2 root or procfs this cycle: try again next period
                return set()
        if not self._advance():
            return set()
        dead = self._candidates - self._seen
        self._running, self._candidates, self._seen = False, set(), set()
        self.sweeps += 1
        return dead

    def _begin(self, keys: Iterable[int]) -> None:
        self._running, self._last_start = True, self._cycle
        self._candidates, self._seen = set(keys), set()
        if self.pid_keys:
            self._seen = {int(n) for n in os.listdir(self.procfs) if n.isdigit()}
            self._stack = []
            return
        root_fd = self.cgroupfs.open_dir("", None)
        try:
            self._seen.add(os.fstat(root_fd).st_ino)
        finally:
            os.close(root_fd)
        self._stack = [""]

    def _advance(self) -> bool:
        """Visit cgroups until the budget is spent; True when the sweep is complete."""
        visited = 0
        while self._stack and visited < self.budget:
            visited += self._visit(self._stack.pop())
        return not self._stack

    def _visit(self, rel: str) -> int:
        """Record the children of one v2 cgroup; queue those with children of their own."""
        try:
            fd = self.cgroupfs.open_dir(rel, None)
        except (OSError, PerfbalanceError):
            return 1  # removed meanwhile (its whole subtree is gone too), or refused
        n = 0
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if not e.is_dir(follow_symlinks=False):
                        continue
                    n += 1
                    self._seen.add(e.inode())
                    if _may_have_subdirs(e):
                        self._stack.append(f"{rel}/{e.name}" if rel else e.name)
        except OSError:
            pass  # removed while listing: what was listed is still valid
        finally:
            os.close(fd)
        return max(n, 1)


def _may_have_subdirs(e: os.DirEntry[str]) -> bool:
    try:
        return e.stat(follow_symlinks=False).st_nlink != 2
    except OSError:
        return False  # removed since readdir


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup: controller (or "" for v2, "name=systemd") -> path."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in parts[1].split(",") if parts[1] else [""]:
            out[ctrl] = parts[2]
    return out


def container_of_pid(procfs: str, pid: int, by_cgroup: Mapping[str, str]) -> str | None:
    """The container whose cgroup (or an ancestor of the process's cgroup) matches, via /proc."""
    try:
        text = read_text(os.path.join(procfs, str(pid), "cgroup"), PROC_CGROUP_MAX_BYTES, "process cgroup file")
    except OSError:
        return None
    paths = parse_proc_cgroup(text)
    for path in paths.values():
        rel = path.strip("/")
        while rel:
            if rel in by_cgroup:
                return by_cgroup[rel]
            rel = rel.rpartition("/")[0]
    return None
