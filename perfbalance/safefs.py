"""Open files under a trusted root without following symlinks and without leaving its filesystem.

perfbalance runs privileged and writes cgroup and resctrl files whose paths are built from
directory names other people create (runtimes, the kubelet, anyone with write access to a
delegated cgroup subtree). A symlink planted as `kubepods/pod.../evil -> /etc` must never turn a
cpuset write into a write to /etc, and a tmpfs mounted (or a hostPath mis-set) where cgroupfs
should be must never be taken for it. So every cgroup/resctrl file is opened relative to a
hierarchy root that is trusted (it comes from the configuration), like this:

- `openat2(root_fd, rel, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH | RESOLVE_NO_XDEV)` (Linux >= 5.6):
  the kernel refuses any symlink in any component (ELOOP), any `..` escape (EXDEV) and any
  mount crossing (EXDEV) in the one syscall;
- otherwise a walk: each directory component opened with `openat(dirfd, name,
  O_DIRECTORY | O_NOFOLLOW)`, the last element with `O_NOFOLLOW` (symlink -> ELOOP/ENOTDIR),
  and the result's st_dev compared with the root's (no mount crossing);
- with `magic` set, `fstatfs(2)` on the opened fd must report that filesystem's magic
  (CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC, RDTGROUP_SUPER_MAGIC from include/uapi/linux/magic.h).
  `os.statvfs` has no f_type, hence ctypes.

Refusals raise UnsafePath (a PerfbalanceError naming the path and why). Other OSErrors are raised
unchanged so callers keep their errno logic (ENOENT = gone, EACCES/EBUSY = cpuset rules, ...).
Every read is bounded by the caller's limit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat as _stat
from collections.abc import Iterable

from perfbalance.errors import ParseError, PerfbalanceError

CGROUP2_SUPER_MAGIC = 0x63677270
CGROUP_SUPER_MAGIC = 0x0027E0EB
RDTGROUP_SUPER_MAGIC = 0x07655821
TMPFS_MAGIC = 0x01021994
MAGIC_NAMES = {CGROUP2_SUPER_MAGIC: "cgroup2", CGROUP_SUPER_MAGIC: "cgroup",
               RDTGROUP_SUPER_MAGIC: "resctrl", TMPFS_MAGIC: "tmpfs"}

_SYS_OPENAT2 = 437  # the same number on every architecture (unified syscall table, Linux 5.6)
_RESOLVE_NO_XDEV, _RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x01, 0x02, 0x04, 0x08
_RESOLVE = _RESOLVE_NO_XDEV | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_SYMLINKS | _RESOLVE_BENEATH
_REFUSED = frozenset({errno.ELOOP, errno.EXDEV})


class UnsafePath(PerfbalanceError):
    """A path was refused: a symlink, a mount crossing, or the wrong filesystem."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"refusing {path}: {reason}")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Statfs(ctypes.Structure):
    # struct statfs starts with `__fsword_t f_type` (a long) on every 64-bit Linux ABI we run on;
    # the rest is padding big enough for the whole struct (120 bytes on x86_64).
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 256)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_openat2_works: bool | None = None  # None: not tried yet; False: ENOSYS/seccomp, use the walk


def fs_magic(path: str) -> int:
    """statfs(2) f_type of the filesystem holding `path` (follows symlinks: a root is trusted)."""
    buf = _Statfs()
    if _libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(buf.f_type) & 0xFFFFFFFF


def fd_magic(fd: int) -> int:
    """fstatfs(2) f_type of an open file descriptor (O_PATH descriptors included)."""
    buf = _Statfs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(buf.f_type) & 0xFFFFFFFF


def magic_name(magic: int) -> str:
    return MAGIC_NAMES.get(magic, hex(magic))


