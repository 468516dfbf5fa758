"""The only module that touches the resctrl mount: reads, writes, mkdir, rmdir, under flock.

Rules it enforces for everyone above it (resctrl.rst "Locking between applications", and the
field notes' "owned state only"):
- every kernel error becomes ResctrlError(op, path, errno, info/last_cmd_status), read right after
  the failure while we still hold the lock;
- one value per write(2): the kernel parses one task id, or one schemata buffer, per call;
- `mkdir` creates only the last path element and refuses names with '/', '.', '..' or a newline;
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
from resctrl.info import MountInfo
from resctrl.schemata import Schemata

# Directory entries of a group that are not groups.
GROUP_ENTRIES = frozenset({"info", "mon_groups", "mon_data", "tasks", "cpus", "cpus_list", "schemata", "mode",
                           "size", "mon_hw_id", "ctrl_hw_id"})
MAX_READ = 1 << 22


def check_name(name: str) -> None:
    """A group name is one directory level: never a path, never '.' or '..'."""
    if not name or name in (".", "..") or "/" in name or "\n" in name or "\0" in name or name in GROUP_ENTRIES:
        raise ValueError(f"not a valid resctrl group name: {name!r}")


@dataclass(frozen=True)
class Counter:
    """One mon_data value: bytes, or None when the kernel says Unavailable/Error."""

    value: int | None
    text: str


class ResctrlFs:
    def __init__(self, *, mount: MountInfo) -> None:
        self.mount = mount
        self.root = mount.path
        self._lock_fd: int | None = None
        self._depth = 0

    # -- paths -------------------------------------------------------------------------------

    def path(self, rel: str, *names: str) -> str:
        return os.path.join(self.root, rel, *names) if rel else os.path.join(self.root, *names)

    @staticmethod
    def mon_rel(ctrl_rel: str, name: str) -> str:
        return f"{ctrl_rel}/mon_groups/{name}" if ctrl_rel else f"mon_groups/{name}"

    # -- locking -----------------------------------------------------------------------------

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive flock on the mount (re-entrant within this object)."""
        if self._depth == 0:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
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
            with open(self.path("", "info", "last_cmd_status"), "rb") as f:
                return f.read(4096).decode(errors="replace").strip()
        except OSError:
            return ""

    def _error(self, op: str, path: str, e: OSError) -> ResctrlError:
        status = self.last_cmd_status() if e.errno not in (errno.ENOENT, errno.EACCES) else ""
        return ResctrlError(op, path, e.errno or errno.EIO, "" if status == "ok" else status)

    # -- reads -------------------------------------------------------------------------------

    def read(self, rel: str, name: str) -> str:
        path = self.path(rel, name)
        try:
            with open(path, "rb") as f:
                return f.read(MAX_READ).decode(errors="replace")
        except OSError as e:
            raise self._error("read", path, e) from None

    def exists(self, rel: str) -> bool:
        return os.path.isdir(self.path(rel))

    def ctrl_groups(self) -> list[str]:
        """Every control group (ours and others'), excluding the root."""
        return self._subdirs(self.root)

    def mon_groups(self, ctrl_rel: str) -> list[str]:
        return self._subdirs(self.path(ctrl_rel, "mon_groups"))

    def _subdirs(self, path: str) -> list[str]:
        try:
            entries = os.listdir(path)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return []
            raise self._error("list", path, e) from None
        return sorted(n for n in entries if n not in GROUP_ENTRIES and os.path.isdir(os.path.join(path, n)))

    def tasks(self, rel: str) -> set[int]:
        return {int(t) for t in self.read(rel, "tasks").split() if t.isdigit()}

    def schemata(self, rel: str) -> Schemata:
        return Schemata.parse(self.read(rel, "schemata"), source=self.path(rel, "schemata"))

    def counters(self, rel: str) -> dict[str, dict[int, Counter]]:
        """event -> domain -> Counter, from <group>/mon_data/mon_L3_<id>/<event>."""
        base = self.path(rel, "mon_data")
        out: dict[str, dict[int, Counter]] = {}
        for d in self._subdirs(base):
            if not d.startswith("mon_L3_"):
                continue
            dom = int(d.rsplit("_", 1)[1])
            for event in sorted(os.listdir(os.path.join(base, d))):
                text = self.read(f"{rel}/mon_data/{d}" if rel else f"mon_data/{d}", event).strip()
                out.setdefault(event, {})[dom] = Counter(int(text) if text.isdigit() else None, text)
        return out

    # -- writes ------------------------------------------------------------------------------

    def write(self, rel: str, name: str, text: str) -> None:
        """One write(2) of `text` (the kernel acts on each call separately)."""
        path = self.path(rel, name)
        data = text.encode()
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as e:
            raise self._error("open", path, e) from None
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
        """Create one group directory (the last element only); returns its relative path."""
        check_name(name)
        rel = f"{parent_rel}/{name}" if parent_rel else name
        path = self.path(rel)
        try:
            os.mkdir(path)
        except OSError as e:
            raise self._error("mkdir", path, e) from None
        return rel

    def rmdir(self, rel: str) -> None:
        path = self.path(rel)
        try:
            os.rmdir(path)
        except OSError as e:
            raise self._error("rmdir", path, e) from None
