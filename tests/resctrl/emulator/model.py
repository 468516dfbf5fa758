"""An in-memory model of the kernel's resctrl filesystem, as strict as the kernel.

Why: this machine has no RDT hardware, and the configuration mistakes that hurt other projects
(an L3 line on a host without L3 allocation, a non-contiguous mask, an MB value below the minimum)
only show up when the kernel rejects a write. This model follows linux-6.6
arch/x86/kernel/cpu/resctrl/{rdtgroup,ctrlmondata}.c and Documentation/arch/x86/resctrl.rst for
what perfbalance uses, including the exact `info/last_cmd_status` texts and errnos:

- mkdir in the root creates a control group (CLOSID + RMID), in a `mon_groups` directory a
  monitoring group (RMID); anything else is EPERM; ENOSPC with "Out of CLOSIDs"/"Out of RMIDs".
- a new control group's cache masks are the shareable bits plus every bit not used by other
  groups' exclusive allocations (`__init_one_rdt_domain`), MB is at its maximum.
- schemata writes must end in a newline; each line is validated (resource name, "id=value" pairs,
  domain ids, hex masks: range, consecutive 1-bits, min_cbm_bits; MB: range [min,max], rounded up
  to the granularity; in mba_MBps mode any value is taken as MBps).
- tasks takes one task id per write (6.6: `kstrtoint`), "No task N" + ESRCH for a missing task; a
  task is in exactly one control group and one monitoring group; moving it to a control group
  drops its monitoring group; moving to a monitoring group of another control group is EINVAL.
- rmdir of a control group returns its tasks (also those of its monitoring groups) to the root;
  rmdir of a monitoring group returns its tasks to the parent control group.
- mon_data counters: a control group reports its own RMID plus its monitoring groups'.

Not modelled: pseudo-locking, SNC sub-domains, RMID limbo, the `size` file's per-domain bytes are
derived from the cache size, `cpus` writes only validate and store (no per-CPU default closid).
Fork inheritance is approximated: a thread never seen before inherits the group of its thread
group leader (or, for a process leader, of its parent) when it started after that task was moved;
otherwise it is in the root group, as if it had been created before the move. New threads of known
processes are adopted when a tasks file is read; new child processes only when they are written.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

MBA_MAX_MBPS = 4294967295  # U32_MAX, the kernel's default in mba_MBps mode


class KernelError(Exception):
    """A syscall failure with its errno (the FUSE layer turns it into FuseOSError)."""

    def __init__(self, err: int) -> None:
        super().__init__(err, os.strerror(err))
        self.errno = err


# -- hardware variants -------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class CacheRes:
    name: str  # schema name: L3, L2, L3CODE, L3DATA
    level: int
    cbm_len: int
    min_cbm_bits: int = 1
    num_closids: int = 16
    shareable_bits: int = 0
    domains: tuple[int, ...] = (0, 1)

    @property
    def full(self) -> int:
        return (1 << self.cbm_len) - 1


@dataclass(frozen=True, kw_only=True)
class MbRes:
    num_closids: int = 8
    min_bandwidth: int = 10
    bandwidth_gran: int = 10
    delay_linear: bool = True
    domains: tuple[int, ...] = (0, 1)


@dataclass(frozen=True, kw_only=True)
class MonRes:
    num_rmids: int = 32
    features: tuple[str, ...] = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")
    domains: tuple[int, ...] = (0, 1)
    max_threshold_occupancy: int = 1048576


@dataclass(frozen=True, kw_only=True)
class Hardware:
    caches: tuple[CacheRes, ...] = ()
    mb: MbRes | None = None
    mon: MonRes | None = None
    options: tuple[str, ...] = ()  # mount options: cdp, cdpl2, mba_MBps
    cache_bytes: Mapping[int, int] = field(default_factory=lambda: {3: 20 * 1024 * 1024, 2: 1024 * 1024})
    cpus: int = 4

    @property
    def alloc_capable(self) -> bool:
        return bool(self.caches) or self.mb is not None

    @property
    def mbps(self) -> bool:
        return "mba_MBps" in self.options

    def schema_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.caches) + (("MB",) if self.mb else ())

    def num_closids(self) -> int:
        ids = [c.num_closids for c in self.caches] + ([self.mb.num_closids] if self.mb else [])
        return min(ids + [32]) if ids else 0


def _l3(**kw: object) -> CacheRes:
    base = dict(name="L3", level=3, cbm_len=20, min_cbm_bits=1, num_closids=16,
                shareable_bits=0xC0000, domains=(0, 1))
    base.update(kw)
    return CacheRes(**base)  # type: ignore[arg-type]


VARIANTS: dict[str, Hardware] = {
    # A two-socket Xeon: L3 CAT (20 ways, two ways shared with I/O), MBA, MBM.
    "full": Hardware(caches=(_l3(),), mb=MbRes(), mon=MonRes()),
    # cri-resource-manager's failing host: MB allocation and MBM only, no L3 allocation; four domains.
    "mb_only": Hardware(mb=MbRes(domains=(0, 1, 2, 3)), mon=MonRes(domains=(0, 1, 2, 3))),
    # Monitoring only: no allocation at all (no schemata file anywhere).
    "mon_only": Hardware(mon=MonRes()),
    # L3 CAT and MBM, no MBA.
    "no_mb": Hardware(caches=(_l3(),), mon=MonRes()),
    # Code/data prioritisation: L3CODE/L3DATA, each with half of the hardware's 16 CLOSIDs.
    "cdp": Hardware(caches=(_l3(name="L3CODE", num_closids=8), _l3(name="L3DATA", num_closids=8)),
                    mb=MbRes(num_closids=8), mon=MonRes(), options=("cdp",)),
    # MBA software controller: MB values are MBps.
    "mba_mbps": Hardware(caches=(_l3(),), mb=MbRes(), mon=MonRes(), options=("mba_MBps",)),
    # L2 CAT only (per-core-pair domains), min_cbm_bits 2, no monitoring.
    "l2_only": Hardware(caches=(CacheRes(name="L2", level=2, cbm_len=8, min_cbm_bits=2, num_closids=8,
                                         domains=(0, 1)),)),
}


def variant(name: str, **overrides: object) -> Hardware:
    """A variant with its limits changed, e.g. variant("full", num_closids=3, num_rmids=4)."""
    hw = VARIANTS[name]
    closids = overrides.pop("num_closids", None)
    rmids = overrides.pop("num_rmids", None)
    if closids is not None:
        hw = replace(hw, caches=tuple(replace(c, num_closids=int(closids)) for c in hw.caches),  # type: ignore[call-overload]
                     mb=replace(hw.mb, num_closids=int(closids)) if hw.mb else None)  # type: ignore[call-overload]
    if rmids is not None and hw.mon is not None:
        hw = replace(hw, mon=replace(hw.mon, num_rmids=int(rmids)))  # type: ignore[call-overload]
    if overrides:
        raise KeyError(f"unknown overrides {sorted(overrides)}")
    return hw


# -- groups ------------------------------------------------------------------------------------

@dataclass(eq=False)
class Group:
    name: str
    kind: str  # "ctrl" | "mon"
    closid: int
    rmid: int
    parent: Group | None = None  # a monitoring group's control group
    ctrl: dict[str, dict[int, int]] = field(default_factory=dict)  # schema -> domain -> value
    mode: str = "shareable"
    cpus: set[int] = field(default_factory=set)
    mon_groups: dict[str, Group] = field(default_factory=dict)

    def rel(self) -> str:
        if self.kind == "mon":
            assert self.parent is not None
            base = self.parent.rel()
            return f"{base}/mon_groups/{self.name}" if base else f"mon_groups/{self.name}"
        return self.name


@dataclass
class TaskState:
    ctrl: Group
    mon: Group | None
    start: int  # /proc/<tid>/stat starttime, to notice tid reuse
    moved_at: int  # boot-time clock ticks when it was last moved


class ProcView:
    """What the model needs from /proc (injectable so that unit tests can fake it)."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root
        self.hz = os.sysconf("SC_CLK_TCK")

    def stat(self, tid: int) -> tuple[int, int, int] | None:
        """(tgid, ppid, starttime) of a live task, or None."""
        try:
            with open(f"{self.root}/{tid}/stat", "rb") as f:
                raw = f.read().decode()
            with open(f"{self.root}/{tid}/status", "rb") as f:
                status = f.read().decode()
        except OSError:
            return None
        fields = raw[raw.rindex(")") + 2:].split()
        ppid, start = int(fields[1]), int(fields[19])
        tgid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Tgid:"))
        return tgid, ppid, start

    def now_ticks(self) -> int:
        return int(time.clock_gettime(time.CLOCK_BOOTTIME) * self.hz)

    def threads_of(self, tgids: set[int]) -> list[int]:
        out = []
        for tgid in tgids:
            try:
                out.extend(int(t) for t in os.listdir(f"{self.root}/{tgid}/task"))
            except OSError:
                pass
        return out

    def all_tids(self) -> list[int]:
        out = []
        for pid in os.listdir(self.root):
            if pid.isdigit():
                try:
                    out.extend(int(t) for t in os.listdir(f"{self.root}/{pid}/task"))
                except OSError:
                    pass
        return out


