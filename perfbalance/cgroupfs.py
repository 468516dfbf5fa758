"""Cgroupfs: one way to find, read and write a cgroup on v1, v2 and hybrid hosts.

Every part of perfbalance that touches cgroups (discovery, the cgroup-stats collector, the cpuset
actuator, BPF cgroup ids, tests and the demo) goes through this class, so that the layout
question ("which directory holds cpuset for this container?") is answered once. The root is
passed in (`/sys/fs/cgroup` on a host, a host mount in a DaemonSet, a temp tree in tests).

Layouts, detected from the tree under the root (not from /proc/mounts, so a temp tree works):
- v2: `<root>/cgroup.controllers` exists; every controller lives in that one hierarchy.
- hybrid: `<root>/unified/cgroup.controllers` exists next to v1 controller directories
  (systemd's "hybrid" mode; this project's development machine).
- v1: only controller directories. Named and co-mounted hierarchies are handled: a directory
  `cpu,cpuacct` serves both `cpu` and `cpuacct` (the `cpu` and `cpuacct` symlinks beside it resolve
  to it); `systemd` is the named `name=systemd` hierarchy.

Containers carry `cgroup` relative to the root *without* the controller prefix; `dir(rel,
controller)` maps it to an absolute directory. ENOENT/ENODEV/ESRCH on a cgroup file mean the
container went away between two reads and become `ContainerGone`.

Every file and directory is opened relative to its hierarchy's root without following symlinks
and without crossing a mount (perfbalance.safefs): a symlink planted in a delegated subtree is
refused (CgroupPathRefused), never followed. With `verify_fs` on (the default when the hierarchies
are real cgroup mounts) each opened file must also be on cgroup/cgroup2 (statfs magic), and a
root whose hierarchies are not cgroup filesystems is refused at construction.

The file also holds pure parsers for the cgroup stat files (cpu.stat, cpuacct.usage, memory.*,
cpu.max, PSI) used by discovery and the cgroup-stats collector.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ContainerGone, FeatureUnavailable, ParseError, PerfbalanceError
from perfbalance.names import PATH_ELEMENT, name_problem
from perfbalance.safefs import (CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC, SafeTree, UnsafePath, fs_magic,
                                magic_name, read_bounded, read_text)

Layout = Literal["v1", "v2", "hybrid"]

MAX_READ_BYTES = 1 << 20  # one cgroup control file; cgroup.procs/threads get MAX_LIST_BYTES
MAX_LIST_BYTES = 16 << 20
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENODEV, errno.ESRCH})
# Order in which hierarchies are asked for a cgroup's processes and existence on v1/hybrid.
PRIMARY_ORDER = ("cpuset", "cpu", "cpuacct", "memory", "pids")
UNLIMITED_BYTES = 1 << 62  # v1 memory.limit_in_bytes reports ~2^63 rounded to pages for "no limit"


class CgroupfsError(PerfbalanceError):
    """A cgroup operation failed for a reason other than the cgroup being gone."""

    def __init__(self, op: str, path: str, err: int, detail: str = "") -> None:
        self.op, self.path, self.errno = op, path, err
        name = errno.errorcode.get(err, str(err))
        super().__init__(f"cgroup {op} {path} failed ({name})" + (f": {detail}" if detail else ""))


class CgroupPathRefused(CgroupfsError):
    """A cgroup path leads through a symlink, across a mount, or off a cgroup filesystem."""

    def __init__(self, op: str, path: str, reason: str) -> None:
        super().__init__(op, path, errno.ELOOP, reason)
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class Hierarchy:
    """One mounted cgroup hierarchy: where it is and which controllers it carries."""

    path: str  # absolute directory of its root cgroup
    version: int  # 1 or 2
    controllers: frozenset[str]

    @property
    def magic(self) -> int:
        return CGROUP2_SUPER_MAGIC if self.version == 2 else CGROUP_SUPER_MAGIC


# ---------------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------------

def check_rel(rel: str) -> str:
    """Normalise a cgroup path relative to the root; reject anything that could escape it."""
    if not isinstance(rel, str) or "\x00" in rel:
        raise ParseError("cgroup path", rel, "must be a string without NUL")
    parts = [p for p in rel.strip("/").split("/") if p]
    for p in parts:
        if p in (".", ".."):
            raise ParseError("cgroup path", rel, "'.' and '..' components are not allowed")
    return "/".join(parts)


def check_name(name: str) -> str:
    """A control-file name: one path element."""
    if name_problem(name, PATH_ELEMENT):
        raise ParseError("cgroup file name", name, "must be a single path element")
    return name


def _is_gone(e: OSError) -> bool:
    return e.errno in GONE_ERRNOS


# ---------------------------------------------------------------------------------------------
# layout detection
# ---------------------------------------------------------------------------------------------

def detect(root: str) -> tuple[Layout, tuple[Hierarchy, ...]]:
    """Find the hierarchies under `root` and name the layout."""
    if os.path.isfile(os.path.join(root, "cgroup.controllers")):
        return "v2", (_v2_hierarchy(root),)
    v1 = _v1_hierarchies(root)
    unified = os.path.join(root, "unified")
    if os.path.isfile(os.path.join(unified, "cgroup.controllers")):
        return "hybrid", (*v1, _v2_hierarchy(unified))
    if not v1:
        raise FeatureUnavailable("cgroupfs", f"no cgroup hierarchy found under {root}")
    return "v1", v1


def _v2_hierarchy(path: str) -> Hierarchy:
    # layout detection reads files at the trusted root itself; cgroups go through SafeTree
    text = read_text(os.path.join(path, "cgroup.controllers"), MAX_READ_BYTES, "cgroup file")
    return Hierarchy(path=path, version=2, controllers=frozenset(text.split()))


def _v1_hierarchies(root: str) -> tuple[Hierarchy, ...]:
    """Group controller directories by what they resolve to (symlinks join co-mounts)."""
    by_real: dict[str, set[str]] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError as e:
        raise FeatureUnavailable("cgroupfs", f"cannot list {root}: {e.strerror}") from None
    for name in entries:
        path = os.path.join(root, name)
        if name == "unified" or not os.path.isdir(path):
            continue
        real = os.path.realpath(path)
        names = by_real.setdefault(real, set())
        names.update(n.removeprefix("name=") for n in name.split(",") if n)
        names.update(n.removeprefix("name=") for n in os.path.basename(real).split(",") if n)
    out = []
    for real, names in sorted(by_real.items()):
        # Prefer the directory under the root that carries the real name (no symlink hop).
        own = os.path.join(root, os.path.basename(real))
        path = own if os.path.realpath(own) == real else real
        out.append(Hierarchy(path=path, version=1, controllers=frozenset(names)))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# raw file access
# ---------------------------------------------------------------------------------------------

def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _verify(hierarchies: Sequence[Hierarchy], verify_fs: bool | None) -> bool:
    """Whether to require cgroup magic: asked, or auto (any hierarchy is a real cgroup mount).

    In auto mode a tree where some hierarchies are cgroup mounts and others are not is refused:
    a plain directory posing as a controller next to real ones is not a layout we write into.
    """
    if verify_fs is False:
        return False
    found = {h.path: _magic_or_zero(h.path) for h in hierarchies}
    if verify_fs is None and not any(m in (CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC) for m in found.values()):
        return False
    for h in hierarchies:
        if found[h.path] != h.magic:
            raise UnsafePath(h.path, f"cgroup v{h.version} hierarchy is on a {magic_name(found[h.path])} "
                                     f"filesystem, not {magic_name(h.magic)}")
    return True


def _magic_or_zero(path: str) -> int:
    try:
        return fs_magic(path)
    except OSError:
        return 0


class Cgroupfs:
    """The cgroup filesystems under one root (see the module docstring for layouts)."""

    def __init__(self, *, root: str = "/sys/fs/cgroup", verify_fs: bool | None = None) -> None:
        """`verify_fs`: require cgroup/cgroup2 statfs magic on every hierarchy and opened file
        (None: when the hierarchies are real cgroup mounts, so plain temp trees work in tests)."""
        self.root = os.path.abspath(root)
        self.layout: Layout
        self.layout, self.hierarchies = detect(self.root)
        self.verify_fs = _verify(self.hierarchies, verify_fs)
        self._trees = {h.path: SafeTree(h.path, magic=h.magic if self.verify_fs else None)
                       for h in self.hierarchies}
        self._by_controller: dict[str, Hierarchy] = {}
        for h in self.hierarchies:  # v1 first: a controller bound to v1 is not usable in v2
            for c in sorted(h.controllers):
                self._by_controller.setdefault(c, h)
        self._v2 = next((h for h in self.hierarchies if h.version == 2), None)

    def __repr__(self) -> str:
        return f"Cgroupfs(root={self.root!r}, layout={self.layout!r})"

    # -- layout ---------------------------------------------------------------------------
    def controllers(self) -> tuple[str, ...]:
        """Every controller (and named v1 hierarchy) available somewhere under the root."""
        return tuple(sorted(self._by_controller))

    def hierarchy(self, controller: str | None) -> Hierarchy:
        """The hierarchy serving `controller` (None: the v2 one)."""
        if controller is None:
            if self._v2 is None:
                raise FeatureUnavailable("cgroup v2", f"no v2 hierarchy under {self.root} (layout v1)")
            return self._v2
        h = self._by_controller.get(controller)
        if h is None and self._v2 is not None and self.layout == "v2":
            return self._v2  # v2 core files (cpu.stat, *.pressure) exist without the controller
        if h is None:
            raise FeatureUnavailable(f"cgroup controller {controller}",
                                     f"not mounted under {self.root} ({self.layout})")
        return h

    def has(self, controller: str | None) -> bool:
        try:
            self.hierarchy(controller)
        except FeatureUnavailable:
            return False
        return True

    def version(self, controller: str | None) -> int:
        return self.hierarchy(controller).version

    def dir(self, rel: str, controller: str | None = None) -> str:
        """Absolute directory of cgroup `rel` in the hierarchy holding `controller`."""
        rel = check_rel(rel)
        base = self.hierarchy(controller).path
        return os.path.join(base, rel) if rel else base

    def _loc(self, rel: str, controller: str | None) -> tuple[SafeTree, str]:
        """The hierarchy's SafeTree and the normalised relative path of cgroup `rel` in it."""
        return self._trees[self.hierarchy(controller).path], check_rel(rel)

    def _tree(self, h: Hierarchy) -> SafeTree:
        return self._trees[h.path]

    def relevant(self, controllers: Sequence[str] | None = None) -> tuple[Hierarchy, ...]:
        """Hierarchies for `controllers` (None: all) plus the v2 one, deduplicated, v2 last."""
        if controllers is None:
            return self.hierarchies
        out: list[Hierarchy] = []
        for c in controllers:
            h = self.hierarchy(c)
            if h not in out:
                out.append(h)
        if self._v2 is not None and self._v2 not in out:
            out.append(self._v2)
        return tuple(out)

    def primary(self, rel: str) -> str:
        """The directory asked for a cgroup's processes: v2 if it exists there, else v1 cpuset..."""
        candidates: list[str | None] = [None] if self._v2 is not None else []
        candidates += [c for c in PRIMARY_ORDER if c in self._by_controller]
        for c in candidates:
            tree, r = self._loc(rel, c)
            if self._isdir(tree, r, "stat"):
                return tree.path(r)
        raise ContainerGone(rel or "/", "cgroup directory not found in any hierarchy")

    def exists(self, rel: str, controller: str | None = None) -> bool:
        tree, r = self._loc(rel, controller)
        return self._isdir(tree, r, "stat")

    @staticmethod
    def _isdir(tree: SafeTree, r: str, op: str) -> bool:
        """A real directory (no symlink anywhere); a symlink is refused, not "absent"."""
        try:
            fd = tree.open(r, os.O_PATH | os.O_DIRECTORY)
        except UnsafePath as e:
            raise CgroupPathRefused(op, e.path, e.reason) from None
        except OSError:
            return False
        os.close(fd)
        return True

    # -- opening (for callers that keep descriptors: the cgroup-stats cache, perf cgroup fds) --
    def open_file(self, rel: str, controller: str | None, name: str, flags: int = os.O_RDONLY) -> int:
        """An fd for one control file (O_CLOEXEC), opened without symlinks; gone -> ContainerGone."""
        tree, r = self._loc(rel, controller)
        return self._open(tree, r, _join(r, check_name(name)), flags, rel, "open")

    def open_dir(self, rel: str, controller: str | None = None) -> int:
        """An O_RDONLY|O_DIRECTORY fd of the cgroup directory (perf_event_open's cgroup fd)."""
        tree, r = self._loc(rel, controller)
        return self._open(tree, r, r, os.O_RDONLY | os.O_DIRECTORY, rel, "open")

    def _open(self, tree: SafeTree, r: str, target: str, flags: int, rel: str, op: str) -> int:
        try:
            return tree.open(target, flags)
        except UnsafePath as e:
            raise CgroupPathRefused(op, e.path, e.reason) from None
        except OSError as e:
            path = tree.path(target)
            if e.errno == errno.ENOENT and target != r and self._isdir(tree, r, op):
                raise CgroupfsError(op, path, e.errno, "no such control file here "
                                    "(controller not enabled for this cgroup?)") from None
            if _is_gone(e) or e.errno == errno.ENOTDIR:
                raise ContainerGone(rel or "/", f"{path}: {e.strerror}") from None
            raise CgroupfsError(op, path, e.errno or 0, e.strerror or "") from None

    # -- reading --------------------------------------------------------------------------
    def read(self, rel: str, controller: str | None, name: str, *, limit: int = MAX_READ_BYTES) -> str:
        """Read one control file, at most `limit` bytes; a vanished cgroup -> ContainerGone."""
        tree, r = self._loc(rel, controller)
        return self._read_at(tree, r, _join(r, check_name(name)), limit, rel)

    def _read_at(self, tree: SafeTree, r: str, target: str, limit: int, rel: str) -> str:
        fd = self._open(tree, r, target, os.O_RDONLY, rel, "read")
        path = tree.path(target)
        try:
            raw = read_bounded(fd, limit, path)
        except OverflowError:
            raise ParseError("cgroup file", path, f"larger than {limit} bytes") from None
        except OSError as e:
            if _is_gone(e):
                raise ContainerGone(rel or "/", f"{path}: {e.strerror}") from None
            raise CgroupfsError("read", path, e.errno or 0, e.strerror or "") from None
        finally:
            os.close(fd)
        return raw.decode("utf-8", errors="replace")

    def read_int(self, rel: str, controller: str | None, name: str) -> int:
        text = self.read(rel, controller, name).strip()
        try:
            return int(text)
        except ValueError:
            raise ParseError("cgroup integer", text[:80], "not an integer",
                             source=os.path.join(self.dir(rel, controller), name)) from None

    def read_cpuset(self, rel: str, controller: str | None, name: str) -> CpuSet:
        text = self.read(rel, controller, name)
        return CpuSet.parse(text, source=os.path.join(self.dir(rel, controller), name))

    def try_read(self, rel: str, controller: str | None, name: str) -> str | None:
        """Like read() but None when the file (not the cgroup) does not exist here."""
        tree, r = self._loc(rel, controller)
        target = _join(r, check_name(name))
        try:
            return self._read_at(tree, r, target, MAX_READ_BYTES, rel)
        except CgroupfsError as e:
            if e.errno == errno.ENOENT:
                return None  # the cgroup is there (checked by _open), the file is not
            raise

    def cgroup_id(self, rel: str) -> int | None:
        """The v2 cgroup id (the directory's inode, what bpf_get_current_cgroup_id returns)."""
        if self._v2 is None:
            return None
        tree, r = self._loc(rel, None)
        fd = self._open(tree, r, r, os.O_PATH | os.O_DIRECTORY, rel, "stat")
        try:
            return os.fstat(fd).st_ino
        finally:
            os.close(fd)

    def pids(self, rel: str, *, recursive: bool = False) -> list[int]:
        """Processes (thread-group leaders) in the cgroup; with `recursive`, also in descendants.

        A container's processes can live in child cgroups (crun's `container/`, CRI-O `exec`
        sessions): use recursive=True for "all processes of this container".
        """
        if not recursive:
            return self._ids(rel, "cgroup.procs")
        return self._subtree_ids(rel, "cgroup.procs")

    def tids(self, rel: str, *, recursive: bool = False) -> list[int]:
        """Every thread in the cgroup (v2 cgroup.threads, v1 tasks); see pids() for recursive."""
        d = self.primary(rel)
        name = "cgroup.threads" if self._is_v2_dir(d) else "tasks"
        return self._subtree_ids(rel, name) if recursive else self._ids(rel, name, d)

    def _subtree_ids(self, rel: str, name: str) -> list[int]:
        d = self.primary(rel)
        ctl = None if self._is_v2_dir(d) else self._controller_of(d)
        out: list[int] = self._ids(rel, name, d)
        for sub in list(self.walk(rel, ctl))[1:]:
            try:
                out += self._ids(sub, name, self.dir(sub, ctl))
            except ContainerGone:
                continue
        return out

    def _controller_of(self, d: str) -> str:
        for c, h in self._by_controller.items():
            if h.version == 1 and (d == h.path or d.startswith(h.path + "/")):
                return c
        raise FeatureUnavailable("cgroup hierarchy", f"no controller owns {d}")

    def _is_v2_dir(self, d: str) -> bool:
        return self._v2 is not None and (d == self._v2.path or d.startswith(self._v2.path + "/"))

    def _ids(self, rel: str, name: str, d: str | None = None) -> list[int]:
        d = d or self.primary(rel)
        h = self._owner(d)
        r = check_rel(os.path.relpath(d, h.path)) if d != h.path else ""
        text = self._read_at(self._tree(h), r, _join(r, name), MAX_LIST_BYTES, rel)
        return parse_id_list(text, source=os.path.join(d, name))

    def _owner(self, d: str) -> Hierarchy:
        """The hierarchy whose directory holds absolute path `d` (the deepest match)."""
        best = [h for h in self.hierarchies if d == h.path or d.startswith(h.path + "/")]
        if not best:
            raise FeatureUnavailable("cgroup hierarchy", f"no hierarchy holds {d}")
        return max(best, key=lambda h: len(h.path))

    def children(self, rel: str, controller: str | None = None) -> list[str]:
        """Names of the child cgroups of `rel` (sorted); a vanished parent -> ContainerGone."""
        tree, r = self._loc(rel, controller)
        fd = self._open(tree, r, r, os.O_RDONLY | os.O_DIRECTORY, rel, "list")
        try:
            with os.scandir(fd) as it:
                return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        except OSError as e:
            if _is_gone(e):
                raise ContainerGone(rel or "/", f"{tree.path(r)}: {e.strerror}") from None
            raise CgroupfsError("list", tree.path(r), e.errno or 0, e.strerror or "") from None
        finally:
            os.close(fd)

    def walk(self, rel: str = "", controller: str | None = None, *,
             max_depth: int = 12) -> Iterator[str]:
        """Every cgroup under `rel` (relative paths, parents before children); vanished skipped."""
        yield check_rel(rel)
        if max_depth <= 0:
            return
        try:
            kids = self.children(rel, controller)
        except ContainerGone:
            return
        for k in kids:
            yield from self.walk(f"{check_rel(rel)}/{k}".strip("/"), controller, max_depth=max_depth - 1)

    # -- writing --------------------------------------------------------------------------
    def write(self, rel: str, controller: str | None, name: str, value: str) -> None:
        """Write one control file in one write(2). Cgroup gone -> ContainerGone; else OSError.

        Other errnos are left to the caller, which knows what they mean (the cpuset actuator turns
        them into CpusetError).
        """
        tree, r = self._loc(rel, controller)
        target = _join(r, check_name(name))
        path = tree.path(target)
        try:
            fd = tree.open(target, os.O_WRONLY | os.O_TRUNC)  # O_TRUNC: as `echo >`
        except UnsafePath as e:
            raise CgroupPathRefused("write", e.path, e.reason) from None
        except OSError as e:
            if e.errno == errno.ENOENT and self._isdir(tree, r, "write"):
                raise  # the cgroup is there, the control file is not: not "gone"
            if _is_gone(e) or e.errno == errno.ENOTDIR:
                raise ContainerGone(rel or "/", f"{path}: {e.strerror}") from None
            raise
        try:
            os.write(fd, value.encode())
        except OSError as e:
            if e.errno in (errno.ENODEV,):
                raise ContainerGone(rel or "/", f"{path}: {e.strerror}") from None
            raise
        finally:
            os.close(fd)

    def create(self, rel: str, controllers: Sequence[str] | None = ("cpuset", "cpu", "cpuacct")) -> None:
        """mkdir `rel` (and missing parents) in the hierarchies of `controllers` and in v2.

        Controllers not mounted here are skipped. New v1 cpuset cgroups get cpuset.cpus/mems
        copied from their parent (the kernel starts them empty and refuses tasks until set). On a
        v2 host the requested controllers are enabled in each parent's cgroup.subtree_control.
        """
        rel = check_rel(rel)
        if not rel:
            raise ParseError("cgroup path", rel, "cannot create the root cgroup")
        wanted = [c for c in controllers if self.has(c)] if controllers is not None else None
        for h in self.relevant(wanted):
            self._create_in(h, rel, wanted)

    def _create_in(self, h: Hierarchy, rel: str, wanted: Sequence[str] | None) -> None:
        tree = self._tree(h)
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            parent, path = "/".join(parts[: i - 1]), "/".join(parts[:i])
            if self._isdir(tree, path, "mkdir"):
                continue
            if h.version == 2:
                self._enable_subtree(tree, parent, wanted)
            try:
                tree.mkdir(path, 0o755)  # mkdirat in the symlink-free parent
            except FileExistsError:
                continue
            except UnsafePath as e:
                raise CgroupPathRefused("mkdir", e.path, e.reason) from None
            except OSError as e:
                raise CgroupfsError("mkdir", tree.path(path), e.errno or 0, e.strerror or "") from None
            if h.version == 1 and "cpuset" in h.controllers:
                _init_v1_cpuset(tree, parent, path)

    def _enable_subtree(self, tree: SafeTree, parent: str, wanted: Sequence[str] | None) -> None:
        if not wanted:
            return
        try:
            avail = set(_tree_text(tree, _join(parent, "cgroup.controllers")).split())
            enabled = set(_tree_text(tree, _join(parent, "cgroup.subtree_control")).split())
        except (OSError, UnsafePath, OverflowError):
            return
        missing = [c for c in wanted if c in avail and c not in enabled]
        if missing:
            _write_tree(tree, _join(parent, "cgroup.subtree_control"),
                        " ".join(f"+{c}" for c in missing), "enable controllers")

    def attach(self, rel: str, pid: int, controllers: Sequence[str] | None = None) -> None:
        """Move process `pid` into `rel` in every hierarchy where `rel` exists (or those listed)."""
        hs = self.relevant([c for c in controllers if self.has(c)]) if controllers is not None \
            else self.hierarchies
        moved = False
        r = check_rel(rel)
        for h in hs:
            tree = self._tree(h)
            d = tree.path(r)
            if not self._isdir(tree, r, "attach"):
                continue
            try:
                tree.write(_join(r, "cgroup.procs"), str(int(pid)).encode())
                moved = True
            except UnsafePath as e:
                raise CgroupPathRefused("attach", e.path, e.reason) from None
            except OSError as e:
                if e.errno == errno.ESRCH:
                    raise ContainerGone(str(pid), f"process exited before joining {rel}") from None
                if e.errno in (errno.ENOENT, errno.ENODEV):
                    raise ContainerGone(rel, f"{d}: {e.strerror}") from None
                raise CgroupfsError("attach", d, e.errno or 0, f"pid {pid}: {e.strerror}") from None
        if not moved:
            raise ContainerGone(rel, "cgroup does not exist in any hierarchy")

    def remove(self, rel: str, *, retries: int = 50, delay: float = 0.02) -> None:
        """rmdir `rel` and its descendants (deepest first) in every hierarchy; absent is fine.

        Processes must have left (exited and been reaped); a briefly busy cgroup (EBUSY while the
        kernel finishes tearing down an exited task) is retried `retries` times.
        """
        rel = check_rel(rel)
        if not rel:
            raise ParseError("cgroup path", rel, "refusing to remove the root cgroup")
        for h in reversed(self.hierarchies):
            tree = self._tree(h)
            for r in self._depth_first(tree, rel):
                _rmdir_retry(tree, r, retries, delay)

    def _depth_first(self, tree: SafeTree, top: str, depth: int = 0) -> list[str]:
        """`top` and its real subdirectories, deepest first (symlinks are never entered)."""
        if depth > 64 or not self._isdir(tree, top, "rmdir"):
            return []
        try:
            kids = tree.subdirs(top)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CgroupfsError("list", tree.path(top), e.errno or 0, e.strerror or "") from None
        out: list[str] = []
        for k in kids:
            out += self._depth_first(tree, f"{top}/{k}", depth + 1)
        return out + [top]


