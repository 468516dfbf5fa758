"""Class groups, thread assignment and per-container monitoring groups on a resctrl mount.

What it does, and the kernel facts behind each rule (resctrl.rst "Resource alloc and monitor
groups", linux rdtgroup.c):
- A control group per configured class (`<prefix><class>`), its schemata written from the pure
  resolution (only entries that differ). Classes the node cannot hold (out of CLOSIDs, nothing
  supported) degrade: their containers stay in the root group, and `degraded` says why.
- Threads are moved one task id per write to `tasks`; ESRCH (the thread exited) is ignored.
  Children inherit their creator's group at fork, but a thread created by a not-yet-moved thread
  while we sweep lands in the old group (the fork race): every cycle re-reads the container's
  threads and the group's tasks and writes only the missing ones, so a late thread is caught one
  interval later. Nothing closes the race completely short of the runtime placing the container
  before it starts (NRI/OCI hooks).
- Moving a thread to a control group drops it from its monitoring group (the kernel resets its
  RMID), so a container's monitoring group is always under its current control group and its
  threads are re-added after every class move.
- Only groups whose name starts with our prefix are created or removed; a group with tasks is
  never removed (the kernel would silently move them to the parent/root); our empty orphans
  (from a crash or a removed class) are removed at start and every cycle.
- Out of RMIDs: containers without a monitoring group are monitored by their class group only
  (per-class LLC/MBM, no per-container values), retried only after one of ours was freed.
- Every step holds the flock on the mount (read-modify-write between cooperating tools).
"""

from __future__ import annotations

import errno
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from perfbalance.errors import ResctrlError
from resctrl.counters import CounterTracker
from resctrl.fs import ResctrlFs
from resctrl.info import ResctrlInfo
from resctrl.resolve import Resolution

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, kw_only=True)
class StartReport:
    created: tuple[str, ...] = ()
    reused: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # our empty orphans
    kept: Mapping[str, str] = field(default_factory=dict)  # our orphans we did not remove, and why
    degraded: Mapping[str, str] = field(default_factory=dict)  # class -> why its containers stay in root
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class MoveResult:
    container: str
    group: str  # control group the threads are now in ("" = root)
    moved: int = 0  # threads written this time
    gone: int = 0  # ESRCH: exited before we got to them
    foreign: int = 0  # in a control group that is not ours: left alone
    degraded: str = ""  # why the requested class could not be used
    error: str = ""  # a kernel refusal for this container (assign_many only)


class _Members:
    """Tasks of control groups read once per sweep and kept up to date with our own writes."""

    def __init__(self, fs: ResctrlFs) -> None:
        self.fs = fs
        self.cache: dict[str, set[int]] = {}

    def get(self, group: str) -> set[int]:
        if group not in self.cache:
            self.cache[group] = self.fs.tasks(group)
        return self.cache[group]

    def moved(self, group: str, tids: list[int]) -> None:
        for g, have in self.cache.items():
            if g == group:
                have.update(tids)
            else:
                have.difference_update(tids)