class Resctrl:
    """The filesystem's state and its operations, addressed by paths relative to the mount."""

    def __init__(self, hw: Hardware, *, proc: ProcView | None = None,
                 counters: Callable[[], Mapping[str, Mapping[str, Mapping[str, object]]]] | None = None,
                 journal: Callable[[str], None] | None = None) -> None:
        self.hw = hw
        self.proc = proc or ProcView()
        self.counters = counters or (lambda: {})
        self.journal = journal or (lambda line: None)
        self.lock = threading.RLock()  # rdtgroup_mutex
        self.status = ""
        self.closid_free = set(range(1, hw.num_closids()))
        self.rmid_free = set(range(1, hw.mon.num_rmids)) if hw.mon else set()
        self.root = Group("", "ctrl", 0, 0, cpus=set(range(hw.cpus)))
        for c in hw.caches:
            self.root.ctrl[c.name] = {d: c.full for d in c.domains}
        if hw.mb:
            self.root.ctrl["MB"] = {d: self._mb_max() for d in hw.mb.domains}
        self.groups: dict[str, Group] = {}
        self.tasks: dict[int, TaskState] = {}

    # -- helpers ---------------------------------------------------------------------------

    def _mb_max(self) -> int:
        return MBA_MAX_MBPS if self.hw.mbps else 100

    def _fail(self, err: int, msg: str = "") -> KernelError:
        if msg:
            self.status += msg + "\n"
        return KernelError(err)

    def _alloc_rmid(self) -> int:
        if not self.rmid_free:
            raise self._fail(errno.ENOSPC, "Out of RMIDs")
        rmid = min(self.rmid_free)
        self.rmid_free.discard(rmid)
        return rmid

    def all_groups(self) -> list[Group]:
        out = [self.root, *self.root.mon_groups.values()]
        for g in self.groups.values():
            out += [g, *g.mon_groups.values()]
        return out

    def find(self, rel: str) -> Group | None:
        """The group at `rel` ("" is the root), or None."""
        parts = [p for p in rel.split("/") if p]
        if not parts:
            return self.root
        ctrl = self.root
        if parts[0] != "mon_groups":
            if parts[0] not in self.groups:
                return None
            ctrl = self.groups[parts[0]]
            parts = parts[1:]
            if not parts:
                return ctrl
        if len(parts) == 2 and parts[0] == "mon_groups" and self.hw.mon:
            return ctrl.mon_groups.get(parts[1])
        return None

    # -- mkdir / rmdir -----------------------------------------------------------------------

    def mkdir(self, parent_rel: str, name: str) -> None:
        with self.lock:
            self.status = ""
            if "\n" in name:
                raise KernelError(errno.EINVAL)
            parts = [p for p in parent_rel.split("/") if p]
            if not parts and self.hw.alloc_capable:
                self._mkdir_ctrl(name)
            elif self.hw.mon and parts and parts[-1] == "mon_groups" and name != "mon_groups":
                parent = self.find("/".join(parts[:-1]))
                if parent is None or parent.kind != "ctrl":
                    raise KernelError(errno.ENOENT)
                self._mkdir_mon(parent, name)
            else:
                raise KernelError(errno.EPERM)
            self.journal("mkdir " + f"{parent_rel}/{name}".lstrip("/"))

    def _taken(self, name: str) -> bool:
        reserved = {"info", "tasks", "cpus", "cpus_list", "schemata", "mode", "size", "mon_groups", "mon_data"}
        return name in self.groups or name in reserved

    def _mkdir_ctrl(self, name: str) -> None:
        if self._taken(name):
            raise KernelError(errno.EEXIST)
        rmid = self._alloc_rmid() if self.hw.mon else 0  # 6.6 allocates the RMID first
        if not self.closid_free:
            if self.hw.mon:
                self.rmid_free.add(rmid)
            raise self._fail(errno.ENOSPC, "Out of CLOSIDs")
        closid = min(self.closid_free)
        group = Group(name, "ctrl", closid, rmid)
        try:
            self._init_alloc(group)
        except KernelError:
            if self.hw.mon:
                self.rmid_free.add(rmid)
            raise
        self.closid_free.discard(closid)
        self.groups[name] = group

    def _init_alloc(self, group: Group) -> None:
        for c in self.hw.caches:
            group.ctrl[c.name] = {}
            for d in c.domains:
                used, new = c.shareable_bits, c.shareable_bits
                for other in [self.root, *self.groups.values()]:
                    val = other.ctrl[c.name][d]
                    used |= val
                    if other.mode == "shareable":
                        new |= val
                new |= (used ^ c.full) & c.full
                new = _ensure_valid(new, c.cbm_len)
                if bin(new).count("1") < c.min_cbm_bits:
                    raise self._fail(errno.ENOSPC, f"No space on {c.name}:{d}")
                group.ctrl[c.name][d] = new
        if self.hw.mb:
            group.ctrl["MB"] = {d: self._mb_max() for d in self.hw.mb.domains}

    def _mkdir_mon(self, parent: Group, name: str) -> None:
        if name in parent.mon_groups:
            raise KernelError(errno.EEXIST)
        rmid = self._alloc_rmid()
        parent.mon_groups[name] = Group(name, "mon", parent.closid, rmid, parent=parent)

    def rmdir(self, rel: str) -> None:
        with self.lock:
            self.status = ""
            group = self.find(rel)
            if group is None or group is self.root:
                raise KernelError(errno.EPERM if group is self.root or self._is_dir(rel) else errno.ENOENT)
            self._refresh()
            if group.kind == "mon":
                assert group.parent is not None
                for t in self.tasks.values():
                    if t.mon is group:
                        t.mon = None
                del group.parent.mon_groups[group.name]
                self.rmid_free.add(group.rmid)
            else:
                for t in self.tasks.values():
                    if t.ctrl is group:
                        t.ctrl, t.mon = self.root, None
                for child in group.mon_groups.values():
                    self.rmid_free.add(child.rmid)
                self.root.cpus |= group.cpus
                del self.groups[group.name]
                self.closid_free.add(group.closid)
                if self.hw.mon:
                    self.rmid_free.add(group.rmid)
            self.journal(f"rmdir {rel}")

    # -- tasks -------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Forget exited tasks (and reused tids); adopt threads that inherited a group at creation."""
        for tid in list(self.tasks):
            st = self.proc.stat(tid)
            if st is None or st[2] != self.tasks[tid].start:
                del self.tasks[tid]
        for tid in self.proc.threads_of({self.proc.stat(t)[0] for t in self.tasks if self.proc.stat(t)}):
            if tid in self.tasks:
                continue
            st = self.proc.stat(tid)
            ctrl, mon = self._state(tid, st)
            if st is not None and (ctrl is not self.root or mon is not None):
                self.tasks[tid] = TaskState(ctrl=ctrl, mon=mon, start=st[2], moved_at=st[2])

    def _state(self, tid: int, seen: tuple[int, int, int] | None = None, depth: int = 0) -> tuple[Group, Group | None]:
        """(control group, monitoring group) of a live task, inferring fork inheritance."""
        st = seen or self.proc.stat(tid)
        known = self.tasks.get(tid)
        if known is not None and st is not None and known.start == st[2]:
            return known.ctrl, known.mon
        if st is None or depth > 8:
            return self.root, None
        tgid, ppid, start = st
        creator = tgid if tgid != tid else ppid
        cst = self.proc.stat(creator) if creator > 0 else None
        if cst is not None:
            cstate = self.tasks.get(creator)
            if cstate is not None and cstate.start == cst[2] and start > cstate.moved_at:  # same tick: ambiguous, not inherited
                return cstate.ctrl, cstate.mon
            if cstate is None and creator != tid:
                ctrl, mon = self._state(creator, cst, depth + 1)
                if ctrl is not self.root or mon is not None:
                    return ctrl, mon
        return self.root, None

    def write_tasks(self, rel: str, data: str) -> None:
        with self.lock:
            text = data.strip()
            try:
                tid = int(text, 0)
            except ValueError:
                raise KernelError(errno.EINVAL) from None
            if tid < 0:
                raise KernelError(errno.EINVAL)
            group = self.find(rel)
            if group is None:
                raise KernelError(errno.ENOENT)
            self.status = ""
            st = self.proc.stat(tid)
            if st is None:
                raise self._fail(errno.ESRCH, f"No task {tid}")
            self._refresh()
            ctrl, mon = self._state(tid, st)
            if group.kind == "ctrl":
                ctrl, mon = group, None
            else:
                if group.parent is not ctrl and not (group.parent is self.root and ctrl is self.root):
                    raise self._fail(errno.EINVAL, "Can't move task to different control group")
                mon = group
            self.tasks[tid] = TaskState(ctrl=ctrl, mon=mon, start=st[2], moved_at=self.proc.now_ticks())
            self.journal(f"tasks {rel} {tid}")

    def read_tasks(self, rel: str) -> str:
        with self.lock:
            group = self.find(rel)
            if group is None:
                raise KernelError(errno.ENOENT)
            self._refresh()
            if group is self.root and not self.hw.alloc_capable:
                return ""  # 6.6 show_rdt_tasks: neither a closid nor an rmid match for the root
            if group is self.root:
                tids = [t for t in self.proc.all_tids() if self._state(t)[0] is self.root]
            elif group.kind == "ctrl":
                tids = [t for t, s in self.tasks.items() if s.ctrl is group]
            else:
                tids = [t for t, s in self.tasks.items() if s.mon is group]
            return "".join(f"{t}\n" for t in sorted(tids))

    # -- schemata ----------------------------------------------------------------------------

    def read_schemata(self, rel: str) -> str:
        with self.lock:
            group = self.find(rel)
            if group is None or group.kind != "ctrl":
                raise KernelError(errno.ENOENT)
            width = max(len(n) for n in self.hw.schema_names())
            lines = []
            for c in self.hw.caches:
                digits = (c.cbm_len + 3) // 4
                doms = ";".join(f"{d}={group.ctrl[c.name][d]:0{digits}x}" for d in c.domains)
                lines.append(f"{c.name:>{width}}:{doms}")
            if self.hw.mb:
                doms = ";".join(f"{d}={group.ctrl['MB'][d]:>3}" for d in self.hw.mb.domains)
                lines.append(f"{'MB':>{width}}:{doms}")
            return "".join(line + "\n" for line in lines)

    def write_schemata(self, rel: str, data: str) -> None:
        with self.lock:
            if not data or not data.endswith("\n"):
                raise KernelError(errno.EINVAL)
            group = self.find(rel)
            if group is None or group.kind != "ctrl":
                raise KernelError(errno.ENOENT)
            self.status = ""
            staged: dict[str, dict[int, int]] = {}
            for tok in data[:-1].split("\n"):
                resname, sep, rest = tok.partition(":")
                resname = resname.strip()
                if not sep:
                    raise self._fail(errno.EINVAL, "Missing ':'")
                if rest == "":
                    raise self._fail(errno.EINVAL, f"Missing '{resname}' value")
                self._parse_line(group, resname, rest, staged)
            for name, doms in staged.items():
                group.ctrl[name].update(doms)
            self.journal(f"schemata {rel} {data.strip()!r}")

    def _parse_line(self, group: Group, resname: str, line: str, staged: dict[str, dict[int, int]]) -> None:
        cache = next((c for c in self.hw.caches if c.name == resname), None)
        is_mb = resname == "MB" and self.hw.mb is not None
        num = cache.num_closids if cache else (self.hw.mb.num_closids if is_mb and self.hw.mb else 0)
        if (cache is None and not is_mb) or group.closid >= num:
            raise self._fail(errno.EINVAL, f"Unknown or unsupported resource name '{resname}'")
        domains = cache.domains if cache else self.hw.mb.domains  # type: ignore[union-attr]
        cfg = staged.setdefault(resname, {})
        while line:
            dom, _, line = line.partition(";")
            ident, eq, value = dom.partition("=")
            try:
                dom_id = int(ident.strip(), 10)
            except ValueError:
                dom_id = -1
            if not eq or dom_id < 0:
                raise self._fail(errno.EINVAL, "Missing '=' or non-numeric domain")
            if dom_id not in domains:
                raise KernelError(errno.EINVAL)  # 6.6 parse_line: no message for an unknown domain
            if dom_id in cfg:
                raise self._fail(errno.EINVAL, f"Duplicate domain {dom_id}")
            value = value.strip()
            cfg[dom_id] = self._cbm(group, cache, dom_id, value) if cache else self._bw(value)

    def _cbm(self, group: Group, c: CacheRes, dom: int, text: str) -> int:
        try:
            val = int(text, 16)
            if text.lower().startswith("0x") or text.startswith(("+", "-")):
                raise ValueError
        except ValueError:
            raise self._fail(errno.EINVAL, f"Non-hex character in the mask {text}") from None
        if (c.min_cbm_bits > 0 and val == 0) or val > c.full:
            raise self._fail(errno.EINVAL, "Mask out of range")
        low = (val & -val).bit_length() - 1 if val else 0
        run = val >> low if val else 0
        if run & (run + 1):
            raise self._fail(errno.EINVAL, f"The mask {val:x} has non-consecutive 1-bits")
        if run.bit_length() < c.min_cbm_bits:
            raise self._fail(errno.EINVAL, f"Need at least {c.min_cbm_bits} bits in the mask")
        for other in [self.root, *self.groups.values()]:
            if other is group or not (other.ctrl[c.name][dom] & val):
                continue
            if other.mode == "exclusive":
                raise self._fail(errno.EINVAL, "Overlaps with exclusive group")
            if group.mode == "exclusive":
                raise self._fail(errno.EINVAL, "Overlaps with other group")
        return val

    def _bw(self, text: str) -> int:
        assert self.hw.mb is not None
        if not text.isdigit():
            raise self._fail(errno.EINVAL, f"Non-decimal digit in MB value {text}")
        bw = int(text)
        if not self.hw.mbps and (bw < self.hw.mb.min_bandwidth or bw > 100):
            raise self._fail(errno.EINVAL, f"MB value {bw} out of range [{self.hw.mb.min_bandwidth},100]")
        if self.hw.mbps:
            return min(bw, MBA_MAX_MBPS)
        gran = self.hw.mb.bandwidth_gran
        return -(-bw // gran) * gran

    # -- mode, cpus, size ----------------------------------------------------------------------

    def write_mode(self, rel: str, data: str) -> None:
        with self.lock:
            group = self.find(rel)
            if group is None or group.kind != "ctrl":
                raise KernelError(errno.ENOENT)
            self.status = ""
            mode = data.strip()
            if mode == group.mode:
                return
            if group is self.root and mode != "shareable":
                raise self._fail(errno.EINVAL, "Cannot change default group mode")
            if mode == "exclusive":
                for c in self.hw.caches:
                    for d in c.domains:
                        mine = group.ctrl[c.name][d]
                        if mine & c.shareable_bits or any(
                                o is not group and o.ctrl[c.name][d] & mine
                                for o in [self.root, *self.groups.values()]):
                            raise self._fail(errno.EINVAL, "Schemata overlaps")
            elif mode != "shareable":
                raise self._fail(errno.EINVAL, "Unknown or unsupported mode")
            group.mode = mode

    def write_cpus(self, rel: str, data: str, *, as_list: bool) -> None:
        with self.lock:
            group = self.find(rel)
            if group is None:
                raise KernelError(errno.ENOENT)
            self.status = ""
            try:
                cpus = _parse_cpus(data.strip(), as_list)
            except ValueError:
                raise self._fail(errno.EINVAL, "Bad CPU list/mask") from None
            if any(c >= self.hw.cpus for c in cpus):
                raise self._fail(errno.EINVAL, "Can only assign online CPUs")
            if group is self.root and not cpus >= group.cpus:
                raise self._fail(errno.EINVAL, "Can't drop CPUs from default group")
            if group.kind == "mon":
                assert group.parent is not None
                if not cpus <= group.parent.cpus:
                    raise self._fail(errno.EINVAL, "Can only add CPUs to mongroup that belong to parent")
            elif group is not self.root:
                self.root.cpus |= group.cpus - cpus
                for other in self.groups.values():
                    if other is not group:
                        other.cpus -= cpus
                self.root.cpus -= cpus
            group.cpus = cpus

    def read_cpus(self, rel: str, *, as_list: bool) -> str:
        group = self.find(rel)
        if group is None:
            raise KernelError(errno.ENOENT)
        if as_list:
            return _format_cpulist(group.cpus) + "\n"
        return f"{sum(1 << c for c in group.cpus):x}\n"

    def read_size(self, rel: str) -> str:
        group = self.find(rel)
        if group is None or group.kind != "ctrl":
            raise KernelError(errno.ENOENT)
        width = max(len(n) for n in self.hw.schema_names())
        lines = []
        for c in self.hw.caches:
            way = self.hw.cache_bytes[c.level] // c.cbm_len
            doms = ";".join(f"{d}={bin(group.ctrl[c.name][d]).count('1') * way}" for d in c.domains)
            lines.append(f"{c.name:>{width}}:{doms}")
        if self.hw.mb:
            doms = ";".join(f"{d}={group.ctrl['MB'][d]:>3}" for d in self.hw.mb.domains)
            lines.append(f"{'MB':>{width}}:{doms}")
        return "".join(line + "\n" for line in lines)

    # -- monitoring ----------------------------------------------------------------------------

    def read_counter(self, rel: str, domain: int, event: str) -> str:
        group = self.find(rel)
        if group is None:
            raise KernelError(errno.ENOENT)
        members = [group] + (list(group.mon_groups.values()) if group.kind == "ctrl" else [])
        table = self.counters()
        total = 0
        for g in members:
            raw = table.get(g.rel(), {}).get(event, {}).get(str(domain), 0)
            if raw in ("Unavailable", "Error"):
                return f"{raw}\n"
            total += int(raw)  # type: ignore[call-overload]
        return f"{total}\n"

    def read_status(self) -> str:
        return self.status if self.status else "ok\n"

    def _is_dir(self, rel: str) -> bool:
        return rel.strip("/").split("/")[0] in ("info", "mon_data", "mon_groups")


def _ensure_valid(val: int, cbm_len: int) -> int:
    """cbm_ensure_valid: keep only the lowest run of 1-bits."""
    if not val:
        return 0
    low = (val & -val).bit_length() - 1
    run = val >> low
    length = (~run & (run + 1)).bit_length() - 1
    return ((1 << length) - 1) << low


def _parse_cpus(text: str, as_list: bool) -> set[int]:
    if not text:
        return set()
    if not as_list:
        return {i for i in range(int(text.replace(",", ""), 16).bit_length()) if int(text.replace(",", ""), 16) >> i & 1}
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(part)
        out.update(range(a, b + 1))
    return out


def _format_cpulist(cpus: set[int]) -> str:
    parts, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)
