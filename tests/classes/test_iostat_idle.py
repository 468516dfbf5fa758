"""iostat on real cgroups: kept fds and reused idle metrics give what a fresh read of the files
gives, and real direct writes (to a loop device) in the cgroup move them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from collectors.iostat import V1_BYTES, V1_OPS, IoStatCollector, IoTotals, parse_io_stat, parse_v1_rwstat, rates
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.model import Container

pytestmark = [pytest.mark.root]


def fresh(fs: Cgroupfs, rel: str) -> IoTotals:
    """The per-file path: each file opened, read and parsed afresh through Cgroupfs."""
    if not fs.has("blkio"):
        return parse_io_stat(fs.read(rel, "io", "io.stat"))
    rb, wb = parse_v1_rwstat(fs.read(rel, "blkio", V1_BYTES))
    ro, wo = parse_v1_rwstat(fs.read(rel, "blkio", V1_OPS))
    return IoTotals(read_bytes=rb, write_bytes=wb, read_ops=ro, write_ops=wo)


@contextmanager
def started(cgfs, cgroups) -> Iterator[tuple[IoStatCollector, Container, tuple[str, ...]]]:
    """A started collector and container "w" in a real cgroup of the block-I/O controller."""
    if not (cgfs.has("blkio") or cgfs.has("io")):
        pytest.skip("no blkio (v1) or io (v2) cgroup controller on this machine")
    ctl = ("blkio",) if cgfs.has("blkio") else ("io",)
    c = Container(id="w", name="w", cgroup=cgroups.make("w", ctl))
    col = IoStatCollector(cgroupfs=cgfs)
    assert col.start().up
    try:
        yield col, c, ctl
    finally:
        col.close()


def test_idle_rates_equal_the_per_file_path_and_move_with_real_direct_writes(cgfs, cgroups, loop_device) -> None:
    with started(cgfs, cgroups) as (col, c, ctl):
        outs = [col.collect([c], now=100.0 + i) for i in range(3)]
        before = fresh(cgfs, c.cgroup)
        assert outs[2]["w"] == rates(before, before, 1.0)
        assert outs[2]["w"] is outs[1]["w"]  # nothing moved: reused, not re-parsed
        dd = cgroups.spawn(c.cgroup, ["dd", "if=/dev/zero", f"of={loop_device}", "bs=64k", "count=16",
                                      "oflag=direct", "status=none"], controllers=ctl)
        assert dd.wait(timeout=60) == 0
        time.sleep(0.1)
        after = col.collect([c], now=104.0)["w"]
        assert after == rates(fresh(cgfs, c.cgroup), before, 2.0)
        assert after["io_write_bytes_per_second"] >= (1 << 20) / 2.0  # control: the writes moved it


def test_a_container_without_a_blkio_cgroup_is_skipped_without_a_line(cgfs, cgroups, caplog) -> None:
    with started(cgfs, cgroups) as (col, c, _):
        gone = Container(id="gone", name="gone", cgroup=f"{c.cgroup}-never-made")
        assert col.collect([gone, c], now=1.0) == {"w": {}} and not caplog.records
