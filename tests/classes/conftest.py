"""Fixtures for class controllers: real cgroups under a unique prefix, a real loop device, real
processes placed in them, all removed afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfbalance.cgroupfs import Cgroupfs
from perfbalance.errors import PerfbalanceError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "podmeta"))
from podmeta_api import api, certs, token_file  # noqa: E402,F401 (fixtures: the HTTPS stand-in API server)


@pytest.fixture
def cgfs() -> Cgroupfs:
    return Cgroupfs(root="/sys/fs/cgroup")


@pytest.fixture
def prefix() -> str:
    return f"pbtest-classes-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Cgroups:
    """Cgroups made for one test (in the given controllers), removed at the end."""

    def __init__(self, cgfs: Cgroupfs, prefix: str) -> None:
        self.cgfs, self.prefix, self.made, self.procs = cgfs, prefix, [], []

    def make(self, name: str, controllers: tuple[str, ...]) -> str:
        rel = f"{self.prefix}/{name}"
        self.cgfs.create(rel, controllers=controllers)
        self.made.append(rel)
        return rel

    def spawn(self, rel: str, argv: list[str], controllers: tuple[str, ...] | None = None) -> subprocess.Popen:
        """Start argv with its first instruction already inside `rel` (it waits on stdin)."""
        p = subprocess.Popen(["sh", "-c", 'read _go; exec "$@"', "sh", *argv], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        self.cgfs.attach(rel, p.pid, controllers=controllers)
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.close()
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for rel in reversed(self.made):
            try:
                self.cgfs.remove(rel)
            except PerfbalanceError:
                pass
        try:
            self.cgfs.remove(self.prefix)
        except PerfbalanceError:
            pass


@pytest.fixture
def cgroups(cgfs: Cgroupfs, prefix: str) -> Iterator[Cgroups]:
    cg = Cgroups(cgfs, prefix)
    try:
        yield cg
    finally:
        cg.close()


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[str]:
    """A loop device on a 64 MiB file (removed afterwards)."""
    if shutil.which("losetup") is None:
        pytest.skip("losetup (util-linux) not installed")
    backing = tmp_path / "classes-loop.img"
    with open(backing, "wb") as f:
        f.truncate(64 << 20)
    out = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot attach a loop device: {out.stderr.strip()}")
    dev = out.stdout.strip()
    try:
        yield dev
    finally:
        detach_loop(dev)


def detach_loop(dev: str) -> None:
    """losetup -d, retried while the device is still busy (a process closing it)."""
    for _ in range(50):
        if subprocess.run(["losetup", "-d", dev], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)


_LOOP_CTL_ADD, _LOOP_CTL_REMOVE = 0x4C80, 0x4C81  # <linux/loop.h>


@pytest.fixture
def fresh_loop_device(tmp_path: Path) -> Iterator[str]:
    """A loop device whose queue no cgroup has configured since it was made: a minor absent from
    /sys/block, added through /dev/loop-control and removed again afterwards (so the next run
    gets a fresh one too). `loop_device` reuses loop minors, whose queues earlier tests configured."""
    import fcntl

    if shutil.which("losetup") is None or not os.path.exists("/dev/loop-control"):
        pytest.skip("losetup or /dev/loop-control missing")
    minor = next(n for n in range(64, 256) if not os.path.exists(f"/sys/block/loop{n}"))
    ctl = os.open("/dev/loop-control", os.O_RDWR)
    try:
        fcntl.ioctl(ctl, _LOOP_CTL_ADD, minor)
        dev = f"/dev/loop{minor}"
        for _ in range(50):  # udev (or devtmpfs) makes the node
            if os.path.exists(dev):
                break
            time.sleep(0.1)
        backing = tmp_path / "fresh-loop.img"
        with open(backing, "wb") as f:
            f.truncate(64 << 20)
        out = subprocess.run(["losetup", dev, str(backing)], capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(f"cannot attach {dev}: {out.stderr.strip()}")
        try:
            yield dev
        finally:
            detach_loop(dev)
    finally:
        for _ in range(50):
            try:
                fcntl.ioctl(ctl, _LOOP_CTL_REMOVE, minor)
                break
            except OSError:
                time.sleep(0.1)  # EBUSY while the detach finishes
        os.close(ctl)
