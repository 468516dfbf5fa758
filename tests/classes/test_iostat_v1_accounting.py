"""iostat on cgroup v1: newer kernels count blkio.throttle.* only on disks where blk-throttle was
started by a configured rule; the collector starts it (a no-limit rule in an empty cgroup of its
own, removed again) so a container's real writes show. Control: the same writes, on a fresh
device, with the accounting step off, show nothing on this kernel."""

from __future__ import annotations

import glob
import os
import time

import pytest

from collectors.iostat import ACCOUNTING_CGROUP, IoStatCollector, block_devices
from perfbalance.model import Container

pytestmark = [pytest.mark.root]


def _v1_only(cgfs) -> None:
    if not (cgfs.has("blkio") and cgfs.version("blkio") == 1):
        pytest.skip("no v1 blkio hierarchy here (v2's io.stat counts without a rule)")


def _dev(path: str) -> str:
    st = os.stat(path)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def _write_mib(cgroups, rel: str, dev: str) -> None:
    dd = cgroups.spawn(rel, ["dd", "if=/dev/zero", f"of={dev}", "bs=64k", "count=16", "oflag=direct", "status=none"],
                       controllers=("blkio",))
    assert dd.wait(timeout=60) == 0
    time.sleep(0.1)


def _written(col: IoStatCollector, c: Container, now: float) -> float:
    return col.collect([c], now=now)["w"].get("io_write_bytes_per_second", 0.0)


def _rules_naming(dev: str) -> list[str]:
    """Every blkio.throttle.*_device file in the v1 hierarchy with a rule for `dev`."""
    hits = []
    for path in glob.glob("/sys/fs/cgroup/blkio/**/blkio.throttle.*_device", recursive=True):
        with open(path) as f:
            if any(line.split()[:1] == [dev] for line in f):
                hits.append(path)
    return hits


def test_without_the_accounting_step_a_fresh_disk_counts_nothing(cgfs, cgroups, fresh_loop_device) -> None:
    _v1_only(cgfs)
    c = Container(id="w", name="w", cgroup=cgroups.make("w", ("blkio",)))
    col = IoStatCollector(cgroupfs=cgfs, v1_accounting=False)
    assert col.start().up
    try:
        col.collect([c], now=100.0)
        _write_mib(cgroups, c.cgroup, fresh_loop_device)
        if _written(col, c, 101.0) > 0:
            pytest.skip("this kernel counts v1 blkio.throttle.* without a rule: the accounting step is not needed here")
        assert "accounting_devices" not in col.status().detail
    finally:
        col.close()


def test_the_collector_turns_accounting_on_and_leaves_no_rule(cgfs, cgroups, fresh_loop_device) -> None:
    _v1_only(cgfs)
    dev = _dev(fresh_loop_device)
    assert dev in block_devices()
    c = Container(id="w", name="w", cgroup=cgroups.make("w", ("blkio",)))
    col = IoStatCollector(cgroupfs=cgfs)
    assert col.start().up
    try:
        assert col.status().detail["accounting_devices"] >= 1
        assert _rules_naming(dev) == [] and not cgfs.exists(ACCOUNTING_CGROUP, "blkio")  # nothing left behind
        col.collect([c], now=100.0)
        _write_mib(cgroups, c.cgroup, fresh_loop_device)
        assert _written(col, c, 101.0) >= 1 << 20  # 16 x 64 KiB in a 1 s window
        assert _written(col, c, 102.0) == 0.0  # control: nothing written since
    finally:
        col.close()


def test_a_disk_that_appears_after_start_is_accounted_at_the_next_cycle(cgfs, cgroups, request) -> None:
    _v1_only(cgfs)
    c = Container(id="w", name="w", cgroup=cgroups.make("w", ("blkio",)))
    col = IoStatCollector(cgroupfs=cgfs)
    assert col.start().up
    try:
        before = col.status().detail.get("accounting_devices", 0)
        dev = request.getfixturevalue("fresh_loop_device")  # attached only now
        col.collect([c], now=100.0)
        assert col.status().detail["accounting_devices"] == before + 1
        _write_mib(cgroups, c.cgroup, dev)
        assert _written(col, c, 101.0) >= 1 << 20
    finally:
        col.close()
