"""Per-container block-I/O rates (bytes and operations per second) from the cgroup I/O stats.

What a block-I/O class does to a container is only visible in these numbers, so they are
collected for every container whether it is in a class or not. cgroup v1 counts in
`blkio.throttle.io_service_bytes_recursive` and `blkio.throttle.io_serviced_recursive`
("MAJ:MIN Read|Write|Sync|Async|Discard|Total N" lines); cgroup v2 in `io.stat` ("MAJ:MIN
rbytes=N wbytes=N rios=N wios=N dbytes=N dios=N"). Both are cumulative: rates are deltas over
the window.

v1's counts are blk-throttle's, and newer kernels (this 6.18 one) start blk-throttle on a disk's
queue only once some cgroup configures a rule for that disk: before, every container reads 0 for
it, however much it writes. So on v1 the collector turns the accounting on for each block device
(`v1_accounting`, on by default): it writes "MAJ:MIN 0" (no limit) into `blkio.throttle.
write_bps_device` of an empty cgroup of its own and removes that cgroup again. No rule is left
anywhere and no I/O is limited; the queue keeps blk-throttle's per-bio check from then on (what
every kernel did before the lazy start). Devices are looked for at start and whenever the listing
of <sysfs>/block changes (a loop device added later, a hot-plugged disk); `detail.accounting_devices`
counts them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collectors.base import IdleMetrics
from collectors.filecache import FileCache
from perfbalance.errors import ContainerGone, ParseError, PerfbalanceError
from perfbalance.model import CollectorStatus, Container

log = logging.getLogger("perfbalance.collectors.iostat")

METRICS = ("io_read_bytes_per_second", "io_write_bytes_per_second",
           "io_read_ops_per_second", "io_write_ops_per_second")


@dataclass(frozen=True, kw_only=True)
class IoTotals:
    read_bytes: int = 0
    write_bytes: int = 0
    read_ops: int = 0
    write_ops: int = 0


def _num(token: str, source: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise ParseError("io counter", token, "not an integer", source=source) from None


def parse_v1_rwstat(text: str, *, source: str = "") -> tuple[int, int]:
    """(read, write) summed over devices from a blkio rwstat file."""
    read = write = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "Read":
            read += _num(parts[2], source)
        elif len(parts) == 3 and parts[1] == "Write":
            write += _num(parts[2], source)
        elif len(parts) not in (0, 2, 3):
            raise ParseError("blkio stat line", line, "expected 'MAJ:MIN Op N' or 'Total N'", source=source)
    return read, write


def parse_io_stat(text: str, *, source: str = "") -> IoTotals:
    """Totals over devices of a v2 io.stat file."""
    sums = {"rbytes": 0, "wbytes": 0, "rios": 0, "wios": 0}
    for line in text.splitlines():
        for field in line.split()[1:]:
            key, sep, value = field.partition("=")
            if not sep:
                raise ParseError("io.stat field", field, "expected key=value", source=source)
            if key in sums:
                sums[key] += _num(value, source)
    return IoTotals(read_bytes=sums["rbytes"], write_bytes=sums["wbytes"], read_ops=sums["rios"],
                    write_ops=sums["wios"])


def rates(cur: IoTotals, prev: IoTotals | None, window: float) -> dict[str, float]:
    if prev is None or window <= 0:
        return {}
    pairs = zip(METRICS, (cur.read_bytes - prev.read_bytes, cur.write_bytes - prev.write_bytes,
                          cur.read_ops - prev.read_ops, cur.write_ops - prev.write_ops))
    return {name: max(0, delta) / window for name, delta in pairs}  # a counter reset reads as 0


class IoStatCollector:
    """The `iostat` collector. Implements collectors.base.Collector.

    Its files are kept open and re-read with pread (collectors.filecache); a container whose
    files' bytes did not change since the last cycle is not parsed again, and its zero rates are
    the last cycle's dict (collectors.base.IdleMetrics)."""

    name = "iostat"

    def __init__(self, *, cgroupfs: Any, enabled: bool = True, max_open_files: int = 4000,
                 sysfs: str = "/sys", v1_accounting: bool = True) -> None:
        self.cgroupfs, self.enabled, self.max_open_files = cgroupfs, enabled, max_open_files
        self.sysfs, self.v1_accounting = sysfs, v1_accounting
        self._accounted: set[str] = set()  # MAJ:MIN whose accounting is on (or was refused: not retried)
        self._disks: list[str] = []  # <sysfs>/block as last listed: its devices are read only when it changes
        self._v1 = False
        self._files: FileCache | None = None
        self._prev: dict[str, IoTotals] = {}
        self._raw: dict[str, tuple[tuple[bytes, ...], IoTotals]] = {}  # cgroup -> files' bytes, parsed
        self._idle = IdleMetrics()
        self._last: float | None = None
        self._status = CollectorStatus(up=False, reason="not started")
        self._warned: set[str] = set()

    def start(self) -> CollectorStatus:
        fs = self.cgroupfs
        if not self.enabled:
            self._status = CollectorStatus(up=False, reason="disabled in config")
        elif fs.has("blkio") and fs.version("blkio") == 1:
            self._v1, self._status = True, CollectorStatus(up=True, detail={"source": "blkio.throttle.*_recursive"})
            self._account_new_devices()
        elif fs.has("io") and fs.version("io") == 2:
            self._status = CollectorStatus(up=True, detail={"source": "io.stat"})
        else:
            self._status = CollectorStatus(up=False, reason=f"no blkio (v1) or io (v2) controller under {fs.root}")
        if self._status.up and self._files is None:
            self._files = FileCache.within_budget(fs, wanted=self.max_open_files)
        return self._status

    def status(self) -> CollectorStatus:
        return self._status

    def close(self) -> None:
        self._prev, self._raw = {}, {}
        if self._files is not None:
            self._files.close()
            self._files = None

    def read(self, rel: str) -> IoTotals:
        """A container's totals; the same object as last time when its files' bytes are unchanged."""
        raw = self._read_raw(rel)
        last = self._raw.get(rel)
        if last is not None and last[0] == raw:
            return last[1]
        totals = parse_files(raw, v1=self._v1, source=rel)
        self._raw[rel] = (raw, totals)
        return totals

    def _read_raw(self, rel: str) -> tuple[bytes, ...]:
        f = self._files if self._files is not None else FileCache(self.cgroupfs, capacity=0)
        data = f.read_group(rel, 0, V1_FILES if self._v1 else V2_FILES)
        if data is not None:
            return tuple(data)
        if self._v1:
            return (f.read_bytes(rel, "blkio", V1_BYTES), f.read_bytes(rel, "blkio", V1_OPS))
        return (f.read_bytes(rel, "io", "io.stat"),)

    def collect(self, containers: Sequence[Container], now: float) -> dict[str, dict[str, float]]:
        if not self._status.up:
            return {}
        window = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        if self._v1:
            self._account_new_devices()
        prev, self._prev = self._prev, {}
        out: dict[str, dict[str, float]] = {}
        for c in containers:
            try:
                cur = self.read(c.cgroup)
            except ContainerGone:
                continue  # gone, or no cgroup in the blkio hierarchy
            except (PerfbalanceError, OSError) as e:
                if c.id not in self._warned:
                    self._warned.add(c.id)
                    log.warning("iostat: %s: %s", c.id, e)
                continue
            self._prev[c.id] = cur
            before = prev.get(c.id)
            if cur is before and window > 0:  # nothing moved: zero rates, whatever the window
                out[c.id] = self._idle.get(c.id, cur) or self._idle.put(c.id, cur, rates(cur, cur, window))
            else:
                out[c.id] = rates(cur, before, window)
        self._idle.end_cycle()
        self._warned &= set(self._prev)
        if self._files is not None:
            self._files.retain(c.cgroup for c in containers)
        live = {c.cgroup for c in containers}
        for rel in [r for r in self._raw if r not in live]:
            del self._raw[rel]
        return out


    def _account_new_devices(self) -> None:
        """v1: turn blk-throttle's accounting on for block devices not seen before (module docstring)."""
        if not self.v1_accounting:
            return
        try:
            disks = sorted(os.listdir(os.path.join(self.sysfs, "block")))
        except OSError:
            return
        if disks == self._disks:
            return  # the same disks as at the last cycle: nothing new (no sysfs file read)
        self._disks = disks
        new = [d for d in block_devices(self.sysfs) if d not in self._accounted]
        if not new:
            return
        self._accounted.update(new)  # a refused one is not retried every cycle
        turned_on = account_v1(self.cgroupfs, new)
        detail = dict(self._status.detail)
        detail["accounting_devices"] = int(detail.get("accounting_devices", 0)) + turned_on
        self._status = CollectorStatus(up=self._status.up, reason=self._status.reason, detail=detail)


