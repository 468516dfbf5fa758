"""Cgroup control files kept open and re-read with pread(2), for the collectors that read
some per container every cycle (cgroup_stats, iostat): an open is a path walk through the safe
open of perfbalance.cgroupfs, several times the cost of the read itself.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterable, Sequence
from typing import Any

from perfbalance.cgroupfs import MAX_READ_BYTES
from perfbalance.errors import ContainerGone, ParseError

READ_BYTES = 4096  # one pread's buffer: every file read here is far shorter (a larger one is read on)


class FileCache:
    """Cgroup control files kept open and re-read with pread(2) at offset 0.

    Opening a cgroup file costs a path walk (about 8 us on a VM, versus 1-2 us for the pread),
    which at five files per container dominated a 1000-container cycle. Files of cgroups that
    left are closed; a removed cgroup's fd reads ENODEV and is dropped (ContainerGone). At most
    `capacity` files stay open, and all caches together leave RESERVED_FDS of the process's
    limit free; beyond that, files are opened and closed per read.
    """

    def __init__(self, cgroupfs: Any, *, capacity: int) -> None:
        self.cgroupfs, self.capacity = cgroupfs, capacity
        self._fds: dict[tuple[str, str | None, str], int] = {}
        self._groups: dict[str, dict[int, tuple[int, ...]]] = {}  # rel -> group -> its kept fds

    @classmethod
    def within_budget(cls, cgroupfs: Any, *, wanted: int) -> FileCache:
        """A cache of at most `wanted` files, fewer if the process's fd limit says so."""
        return cls(cgroupfs, capacity=fd_budget(wanted))

    def read(self, rel: str, controller: str | None, name: str) -> str:
        return self.read_bytes(rel, controller, name).decode("utf-8", errors="replace")

    def read_bytes(self, rel: str, controller: str | None, name: str) -> bytes:
        key = (rel, controller, name)
        fd = self._fds.get(key)
        if fd is None:
            fd = self._open(rel, controller, name)
            if len(self._fds) >= self.capacity or not _room():
                try:
                    return _pread(fd, rel)
                finally:
                    os.close(fd)
            self._keep(key, fd)
        try:
            return _pread(fd, rel)
        except ContainerGone:
            self._close(key)
            raise

    def read_group(self, rel: str, group: int, files: Sequence[tuple[str | None, str]]) -> list[bytes] | None:
        """The bytes of `files` of one cgroup, all already kept open, read back to back: the
        cycle's hot path. None when one is not kept open, fails or is long: then read them one by
        one with read_bytes, which opens, reports and drops as usual. `group` names this list of
        files for the caller (its fds are looked up once per cgroup, not per file)."""
        by_group = self._groups.get(rel)
        fds = by_group.get(group) if by_group is not None else None
        if fds is None:
            fds = self._group_fds(rel, group, files)
            if fds is None:
                return None
        try:
            data = [os.pread(fd, READ_BYTES, 0) for fd in fds]
        except OSError:
            return None
        return data if max(map(len, data)) < READ_BYTES else None

    def _group_fds(self, rel: str, group: int, files: Sequence[tuple[str | None, str]]) -> tuple[int, ...] | None:
        fds = tuple(self._fds.get((rel, controller, name), -1) for controller, name in files)
        if -1 in fds:
            return None
        self._groups.setdefault(rel, {})[group] = fds
        return fds

    def _open(self, rel: str, controller: str | None, name: str) -> int:
        """Through Cgroupfs's safe open: a symlink or mount crossing anywhere on the way is
        refused (CgroupPathRefused), a vanished cgroup is ContainerGone, a control file missing
        from a live cgroup is CgroupfsError(ENOENT)."""
        return int(self.cgroupfs.open_file(rel, controller, name))

    def _keep(self, key: tuple[str, str | None, str], fd: int) -> None:
        global _kept
        self._fds[key] = fd
        _kept += 1

    def _close(self, key: tuple[str, str | None, str]) -> None:
        global _kept
        fd = self._fds.pop(key, None)
        if fd is not None:
            self._groups.pop(key[0], None)  # before the fd number can be reused
            os.close(fd)
            _kept -= 1

    def retain(self, rels: Iterable[str]) -> None:
        """Close the files of cgroups not in `rels`."""
        keep = set(rels)
        for key in [k for k in self._fds if k[0] not in keep]:
            self._close(key)

    def close(self) -> None:
        for key in list(self._fds):
            self._close(key)

    def __len__(self) -> int:
        return len(self._fds)


def _pread(fd: int, rel: str) -> bytes:
    try:
        data = os.pread(fd, READ_BYTES, 0)
        return data if len(data) < READ_BYTES else _pread_whole(fd, rel)
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.ENOENT, errno.ESRCH):
            raise ContainerGone(rel or "/", e.strerror or "") from None
        raise


def _pread_whole(fd: int, rel: str) -> bytes:
    """A file longer than READ_BYTES: read on from where the first read stopped, up to the bound
    of every cgroup file read (perfbalance.cgroupfs.MAX_READ_BYTES)."""
    parts = [os.pread(fd, READ_BYTES, 0)]
    while len(parts[-1]) == READ_BYTES:
        if len(parts) * READ_BYTES >= MAX_READ_BYTES:
            raise ParseError("cgroup file", f"{rel or '/'}", f"larger than {MAX_READ_BYTES} bytes")
        parts.append(os.pread(fd, READ_BYTES, READ_BYTES * len(parts)))
    return b"".join(parts)


# Files kept open by every FileCache of this process: the fd limit is the process's, so they keep
# files together only while RESERVED_FDS stay free for everything else (sockets, BPF, perf).
RESERVED_FDS = 1024
_kept = 0


def _room() -> bool:
    return _kept < resource.getrlimit(resource.RLIMIT_NOFILE)[0] - RESERVED_FDS


def fd_budget(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit; return how many fds we may keep."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = soft if hard == resource.RLIM_INFINITY and soft >= wanted else min(max(soft, wanted + RESERVED_FDS), hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(0, min(wanted, soft - RESERVED_FDS))
