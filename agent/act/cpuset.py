"""Move a container between cpusets by writing cgroupfs, safely, on cgroup v1 and v2.

The planner decides *where*; this module makes it so, and refuses what must never happen:
- CPUs the kubelet dedicated to another container (static CPU manager), reserved CPUs,
  isolated CPUs (unless allowed), offline or unknown CPUs, an empty set;
- moving a container that itself holds kubelet-dedicated CPUs (the kubelet owns it);
- any cgroup that the last discovery did not match (the actuator only writes where a container
  was found; a path in an action is never trusted by itself).
A refusal raises CpusetRefused before anything is written.

Write order (kernel Documentation/admin-guide/cgroup-v1/cpusets.rst, cgroup-v2.rst): in v1 a
cgroup's CPUs must stay within its parent's (EACCES) and a parent cannot drop CPUs a child uses
(EBUSY). A container's cgroup may have children (crun's `container/`, CRI-O `exec` sessions), so
the move is two passes: widen top-down (each cgroup to old | new), then shrink bottom-up (each to
new). v2 has no such errors but the same order is harmless; v2 children with an empty
cpuset.cpus inherit and are left alone. cpuset.mems follows the NUMA nodes of the CPUs. After
writing, the effective sets are read back and must equal the request.

The kubelet and runtimes re-apply their own cpusets (kubelet restart, `systemctl daemon-reload`,
container restart): direct cgroupfs writes are last-writer-wins. So the actuator remembers what
it applied, `check_drift()` compares that with what discovery saw, and `reassert()` writes it
again, counted, with per-container exponential backoff after failures so that a permanent error
is never retried in a hot loop (koordinator PR #3218 burned 350-420m CPU doing that).

With a runtime route (NRI connected, docs/nri.md), a move of a container the runtime knows goes
as the runtime's UpdateContainers instead: the same refusals first, the same read-back after,
and the runtime keeps the value in its own record, so its later updates (and the kubelet's) do
not undo it. Drift re-assertion takes the same route, so it never races the runtime. When the
route is down the move is written to cgroupfs as without NRI.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from perfbalance.cgroupfs import GONE_ERRNOS, CgroupfsError, Cgroupfs, check_rel
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ContainerGone, CpusetError, FeatureUnavailable, ParseError, PerfbalanceError
from perfbalance.model import Container, KubeletState
from perfbalance.topology import Topology

log = logging.getLogger(__name__)

BACKOFF_BASE_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 600.0


class CpusetRefused(PerfbalanceError):
    """The actuator will not make this move; nothing was written."""

    def __init__(self, container: str, cpus: object, reason: str) -> None:
        self.container, self.cpus, self.reason = container, cpus, reason
        super().__init__(f"refusing to move {container} to CPUs {cpus}: {reason}")


class CpusetNotGranted(PerfbalanceError):
    """The writes succeeded but the kernel's effective set differs from the request."""

    def __init__(self, container: str, path: str, wanted: CpuSet, got: CpuSet) -> None:
        self.container, self.path, self.wanted, self.got = container, path, wanted, got
        super().__init__(f"cpuset of {container} not granted: {path} is {got or 'empty'}, wanted {wanted}")


class RuntimeRefused(PerfbalanceError):
    """The container runtime (NRI UpdateContainers) did not apply the move: like a kernel error,
    the container is backed off."""

    def __init__(self, container: str, cpus: object, reason: str) -> None:
        self.container, self.cpus, self.reason = container, cpus, reason
        super().__init__(f"runtime did not move {container} to CPUs {cpus}: {reason}")


class RuntimeRoute(Protocol):
    """Moves through the container runtime (agent.nri.runtime.NriRuntime)."""

    @property
    def path(self) -> str: ...  # "nri" while usable, else "cgroupfs"

    def knows(self, container_id: str) -> bool: ...

    def move(self, container_id: str, cpus: str, mems: str) -> str: ...  # "" or why not; ConnectionError: down


@dataclass(frozen=True, kw_only=True)
class ApplyResult:
    container: str  # container id
    cgroup: str
    cpus: CpuSet
    mems: CpuSet
    changed: bool  # False: everything already was as requested (no write)
    writes: tuple[str, ...] = ()  # "<rel>/<file> <- <value>" in the order written
    path: str = "cgroupfs"  # or "nri": the runtime applied it (UpdateContainers)