ACCOUNTING_CGROUP = "perfbalance-io-accounting"


def block_devices(sysfs: str = "/sys") -> list[str]:
    """MAJ:MIN of the whole block devices in <sysfs>/block (odd or unreadable entries left out)."""
    try:
        names = sorted(os.listdir(os.path.join(sysfs, "block")))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            with open(os.path.join(sysfs, "block", name, "dev")) as f:
                dev = f.read(64).strip()
        except OSError:
            continue
        major, sep, minor = dev.partition(":")
        if sep and major.isdigit() and minor.isdigit():
            out.append(dev)
    return out


def account_v1(fs: Any, devices: Sequence[str]) -> int:
    """Start blk-throttle (and so v1's per-cgroup I/O counts) on `devices`, leaving no rule: a
    no-limit rule in an empty cgroup of ours, which is then removed. Returns how many took; a
    refusal (a device without a queue, e.g. a loop device with no file) is logged once, no raise."""
    done = 0
    try:
        fs.create(ACCOUNTING_CGROUP, ("blkio",))
    except (PerfbalanceError, OSError) as e:
        log.warning("iostat: cannot create blkio cgroup %s to turn on I/O accounting: %s", ACCOUNTING_CGROUP, e)
        return 0
    try:
        for dev in devices:
            try:
                fs.write(ACCOUNTING_CGROUP, "blkio", "blkio.throttle.write_bps_device", f"{dev} 0")
                done += 1
            except (PerfbalanceError, OSError) as e:
                log.info("iostat: I/O accounting not turned on for block device %s: %s", dev, e)
    finally:
        try:
            fs.remove(ACCOUNTING_CGROUP)
        except (PerfbalanceError, OSError) as e:
            log.warning("iostat: cannot remove blkio cgroup %s: %s", ACCOUNTING_CGROUP, e)
    return done


V1_BYTES, V1_OPS = "blkio.throttle.io_service_bytes_recursive", "blkio.throttle.io_serviced_recursive"
V1_FILES, V2_FILES = (("blkio", V1_BYTES), ("blkio", V1_OPS)), (("io", "io.stat"),)


def parse_files(raw: Sequence[bytes], *, v1: bool, source: str = "") -> IoTotals:
    """A container's totals from its files' bytes (pure): v1's two rwstat files, or v2 io.stat."""
    text = [b.decode("utf-8", errors="replace") for b in raw]
    if not v1:
        return parse_io_stat(text[0], source=f"{source}/io.stat")
    rb, wb = parse_v1_rwstat(text[0], source=f"{source}/{V1_BYTES}")
    ro, wo = parse_v1_rwstat(text[1], source=f"{source}/{V1_OPS}")
    return IoTotals(read_bytes=rb, write_bytes=wb, read_ops=ro, write_ops=wo)
