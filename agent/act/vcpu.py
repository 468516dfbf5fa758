"""The vCPU actuator: puts each VM sandbox's VMM threads where the plan's `VcpuPinning` says.

It applies and decides nothing: the pinning comes from the planner (`Plan.vcpu_pinning`, made
by `rebalancer.vm.plan_vcpus` from `Snapshot.vmms`). One `sched_setaffinity` per thread whose
affinity differs (so applying every cycle is cheap and idempotent), each write read back; an
`OSError` becomes one line naming the thread, the CPUs and what the errno means here. A thread
that exited meanwhile is skipped: the next cycle's discovery sees the new thread list.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from perfbalance.cpuset import CpuSet
from perfbalance.sandbox import VcpuPinning

Affinity = Callable[[int], set[int]]
SetAffinity = Callable[[int, Iterable[int]], None]


@dataclass(frozen=True, kw_only=True)
class VcpuApplied:
    """One `apply()`: writes made and refused ones (named per pod)."""

    pinnings: tuple[VcpuPinning, ...] = ()
    writes: int = 0  # sched_setaffinity calls made (0 when everything already was right)
    errors: tuple[str, ...] = ()


class VcpuActuator:
    """Applies `VcpuPinning`s and remembers the last applied ones (what the report exports)."""

    def __init__(self, *, setaffinity: SetAffinity = os.sched_setaffinity,
                 getaffinity: Affinity = os.sched_getaffinity) -> None:
        self._set, self._get = setaffinity, getaffinity
        self.last = VcpuApplied()

    def apply(self, pinnings: Sequence[VcpuPinning]) -> VcpuApplied:
        writes, errors = 0, []
        for p in pinnings:
            n, errs = self._apply_one(p)
            writes += n
            errors.extend(f"pod {p.pod}: {e}" for e in errs)
        self.last = VcpuApplied(pinnings=tuple(pinnings), writes=writes, errors=tuple(errors))
        return self.last

    def vcpu_map(self) -> dict[str, dict[int, int]]:
        """container id -> {host cpu: vCPU} for every container pinned 1:1 (last applied)."""
        return {cid: dict(m) for p in self.last.pinnings for cid, m in p.mapping.items()}

    def _apply_one(self, p: VcpuPinning) -> tuple[int, list[str]]:
        writes, errors = 0, []
        for tid, cpus in sorted(p.affinity.items()):
            if not cpus:
                continue
            try:
                if self._get(tid) == set(cpus):
                    continue
                writes += 1
                self._set(tid, set(cpus))
                got = self._get(tid)
            except ProcessLookupError:
                continue
            except OSError as e:
                errors.append(affinity_error(tid, cpus, e))
                continue
            if got != set(cpus):
                errors.append(f"tid {tid}: affinity {cpus} read back as {CpuSet(got)} "
                              "(its cgroup's cpuset does not allow all of them)")
        return writes, errors


def affinity_error(tid: int, cpus: CpuSet, e: OSError) -> str:
    """A refused `sched_setaffinity`, as one line: the thread, the CPUs, the errno's meaning."""
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    hint = {errno.EINVAL: ": none of them is allowed by its cgroup's cpuset or online",
            errno.EPERM: ": not permitted (the agent needs CAP_SYS_NICE and hostPID)"}
    return f"tid {tid}: sched_setaffinity {cpus} refused ({name}){hint.get(e.errno or 0, '')}"
