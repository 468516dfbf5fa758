"""The FUSE face of the resctrl model: kernfs-like files over mfusepy.

Run as a subprocess by the test fixtures (`python fusefs.py --mount M --variant V --state D`):
it mounts, serves until unmounted (`fusermount3 -u`), and reads the counters the test sets from
`<state>/counters.json` (re-read when it changes). Every successful change is appended to
`<state>/journal.log`, so a test can assert what was (not) written.

Files are served with direct_io (size 0, contents generated at open like a seq_file); writes are
handed to the model whole, one write(2) call at a time, as kernfs does; O_TRUNC is accepted and
ignored. Attribute and entry caching are off so that mkdir/rmdir are seen at once.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mfusepy  # noqa: E402
from model import Group, KernelError, Resctrl, variant  # noqa: E402

RO, RW = 0o444, 0o644
GROUP_FILES = ("tasks", "cpus", "cpus_list")
CTRL_FILES = ("schemata", "mode", "size")


class Node:
    def __init__(self, *, is_dir: bool, mode: int = RO, children: Callable[[], list[str]] | None = None,
                 read: Callable[[], str] | None = None, write: Callable[[str], None] | None = None) -> None:
        self.is_dir, self.mode, self.children, self.read, self.write = is_dir, mode, children, read, write


class Tree:
    """Maps a path to a Node (directory or file) of the model."""

    def __init__(self, fs: Resctrl) -> None:
        self.fs = fs

    def lookup(self, path: str) -> Node:
        parts = [p for p in path.split("/") if p]
        if parts and parts[0] == "info":
            return self._info(parts[1:])
        group, rest = self._group_prefix(parts)
        if group is None:
            raise KernelError(errno.ENOENT)
        return self._in_group(group, rest)

    def _group_prefix(self, parts: list[str]) -> tuple[Group | None, list[str]]:
        fs = self.fs
        group: Group | None = fs.root
        rest = parts
        if rest and rest[0] in fs.groups:
            group, rest = fs.groups[rest[0]], rest[1:]
        if len(rest) >= 2 and rest[0] == "mon_groups" and fs.hw.mon:
            assert group is not None
            child = group.mon_groups.get(rest[1])
            if child is None:
                return None, rest
            group, rest = child, rest[2:]
        return group, rest

    def _in_group(self, g: Group, rest: list[str]) -> Node:
        fs, rel = self.fs, g.rel()
        if not rest:
            return Node(is_dir=True, children=lambda: self._group_children(g))
        name = rest[0]
        if name == "mon_groups" and g.kind == "ctrl" and fs.hw.mon and len(rest) == 1:
            return Node(is_dir=True, children=lambda: sorted(g.mon_groups))
        if name == "mon_data" and fs.hw.mon:
            return self._mon_data(rel, rest[1:])
        if len(rest) != 1:
            raise KernelError(errno.ENOENT)
        files: dict[str, Node] = {
            "tasks": Node(is_dir=False, mode=RW, read=lambda: fs.read_tasks(rel),
                          write=lambda d: fs.write_tasks(rel, d)),
            "cpus": Node(is_dir=False, mode=RW, read=lambda: fs.read_cpus(rel, as_list=False),
                         write=lambda d: fs.write_cpus(rel, d, as_list=False)),
            "cpus_list": Node(is_dir=False, mode=RW, read=lambda: fs.read_cpus(rel, as_list=True),
                              write=lambda d: fs.write_cpus(rel, d, as_list=True)),
        }
        if g.kind == "ctrl" and fs.hw.alloc_capable:
            files["schemata"] = Node(is_dir=False, mode=RW, read=lambda: fs.read_schemata(rel),
                                     write=lambda d: fs.write_schemata(rel, d))
            files["mode"] = Node(is_dir=False, mode=RW, read=lambda: g.mode + "\n",
                                 write=lambda d: fs.write_mode(rel, d))
            files["size"] = Node(is_dir=False, read=lambda: fs.read_size(rel))
        if name not in files:
            raise KernelError(errno.ENOENT)
        return files[name]

    def _group_children(self, g: Group) -> list[str]:
        fs = self.fs
        names = list(GROUP_FILES)
        if g.kind == "ctrl" and fs.hw.alloc_capable:
            names += CTRL_FILES
        if fs.hw.mon:
            names.append("mon_data")
            if g.kind == "ctrl":
                names.append("mon_groups")
        if g is fs.root:
            names += ["info", *sorted(fs.groups)]
        return names

    def _mon_data(self, rel: str, rest: list[str]) -> Node:
        mon = self.fs.hw.mon
        assert mon is not None
        dirs = {f"mon_L3_{d:02d}": d for d in mon.domains}
        if not rest:
            return Node(is_dir=True, children=lambda: sorted(dirs))
        if rest[0] not in dirs:
            raise KernelError(errno.ENOENT)
        dom = dirs[rest[0]]
        if len(rest) == 1:
            return Node(is_dir=True, children=lambda: list(mon.features))
        if len(rest) == 2 and rest[1] in mon.features:
            event = rest[1]
            return Node(is_dir=False, read=lambda: self.fs.read_counter(rel, dom, event))
        raise KernelError(errno.ENOENT)

    def _info(self, rest: list[str]) -> Node:
        files = self._info_files()
        if not rest:
            return Node(is_dir=True, children=lambda: sorted(files))
        entry = files.get(rest[0])
        if entry is None:
            raise KernelError(errno.ENOENT)
        if isinstance(entry, Node):
            if len(rest) != 1:
                raise KernelError(errno.ENOENT)
            return entry
        if len(rest) == 1:
            return Node(is_dir=True, children=lambda: sorted(entry))
        if len(rest) == 2 and rest[1] in entry:
            value = entry[rest[1]]
            return Node(is_dir=False, read=lambda: value)
        raise KernelError(errno.ENOENT)

    def _info_files(self) -> dict[str, Any]:
        hw, fs = self.fs.hw, self.fs
        out: dict[str, Any] = {"last_cmd_status": Node(is_dir=False, read=fs.read_status)}
        for c in hw.caches:
            out[c.name] = {
                "cbm_mask": f"{c.full:x}\n", "min_cbm_bits": f"{c.min_cbm_bits}\n",
                "num_closids": f"{c.num_closids}\n", "shareable_bits": f"{c.shareable_bits:x}\n",
                "sparse_masks": "0\n", "bit_usage": self._bit_usage(c),
            }
        if hw.mb:
            out["MB"] = {
                "bandwidth_gran": f"{hw.mb.bandwidth_gran}\n", "min_bandwidth": f"{hw.mb.min_bandwidth}\n",
                "num_closids": f"{hw.mb.num_closids}\n", "delay_linear": f"{int(hw.mb.delay_linear)}\n",
                "thread_throttle_mode": "max\n",
            }
        if hw.mon:
            out["L3_MON"] = {
                "num_rmids": f"{hw.mon.num_rmids}\n", "mon_features": "".join(f + "\n" for f in hw.mon.features),
                "max_threshold_occupancy": f"{hw.mon.max_threshold_occupancy}\n",
            }
        return out

    def _bit_usage(self, c: Any) -> str:
        doms = []
        for d in c.domains:
            used = 0
            for g in [self.fs.root, *self.fs.groups.values()]:
                used |= g.ctrl[c.name][d]
            chars = "".join("S" if (c.shareable_bits >> b) & 1 else ("X" if (used >> b) & 1 else "0")
                            for b in reversed(range(c.cbm_len)))
            doms.append(f"{d}={chars}")
        return ";".join(doms) + "\n"


class ResctrlOps(mfusepy.Operations):
    use_ns = True

    def __init__(self, fs: Resctrl) -> None:
        self.fs = fs
        self.tree = Tree(fs)
        self.handles: dict[int, bytes] = {}
        self.next_fh = 1
        self.lock = threading.Lock()
        self.t0 = time.time_ns()

    def _node(self, path: str) -> Node:
        try:
            return self.tree.lookup(path)
        except KernelError as e:
            raise mfusepy.FuseOSError(e.errno) from None

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        node = self._node(path)
        mode = (stat.S_IFDIR | 0o755) if node.is_dir else (stat.S_IFREG | node.mode)
        return {"st_mode": mode, "st_nlink": 2 if node.is_dir else 1, "st_size": 0,
                "st_uid": 0, "st_gid": 0, "st_atime": self.t0, "st_mtime": self.t0, "st_ctime": self.t0}

    def readdir(self, path: str, fh: int) -> list[str]:
        node = self._node(path)
        if not node.is_dir or node.children is None:
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        return [".", "..", *node.children()]

    def open(self, path: str, flags: int) -> int:
        node = self._node(path)
        if node.is_dir:
            raise mfusepy.FuseOSError(errno.EISDIR)
        content = b""
        if (flags & os.O_ACCMODE) != os.O_WRONLY and node.read is not None:
            try:
                content = node.read().encode()
            except KernelError as e:
                raise mfusepy.FuseOSError(e.errno) from None
        with self.lock:
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = content
        return fh

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return self.handles.get(fh, b"")[offset:offset + size]

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        node = self._node(path)
        if node.write is None:
            raise mfusepy.FuseOSError(errno.EINVAL)
        try:
            node.write(data.decode(errors="replace"))
        except KernelError as e:
            raise mfusepy.FuseOSError(e.errno) from None
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._node(path)
        return 0

    def release(self, path: str, fh: int) -> int:
        with self.lock:
            self.handles.pop(fh, None)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        parent, _, name = path.rstrip("/").rpartition("/")
        self._node(parent or "/")
        try:
            self.fs.mkdir(parent.strip("/"), name)
        except KernelError as e:
            raise mfusepy.FuseOSError(e.errno) from None
        return 0

    def rmdir(self, path: str) -> int:
        try:
            self.fs.rmdir(path.strip("/"))
        except KernelError as e:
            raise mfusepy.FuseOSError(e.errno) from None
        return 0

    def unlink(self, path: str) -> int:
        raise mfusepy.FuseOSError(errno.EPERM)

    def rename(self, old: str, new: str) -> int:
        raise mfusepy.FuseOSError(errno.EPERM)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        raise mfusepy.FuseOSError(errno.EACCES)

    def utimens(self, path: str, times: Any = None) -> int:
        return 0


class CounterFile:
    """The test's control channel: counters.json, re-read when its mtime changes."""

    def __init__(self, path: str) -> None:
        self.path, self.stamp, self.data = path, None, {}

    def __call__(self) -> dict[str, Any]:
        try:
            st = os.stat(self.path)
        except OSError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self.stamp:
            with open(self.path, encoding="utf-8") as f:
                self.data = json.load(f)
            self.stamp = stamp
        return self.data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mount", required=True)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--overrides", default="{}")
    args = ap.parse_args(argv)
    hw = variant(args.variant, **json.loads(args.overrides))
    journal_path = os.path.join(args.state, "journal.log")

    def journal(line: str) -> None:
        with open(journal_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    fs = Resctrl(hw, counters=CounterFile(os.path.join(args.state, "counters.json")), journal=journal)
    mfusepy.FUSE(ResctrlOps(fs), args.mount, foreground=True, nothreads=True, fsname="resctrl",
                 direct_io=True, attr_timeout=0, entry_timeout=0, negative_timeout=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
