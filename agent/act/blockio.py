"""Block-I/O classes: a weight and per-device bps/iops limits written to a container's cgroup.

cgroup v1 (`blkio`): limits go to `blkio.throttle.{read,write}_{bps,iops}_device` one
"MAJ:MIN VALUE" line per write, "MAJ:MIN 0" removes one (Documentation/admin-guide/cgroup-v1/
blkio-controller.rst); the proportional weight is BFQ's `blkio.bfq.weight` (1-1000), honoured only
on devices whose scheduler is bfq. cgroup v2 (`io`): `io.max` takes "MAJ:MIN rbps=N wbps=N
riops=N wiops=N" ("max" removes a limit) and the weight is `io.bfq.weight` or `io.weight`
(Documentation/admin-guide/cgroup-v2.rst). Throttling applies to whole disks only: the kernel
refuses a partition's numbers (blkg_conf_open_bdev -> ENODEV), so globs skip partitions and a
partition named explicitly is an error.

Devices are named in the configuration by path or glob and resolved to MAJ:MIN every time a class
is applied, so a device that appears later is picked up at the next cycle. Only entries this
controller wrote are ever cleared; limits set by a runtime on other devices stay.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from perfbalance.cgroupfs import Cgroupfs
from perfbalance.classes import BlockIoClass, BlockIoSection, ClassError, DeviceLimit
from perfbalance.errors import ContainerGone, FeatureUnavailable
from perfbalance.model import Container

V1_FILES = {"read_bps": "blkio.throttle.read_bps_device", "write_bps": "blkio.throttle.write_bps_device",
            "read_iops": "blkio.throttle.read_iops_device", "write_iops": "blkio.throttle.write_iops_device"}
V2_KEYS = {"read_bps": "rbps", "write_bps": "wbps", "read_iops": "riops", "write_iops": "wiops"}

Limits = dict[str, dict[str, int]]  # "MAJ:MIN" -> {read_bps: n, ...} (0: no limit)


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """A class's limits by MAJ:MIN as the devices are now, and what could not be resolved."""

    limits: Limits = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # a named device missing, not a block device, a partition
    notes: tuple[str, ...] = ()  # a glob that matches nothing (yet)


def resolve_class(name: str, cls: BlockIoClass, *, dev_root: str, sysfs_root: str) -> Resolved:
    """Every device limit of class `name` as MAJ:MIN -> limits; later entries win per device."""
    limits: Limits = {}
    problems, notes = [], []
    for i, dev in enumerate(cls.devices):
        where = f"blockio.classes.{name}.devices[{i}].path"
        found, problem = resolve_devices(dev, dev_root=dev_root, sysfs_root=sysfs_root)
        if problem:
            problems.append(f"{where}: {dev.path!r} {problem}")
        elif not found:
            notes.append(f"{where}: {dev.path!r} matches no whole-disk block device (yet)")
        for majmin in found:
            limits.setdefault(majmin, {}).update(dev.limits())
    return Resolved(limits=limits, problems=tuple(problems), notes=tuple(notes))


def resolve_devices(dev: DeviceLimit, *, dev_root: str, sysfs_root: str) -> tuple[list[str], str]:
    """MAJ:MIN of the whole disks `dev.path` names, or ([], why not) for a bad explicit path."""
    rel = dev.path.removeprefix("/dev/")
    if not dev.is_glob():
        majmin, problem = _block_device(os.path.join(dev_root, rel), sysfs_root)
        return ([majmin] if majmin else []), problem
    out = []
    for path in sorted(_glob(dev_root, rel)):
        majmin, problem = _block_device(path, sysfs_root)
        if majmin and not problem:
            out.append(majmin)
    return sorted(set(out)), ""


def _glob(dev_root: str, rel: str) -> list[str]:
    """Matches of a glob under dev_root, one directory level per pattern element (no recursion
    through symlinked directories: only the last element may match a symlink to a device)."""
    dirs = [dev_root]
    parts = rel.split("/")
    for depth, part in enumerate(parts):
        nxt = []
        for d in dirs:
            try:
                names = sorted(os.listdir(d))
            except OSError:
                continue
            for n in fnmatch.filter(names, part):
                p = os.path.join(d, n)
                if depth == len(parts) - 1 or (os.path.isdir(p) and not os.path.islink(p)):
                    nxt.append(p)
        dirs = nxt
    return dirs


def _block_device(path: str, sysfs_root: str) -> tuple[str, str]:
    try:
        st = os.stat(path)  # follows /dev/disk/by-id/... symlinks to the device node
    except FileNotFoundError:
        return "", "does not exist"
    except OSError as e:
        return "", f"cannot be read ({e.strerror})"
    if not stat.S_ISBLK(st.st_mode):
        return "", "is not a block device"
    majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if os.path.exists(os.path.join(sysfs_root, "dev", "block", majmin, "partition")):
        return "", f"is a partition ({majmin}): limits apply to whole disks only"
    return majmin, ""