@dataclass(frozen=True, kw_only=True)
class Drift:
    """A container whose cpuset is no longer what we applied (someone rewrote it)."""

    container: Container
    applied_cpus: CpuSet
    applied_mems: CpuSet
    seen_cpus: CpuSet


@dataclass(frozen=True, kw_only=True)
class ReassertOutcome:
    container: str
    ok: bool
    skipped: bool = False  # still backing off from an earlier failure
    error: str = ""
    retry_at: float = 0.0


@dataclass(frozen=True, kw_only=True)
class _Node:
    """One cgroup of the container's subtree, with its current requested sets."""

    rel: str
    cpus: CpuSet
    mems: CpuSet


@dataclass(frozen=True, kw_only=True)
class _Backoff:
    failures: int
    retry_at: float


class CpusetActuator:
    """Applies cpuset moves; see the module docstring for the rules it enforces."""

    def __init__(self, cgfs: Cgroupfs, *, reserved: CpuSet, kubelet: KubeletState,
                 topology: Topology, allow_isolated: bool = False, reassert_drift: bool = True,
                 backoff_base: float = BACKOFF_BASE_SECONDS, backoff_max: float = BACKOFF_MAX_SECONDS,
                 clock: Callable[[], float] = time.monotonic, route: RuntimeRoute | None = None) -> None:
        self.cgfs, self.reserved, self.kubelet, self.topology = cgfs, reserved, kubelet, topology
        self.route = route
        self.allow_isolated, self.reassert_drift = allow_isolated, reassert_drift
        self.backoff_base, self.backoff_max, self.clock = backoff_base, backoff_max, clock
        self.v2 = cgfs.version("cpuset") == 2
        self.counters: Counter[str] = Counter()
        self._known: dict[str, Container] = {}
        self._applied: dict[str, tuple[str, CpuSet, CpuSet]] = {}  # id -> (cgroup, cpus, mems)
        self._backoff: dict[str, _Backoff] = {}

    # -- per-cycle inputs -----------------------------------------------------------------
    def observe(self, containers: Iterable[Container], *, kubelet: KubeletState | None = None,
                reserved: CpuSet | None = None, topology: Topology | None = None) -> None:
        """The latest discovery (and kubelet state): only these containers may be written."""
        self._known = {c.id: c for c in containers}
        if kubelet is not None:
            self.kubelet = kubelet
        if reserved is not None:
            self.reserved = reserved
        if topology is not None:
            self.topology = topology
        for gone in set(self._applied) - set(self._known):
            self.forget(gone)

    def update(self, *, containers: Iterable[Container], kubelet: KubeletState | None = None,
               reserved: CpuSet | None = None, topology: Topology | None = None) -> None:
        """Per-cycle inputs (same as observe(), keyword form for the agent loop)."""
        self.observe(containers, kubelet=kubelet, reserved=reserved, topology=topology)

    def maintain(self, containers: Sequence[Container]) -> tuple[int, list[str]]:
        """One cycle of drift handling: (number re-asserted, error texts).

        With `reassert_drift` off, drift is counted and logged once and the container let go.
        """
        drifted = self.check_drift(containers)
        if not self.reassert_drift:
            for d in drifted:
                log.info("cpuset of %s rewritten to %s (we applied %s); not re-asserting",
                         d.container.id, d.seen_cpus, d.applied_cpus)
                self.forget(d.container.id)
            return 0, []
        outcomes = self.reassert(drifted)
        errors = [f"cpuset drift of {o.container}: {o.error}" for o in outcomes if not o.ok and not o.skipped]
        return sum(1 for o in outcomes if o.ok), errors

    def forget(self, container_id: str) -> None:
        """Drop what we remember about a container (it is gone, or someone else owns it now)."""
        self._applied.pop(container_id, None)
        self._backoff.pop(container_id, None)

    def applied(self) -> dict[str, tuple[str, CpuSet, CpuSet]]:
        return dict(self._applied)

    def adopt(self, placements: Mapping[str, tuple[str, CpuSet, CpuSet]]) -> int:
        """After a restart: take back what an earlier run applied (from agent.persist.checkpoint), so
        drift detection goes on. Only containers the last discovery matched in the same cgroup
        (and not owned by the kubelet) are adopted; returns how many."""
        n = 0
        for cid, (cgroup, cpus, mems) in placements.items():
            known = self._known.get(cid)
            if known is None or known.cgroup != cgroup or known.exclusive or not cpus:
                continue
            self._applied[cid] = (cgroup, cpus, mems)
            n += 1
        return n

    # -- checks ---------------------------------------------------------------------------
    def check(self, container: Container, cpus: CpuSet, mems: CpuSet | None = None) -> CpuSet:
        """Raise CpusetRefused if the move is not allowed; return the mems to write."""
        def refuse(reason: str) -> CpusetRefused:
            self.counters["refused_total"] += 1
            return CpusetRefused(container.id, str(cpus) or "<empty>", reason)

        known = self._known.get(container.id)
        if known is None or known.cgroup != container.cgroup:
            raise refuse(f"cgroup {container.cgroup!r} was not matched by discovery")
        try:
            check_rel(container.cgroup)
        except ParseError as e:
            raise refuse(str(e)) from None
        if not cpus:
            raise refuse("empty CPU set")
        if not cpus <= self.topology.online:
            raise refuse(f"CPUs {cpus - self.topology.online} are not online (online: {self.topology.online})")
        if not cpus.isdisjoint(self.reserved):
            raise refuse(f"CPUs {cpus & self.reserved} are reserved for the system")
        if not self.allow_isolated and not cpus.isdisjoint(self.topology.isolated):
            raise refuse(f"CPUs {cpus & self.topology.isolated} are isolated (isolcpus)")
        if known.exclusive or self._owns_exclusive(known):
            raise refuse("the kubelet's CPU manager dedicated CPUs to this container; it owns it")
        others = self._dedicated_to_others(known)
        if not cpus.isdisjoint(others):
            raise refuse(f"CPUs {cpus & others} are dedicated by the kubelet to other containers")
        want_mems = mems if mems is not None else self.topology.nodes_of(cpus)
        if not want_mems:
            raise refuse("no NUMA node for these CPUs (cpuset.mems would be empty)")
        return want_mems

    def _owns_exclusive(self, c: Container) -> bool:
        return ("", c.id) in self.kubelet.exclusive or (
            bool(c.name) and (c.pod_uid, c.name) in self.kubelet.exclusive)

    def _dedicated_to_others(self, c: Container) -> CpuSet:
        mine = {("", c.id), (c.pod_uid, c.name)}
        out = CpuSet()
        for key, cpus in self.kubelet.exclusive.items():
            if key not in mine:
                out = out | cpus
        return out

    # -- apply ----------------------------------------------------------------------------
    def apply(self, container: Container, cpus: CpuSet, mems: CpuSet | None = None) -> ApplyResult:
        """Move `container` (and its child cgroups) to `cpus`/`mems` and verify.

        Raises CpusetRefused (nothing written), ContainerGone (cgroup vanished), CpusetError
        (the kernel refused a write: errno, path, value; earlier writes are rolled back best
        effort) or CpusetNotGranted (effective set differs after writing).
        """
        want_mems = self.check(container, cpus, mems)
        try:
            result = self._by_runtime(container, cpus, want_mems) or self._move(container, cpus, want_mems)
        except ContainerGone:
            self.counters["gone_total"] += 1
            self.forget(container.id)
            raise
        except (CpusetError, CpusetNotGranted, CgroupfsError, RuntimeRefused):
            self.counters["errors_total"] += 1
            raise
        self._applied[container.id] = (container.cgroup, cpus, want_mems)
        self.counters["applied_total" if result.changed else "unchanged_total"] += 1
        return result

    def _move(self, c: Container, cpus: CpuSet, mems: CpuSet) -> ApplyResult:
        nodes = self._subtree(c)
        cur = {(n.rel, k): v for n in nodes for k, v in (("cpuset.cpus", n.cpus), ("cpuset.mems", n.mems))}
        writes: list[tuple[str, str, str]] = []

        def put(rel: str, name: str, want: CpuSet) -> None:
            if cur[(rel, name)] != want:
                self._write(c, rel, name, str(want))
                cur[(rel, name)] = want
                writes.append((rel, name, str(want)))

        try:
            for n in nodes:  # widen, parents first
                put(n.rel, "cpuset.mems", cur[(n.rel, "cpuset.mems")] | mems)
                put(n.rel, "cpuset.cpus", cur[(n.rel, "cpuset.cpus")] | cpus)
            for n in reversed(nodes):  # shrink, children first
                put(n.rel, "cpuset.cpus", cpus)
                put(n.rel, "cpuset.mems", mems)
        except (CpusetError, CgroupfsError):  # CgroupfsError: e.g. a symlink planted mid-move
            self._rollback(c, nodes, writes)
            raise
        self._verify(c, nodes, cpus, mems)
        return ApplyResult(container=c.id, cgroup=c.cgroup, cpus=cpus, mems=mems, changed=bool(writes),
                           writes=tuple(f"{rel}/{name} <- {value}" for rel, name, value in writes))

    def _by_runtime(self, c: Container, cpus: CpuSet, mems: CpuSet) -> ApplyResult | None:
        """The move as the runtime's UpdateContainers, read back like a write; None when there is
        no usable route for this container (then cgroupfs is written)."""
        route = self.route
        if route is None or route.path != "nri" or not route.knows(c.id):
            return None
        before = self._effective(c.cgroup)
        try:
            why = route.move(c.id, str(cpus), str(mems))
        except ConnectionError as e:
            log.info("moving %s by cgroupfs: %s", c.id, e)
            return None
        if why:
            raise RuntimeRefused(c.id, cpus, why)
        got = self._effective(c.cgroup)
        if got != cpus:
            raise CpusetNotGranted(c.id, self.cgfs.dir(c.cgroup, "cpuset"), cpus, got)
        self.counters["runtime_applied_total"] += 1
        return ApplyResult(container=c.id, cgroup=c.cgroup, cpus=cpus, mems=mems, changed=before != cpus,
                           path="nri")

    def _subtree(self, c: Container) -> list[_Node]:
        """The container's cgroup and its descendants, parents first, with their current sets."""
        nodes: list[_Node] = []
        for rel in self.cgfs.walk(c.cgroup, "cpuset"):
            node = self._node(rel, top=rel == c.cgroup)
            if node is not None:
                nodes.append(node)
        if not nodes or nodes[0].rel != c.cgroup:
            raise ContainerGone(c.id, f"cgroup {c.cgroup} not found in the cpuset hierarchy")
        return nodes

    def _node(self, rel: str, *, top: bool) -> _Node | None:
        try:
            cpus_t = self.cgfs.try_read(rel, "cpuset", "cpuset.cpus")
            mems_t = self.cgfs.try_read(rel, "cpuset", "cpuset.mems")
        except ContainerGone:
            if top:
                raise
            return None  # an exec child that ended meanwhile
        if cpus_t is None or mems_t is None:
            if top:
                raise FeatureUnavailable("cpuset controller", f"no cpuset files for {rel} (on v2: "
                                         "is cpuset in the parent's cgroup.subtree_control?)")
            return None
        if self.v2 and not top and not cpus_t.strip():
            return None  # v2 child inheriting its parent's set: follows without a write
        where = self.cgfs.dir(rel, "cpuset")
        return _Node(rel=rel, cpus=CpuSet.parse(cpus_t, source=f"{where}/cpuset.cpus"),
                     mems=CpuSet.parse(mems_t, source=f"{where}/cpuset.mems"))

    def _current(self, rel: str, name: str) -> CpuSet:
        text = self.cgfs.read(rel, "cpuset", name)
        return CpuSet.parse(text, source=f"{self.cgfs.dir(rel, 'cpuset')}/{name}")

    def _write(self, c: Container, rel: str, name: str, value: str) -> None:
        try:
            self.cgfs.write(rel, "cpuset", name, value)
        except ContainerGone:
            raise ContainerGone(c.id, f"{rel} vanished while writing {name}") from None
        except OSError as e:
            if e.errno in GONE_ERRNOS:
                raise ContainerGone(c.id, f"{rel}: {e.strerror}") from None
            raise CpusetError(e.errno or errno.EIO, c.id,
                              f"{self.cgfs.dir(rel, 'cpuset')}/{name}", value) from None

    def _rollback(self, c: Container, nodes: Sequence[_Node], writes: Sequence[tuple[str, str, str]]) -> None:
        """Best effort: put back the sets we started from (widen first, then shrink)."""
        touched = {(rel, name) for rel, name, _ in writes}
        for phase in ("widen", "shrink"):
            order = nodes if phase == "widen" else list(reversed(nodes))
            for n in order:
                for name, old in (("cpuset.mems", n.mems), ("cpuset.cpus", n.cpus)):
                    if (n.rel, name) not in touched or (self.v2 and not old):
                        continue
                    try:
                        cur = self._current(n.rel, name)
                        value = cur | old if phase == "widen" else old
                        if value != cur:
                            self.cgfs.write(n.rel, "cpuset", name, str(value))
                    except (OSError, PerfbalanceError) as e:
                        log.warning("rollback of %s %s/%s failed: %s", c.id, n.rel, name, e)

    def _verify(self, c: Container, nodes: Sequence[_Node], cpus: CpuSet, mems: CpuSet) -> None:
        eff = ("cpuset.cpus.effective", "cpuset.mems.effective") if self.v2 else \
            ("cpuset.effective_cpus", "cpuset.effective_mems")
        for n in nodes:
            for name, fallback, want in ((eff[0], "cpuset.cpus", cpus), (eff[1], "cpuset.mems", mems)):
                text = self.cgfs.try_read(n.rel, "cpuset", name)
                if text is None:  # kernels without effective files: read back the request
                    name, text = fallback, self.cgfs.read(n.rel, "cpuset", fallback)
                got = CpuSet.parse(text, source=f"{self.cgfs.dir(n.rel, 'cpuset')}/{name}")
                if got != want:
                    raise CpusetNotGranted(c.id, f"{self.cgfs.dir(n.rel, 'cpuset')}/{name}", want, got)

    # -- drift ----------------------------------------------------------------------------
    def check_drift(self, containers: Sequence[Container]) -> list[Drift]:
        """Containers whose cpuset is no longer what we applied; also refreshes what is known.

        The current set is read from cgroupfs, not taken from `containers` (which may have been
        discovered before this cycle's moves): only a rewrite by someone else counts as drift.
        """
        self.observe(containers)
        out = []
        for c in containers:
            rec = self._applied.get(c.id)
            if rec is None or rec[0] != c.cgroup:
                continue
            try:
                seen = self._effective(c.cgroup)
            except ContainerGone:
                self.forget(c.id)
                continue
            except (ParseError, PerfbalanceError, OSError) as e:
                log.warning("cannot read the cpuset of %s: %s", c.id, e)
                continue
            if seen != rec[1]:
                out.append(Drift(container=c, applied_cpus=rec[1], applied_mems=rec[2], seen_cpus=seen))
        self.counters["drift_detected_total"] += len(out)
        return out

    def _effective(self, rel: str) -> CpuSet:
        name = "cpuset.cpus.effective" if self.v2 else "cpuset.effective_cpus"
        text = self.cgfs.try_read(rel, "cpuset", name)
        if text is None:
            name, text = "cpuset.cpus", self.cgfs.read(rel, "cpuset", "cpuset.cpus")
        return CpuSet.parse(text, source=f"{self.cgfs.dir(rel, 'cpuset')}/{name}")

    def reassert(self, drifted: Sequence[Drift]) -> list[ReassertOutcome]:
        """Re-apply what we applied; failures back off exponentially per container."""
        now = self.clock()
        return [self._reassert_one(d, now) for d in drifted]

    def _reassert_one(self, d: Drift, now: float) -> ReassertOutcome:
        cid = d.container.id
        b = self._backoff.get(cid)
        if b is not None and now < b.retry_at:
            self.counters["drift_backoff_skipped_total"] += 1
            return ReassertOutcome(container=cid, ok=False, skipped=True, retry_at=b.retry_at)
        try:
            self.apply(d.container, d.applied_cpus, d.applied_mems)
        except CpusetRefused as e:
            self.forget(cid)  # the rules changed (e.g. the kubelet dedicated those CPUs): let go
            return ReassertOutcome(container=cid, ok=False, error=str(e))
        except ContainerGone as e:
            return ReassertOutcome(container=cid, ok=False, error=str(e))
        except (CpusetError, CpusetNotGranted, CgroupfsError, FeatureUnavailable, ParseError, RuntimeRefused) as e:
            retry = self._fail(cid, now)
            log.warning("re-asserting cpuset of %s failed (retry in %.0fs): %s", cid, retry - now, e)
            return ReassertOutcome(container=cid, ok=False, error=str(e), retry_at=retry)
        self._backoff.pop(cid, None)
        self.counters["drift_reasserted_total"] += 1
        log.info("re-asserted cpuset %s of %s (was rewritten to %s)", d.applied_cpus, cid, d.seen_cpus)
        return ReassertOutcome(container=cid, ok=True)

    def _fail(self, cid: str, now: float) -> float:
        failures = self._backoff[cid].failures + 1 if cid in self._backoff else 1
        delay = min(self.backoff_max, self.backoff_base * 2 ** (failures - 1))
        self._backoff[cid] = _Backoff(failures=failures, retry_at=now + delay)
        self.counters["drift_reassert_failed_total"] += 1
        return now + delay
