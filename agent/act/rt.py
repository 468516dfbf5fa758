"""Real-time classes: a SCHED_FIFO/RR budget (cpu.rt_runtime_us per cpu.rt_period_us) per class.

With CONFIG_RT_GROUP_SCHED every cgroup of the v1 cpu controller has an RT budget, 0 by default,
and a task cannot even become SCHED_FIFO in a group without one (sched_setscheduler -> EPERM). The
kernel accepts a budget only if the whole tree stays schedulable (kernel/sched/rt.c
tg_rt_schedulable): runtime <= period, and for every group the sum of its children's ratios
runtime/period (fixed point, to_ratio() with BW_SHIFT 20) is at most its own, up to the root's
(sched_rt_runtime_us / sched_rt_period_us). So a container's parents are given enough budget
first, topmost first, before the container's own write; a budget the root cannot give is refused
before anything is written. Lowering a budget to 0 under running RT tasks is refused by the kernel
(EBUSY): the container keeps its class. Parents' budgets are left as they are when a container
leaves (they only bound what their children may get).

cgroup v2 has no RT group interface: RT tasks there run in the root's budget, and `doctor`
reports the controller unavailable.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfbalance.cgroupfs import Cgroupfs
from perfbalance.classes import ClassError, RtSection
from perfbalance.errors import ContainerGone, FeatureUnavailable, PerfbalanceError
from perfbalance.model import Container

BW_SHIFT = 20  # kernel/sched/sched.h
RUNTIME_INF = -1


def to_ratio(period_us: int, runtime_us: int) -> int:
    """The kernel's fixed-point bandwidth (kernel/sched/core.c to_ratio)."""
    if runtime_us == RUNTIME_INF:
        return 1 << BW_SHIFT
    if period_us == 0:
        return 0
    return (runtime_us << BW_SHIFT) // period_us


def runtime_for(ratio: int, period_us: int) -> int:
    """The smallest runtime whose to_ratio() reaches `ratio` at `period_us`."""
    runtime = (ratio * period_us) >> BW_SHIFT
    while to_ratio(period_us, runtime) < ratio:
        runtime += 1
    return runtime


@dataclass(frozen=True, kw_only=True)
class Group:
    """One cgroup on the way from a container up to the root's child, as read now."""

    rel: str
    runtime_us: int
    period_us: int
    others: int  # sum of the ratios of its children other than the one on the path (for the
    #              container itself: all its children)


@dataclass(frozen=True, kw_only=True)
class Write:
    rel: str
    file: str
    value: int


def plan_budget(chain: Sequence[Group], *, runtime_us: int, period_us: int, root_ratio: int,
                root_others: int) -> list[Write]:
    """The writes giving chain[0] (the container) runtime/period, parents first.

    `chain` runs from the container up to the root's child; `root_others` is the ratio the
    root's other children hold. Raises ValueError naming the group that cannot give the budget.
    """
    need = to_ratio(period_us, runtime_us)
    if chain[0].others > need:
        raise ValueError(f"{chain[0].rel}: its own child groups hold more real-time budget than {runtime_us}/{period_us}")
    parents: list[Write] = []
    for g in chain[1:]:
        need = g.others + need
        if to_ratio(g.period_us, g.runtime_us) >= need:
            need = to_ratio(g.period_us, g.runtime_us)
            continue
        runtime = runtime_for(need, g.period_us)
        if runtime > g.period_us:
            raise ValueError(f"{g.rel} would need {runtime}us per {g.period_us}us period (more than the period)")
        parents.append(Write(rel=g.rel, file="cpu.rt_runtime_us", value=runtime))
        need = to_ratio(g.period_us, runtime)
    if root_others + need > root_ratio:
        free = max(0, root_ratio - root_others) * 100 / (1 << BW_SHIFT)
        raise ValueError(f"the root group has {free:.1f}% of real-time CPU left, {need * 100 / (1 << BW_SHIFT):.1f}% needed")
    return list(reversed(parents)) + _own_writes(chain[0], runtime_us, period_us)


def _own_writes(g: Group, runtime_us: int, period_us: int) -> list[Write]:
    """Period and runtime in the order whose in-between state is the smaller budget."""
    runtime = Write(rel=g.rel, file="cpu.rt_runtime_us", value=runtime_us)
    if period_us == g.period_us:
        return [runtime] if runtime_us != g.runtime_us else []
    period = Write(rel=g.rel, file="cpu.rt_period_us", value=period_us)
    if to_ratio(period_us, g.runtime_us) <= to_ratio(g.period_us, runtime_us):
        return [period, runtime]
    return [runtime, period]


