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

The file also holds pure parsers for the cgroup stat files (cpu.stat, cpuacct.usage, memory.*,
cpu.max, PSI) used by discovery and the cgroup-stats collector.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ContainerGone, FeatureUnavailable, ParseError, PerfbalanceError

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


@dataclass(frozen=True, kw_only=True)
class Hierarchy:
    """One mounted cgroup hierarchy: where it is and which controllers it carries."""

    path: str  # absolute directory of its root cgroup
    version: int  # 1 or 2
    controllers: frozenset[str]


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
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
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
    text = _read_text(os.path.join(path, "cgroup.controllers"), MAX_READ_BYTES)
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

def _read_text(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ParseError("cgroup file", path, f"larger than {limit} bytes")
    return raw.decode("utf-8", errors="replace")


class Cgroupfs:
    """The cgroup filesystems under one root (see the module docstring for layouts)."""

    def __init__(self, *, root: str = "/sys/fs/cgroup") -> None:
        self.root = os.path.abspath(root)
        self.layout: Layout
        self.layout, self.hierarchies = detect(self.root)
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
            d = self.dir(rel, c)
            if os.path.isdir(d):
                return d
        raise ContainerGone(rel or "/", "cgroup directory not found in any hierarchy")

    def exists(self, rel: str, controller: str | None = None) -> bool:
        return os.path.isdir(self.dir(rel, controller))

    # -- reading --------------------------------------------------------------------------
    def read(self, rel: str, controller: str | None, name: str, *, limit: int = MAX_READ_BYTES) -> str:
        """Read one control file, at most `limit` bytes; a vanished cgroup -> ContainerGone."""
        path = os.path.join(self.dir(rel, controller), check_name(name))
        try:
            return _read_text(path, limit)
        except OSError as e:
            if e.errno == errno.ENOENT and os.path.isdir(os.path.dirname(path)):
                raise CgroupfsError("read", path, e.errno, "no such control file here "
                                    "(controller not enabled for this cgroup?)") from None
            if _is_gone(e):
                raise ContainerGone(rel or "/", f"{path}: {e.strerror}") from None
            raise CgroupfsError("read", path, e.errno or 0, e.strerror or "") from None

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
        d = self.dir(rel, controller)
        if not os.path.exists(os.path.join(d, check_name(name))):
            if not os.path.isdir(d):
                raise ContainerGone(rel or "/", f"{d} does not exist")
            return None
        return self.read(rel, controller, name)

    def cgroup_id(self, rel: str) -> int | None:
        """The v2 cgroup id (the directory's inode, what bpf_get_current_cgroup_id returns)."""
        if self._v2 is None:
            return None
        d = self.dir(rel, None)
        try:
            return os.stat(d).st_ino
        except OSError as e:
            if _is_gone(e):
                raise ContainerGone(rel or "/", f"{d}: {e.strerror}") from None
            raise CgroupfsError("stat", d, e.errno or 0, e.strerror or "") from None

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

    def subtree_ids(self, rel: str) -> dict[int, str]:
        """v2 cgroup id -> relative path for `rel` and its descendants (BPF keys of a container)."""
        if self._v2 is None:
            return {}
        out: dict[int, str] = {}
        for sub in self.walk(rel, None):
            try:
                cid = self.cgroup_id(sub)
            except ContainerGone:
                continue
            if cid is not None:
                out[cid] = sub
        return out

    def _is_v2_dir(self, d: str) -> bool:
        return self._v2 is not None and (d == self._v2.path or d.startswith(self._v2.path + "/"))

    def _ids(self, rel: str, name: str, d: str | None = None) -> list[int]:
        d = d or self.primary(rel)
        path = os.path.join(d, name)
        try:
            text = _read_text(path, MAX_LIST_BYTES)
        except OSError as e:
            if _is_gone(e):
                raise ContainerGone(rel or "/", f"{path}: {e.strerror}") from None
            raise CgroupfsError("read", path, e.errno or 0, e.strerror or "") from None
        return parse_id_list(text, source=path)

    def children(self, rel: str, controller: str | None = None) -> list[str]:
        """Names of the child cgroups of `rel` (sorted); a vanished parent -> ContainerGone."""
        d = self.dir(rel, controller)
        try:
            with os.scandir(d) as it:
                return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        except OSError as e:
            if _is_gone(e) or e.errno == errno.ENOTDIR:
                raise ContainerGone(rel or "/", f"{d}: {e.strerror}") from None
            raise CgroupfsError("list", d, e.errno or 0, e.strerror or "") from None

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
        path = os.path.join(self.dir(rel, controller), check_name(name))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)  # O_TRUNC: as `echo >`
        except OSError as e:
            if e.errno == errno.ENOENT and os.path.isdir(os.path.dirname(path)):
                raise  # the cgroup is there, the control file is not: not "gone"
            if _is_gone(e):
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
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            parent = os.path.join(h.path, *parts[: i - 1])
            path = os.path.join(h.path, *parts[:i])
            if os.path.isdir(path):
                continue
            if h.version == 2:
                self._enable_subtree(parent, wanted)
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                continue
            except OSError as e:
                raise CgroupfsError("mkdir", path, e.errno or 0, e.strerror or "") from None
            if h.version == 1 and "cpuset" in h.controllers:
                _init_v1_cpuset(parent, path)

    def _enable_subtree(self, parent: str, wanted: Sequence[str] | None) -> None:
        if not wanted:
            return
        try:
            avail = set(_read_text(os.path.join(parent, "cgroup.controllers"), MAX_READ_BYTES).split())
            enabled = set(_read_text(os.path.join(parent, "cgroup.subtree_control"), MAX_READ_BYTES).split())
        except OSError:
            return
        missing = [c for c in wanted if c in avail and c not in enabled]
        if missing:
            _write_path(os.path.join(parent, "cgroup.subtree_control"),
                        " ".join(f"+{c}" for c in missing), "enable controllers")

    def attach(self, rel: str, pid: int, controllers: Sequence[str] | None = None) -> None:
        """Move process `pid` into `rel` in every hierarchy where `rel` exists (or those listed)."""
        hs = self.relevant([c for c in controllers if self.has(c)]) if controllers is not None \
            else self.hierarchies
        moved = False
        for h in hs:
            d = os.path.join(h.path, check_rel(rel))
            if not os.path.isdir(d):
                continue
            try:
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(int(pid)))
                moved = True
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
            top = os.path.join(h.path, rel)
            for path in _depth_first(top):
                _rmdir_retry(path, retries, delay)