class BlockIoController:
    """Puts containers into block-I/O classes on one node (v1 blkio or v2 io)."""

    name = "blockio"
    reapply = True  # devices are resolved again every cycle

    def __init__(self, *, section: BlockIoSection, cgroupfs: Cgroupfs, dev_root: str = "/dev",
                 sysfs_root: str = "/sys") -> None:
        self.section, self.cgfs = section, cgroupfs
        self.dev_root, self.sysfs_root = dev_root, sysfs_root
        # controllers(), not has(): on a v2-only host has() answers for any name (core files)
        names = cgroupfs.controllers()
        self.v2 = "io" in names and "blkio" not in names
        self.controller = "io" if self.v2 else "blkio"
        self.applied: dict[str, tuple[str | None, Limits, int]] = {}  # cid -> (class, limits, weight)
        self._resolved: dict[str, Resolved] = {}

    def begin_cycle(self) -> None:
        """Devices are resolved again once per cycle (a disk attached since is picked up)."""
        self._resolved = {}

    # -- what the node offers ----------------------------------------------------------------
    def unavailable(self) -> str:
        """Why block-I/O classes cannot be used here ("" when they can)."""
        names = self.cgfs.controllers()
        if "blkio" not in names and "io" not in names:
            return f"neither the blkio (v1) nor the io (v2) controller is mounted under {self.cgfs.root}"
        if self.v2 and self.cgfs.hierarchy("io").version != 2:
            return "io controller not in the v2 hierarchy"
        return ""

    def weight_file(self, rel: str = "") -> str:
        """The weight file this node has ("" when none: no BFQ and no io.cost)."""
        names = ("io.bfq.weight", "io.weight") if self.v2 else ("blkio.bfq.weight", "blkio.weight")
        for n in names:
            if self.cgfs.try_read(rel, self.controller, n) is not None:
                return n
        return ""

    def classes(self) -> Mapping[str, bool]:
        return {k: v.allow_annotation for k, v in self.section.classes.items()}

    # -- applying ------------------------------------------------------------------------------
    def resolve(self, class_name: str) -> Resolved:
        if class_name not in self._resolved:
            self._resolved[class_name] = resolve_class(class_name, self.section.classes[class_name],
                                                       dev_root=self.dev_root, sysfs_root=self.sysfs_root)
        return self._resolved[class_name]

    def apply(self, container: Container, class_name: str | None) -> list[str]:
        """Make the container's cgroup match `class_name` (None: clear what we set). Returns notes;
        raises ClassError (bad device, refused write) or ContainerGone. Writes only changes."""
        if class_name is not None and class_name not in self.section.classes:
            raise ClassError(self.name, container, "class", class_name, "is not a configured block-I/O class")
        notes: list[str] = []
        limits: Limits = {}
        weight = 0
        if class_name is not None:
            resolved = self.resolve(class_name)
            if resolved.problems:
                raise ClassError(self.name, container, "class", class_name, "; ".join(resolved.problems))
            limits, notes = resolved.limits, list(resolved.notes)
            weight = self.section.classes[class_name].weight
        _old_class, old_limits, old_weight = self.applied.get(container.id, (None, {}, 0))
        self._write_limits(container, old_limits, limits)
        notes += self._write_weight(container, old_weight, weight, class_name)
        self.applied[container.id] = (class_name, limits, weight)
        return notes

    def _write_limits(self, c: Container, old: Limits, new: Limits) -> None:
        for majmin in sorted(set(old) | set(new)):
            want = {k: new.get(majmin, {}).get(k, 0) for k in V1_FILES}
            had = {k: old.get(majmin, {}).get(k, 0) for k in V1_FILES}
            if want == had:
                continue
            if self.v2:
                value = " ".join(f"{V2_KEYS[k]}={v or 'max'}" for k, v in want.items())
                self._write(c, "io.max", f"{majmin} {value}")
                continue
            for k, file in V1_FILES.items():
                if want[k] != had[k]:
                    self._write(c, file, f"{majmin} {want[k]}")

    def _write_weight(self, c: Container, old: int, new: int, class_name: str | None) -> list[str]:
        if new == old or new == 0:
            return []  # a weight we set stays until another class sets one (the default is 100)
        file = self.weight_file(c.cgroup)
        if not file:
            why = f"class {class_name}: weight {new} not enforced: no BFQ weight file (io scheduler bfq not available)"
            if self.section.enforce == "hard":
                raise ClassError(self.name, c, "class", class_name or "", why)
            return [why]
        self._write(c, file, f"default {new}" if file == "io.weight" else str(new))
        return []

    def _write(self, c: Container, file: str, value: str) -> None:
        try:
            self.cgfs.write(c.cgroup, self.controller, file, value)
        except ContainerGone:
            raise
        except FeatureUnavailable as e:
            raise ClassError(self.name, c, file, value, str(e)) from None
        except OSError as e:
            name = errno.errorcode.get(e.errno or 0, str(e.errno))
            raise ClassError(self.name, c, file, value, f"kernel refused ({name}: {e.strerror})") from None

    def adopt(self, container_id: str, class_name: str | None) -> None:
        """A previous run put the container in `class_name`: what it wrote is what we clear later."""
        if class_name is None or class_name not in self.section.classes:
            self.applied.pop(container_id, None)
            return
        self.applied[container_id] = (class_name, self.resolve(class_name).limits,
                                      self.section.classes[class_name].weight)

    def forget(self, alive: Sequence[str]) -> None:
        keep = set(alive)
        self.applied = {k: v for k, v in self.applied.items() if k in keep}