class ResctrlManager:
    def __init__(self, *, fs: ResctrlFs, info: ResctrlInfo, resolution: Resolution, prefix: str,
                 monitor_containers: bool = True, max_mon_groups: int = 0) -> None:
        self.fs, self.info, self.resolution, self.prefix = fs, info, resolution, prefix
        self.monitor_containers, self.max_mon_groups = monitor_containers, max_mon_groups
        self.class_groups: dict[str, str] = {}  # class -> control group rel
        self.degraded: dict[str, str] = {}
        self.placement: dict[str, str] = {}  # container -> control group rel its threads are in
        self.classes: dict[str, str | None] = {}  # container -> class it was assigned
        self.mon: dict[str, str] = {}  # container -> its monitoring group rel
        self.by_class: set[str] = set()  # containers monitored by class only (no RMID)
        self.mon_reason = ""
        self._rmids_exhausted = False
        self.tracker = CounterTracker()

    # -- names -------------------------------------------------------------------------------

    def class_group_name(self, cls: str) -> str:
        return f"{self.prefix}{cls}"

    def mon_group_name(self, container_id: str) -> str:
        """`<prefix>c-<id>`: safe characters only; a hash when the id had to be changed."""
        safe = _UNSAFE.sub("_", container_id)[:64]
        if safe != container_id:
            safe = f"{safe[:55]}-{hashlib.sha1(container_id.encode()).hexdigest()[:8]}"
        return f"{self.prefix}c-{safe}"

    def ours(self, name: str) -> bool:
        return name.startswith(self.prefix)

    # -- start -------------------------------------------------------------------------------

    def start(self) -> StartReport:
        """Remove our empty orphans, create or reuse class groups, write schemata."""
        with self.fs.lock():
            removed, kept = self._gc(set(), initial=True)
            created, reused = self._create_classes()
            self._write_root()
        return StartReport(created=tuple(created), reused=tuple(reused), removed=tuple(removed), kept=kept,
                           degraded=dict(self.degraded), warnings=self.resolution.warnings)

    def reconfigure(self, resolution: Resolution) -> StartReport:
        """Apply a reloaded configuration: new classes created, schemata rewritten, retired
        classes left to empty (the next sweep moves their containers) and then collected."""
        self.resolution = resolution
        self.class_groups.clear()
        self.degraded.clear()
        return self.start()

    def _wanted(self) -> dict[str, str]:
        """class -> group name, for the classes that have schemata on this node."""
        return {c: self.class_group_name(c) for c, r in self.resolution.classes.items() if r.schemata}

    def _create_classes(self) -> tuple[list[str], list[str]]:
        created, reused = [], []
        if not self.info.alloc_capable:
            for cls in self.resolution.classes:
                self.degraded[cls] = f"this node has no RDT allocation (resctrl offers: {self.info.describe()})"
            return created, reused
        for cls, r in self.resolution.classes.items():
            if not r.schemata:
                self.degraded[cls] = "the class sets nothing this node supports"
        existing = set(self.fs.ctrl_groups())
        for cls, name in self._wanted().items():
            try:
                if name in existing:
                    reused.append(name)
                else:
                    self.fs.mkdir("", name)
                    created.append(name)
                self._write_class(cls, name)
                self.class_groups[cls] = name
            except ResctrlError as e:
                self.degraded[cls] = self._degrade_reason(e)
                if name in created and not self.fs.tasks(name):
                    self.fs.rmdir(name)
                    created.remove(name)
        return created, reused

    def _degrade_reason(self, e: ResctrlError) -> str:
        if e.errno == errno.ENOSPC:
            return (f"out of CLOSIDs (num_closids {self.info.num_closids}, root included): "
                    f"{e.last_cmd_status or 'ENOSPC'}; its containers stay in the root group")
        return f"{e}; its containers stay in the root group"

    def _write_class(self, cls: str, name: str) -> None:
        want = self.resolution.classes[cls].schemata
        change = want.differs(self.fs.schemata(name))
        self.fs.write_schemata(name, change)

    def _write_root(self) -> None:
        if self.resolution.root and self.info.alloc_capable:
            self.fs.write_schemata("", self.resolution.root.differs(self.fs.schemata("")))

    # -- garbage collection --------------------------------------------------------------------

    def gc(self, alive: Iterable[str]) -> tuple[list[str], dict[str, str]]:
        """Forget containers not in `alive`; remove our empty groups nobody needs."""
        alive = set(alive)
        for cid in [c for c in set(self.placement) | set(self.mon) | set(self.classes) if c not in alive]:
            self.placement.pop(cid, None)
            self.classes.pop(cid, None)
            self.by_class.discard(cid)
            self.mon.pop(cid, None)
            self.tracker.forget(cid)
        with self.fs.lock():
            return self._gc(alive, initial=False)

    def _gc(self, alive: set[str], *, initial: bool) -> tuple[list[str], dict[str, str]]:
        removed: list[str] = []
        kept: dict[str, str] = {}
        wanted = set(self._wanted().values())
        in_use = set(self.mon.values())
        for ctrl in [""] + self.fs.ctrl_groups():
            if ctrl and not self.ours(ctrl):
                continue  # not ours: never touched, not even its monitoring groups
            if self.info.mon_capable:
                for mname in self.fs.mon_groups(ctrl):
                    rel = self.fs.mon_rel(ctrl, mname)
                    if self.ours(mname) and rel not in in_use:
                        self._remove_if_empty(rel, removed, kept)
            if ctrl and ctrl not in wanted and (initial or ctrl not in self.class_groups.values()):
                self._remove_if_empty(ctrl, removed, kept)
        if removed:
            self._rmids_exhausted = False
        return removed, kept

    def _remove_if_empty(self, rel: str, removed: list[str], kept: dict[str, str]) -> None:
        try:
            tasks = self.fs.tasks(rel)
            if tasks:
                kept[rel] = f"has {len(tasks)} tasks; never removing a non-empty group"
                return
            self.fs.rmdir(rel)
            removed.append(rel)
        except ResctrlError as e:
            kept[rel] = str(e)

    # -- assignment ----------------------------------------------------------------------------

    def target(self, cls: str | None) -> tuple[str, str]:
        """(control group rel, degraded reason) for a class; None and degraded classes -> root."""
        if cls is None:
            return "", ""
        if cls not in self.resolution.classes:
            return "", f"class {cls!r} is not configured"
        if cls in self.class_groups:
            return self.class_groups[cls], ""
        return "", self.degraded.get(cls, "class group not created")

    def assign(self, container_id: str, cls: str | None, tids: Iterable[int]) -> MoveResult:
        """Put every thread of the container in the class's group (re-sweep: only missing ones)."""
        with self.fs.lock():
            return self._assign_one(container_id, cls, sorted(set(tids)), _Members(self.fs))

    def assign_many(self, items: Iterable[tuple[str, str | None, Iterable[int]]]) -> list[MoveResult]:
        """`assign` for a whole cycle under one lock, reading each group's tasks once.

        A kernel error for one container is recorded in its result (`error`), not raised."""
        out = []
        with self.fs.lock():
            members = _Members(self.fs)
            for cid, cls, tids in items:
                try:
                    out.append(self._assign_one(cid, cls, sorted(set(tids)), members))
                except ResctrlError as e:
                    out.append(MoveResult(container=cid, group=self.placement.get(cid, ""), error=str(e)))
                    members.cache.clear()  # a failed write leaves the kernel's view uncertain
        return out

    def _assign_one(self, container_id: str, cls: str | None, tids: list[int], members: _Members) -> MoveResult:
        group, why = self.target(cls)
        if group:
            have = members.get(group)
            missing = [t for t in tids if t not in have]
        else:
            ours: set[int] = set().union(*(members.get(g) for g in self.class_groups.values()))
            was_ours = self.placement.get(container_id, "") != ""
            missing = [t for t in tids if was_ours or t in ours]
        moved, gone = self._write_tids(group, missing)
        members.moved(group, missing)
        previous = self.placement.get(container_id)
        self.placement[container_id] = group
        self.classes[container_id] = cls
        if container_id in self.mon:
            self._follow_monitor(container_id, group, previous, tids)
        return MoveResult(container=container_id, group=group, moved=moved, gone=gone, degraded=why)

    def _write_tids(self, group: str, tids: Iterable[int]) -> tuple[int, int]:
        moved = gone = 0
        for tid in tids:
            if self.fs.add_task(group, tid):
                moved += 1
            else:
                gone += 1
        return moved, gone

    def _follow_monitor(self, cid: str, group: str, previous: str | None, tids: list[int]) -> None:
        """After a move the threads left their monitoring group: re-add, or recreate under `group`."""
        rel = self.mon[cid]
        if previous == group and self.fs.exists(rel):
            self._fill_mon(rel, tids)
            return
        del self.mon[cid]
        self.tracker.forget(cid)
        removed: list[str] = []
        self._remove_if_empty(rel, removed, {})
        if removed:
            self._rmids_exhausted = False
        self._ensure_mon(cid, group, tids)

    # -- monitoring ----------------------------------------------------------------------------

    def monitor(self, container_id: str, tids: Iterable[int]) -> str | None:
        """The container's monitoring group (created or adopted, threads re-swept), or None."""
        if not self.info.mon_capable or not self.monitor_containers:
            return None
        tids = sorted(set(tids))
        group = self.placement.get(container_id, "")
        with self.fs.lock():
            rel = self.mon.get(container_id)
            if rel is not None and self.fs.exists(rel):
                self._fill_mon(rel, tids)
                return rel
            self.mon.pop(container_id, None)
            return self._ensure_mon(container_id, group, tids)

    def _ensure_mon(self, cid: str, group: str, tids: list[int]) -> str | None:
        if self.max_mon_groups and len(self.mon) >= self.max_mon_groups:
            return self._by_class(cid, f"max_mon_groups {self.max_mon_groups} reached")
        name = self.mon_group_name(cid)
        rel = self.fs.mon_rel(group, name)
        if not self.fs.exists(rel):
            if self._rmids_exhausted:
                return self._by_class(cid, self.mon_reason)
            try:
                self.fs.mkdir(self.fs.mon_rel(group, "").rstrip("/"), name)
            except ResctrlError as e:
                if e.errno != errno.ENOSPC:
                    raise
                self._rmids_exhausted = True
                return self._by_class(cid, f"out of RMIDs (num_rmids {self.info.mon.num_rmids if self.info.mon else 0}): "
                                           f"{e.last_cmd_status or 'ENOSPC'}")
        self.mon[cid] = rel
        self.by_class.discard(cid)
        self._fill_mon(rel, tids)
        return rel

    def _by_class(self, cid: str, reason: str) -> None:
        self.by_class.add(cid)
        self.mon_reason = reason
        return None

    def _fill_mon(self, rel: str, tids: list[int]) -> None:
        have = self.fs.tasks(rel)
        for tid in tids:
            if tid in have:
                continue
            try:
                self.fs.add_task(rel, tid)
            except ResctrlError as e:
                if e.errno != errno.EINVAL:  # "Can't move task to different control group": not ours
                    raise

    def monitoring_mode(self) -> str:
        if not self.info.mon_capable:
            return "off"
        if not self.monitor_containers:
            return "by-class"
        return "per-container+by-class" if self.by_class else "per-container"
