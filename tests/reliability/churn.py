"""Churn of real containers (cgroup + `sleep` process) and what to measure on the agent meanwhile.

`Churn` creates and destroys real cgroups under one prefix through Cgroupfs (the same code the
agent reads them with), each holding one `sleep`; `close()` undoes everything. The measurement
helpers read the agent process from /proc (fds, RSS, threads), count entries of the agent's BPF
hash maps through the bpf(2) syscall (no bpftool on this machine), and count metric series.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import signal
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

from perfbalance.cgroupfs import Cgroupfs

CONTROLLERS = ("cpuset", "cpu", "cpuacct")


class Churn:
    """Containers named `<prefix>/c<n>`: one cgroup (cpuset, cpu, cpuacct + v2) and one sleep each."""

    def __init__(self, cgfs: Cgroupfs, prefix: str, *, seed: int = 8) -> None:
        self.cgfs, self.prefix = cgfs, prefix
        self.rng = random.Random(seed)
        self.live: dict[str, subprocess.Popen[bytes]] = {}
        self.created = self.destroyed = 0
        self.ids: set[int] = set()  # v2 cgroup ids of every container ever created (BPF map keys)
        self._next = 0
        cgfs.create(prefix, CONTROLLERS)

    def rel(self, n: int) -> str:
        return f"{self.prefix}/c{n:06d}"

    def create(self, count: int) -> None:
        for _ in range(count):
            rel = self.rel(self._next)
            self._next += 1
            self.cgfs.create(rel, CONTROLLERS)
            cid = self.cgfs.cgroup_id(rel)
            if cid is not None:
                self.ids.add(cid)
            p = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            self.cgfs.attach(rel, p.pid)  # a `sleep` does nothing before it sleeps: joining late is fine
            self.live[rel] = p
            self.created += 1

    def destroy(self, count: int) -> None:
        victims = self.rng.sample(sorted(self.live), min(count, len(self.live)))
        procs = [self.live.pop(rel) for rel in victims]
        kill_and_reap(procs)  # reap all first: rmdir is EBUSY while a task is still attached
        for rel in victims:
            self.cgfs.remove(rel)
        self.destroyed += len(victims)

    def step(self, create: int, destroy: int) -> None:
        self.destroy(destroy)
        self.create(create)

    def close(self) -> None:
        for p in self.live.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.live.values():
            p.wait(timeout=30)
        self.live.clear()
        self.cgfs.remove(self.prefix)

    def leftover_cgroups(self) -> list[str]:
        """Directories of our prefix still present in any hierarchy (must be [] after close)."""
        return [h.path for h in self.cgfs.hierarchies if os.path.isdir(os.path.join(h.path, self.prefix))]


def kill_and_reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# measuring a process
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ProcSample:
    time: float
    fds: int
    rss_kib: int
    threads: int
    anon_kib: int = 0  # RssAnon: what a leak grows (RssFile is library pages, bounded by their size)


def proc_sample(pid: int, procfs: str = "/proc") -> ProcSample:
    status = {}
    with open(os.path.join(procfs, str(pid), "status")) as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    return ProcSample(time=time.monotonic(), fds=len(os.listdir(os.path.join(procfs, str(pid), "fd"))),
                      rss_kib=int(status["VmRSS"].split()[0]), threads=int(status["Threads"]),
                      anon_kib=int(status.get("RssAnon", "0 kB").split()[0]))


# ---------------------------------------------------------------------------------------------
# BPF hash maps of a process, counted through bpf(2)
# ---------------------------------------------------------------------------------------------

_SYS_BPF = 321  # x86_64
_BPF_MAP_GET_NEXT_KEY, _BPF_MAP_GET_FD_BY_ID = 4, 14
HASH_TYPES = {1: "hash", 5: "percpu_hash", 9: "lru_hash", 10: "lru_percpu_hash"}
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True, kw_only=True)
class BpfMap:
    map_id: int
    map_type: int
    key_size: int
    max_entries: int


def bpf_maps(pid: int, procfs: str = "/proc") -> list[BpfMap]:
    """The BPF maps a process holds open (from /proc/<pid>/fdinfo), deduplicated by id."""
    out: dict[int, BpfMap] = {}
    fd_dir = os.path.join(procfs, str(pid), "fdinfo")
    for fd in os.listdir(fd_dir):
        try:
            with open(os.path.join(fd_dir, fd)) as f:
                info = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue
        if "map_id" not in info:
            continue
        m = BpfMap(map_id=int(info["map_id"]), map_type=int(info["map_type"]),
                   key_size=int(info["key_size"]), max_entries=int(info["max_entries"]))
        out[m.map_id] = m
    return sorted(out.values(), key=lambda m: m.map_id)


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    r = _libc.syscall(_SYS_BPF, cmd, attr, len(attr))
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(r)


def count_entries(m: BpfMap, *, limit: int = 1 << 20) -> int:
    """Number of keys in one map (BPF_MAP_GET_FD_BY_ID + GET_NEXT_KEY; needs CAP_SYS_ADMIN)."""
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("I", attr, 0, m.map_id)
    fd = _bpf(_BPF_MAP_GET_FD_BY_ID, attr)
    try:
        return sum(1 for _ in _keys(fd, m.key_size, limit))
    finally:
        os.close(fd)


def _keys(fd: int, key_size: int, limit: int) -> Iterator[bytes]:
    key = ctypes.create_string_buffer(key_size)
    nxt = ctypes.create_string_buffer(key_size)
    attr = ctypes.create_string_buffer(128)
    first = True
    for _ in range(limit):
        struct.pack_into("IIQQ", attr, 0, fd, 0, 0 if first else ctypes.addressof(key), ctypes.addressof(nxt))
        try:
            _bpf(_BPF_MAP_GET_NEXT_KEY, attr)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return
            raise
        yield nxt.raw
        ctypes.memmove(key, nxt, key_size)
        first = False


def hash_map_entries(pid: int) -> dict[int, int]:
    """map id -> entries, for every hash-type map the process holds (arrays always look full)."""
    return {m.map_id: count_entries(m) for m in bpf_maps(pid) if m.map_type in HASH_TYPES}


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------

def scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read(64 << 20).decode()


@dataclass(frozen=True)
class HeapSample:
    """The agent's own allocator figures, from its metrics (agent/export/selfmem.py)."""
    time: float
    malloc_inuse_kib: float
    python_blocks: float