class RtController:
    """Puts containers into real-time classes on one node (v1 cpu controller)."""

    name = "rt"
    reapply = False  # a budget is written once; the kernel keeps it

    def __init__(self, *, section: RtSection, cgroupfs: Cgroupfs) -> None:
        self.section, self.cgfs = section, cgroupfs
        self.applied: dict[str, str | None] = {}

    def unavailable(self) -> str:
        fs = self.cgfs
        if not fs.has("cpu"):
            return f"no cpu controller under {fs.root}"
        if fs.version("cpu") == 2:
            return "cgroup v2: no real-time group scheduling interface (cpu.rt_runtime_us exists only in v1)"
        if fs.try_read("", "cpu", "cpu.rt_runtime_us") is None:
            return "kernel without CONFIG_RT_GROUP_SCHED (no cpu.rt_runtime_us)"
        return ""

    def classes(self) -> Mapping[str, bool]:
        return {k: v.allow_annotation for k, v in self.section.classes.items()}

    def begin_cycle(self) -> None:
        pass

    def apply(self, container: Container, class_name: str | None) -> list[str]:
        if class_name is not None and class_name not in self.section.classes:
            raise ClassError(self.name, container, "class", class_name, "is not a configured real-time class")
        cls = self.section.classes.get(class_name) if class_name else None
        runtime, period = (cls.runtime_us, cls.period_us) if cls else (0, None)
        try:
            writes = self.plan(container.cgroup, runtime, period)
        except ValueError as e:
            raise ClassError(self.name, container, "class", class_name or "", f"budget cannot be given: {e}") from None
        for w in writes:
            self._write(container, class_name, w)
        self.applied[container.id] = class_name
        return []

    def plan(self, rel: str, runtime_us: int, period_us: int | None) -> list[Write]:
        chain = self.chain(rel)
        root_ratio = to_ratio(self._int("", "cpu.rt_period_us"), self._int("", "cpu.rt_runtime_us"))
        top = chain[-1].rel
        root_others = sum(self._ratio(k) for k in self.cgfs.children("", "cpu") if k != top)
        return plan_budget(chain, runtime_us=runtime_us, period_us=period_us or chain[0].period_us,
                           root_ratio=root_ratio, root_others=root_others)

    def chain(self, rel: str) -> list[Group]:
        parts = [p for p in rel.split("/") if p]
        out = []
        below = None
        for i in range(len(parts), 0, -1):
            g = "/".join(parts[:i])
            kids = [f"{g}/{k}" for k in self.cgfs.children(g, "cpu")]
            others = sum(self._ratio(k) for k in kids if k != below)
            out.append(Group(rel=g, runtime_us=self._int(g, "cpu.rt_runtime_us"),
                             period_us=self._int(g, "cpu.rt_period_us"), others=others))
            below = g
        return out

    def _ratio(self, rel: str) -> int:
        try:
            return to_ratio(self._int(rel, "cpu.rt_period_us"), self._int(rel, "cpu.rt_runtime_us"))
        except ContainerGone:
            return 0

    def _int(self, rel: str, name: str) -> int:
        return self.cgfs.read_int(rel, "cpu", name)

    def _write(self, c: Container, class_name: str | None, w: Write) -> None:
        try:
            self.cgfs.write(w.rel, "cpu", w.file, str(w.value))
        except ContainerGone:
            raise
        except (FeatureUnavailable, PerfbalanceError) as e:
            raise ClassError(self.name, c, "class", class_name or "", str(e)) from None
        except OSError as e:
            why = errno.errorcode.get(e.errno or 0, str(e.errno))
            if e.errno == errno.EBUSY:
                why = "EBUSY: the group still runs real-time tasks, its budget cannot drop to 0"
            elif e.errno == errno.EINVAL:
                why = ("EINVAL: the kernel found the budget not schedulable in the hierarchy (a group "
                       "removed moments ago may still hold its budget; retried next cycle)")
            raise ClassError(self.name, c, "class", class_name or "",
                             f"writing {w.value} to {w.rel}/{w.file}: {why}") from None

    def adopt(self, container_id: str, class_name: str | None) -> None:
        self.applied[container_id] = class_name

    def forget(self, alive: Sequence[str]) -> None:
        keep = set(alive)
        self.applied = {k: v for k, v in self.applied.items() if k in keep}
