"""The only module that touches the resctrl mount: reads, writes, mkdir, rmdir, under flock.

Rules it enforces for everyone above it (resctrl.rst "Locking between applications", and owned
state only: groups without our prefix are never touched):
- every kernel error becomes ResctrlError(op, path, errno, info/last_cmd_status), read right after
  the failure while we still hold the lock;
- one value per write(2): the kernel parses one task id, or one schemata buffer, per call;
- `mkdir` creates only the last path element and refuses names with '/', '.', '..' or a newline;
- every file and directory is opened relative to the mount through perfbalance.safefs.SafeTree:
  no symlink is followed, no mount is crossed, and on a real resctrl mount every opened file must
  be on resctrl (statfs RDTGROUP_SUPER_MAGIC; see resctrl.info.open_tree for when that is checked).
  A refusal, or a file larger than MAX_READ, is a ResctrlRefused (a ResctrlError) naming the path;
- `lock()` is an exclusive flock on the mount's root directory, the protocol the kernel
  documentation gives for read-modify-write between cooperating tools.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from perfbalance.errors import ResctrlError
from perfbalance.names import PATH_ELEMENT, name_problem
from perfbalance.safefs import SafeTree, UnsafePath
from resctrl.info import MountInfo, open_tree
from resctrl.schemata import Schemata

# Directory entries of a group that are not groups.
GROUP_ENTRIES = frozenset({"info", "mon_groups", "mon_data", "tasks", "cpus", "cpus_list", "schemata", "mode",
                           "size", "mon_hw_id", "ctrl_hw_id"})
MAX_READ = 1 << 22  # a tasks file of a few hundred thousand threads; schemata, counters are tiny
STATUS_MAX_READ = 4096  # info/last_cmd_status is one line


def check_name(name: str) -> None:
    """A group name is one directory level: never a path, never '.' or '..'."""
    if name_problem(name, PATH_ELEMENT) or name in GROUP_ENTRIES:
        raise ValueError(f"not a valid resctrl group name: {name!r}")


@dataclass(frozen=True)
class Counter:
    """One mon_data value: bytes, or None when the kernel says Unavailable/Error."""

    value: int | None
    text: str


class ResctrlRefused(ResctrlError):
    """A resctrl path was refused (symlink, mount crossing, wrong filesystem) or a file was too big."""

    def __init__(self, op: str, path: str, err: int, reason: str) -> None:
        super().__init__(op, path, err)
        self.reason = reason
        self.args = (f"resctrl {op} {path} refused ({errno.errorcode.get(err, str(err))}): {reason}",)


def _join(rel: str, *names: str) -> str:
    return "/".join(p for p in (rel, *names) if p)


class ResctrlFs:
    """The resctrl mount. `verify_fs`: require resctrl statfs magic on every opened file (True),
    never (False), or auto (None: see resctrl.info.open_tree)."""

    def __init__(self, *, mount: MountInfo, verify_fs: bool | None = None) -> None:
        self.mount = mount
        self.root = mount.path
        self.tree: SafeTree = open_tree(mount, verify_fs)
        self._lock_fd: int | None = None
        self._depth = 0

    # -- paths -------------------------------------------------------------------------------

    def path(self, rel: str, *names: str) -> str:
        return self.tree.path(_join(rel, *names))

    @staticmethod
    def mon_rel(ctrl_rel: str, name: str) -> str:
        return f"{ctrl_rel}/mon_groups/{name}" if ctrl_rel else f"mon_groups/{name}"

    def _open(self, op: str, rel: str, flags: int) -> int:
        """An fd under the mount; refusals and kernel errors become ResctrlError."""
        try:
            return self.tree.open(rel, flags)
        except UnsafePath as e:
            raise ResctrlRefused(op, e.path, errno.ELOOP, e.reason) from None
        except OSError as e:
            raise self._error(op, self.path(rel), e) from None

    # -- locking -----------------------------------------------------------------------------

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive flock on the mount (re-entrant within this object)."""
        if self._depth == 0:
            fd = self._open("lock", "", os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                os.close(fd)
                raise
            self._lock_fd = fd
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._lock_fd is not None:
                os.close(self._lock_fd)  # closing drops the flock
                self._lock_fd = None

    # -- errors ------------------------------------------------------------------------------

    def last_cmd_status(self) -> str:
        try:
            return self.tree.read("info/last_cmd_status", STATUS_MAX_READ).decode(errors="replace").strip()
        except (OSError, UnsafePath, OverflowError):
            return ""

    def _error(self, op: str, path: str, e: OSError) -> ResctrlError:
        status = self.last_cmd_status() if e.errno not in (errno.ENOENT, errno.EACCES) else ""
        return ResctrlError(op, path, e.errno or errno.EIO, "" if status == "ok" else status)

    # -- reads -------------------------------------------------------------------------------

    def read(self, rel: str, name: str) -> str:
        target = _join(rel, name)
        try:
            return self.tree.read(target, MAX_READ).decode(errors="replace")
        except UnsafePath as e:
            raise ResctrlRefused("read", e.path, errno.ELOOP, e.reason) from None
        except OverflowError:
            raise ResctrlRefused("read", self.path(target), errno.EFBIG, f"larger than {MAX_READ} bytes") from None
        except OSError as e:
            raise self._error("read", self.path(target), e) from None

    def exists(self, rel: str) -> bool:
        """A real directory reached without symlinks (a refused path is not "existing")."""
        return self.tree.isdir(rel)

    def ctrl_groups(self) -> list[str]:
        """Every control group (ours and others'), excluding the root."""
        return self._subdirs("")

    def mon_groups(self, ctrl_rel: str) -> list[str]:
        return self._subdirs(_join(ctrl_rel, "mon_groups"))

    def _subdirs(self, rel: str) -> list[str]:
        try:
            names = self.tree.subdirs(rel)
        except FileNotFoundError:
            return []
        except UnsafePath as e:
            raise ResctrlRefused("list", e.path, errno.ELOOP, e.reason) from None
        except OSError as e:
            raise self._error("list", self.path(rel), e) from None
        return [n for n in names if n not in GROUP_ENTRIES]

    def _files(self, rel: str) -> list[str]:
        """Names of the regular files of directory `rel` (sorted)."""
        fd = self._open("list", rel, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with os.scandir(fd) as it:
                return sorted(e.name for e in it if e.is_file(follow_symlinks=False))
        except OSError as e:
            raise self._error("list", self.path(rel), e) from None
        finally:
            os.close(fd)

    def tasks(self, rel: str) -> set[int]:
        return {int(t) for t in self.read(rel, "tasks").split() if t.isdigit()}

    def schemata(self, rel: str) -> Schemata:
        return Schemata.parse(self.read(rel, "schemata"), source=self.path(rel, "schemata"))

    def counters(self, rel: str) -> dict[str, dict[int, Counter]]:
        """event -> domain -> Counter, from <group>/mon_data/mon_L3_<id>/<event>."""
        base = _join(rel, "mon_data")
        out: dict[str, dict[int, Counter]] = {}
        for d in self._subdirs(base):
            if not d.startswith("mon_L3_") or not d.rsplit("_", 1)[1].isdigit():
                continue
            dom = int(d.rsplit("_", 1)[1])
            for event in self._files(_join(base, d)):
                text = self.read(_join(base, d), event).strip()
                out.setdefault(event, {})[dom] = Counter(int(text) if text.isdigit() else None, text)
        return out

    # -- writes ------------------------------------------------------------------------------

    def write(self, rel: str, name: str, text: str) -> None:
        """One write(2) of `text` (the kernel acts on each call separately)."""
        target = _join(rel, name)
        path = self.path(target)
        data = text.encode()
        fd = self._open("open", target, os.O_WRONLY)
        try:
            n = os.write(fd, data)
            if n != len(data):
                raise ResctrlError("write", path, errno.EIO, f"short write {n} of {len(data)} bytes")
        except OSError as e:
            raise self._error(f"write {text.strip()!r} to", path, e) from None
        finally:
            os.close(fd)

    def write_schemata(self, rel: str, schemata: Schemata) -> None:
        text = schemata.format()
        if text:
            self.write(rel, "schemata", text)

    def add_task(self, rel: str, tid: int) -> bool:
        """Move one thread; False when it no longer exists (ESRCH: exited, which is normal)."""
        try:
            self.write(rel, "tasks", f"{int(tid)}\n")
        except ResctrlError as e:
            if e.errno == errno.ESRCH:
                return False
            raise
        return True

    def mkdir(self, parent_rel: str, name: str) -> str:
        """Create one group directory (the last element only, mkdirat in a symlink-free parent)."""
        check_name(name)
        rel = _join(parent_rel, name)
        try:
            self.tree.mkdir(rel, 0o755)
        except UnsafePath as e:
            raise ResctrlRefused("mkdir", e.path, errno.ELOOP, e.reason) from None
        except OSError as e:
            raise self._error("mkdir", self.path(rel), e) from None
        return rel

    def rmdir(self, rel: str) -> None:
        try:
            self.tree.rmdir(rel)
        except UnsafePath as e:
            raise ResctrlRefused("rmdir", e.path, errno.ELOOP, e.reason) from None
        except OSError as e:
            raise self._error("rmdir", self.path(rel), e) from None