def heap_sample(text: str) -> HeapSample:
    """A /metrics body -> the agent's heap in use; KeyError when the agent exports none."""
    got: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('perfbalance_agent_memory_bytes{kind="malloc_inuse"}'):
            got["malloc"] = float(line.rsplit(" ", 1)[1]) / 1024
        elif line.startswith("perfbalance_agent_python_allocated_blocks "):
            got["blocks"] = float(line.rsplit(" ", 1)[1])
    return HeapSample(time.monotonic(), got["malloc"], got["blocks"])


def robust_slope(xs: list[float], ys: list[float]) -> float:
    """Theil-Sen: the median of the slopes between every pair of points. A one-off peak (a cycle's
    transient objects caught mid-cycle) moves a least-squares slope; it does not move this."""
    slopes = sorted((ys[j] - ys[i]) / (xs[j] - xs[i])
                    for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i])
    n = len(slopes)
    return (slopes[n // 2] + slopes[(n - 1) // 2]) / 2


def series_with(text: str, needle: str) -> int:
    """Sample lines (not # HELP/TYPE) whose labels contain `needle`."""
    return sum(1 for line in text.splitlines() if line and not line.startswith("#") and needle in line)


def series_total(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def hash_map_keys(pid: int) -> dict[int, set[int]]:
    """map id -> its keys read as native u64 (the agent's maps are keyed by v2 cgroup id)."""
    out: dict[int, set[int]] = {}
    for m in bpf_maps(pid):
        if m.map_type not in HASH_TYPES or m.key_size != 8:
            continue
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("I", attr, 0, m.map_id)
        fd = _bpf(_BPF_MAP_GET_FD_BY_ID, attr)
        try:
            out[m.map_id] = {struct.unpack("Q", k)[0] for k in _keys(fd, 8, 1 << 20)}
        finally:
            os.close(fd)
    return out


def live_cgroup_ids(v2_root: str) -> set[int]:
    """Inodes of every directory of the v2 hierarchy (= the cgroup ids BPF sees)."""
    ids = {os.stat(v2_root).st_ino}
    for dirpath, dirnames, _ in os.walk(v2_root):
        for d in dirnames:
            try:
                ids.add(os.stat(os.path.join(dirpath, d), follow_symlinks=False).st_ino)
            except OSError:
                continue
    return ids


def keys_among(pid: int, ids: set[int]) -> dict[int, int]:
    """map id -> number of its keys that are in `ids` (e.g. the churned containers' cgroups)."""
    return {map_id: len(keys & ids) for map_id, keys in hash_map_keys(pid).items()}


def dead_keys(pid: int, v2_root: str) -> dict[int, int]:
    """map id -> number of keys naming a cgroup that no longer exists (leaked entries)."""
    live = live_cgroup_ids(v2_root)
    return {map_id: len(keys - live) for map_id, keys in hash_map_keys(pid).items()}