def _tree_text(tree: SafeTree, rel: str) -> str:
    return tree.read(rel, MAX_READ_BYTES).decode("utf-8", errors="replace")


def _init_v1_cpuset(tree: SafeTree, parent: str, path: str) -> None:
    for name in ("cpuset.cpus", "cpuset.mems"):
        try:
            value = _tree_text(tree, _join(parent, name)).strip()
        except FileNotFoundError:
            continue
        except (OSError, UnsafePath, OverflowError) as e:
            raise CgroupfsError("initialise cpuset", tree.path(_join(parent, name)),
                                getattr(e, "errno", None) or errno.EIO, str(e)) from None
        if value:
            _write_tree(tree, _join(path, name), value, "initialise cpuset")


def _write_tree(tree: SafeTree, rel: str, value: str, op: str) -> None:
    try:
        tree.write(rel, value.encode())
    except UnsafePath as e:
        raise CgroupPathRefused(op, e.path, e.reason) from None
    except OSError as e:
        raise CgroupfsError(op, tree.path(rel), e.errno or 0, f"{value!r}: {e.strerror}") from None


def _rmdir_retry(tree: SafeTree, rel: str, retries: int, delay: float) -> None:
    for attempt in range(retries + 1):
        try:
            tree.rmdir(rel)
            return
        except FileNotFoundError:
            return
        except UnsafePath as e:
            raise CgroupPathRefused("rmdir", e.path, e.reason) from None
        except OSError as e:
            if e.errno != errno.EBUSY or attempt == retries:
                raise CgroupfsError("rmdir", tree.path(rel), e.errno or 0, e.strerror or "") from None
            time.sleep(delay)


