"""PMU counters per container, with file descriptors that scale with CPUs x events, never containers.

Two modes (docs/collectors.md):
- `bpf`: each event opened once per CPU into the `pmu` program's perf array; a tiny sched_switch
  program adds per-CPU deltas (and enabled/running times) to the outgoing task's cgroup. What
  `perf stat --bpf-counters --for-each-cgroup` does; cadvisor's per-cgroup fds are the
  anti-pattern (containers x CPUs x events).
- `cgroup`: per-cgroup events (PERF_FLAG_PID_CGROUP with the cgroup directory's fd), for hosts
  without BPF; costs containers x CPUs x events fds and is said so in the status.
Where the hardware PMU is absent (VMs), the software event task-clock runs through the same path. Counts are corrected for multiplexing with the
enabled/running times; rates come from deltas of cumulative counts, never from resets.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import bpf
from collectors.base import IdleMetrics, LogOnce, Metrics
from collectors.bpfenv.keys import KeyMap, KeyMaps, LiveKeys
from collectors.bpfenv.loader import prepare
from collectors.bpfenv.kernel import kernel_ok
from collectors.bpfenv.maps import CountingMap
from collectors.config import PerfConfig
from collectors.events import KNOWN, SOFTWARE_FALLBACK, EventSpec, parse_event, parse_events
from perfbalance import cpus
from perfbalance.errors import FeatureUnavailable, ParseError, PerfbalanceError
from perfbalance.host import HostPaths
from perfbalance.model import CollectorStatus, Container

log = logging.getLogger(__name__)

PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_FLAG_PID_CGROUP = 1 << 2
PERF_FORMAT_TOTAL_TIME_ENABLED, PERF_FORMAT_TOTAL_TIME_RUNNING = 1, 2
_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
TASK_BITS = 16  # bpf/pmu.bpf.c pmu_task: 64k slots of (key, thread id), 1 MiB


# --- perf_event_open through ctypes --------------------------------------------------------------


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1, accepted by every kernel)."""

    _fields_ = [
        ("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def perf_event_open(event: EventSpec, *, pid: int, cpu: int, flags: int = 0) -> int:
    """Open one counting event; returns the fd or raises OSError with the kernel's errno."""
    nr = _SYS_PERF_EVENT_OPEN.get(os.uname().machine)
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open syscall number unknown for {os.uname().machine}")
    attr = PerfEventAttr(type=event.type, size=ctypes.sizeof(PerfEventAttr), config=event.config,
                         read_format=PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING)
    fd = _libc.syscall(nr, ctypes.byref(attr), pid, cpu, -1, flags | PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open({event.name}, pid={pid}, cpu={cpu}): {os.strerror(err)}")
    return int(fd)


@dataclass(frozen=True, kw_only=True)
class Reading:
    counter: int
    enabled: int
    running: int


def parse_reading(data: bytes) -> Reading:
    """read() of a counting fd with TOTAL_TIME_ENABLED|RUNNING: value, enabled, running (u64)."""
    if len(data) < 24:
        raise ParseError("perf read", data.hex(), "expected 24 bytes (value, enabled, running)")
    counter, enabled, running = struct.unpack_from("=QQQ", data)
    return Reading(counter=counter, enabled=enabled, running=running)


def scaled(counter: int, enabled: int, running: int) -> float:
    """Correct a multiplexed count: counter * enabled / running (0 when it never ran)."""
    if running <= 0:
        return 0.0
    return counter * (enabled / running) if enabled > running else float(counter)


def online_cpus(sysfs: str = "/sys") -> list[int]:
    """The online CPUs (perfbalance.cpus); all `os.cpu_count()` when sysfs cannot say."""
    try:
        return sorted(cpus.online_cpus(sysfs))
    except (OSError, FeatureUnavailable):
        return list(range(os.cpu_count() or 1))


def probe_events(names: Sequence[str] = ("cycles", "instructions", "llc_references", "llc_misses",
                                         "task_clock", "context_switches", "cpu_migrations"),
                 *, cpu: int = 0) -> dict[str, str]:
    """Which events open on this host: name -> "ok" or the errno text (for `doctor`)."""
    out: dict[str, str] = {}
    for name in names:
        try:
            fd = perf_event_open(parse_event(name), pid=-1, cpu=cpu)
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno or 0, str(e.errno))
            continue
        os.close(fd)
        out[name] = "ok"
    return out


def choose_events(wanted: Sequence[EventSpec], *, cpu: int = 0) -> tuple[tuple[EventSpec, ...], list[str]]:
    """The wanted events that open here; when no hardware event opens, the software fallback.

    Only what is asked for is read: every event costs a counter read at each sched_switch that
    changes cgroup. task_clock is the software fallback (no software event feeds the planner; it
    keeps the attribution path running and checkable against cpuacct), and the one event used when
    nothing else opens. Returns (events, notes on what was dropped).
    """
    ok: list[EventSpec] = []
    notes: list[str] = []
    for e in wanted:
        try:
            os.close(perf_event_open(e, pid=-1, cpu=cpu))
            ok.append(e)
        except OSError as err:
            notes.append(f"{e.name}: {errno.errorcode.get(err.errno or 0, err.errno)}")
    if not any(e.hardware for e in ok) and any(e.hardware for e in wanted):
        notes.append("no hardware PMU events open: using software events " + ", ".join(SOFTWARE_FALLBACK))
        ok += [KNOWN[n] for n in SOFTWARE_FALLBACK if n not in {e.name for e in ok}]
    if not ok:
        ok.append(KNOWN["task_clock"])
    return tuple(ok), notes


# --- per-container windows and derived metrics (pure) -------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Raw:
    """Raw (counter, enabled, running) deltas of one container in one window, per event index."""

    counter: tuple[int, ...]
    enabled: tuple[int, ...]
    running: tuple[int, ...]

    def __add__(self, other: Raw) -> Raw:
        return Raw(counter=tuple(a + b for a, b in zip(self.counter, other.counter)),
                   enabled=tuple(a + b for a, b in zip(self.enabled, other.enabled)),
                   running=tuple(a + b for a, b in zip(self.running, other.running)))


def split_row(row: Sequence[int], n: int) -> Raw:
    """A flat map value (counter[n], enabled[n], running[n]) as a Raw."""
    return Raw(counter=tuple(row[:n]), enabled=tuple(row[n:2 * n]), running=tuple(row[2 * n:3 * n]))


def window_counts(events: Sequence[EventSpec], raw: Raw) -> dict[str, float]:
    """Multiplexing-corrected counts of one window, by event name, in the event's unit."""
    return {e.name: scaled(raw.counter[i], raw.enabled[i], raw.running[i]) * e.unit_scale
            for i, e in enumerate(events)}


def derive(events: Sequence[EventSpec], counts: Mapping[str, float], totals: Mapping[str, float],
           window: float) -> dict[str, float]:
    """One container's metrics: <stem>_total and <stem>_per_second of each event.

    Ratios of events (ipc, llc_mpki) are derived from these rates once the agent has merged every
    collector's metrics (agent/snapshot/derive.py).
    """
    out: dict[str, float] = {}
    for e in events:
        out[f"{e.stem}_total"] = totals.get(e.name, 0.0)
        if window > 0:
            out[f"{e.stem}_per_second"] = counts.get(e.name, 0.0) / window
    return out


def accumulate(totals: Mapping[str, float], counts: Mapping[str, float]) -> dict[str, float]:
    return {k: totals.get(k, 0.0) + counts.get(k, 0.0) for k in set(totals) | set(counts)}


def describe(events: Sequence[EventSpec]) -> list[dict[str, Any]]:
    return [{"name": e.name, "type": e.type, "config": hex(e.config)} for e in events]


# --- the collectors ----------------------------------------------------------------------------


class _Base:
    """What both modes share: status, once-only logging, totals per container, metrics."""

    name = "perf"

    def __init__(self, *, config: PerfConfig, host: HostPaths, cgroupfs: Any) -> None:
        self.config, self.host, self.cgroupfs = config, host, cgroupfs
        self.events: tuple[EventSpec, ...] = ()
        self._fds: list[int] = []
        self._totals: dict[str, dict[str, float]] = {}
        self._idle = IdleMetrics()
        self._last: float | None = None
        self._status = CollectorStatus(up=False, reason="not started")
        self._log = LogOnce(log)

    def status(self) -> CollectorStatus:
        return self._status

    @property
    def perf_fds(self) -> int:
        return len(self._fds)

    def _set(self, up: bool, reason: str, **detail: Any) -> CollectorStatus:
        self._status = CollectorStatus(up=up, reason=reason, detail=detail)
        return self._status

    def _choose(self) -> list[str]:
        wanted = parse_events(self.config.events)
        self.events, notes = choose_events(wanted, cpu=online_cpus(self.host.sysfs)[0])
        for n in notes:
            self._log.warning(f"perf: {n}")
        return notes

    def _close_fds(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []

    def _window(self, now: float) -> float:
        window = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        return window

    def _metrics(self, containers: Sequence[Container], raws: Mapping[str, Raw], window: float) -> dict[str, dict[str, float]]:
        zero = Raw(counter=(0,) * len(self.events), enabled=(0,) * len(self.events), running=(0,) * len(self.events))
        out: dict[str, dict[str, float]] = {}
        totals: dict[str, dict[str, float]] = {}
        idle = self._idle
        for c in containers:
            raw, before = raws.get(c.id), self._totals.get(c.id)
            if raw is None and before is not None and window > 0:  # nothing counted: totals stay
                totals[c.id] = before
                out[c.id] = idle.get(c.id, before) or idle.put(
                    c.id, before, derive(self.events, {}, before, window))
                continue
            counts = window_counts(self.events, raw or zero)
            totals[c.id] = accumulate(before or {}, counts)
            out[c.id] = derive(self.events, counts, totals[c.id], window)
        idle.end_cycle()
        self._totals = totals  # containers that left are forgotten
        return out


def bpf_defines(config: PerfConfig, *, nevents: int, ncpu: int, pid_keys: bool) -> dict[str, bpf.DefineValue]:
    """The -D flags of bpf/pmu.bpf.c: events x possible CPUs perf array (pure: `doctor --dump-bpf`)."""
    return {"PB_NEVENTS": nevents, "PB_NCPU": ncpu, "PB_MAX_KEYS": config.max_keys, "PB_KEY_PID": pid_keys,
            "PB_TASK_BITS": TASK_BITS}


class BpfPerfCollector(_Base):
    """Mode `bpf`: events opened once per CPU, attributed by the `pmu` sched_switch program."""

    def __init__(self, *, config: PerfConfig, host: HostPaths, cgroupfs: Any, pid_keys: bool | None = None,
                 keymaps: KeyMaps | None = None) -> None:
        super().__init__(config=config, host=host, cgroupfs=cgroupfs)
        self._force_pid_keys = pid_keys
        self.keymaps = keymaps  # shared with the other BPF collectors: one walk per cycle
        self._bpf: Any = None
        self._map: CountingMap | None = None
        self._keys: KeyMap | None = None
        self._owners: dict[int, tuple[str, str]] = {}
        self.defines: dict[str, bpf.DefineValue] = {}

    def start(self) -> CollectorStatus:
        try:
            notes = self._choose()
            env = prepare(self.host, need=["pmu"])
            if not kernel_ok(env.version, "bpf_perf_event_read_value"):
                raise FeatureUnavailable("bpf", f"kernel {env.release} < 4.15 (no bpf_perf_event_read_value)")
            pid_keys = not env.cgroup_keys if self._force_pid_keys is None else self._force_pid_keys
            ncpu = cpus.possible_cpus(self.host.sysfs)
            self.defines = bpf_defines(self.config, nevents=len(self.events), ncpu=ncpu, pid_keys=pid_keys)
            self._bpf = env.load(bpf.render("pmu", self.defines))
            self._open_into(self._bpf[b"pmu_events"], ncpu)
            live = LiveKeys(self.cgroupfs, pid_keys=pid_keys, procfs=self.host.procfs)
            self._map = CountingMap(self._bpf[b"pmu_counts"], fields=("counter", "enabled", "running"),
                                    batch=env.batch_reads, max_keys=self.config.max_keys, live=live, name="pmu_counts")
            self._keys = (self.keymaps or KeyMaps(self.cgroupfs, procfs=self.host.procfs)).get(pid_keys=pid_keys)
        except (FeatureUnavailable, PerfbalanceError, OSError) as e:
            self.close()
            reason = getattr(e, "reason", None) or str(e)
            self._log.warning(f"perf (bpf): {reason}")
            return self._set(False, reason)
        return self._set(True, "; ".join(notes), mode="bpf", events=describe(self.events),
                         perf_fds=len(self._fds), keys="pid" if pid_keys else "cgroup_id")

    def _open_into(self, array: Any, ncpu: int) -> None:
        """Each event once per online CPU at index event * ncpu + cpu: CPUs x events fds."""
        for i, e in enumerate(self.events):
            for cpu in online_cpus(self.host.sysfs):
                fd = perf_event_open(e, pid=-1, cpu=cpu)
                self._fds.append(fd)
                array[ctypes.c_int(i * ncpu + cpu)] = ctypes.c_int(fd)

    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        if not self._status.up or self._map is None or self._keys is None:
            return {}
        window = self._window(now)
        try:
            deltas = self._map.deltas()
            owners = self._keys.build(containers, deltas.keys(), now=now)
            self._map.prune(self._owners, owners)
            self._owners = owners
        except (PerfbalanceError, OSError) as e:
            self._log.warning(f"perf (bpf): collection failed: {e}")
            return {}
        n = len(self.events)
        raws: dict[str, Raw] = {}
        for key, row in deltas.items():
            owner = owners.get(key)
            if owner is not None:
                r = split_row(row, n)
                raws[owner[0]] = raws[owner[0]] + r if owner[0] in raws else r
        return self._metrics(containers, raws, window)

    def switches(self, cpu: int | None = None) -> tuple[int, int]:
        """(switches that read the counters, switches between two tasks of one key that did not)
        since the program was loaded, on `cpu` or summed over CPUs; (0, 0) when not loaded."""
        if self._bpf is None:
            return 0, 0
        table = self._bpf[b"pmu_cpu"]  # one entry per possible CPU
        rows = [table[table.Key(cpu)]] if cpu is not None else list(table.values())
        return int(sum(r.switches[0] for r in rows)), int(sum(r.switches[1] for r in rows))

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        self._map = None
        self._close_fds()
        if self._status.up:
            self._set(False, "closed")


class CgroupPerfCollector(_Base):
    """Mode `cgroup`: PERF_FLAG_PID_CGROUP events per container per CPU (hosts without BPF).

    Costs containers x CPUs x events fds (cadvisor's way), which is why it is the fallback.
    The cgroup fd is a directory of the v2 hierarchy, or of v1 perf_event where that is mounted.
    """

    def __init__(self, *, config: PerfConfig, host: HostPaths, cgroupfs: Any) -> None:
        super().__init__(config=config, host=host, cgroupfs=cgroupfs)
        self._open: dict[str, list[tuple[int, int]]] = {}  # container id -> [(event index, fd)]
        self._prev: dict[str, dict[int, Reading]] = {}
        self._controller: str | None = None

    def start(self) -> CollectorStatus:
        try:
            notes = self._choose()
            self._controller = "perf_event" if self.cgroupfs.has("perf_event") else None
            self.cgroupfs.hierarchy(self._controller)  # FeatureUnavailable on v1 without perf_event
        except (FeatureUnavailable, PerfbalanceError, OSError) as e:
            reason = getattr(e, "reason", None) or str(e)
            self._log.warning(f"perf (cgroup): {reason}")
            return self._set(False, reason)
        return self._set(True, "; ".join(notes + ["per-cgroup fds: containers x CPUs x events"]),
                         mode="cgroup", events=describe(self.events))

    def _ensure_open(self, c: Container) -> list[tuple[int, int]]:
        if c.id in self._open:
            return self._open[c.id]
        opened: list[tuple[int, int]] = []
        # Safe open: a symlinked cgroup path would count someone else's cgroup (CgroupPathRefused).
        dfd = self.cgroupfs.open_dir(c.cgroup, self._controller)
        try:
            for i, e in enumerate(self.events):
                for cpu in online_cpus(self.host.sysfs):
                    opened.append((i, perf_event_open(e, pid=dfd, cpu=cpu, flags=PERF_FLAG_PID_CGROUP)))
        except OSError:
            for _, fd in opened:
                os.close(fd)
            raise
        finally:
            os.close(dfd)
        self._open[c.id] = opened
        self._fds.extend(fd for _, fd in opened)
        return opened

    def _read(self, opened: Sequence[tuple[int, int]]) -> dict[int, Reading]:
        """Sum each event over CPUs (cumulative)."""
        acc: dict[int, list[int]] = {}
        for i, fd in opened:
            r = parse_reading(os.read(fd, 24))
            a = acc.setdefault(i, [0, 0, 0])
            a[0] += r.counter
            a[1] += r.enabled
            a[2] += r.running
        return {i: Reading(counter=a[0], enabled=a[1], running=a[2]) for i, a in acc.items()}

    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        if not self._status.up:
            return {}
        window = self._window(now)
        raws: dict[str, Raw] = {}
        live = {c.id for c in containers}
        for cid in [k for k in self._open if k not in live]:
            self._forget(cid)
        for c in containers:
            try:
                cur = self._read(self._ensure_open(c))
            except (PerfbalanceError, OSError) as e:
                self._log.warning(f"perf (cgroup): {c.id}: {e}")
                self._forget(c.id)
                continue
            prev = self._prev.get(c.id, {})
            self._prev[c.id] = cur
            raws[c.id] = _raw_delta(cur, prev, len(self.events))
        return self._metrics([c for c in containers if c.id in raws], raws, window)  # no zeros for the unread

    def _forget(self, cid: str) -> None:
        for _, fd in self._open.pop(cid, []):
            os.close(fd)
            self._fds.remove(fd)
        self._prev.pop(cid, None)

    def close(self) -> None:
        for cid in list(self._open):
            self._forget(cid)
        self._close_fds()
        if self._status.up:
            self._set(False, "closed")


def _raw_delta(cur: Mapping[int, Reading], prev: Mapping[int, Reading], n: int) -> Raw:
    def d(i: int, f: str) -> int:
        c = getattr(cur[i], f) if i in cur else 0
        p = getattr(prev[i], f) if i in prev else 0
        return c - p if c >= p else c
    return Raw(counter=tuple(d(i, "counter") for i in range(n)), enabled=tuple(d(i, "enabled") for i in range(n)),
               running=tuple(d(i, "running") for i in range(n)))


def make_collector(*, config: PerfConfig, host: HostPaths, cgroupfs: Any, keymaps: KeyMaps | None = None) -> Any:
    """The configured mode; `auto` tries BPF, then per-cgroup events. Call start() on the result."""
    if config.mode == "off":
        return OffCollector()
    if config.mode == "cgroup":
        return CgroupPerfCollector(config=config, host=host, cgroupfs=cgroupfs)
    if config.mode == "bpf":
        return BpfPerfCollector(config=config, host=host, cgroupfs=cgroupfs, keymaps=keymaps)
    return AutoPerfCollector(config=config, host=host, cgroupfs=cgroupfs, keymaps=keymaps)


class AutoPerfCollector:
    """`auto`: the BPF mode, else the per-cgroup mode (saying why BPF was not used)."""

    name = "perf"

    def __init__(self, *, config: PerfConfig, host: HostPaths, cgroupfs: Any, keymaps: KeyMaps | None = None) -> None:
        self._args = {"config": config, "host": host, "cgroupfs": cgroupfs}
        self.inner: Any = BpfPerfCollector(**self._args, keymaps=keymaps)

    def start(self) -> CollectorStatus:
        st = self.inner.start()
        if st.up:
            return st
        self.inner = CgroupPerfCollector(**self._args)
        st2 = self.inner.start()
        if st2.up:
            self.inner._set(True, f"BPF mode unavailable ({st.reason}); {st2.reason}", **st2.detail)
        return self.inner.status()

    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        return self.inner.collect(containers, now)  # type: ignore[no-any-return]

    def status(self) -> CollectorStatus:
        return self.inner.status()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.inner.close()

    @property
    def perf_fds(self) -> int:
        return int(self.inner.perf_fds)


class OffCollector:
    name = "perf"
    perf_fds = 0

    def start(self) -> CollectorStatus:
        return CollectorStatus(up=False, reason="disabled in config (collectors.perf.mode: off)")

    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        return {}

    def status(self) -> CollectorStatus:
        return self.start()

    def close(self) -> None:
        return None
