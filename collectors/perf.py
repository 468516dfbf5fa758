"""PMU counters per container, with file descriptors that scale with CPUs x events, never containers.

Two modes (docs/collectors.md):
- `bpf`: each event opened once per CPU into the `pmu` program's perf array; a tiny sched_switch
  program adds per-CPU deltas (and enabled/running times) to the outgoing task's cgroup. What
  `perf stat --bpf-counters --for-each-cgroup` does; cadvisor's per-cgroup fds are the
  anti-pattern (containers x CPUs x events).
- `cgroup`: per-cgroup events (PERF_FLAG_PID_CGROUP with the cgroup directory's fd), for hosts
  without BPF; costs containers x CPUs x events fds and is said so in the status.
Where the hardware PMU is absent (VMs), the software events task-clock, context-switches and
cpu-migrations run through the same path. Counts are corrected for multiplexing with the
enabled/running times; rates come from deltas of cumulative counts, never from resets.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfbalance.errors import FeatureUnavailable, ParseError

log = logging.getLogger(__name__)

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_RAW = 0, 1, 4
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_FLAG_PID_CGROUP = 1 << 2
PERF_FORMAT_TOTAL_TIME_ENABLED, PERF_FORMAT_TOTAL_TIME_RUNNING = 1, 2
_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}


@dataclass(frozen=True, kw_only=True)
class EventSpec:
    """One event: a metric-safe name, the perf type/config, and how its unit converts."""

    name: str  # metric stem: instructions, task_clock, core_power_lvl2_turbo_license
    type: int
    config: int
    unit_scale: float = 1.0  # task-clock counts ns -> seconds
    unit: str = ""  # "seconds" for clocks: metric task_clock_seconds_per_second

    @property
    def hardware(self) -> bool:
        return self.type != PERF_TYPE_SOFTWARE

    @property
    def stem(self) -> str:
        return f"{self.name}_{self.unit}" if self.unit else self.name


KNOWN: dict[str, EventSpec] = {e.name: e for e in (
    EventSpec(name="cycles", type=PERF_TYPE_HARDWARE, config=0),
    EventSpec(name="instructions", type=PERF_TYPE_HARDWARE, config=1),
    EventSpec(name="llc_references", type=PERF_TYPE_HARDWARE, config=2),
    EventSpec(name="llc_misses", type=PERF_TYPE_HARDWARE, config=3),
    EventSpec(name="branches", type=PERF_TYPE_HARDWARE, config=4),
    EventSpec(name="branch_misses", type=PERF_TYPE_HARDWARE, config=5),
    EventSpec(name="cpu_clock", type=PERF_TYPE_SOFTWARE, config=0, unit_scale=1e-9, unit="seconds"),
    EventSpec(name="task_clock", type=PERF_TYPE_SOFTWARE, config=1, unit_scale=1e-9, unit="seconds"),
    EventSpec(name="page_faults", type=PERF_TYPE_SOFTWARE, config=2),
    EventSpec(name="context_switches", type=PERF_TYPE_SOFTWARE, config=3),
    EventSpec(name="cpu_migrations", type=PERF_TYPE_SOFTWARE, config=4),
)}
SOFTWARE_FALLBACK = ("task_clock", "context_switches", "cpu_migrations")
_ALIASES = {"cache_references": "llc_references", "cache_misses": "llc_misses",
            "cpu_cycles": "cycles", "cs": "context_switches", "migrations": "cpu_migrations"}
_RAW = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*=\s*(0[xX][0-9a-fA-F]+|\d+)\s*$")


def metric_name(text: str) -> str:
    """`CORE_POWER.LVL2_TURBO_LICENSE` -> `core_power_lvl2_turbo_license`."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def parse_event(text: str) -> EventSpec:
    """A known event name (`instructions`, `task-clock`, ...) or a raw one `NAME=0xCONFIG`."""
    m = _RAW.match(text)
    if m:
        return EventSpec(name=metric_name(m[1]), type=PERF_TYPE_RAW, config=int(m[2], 0))
    key = metric_name(text)
    key = _ALIASES.get(key, key)
    if key not in KNOWN:
        raise ParseError("perf event", text, f"unknown (known: {', '.join(sorted(KNOWN))}; raw: NAME=0xCONFIG)")
    return KNOWN[key]


def parse_events(texts: Iterable[str]) -> tuple[EventSpec, ...]:
    out: list[EventSpec] = []
    for t in texts:
        e = parse_event(t)
        if e.name not in {x.name for x in out}:
            out.append(e)
    return tuple(out)


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
    from perfbalance.cpuset import CpuSet  # noqa: PLC0415
    try:
        with open(os.path.join(sysfs, "devices/system/cpu/online")) as f:
            return sorted(CpuSet.parse(f.read().strip()))
    except OSError:
        return list(range(os.cpu_count() or 1))


def possible_cpus(sysfs: str = "/sys") -> int:
    from perfbalance.cpuset import CpuSet  # noqa: PLC0415
    try:
        with open(os.path.join(sysfs, "devices/system/cpu/possible")) as f:
            return max(CpuSet.parse(f.read().strip())) + 1
    except (OSError, ValueError):
        return os.cpu_count() or 1


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

    task_clock is always added (it gives CPU seconds). Returns (events, notes on what was dropped).
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
    if "task_clock" not in {e.name for e in ok}:
        ok.append(KNOWN["task_clock"])
    return tuple(ok), notes


# --- per-container totals and derived metrics (pure) ---------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Totals:
    """Cumulative, multiplexing-corrected counts of one container, by event name."""

    values: Mapping[str, float] = field(default_factory=dict)


def derive(events: Sequence[EventSpec], now: Totals, before: Totals | None, window: float) -> dict[str, float]:
    """Metrics of one container: <stem>_total, <stem>_per_second, ipc, llc_mpki."""
    out: dict[str, float] = {}
    rates: dict[str, float] = {}
    for e in events:
        if e.name not in now.values:
            continue
        total = now.values[e.name] * e.unit_scale
        out[f"{e.stem}_total"] = total
        if before is not None and e.name in before.values and window > 0:
            delta = max(0.0, total - before.values[e.name] * e.unit_scale)
            rates[e.name] = delta / window
            out[f"{e.stem}_per_second"] = rates[e.name]
    if rates.get("cycles", 0) > 0 and "instructions" in rates:
        out["ipc"] = rates["instructions"] / rates["cycles"]
    if rates.get("instructions", 0) > 0 and "llc_misses" in rates:
        out["llc_mpki"] = rates["llc_misses"] / (rates["instructions"] / 1000.0)
    return out


def sum_keys(rows: Iterable[tuple[Sequence[int], Sequence[int], Sequence[int]]], events: Sequence[EventSpec]) -> Totals:
    """Add the (counter, enabled, running) arrays of several keys (cgroup ids) of one container."""
    acc = {e.name: [0, 0, 0] for e in events}
    for counter, enabled, running in rows:
        for i, e in enumerate(events):
            a = acc[e.name]
            a[0] += counter[i]
            a[1] += enabled[i]
            a[2] += running[i]
    return Totals(values={n: scaled(c, en, r) if r else float(c) for n, (c, en, r) in acc.items()})


def describe(events: Sequence[EventSpec]) -> list[dict[str, Any]]:
    return [{"name": e.name, "type": e.type, "config": hex(e.config)} for e in events]