# ---------------------------------------------------------------------------------------------
# pure parsers
# ---------------------------------------------------------------------------------------------

def parse_id_list(text: str, *, source: str = "") -> list[int]:
    """cgroup.procs / tasks / cgroup.threads: one id per line."""
    out = []
    for line in text.split():
        try:
            out.append(int(line))
        except ValueError:
            raise ParseError("pid list", line[:40], "not an integer", source=source) from None
    return out


def parse_int_text(text: str, *, source: str = "") -> int:
    """A control file holding one integer (cpu.shares, cpu.weight, cfs_quota_us, ...)."""
    try:
        return int(text.strip())
    except ValueError:
        raise ParseError("cgroup integer", text.strip()[:80], "not an integer", source=source) from None


def parse_flat_keyed(text: str, *, source: str = "") -> dict[str, int]:
    """`key value` lines (cpu.stat, memory.stat, cpuacct.stat); non-integer values skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if not key:
            continue
        try:
            out[key] = int(value.strip())
        except ValueError:
            continue
    return out


@dataclass(frozen=True, kw_only=True)
class CpuStat:
    """CPU accounting of a cgroup in common units (v1 cpu.stat+cpuacct.usage or v2 cpu.stat)."""

    usage_usec: int | None = None  # v2 usage_usec, or v1 cpuacct.usage / 1000
    user_usec: int | None = None
    system_usec: int | None = None
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_usec: int = 0


def parse_cpu_stat(text: str, *, source: str = "") -> CpuStat:
    """cpu.stat of v2 (usage_usec, throttled_usec) or v1 (throttled_time in ns)."""
    kv = parse_flat_keyed(text, source=source)
    throttled = kv.get("throttled_usec")
    if throttled is None and "throttled_time" in kv:
        throttled = kv["throttled_time"] // 1000
    return CpuStat(usage_usec=kv.get("usage_usec"), user_usec=kv.get("user_usec"),
                   system_usec=kv.get("system_usec"), nr_periods=kv.get("nr_periods", 0),
                   nr_throttled=kv.get("nr_throttled", 0), throttled_usec=throttled or 0)


def parse_cpuacct_usage(text: str, *, source: str = "") -> int:
    """v1 cpuacct.usage: cumulative CPU time in nanoseconds -> microseconds."""
    try:
        return int(text.strip()) // 1000
    except ValueError:
        raise ParseError("cpuacct.usage", text[:80], "not an integer", source=source) from None


def parse_memory_limit(text: str, *, source: str = "") -> int | None:
    """v2 memory.max ("max" = None) or v1 memory.limit_in_bytes (~2^63 = None)."""
    t = text.strip()
    if t == "max":
        return None
    try:
        v = int(t)
    except ValueError:
        raise ParseError("memory limit", t[:80], "not an integer or 'max'", source=source) from None
    return None if v >= UNLIMITED_BYTES else v


def parse_memory_usage(text: str, *, source: str = "") -> int:
    """v2 memory.current or v1 memory.usage_in_bytes."""
    try:
        return int(text.strip())
    except ValueError:
        raise ParseError("memory usage", text[:80], "not an integer", source=source) from None


@dataclass(frozen=True, kw_only=True)
class CpuMax:
    quota_usec: int | None  # None: no limit
    period_usec: int


def parse_cpu_max(text: str, *, source: str = "") -> CpuMax:
    """v2 cpu.max: "max 100000" or "50000 100000" (the kernel's period is 1000..1000000 us)."""
    parts = text.split()
    try:
        if len(parts) == 1:
            period = 100000
        elif len(parts) == 2:
            period = int(parts[1])
        else:
            raise ValueError
        quota = None if parts[0] == "max" else int(parts[0])
    except (ValueError, IndexError):
        raise ParseError("cpu.max", text[:80], "expected '<quota|max> <period>'", source=source) from None
    if period <= 0:
        raise ParseError("cpu.max", text[:80], "period must be positive", source=source)
    return CpuMax(quota_usec=quota if quota is None or quota > 0 else None, period_usec=period)


def cfs_limit(quota_usec: int | None, period_usec: int) -> CpuMax:
    """v1 cpu.cfs_quota_us (-1 = no limit) and cpu.cfs_period_us as a CpuMax."""
    return CpuMax(quota_usec=quota_usec if quota_usec and quota_usec > 0 else None,
                  period_usec=period_usec)


@dataclass(frozen=True, kw_only=True)
class Psi:
    """A *.pressure file: averages as 0..1 fractions, totals in microseconds."""

    some_avg10: float = 0.0
    some_avg60: float = 0.0
    some_avg300: float = 0.0
    some_total_usec: int = 0
    full_avg10: float = 0.0
    full_avg60: float = 0.0
    full_avg300: float = 0.0
    full_total_usec: int = 0


PSI_AVGS = ("avg10", "avg60", "avg300")


def parse_psi(text: str, *, source: str = "") -> Psi:
    """`some avg10=1.23 avg60=... avg300=... total=N` and `full ...` lines (percent -> fraction).

    Unknown keys are ignored (a newer kernel may add some); averages must be 0..100 and totals
    non-negative integers, as kernel/sched/psi.c prints them.
    """
    values: dict[str, float] = {}
    totals: dict[str, int] = {}
    seen = False
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind not in ("some", "full"):
            continue
        seen = True
        for item in rest.split():
            key, _, v = item.partition("=")
            if key in PSI_AVGS:
                values[f"{kind}_{key}"] = _psi_avg(v, line, source)
            elif key == "total":
                totals[f"{kind}_total_usec"] = _psi_total(v, line, source)
    if not seen:
        raise ParseError("pressure", text[:120], "no 'some'/'full' lines", source=source)
    return Psi(**values, **totals)


def _psi_avg(v: str, line: str, source: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise ParseError("pressure", line[:120], f"bad average {v[:40]!r}", source=source) from None
    if not 0.0 <= f <= 100.0:  # also rejects nan
        raise ParseError("pressure", line[:120], f"average {v[:40]!r} outside 0..100", source=source)
    return f / 100.0


def _psi_total(v: str, line: str, source: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise ParseError("pressure", line[:120], f"bad total {v[:40]!r}", source=source) from None
    if n < 0:
        raise ParseError("pressure", line[:120], f"negative total {n}", source=source)
    return n


def shares_from_weight(weight: int) -> int:
    """v2 cpu.weight (1..10000) back to v1 cpu.shares (2..262144), inverse of runc's mapping."""
    return 2 + ((weight - 1) * 262142) // 9999


def weight_from_shares(shares: int) -> int:
    """runc's v1 shares -> v2 weight mapping: 1 + (shares - 2) * 9999 / 262142."""
    return 1 + ((max(2, min(shares, 262144)) - 2) * 9999) // 262142


def check_glob(pattern: str) -> list[str]:
    """A discovery glob -> its path elements; '..', '.' and empty patterns are refused."""
    parts = [p for p in pattern.strip().strip("/").split("/") if p]
    if not parts or any(p in (".", "..") or p == "**" for p in parts):
        raise ParseError("discovery glob", pattern, "must be a relative path of name patterns "
                         "(no '.', '..' or '**')")
    return parts