def _init_v1_cpuset(parent: str, path: str) -> None:
    for name in ("cpuset.cpus", "cpuset.mems"):
        src = os.path.join(parent, name)
        if not os.path.exists(src):
            continue
        value = _read_text(src, MAX_READ_BYTES).strip()
        if value:
            _write_path(os.path.join(path, name), value, "initialise cpuset")


def _write_path(path: str, value: str, op: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise CgroupfsError(op, path, e.errno or 0, f"{value!r}: {e.strerror}") from None


def _depth_first(top: str) -> list[str]:
    if not os.path.isdir(top):
        return []
    out: list[str] = []
    for dirpath, dirnames, _ in os.walk(top, topdown=False):
        del dirnames
        out.append(dirpath)
    return out


def _rmdir_retry(path: str, retries: int, delay: float) -> None:
    for attempt in range(retries + 1):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or attempt == retries:
                raise CgroupfsError("rmdir", path, e.errno or 0, e.strerror or "") from None
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
    """v2 cpu.max: "max 100000" or "50000 100000"."""
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


def parse_psi(text: str, *, source: str = "") -> Psi:
    """`some avg10=1.23 avg60=... avg300=... total=N` and `full ...` lines (percent -> fraction)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind not in ("some", "full"):
            continue
        for item in rest.split():
            key, _, v = item.partition("=")
            try:
                values[f"{kind}_{key}"] = float(v)
            except ValueError:
                raise ParseError("pressure", line[:120], f"bad value {item!r}", source=source) from None
    if not values:
        raise ParseError("pressure", text[:120], "no 'some'/'full' lines", source=source)
    avg = {k: v / 100.0 for k, v in values.items() if "_avg" in k}
    return Psi(**avg, some_total_usec=int(values.get("some_total", 0)),
               full_total_usec=int(values.get("full_total", 0)))


def shares_from_weight(weight: int) -> int:
    """v2 cpu.weight (1..10000) back to v1 cpu.shares (2..262144), inverse of runc's mapping."""
    return 2 + ((weight - 1) * 262142) // 9999


def weight_from_shares(shares: int) -> int:
    """runc's v1 shares -> v2 weight mapping: 1 + (shares - 2) * 9999 / 262142."""
    return 1 + ((max(2, min(shares, 262144)) - 2) * 9999) // 262142


def flat_mapping(m: Mapping[str, int]) -> str:
    return "\n".join(f"{k} {v}" for k, v in m.items())