def split_rel(rel: str) -> list[str]:
    """Path elements of a relative path; '.', '..', NUL and absolute paths are refused."""
    if "\x00" in rel:
        raise UnsafePath(rel, "NUL in path")
    if rel.startswith("/"):
        raise UnsafePath(rel, "absolute path where a relative one is required")
    parts = [p for p in rel.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UnsafePath(rel, "'.' or '..' component")
    return parts


def _openat2(dirfd: int, rel: str, flags: int, mode: int) -> int | None:
    """openat2 with the no-symlink/no-escape/no-mount-crossing resolve flags; None if absent."""
    global _openat2_works
    if _openat2_works is False:
        return None
    # openat2 rejects a mode without O_CREAT/O_TMPFILE (EINVAL), unlike open(2).
    how = _OpenHow(flags=flags, mode=mode if _creates(flags) else 0, resolve=_RESOLVE)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        _openat2_works = True
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM) and _openat2_works is None:
        _openat2_works = False  # old kernel, or a seccomp profile without openat2
        return None
    raise OSError(err, os.strerror(err))


class SafeTree:
    """Files under one trusted root directory, opened with no symlinks and on one filesystem.

    `magic`: required statfs f_type of every opened file (None: not checked, e.g. a temp tree
    in tests). `use_openat2=False` forces the portable walk (tests exercise both).
    """

    def __init__(self, root: str, *, magic: int | Iterable[int] | None = None,
                 use_openat2: bool = True) -> None:
        self.root = os.path.abspath(root)
        if magic is None:
            self.magic: frozenset[int] | None = None
        elif isinstance(magic, int):
            self.magic = frozenset({magic})
        else:
            self.magic = frozenset(magic)
        self.use_openat2 = use_openat2

    def __repr__(self) -> str:
        return f"SafeTree({self.root!r}, magic={sorted(self.magic) if self.magic else None})"

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    # -- opening ----------------------------------------------------------------------------
    def open(self, rel: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
        """An fd for `rel` under the root (O_CLOEXEC added); UnsafePath or the OSError."""
        parts = split_rel(rel)
        flags |= os.O_CLOEXEC
        root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = self._open_under(root_fd, parts, flags, mode, rel)
        finally:
            os.close(root_fd)
        try:
            if flags & os.O_PATH and _stat.S_ISLNK(os.fstat(fd).st_mode):
                # O_PATH|O_NOFOLLOW opens a final symlink itself instead of failing
                raise UnsafePath(self.path(rel), _why(errno.ELOOP))
            self._check_magic(fd, rel)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_under(self, root_fd: int, parts: list[str], flags: int, mode: int, rel: str) -> int:
        if not parts:
            return os.open(".", flags, mode, dir_fd=root_fd)
        try:
            if self.use_openat2:
                fd = _openat2(root_fd, "/".join(parts), flags, mode)
                if fd is not None:
                    return fd
            return self._walk(root_fd, parts, flags, mode)
        except OSError as e:
            if e.errno in _REFUSED:
                raise UnsafePath(self.path(rel), _why(e.errno)) from None
            raise OSError(e.errno, e.strerror, self.path(rel)) from None

    def _walk(self, root_fd: int, parts: list[str], flags: int, mode: int) -> int:
        root_dev = os.fstat(root_fd).st_dev
        dirfd = os.dup(root_fd)
        try:
            for name in parts[:-1]:
                nxt = self._step(dirfd, name)
                os.close(dirfd)
                dirfd = nxt
            fd = self._last(dirfd, parts[-1], flags, mode)
        finally:
            os.close(dirfd)
        if os.fstat(fd).st_dev != root_dev:
            os.close(fd)
            raise OSError(errno.EXDEV, "crosses a mount point")
        return fd

    @staticmethod
    def _last(dirfd: int, name: str, flags: int, mode: int) -> int:
        try:
            return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=dirfd)
        except OSError as e:
            if e.errno == errno.ENOTDIR and _is_symlink(dirfd, name):
                raise OSError(errno.ELOOP, "symlink") from None
            raise

    @staticmethod
    def _step(dirfd: int, name: str) -> int:
        try:
            return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError as e:
            # O_PATH|O_NOFOLLOW on a symlink with O_DIRECTORY gives ENOTDIR: tell it apart
            # from a plain file in the way.
            if e.errno == errno.ENOTDIR and _is_symlink(dirfd, name):
                raise OSError(errno.ELOOP, "symlink") from None
            raise

    def _check_magic(self, fd: int, rel: str) -> None:
        if self.magic is None:
            return
        got = fd_magic(fd)
        if got not in self.magic:
            want = " or ".join(magic_name(m) for m in sorted(self.magic))
            raise UnsafePath(self.path(rel), f"on a {magic_name(got)} filesystem, expected {want}")

    # -- operations -------------------------------------------------------------------------
    def read(self, rel: str, limit: int) -> bytes:
        """At most `limit` bytes; a longer file raises OverflowError (callers name it)."""
        fd = self.open(rel, os.O_RDONLY)
        try:
            return read_bounded(fd, limit, self.path(rel))
        finally:
            os.close(fd)

    def write(self, rel: str, data: bytes, *, truncate: bool = True) -> int:
        """One write(2) of `data` (the kernel acts on each cgroup/resctrl write separately)."""
        fd = self.open(rel, os.O_WRONLY | (os.O_TRUNC if truncate else 0))
        try:
            return os.write(fd, data)
        finally:
            os.close(fd)

    def isdir(self, rel: str) -> bool:
        """True for a real directory reached without symlinks; False when absent or refused."""
        try:
            fd = self.open(rel, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        except (OSError, UnsafePath):
            return False
        os.close(fd)
        return True

    def exists(self, rel: str) -> bool:
        try:
            fd = self.open(rel, os.O_PATH | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False
        except NotADirectoryError:
            return False
        os.close(fd)
        return True

    def stat(self, rel: str) -> os.stat_result:
        fd = self.open(rel, os.O_PATH | os.O_NOFOLLOW)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def subdirs(self, rel: str) -> list[str]:
        """Names of the real (non-symlink) subdirectories of `rel`, sorted."""
        fd = self.open(rel, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with os.scandir(fd) as it:
                return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        finally:
            os.close(fd)

    def mkdir(self, rel: str, mode: int = 0o755) -> None:
        """Create the last element of `rel` inside its (symlink-free) parent."""
        parts = split_rel(rel)
        if not parts:
            raise UnsafePath(self.root, "refusing to create the root")
        parent = self.open("/".join(parts[:-1]), os.O_PATH | os.O_DIRECTORY)
        try:
            os.mkdir(parts[-1], mode, dir_fd=parent)
        finally:
            os.close(parent)

    def rmdir(self, rel: str) -> None:
        parts = split_rel(rel)
        if not parts:
            raise UnsafePath(self.root, "refusing to remove the root")
        parent = self.open("/".join(parts[:-1]), os.O_PATH | os.O_DIRECTORY)
        try:
            os.rmdir(parts[-1], dir_fd=parent)
        finally:
            os.close(parent)


def read_bounded(fd: int, limit: int, what: str = "") -> bytes:
    """Read until EOF but never more than `limit` bytes (OverflowError beyond)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(65536, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise OverflowError(f"{what or 'file'} is larger than {limit} bytes")
    return b"".join(chunks)


def read_file(path: str, limit: int) -> bytes:
    """A whole file of at most `limit` bytes: OverflowError beyond it (a corrupt or hostile file
    is an error, not a memory spike), OSError (absent, refused) unchanged. Callers turn both into
    their own error naming the file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_bounded(fd, limit, path)
    finally:
        os.close(fd)


def read_text(path: str, limit: int, what: str) -> str:
    """A whole host file of at most `limit` bytes as text (undecodable bytes replaced).

    Beyond the limit: ParseError naming `what` and the path. OSError is raised unchanged.
    """
    try:
        raw = read_file(path, limit)
    except OverflowError:
        raise ParseError(what, path, f"larger than {limit} bytes") from None
    return raw.decode("utf-8", errors="replace")


def _creates(flags: int) -> bool:
    # O_TMPFILE includes O_DIRECTORY's bit: test it whole, or every O_DIRECTORY open matches
    return bool(flags & os.O_CREAT) or flags & os.O_TMPFILE == os.O_TMPFILE


def _is_symlink(dirfd: int, name: str) -> bool:
    try:
        return _stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _why(err: int) -> str:
    if err == errno.ELOOP:
        return "a path component is a symlink (cgroup and resctrl paths are never followed)"
    return "the path leaves the hierarchy (mount point or '..' crossing)"
