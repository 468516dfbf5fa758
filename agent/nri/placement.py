"""The agent's NRI policy: new containers placed by rebalancer.admit, our placements kept.

A thin adapter from NRI's pods and containers to the planner's pure admission function. The
snapshot (topology, reserved CPUs, exclusive containers) is the latest cycle's; the kubelet's CPU
manager state is read fresh at every creation, because the kubelet allocates a Guaranteed
container's dedicated CPUs just before it asks the runtime to create it.

Classes: at CreateContainer the adjustment carries only the class names the agent's `classes`
callback hands over (the operator listed them as known to the runtime: a name the runtime does
not know would fail the creation); at StartContainer `started` tells the agent, which applies
the container's classes itself. Neither callback may fail a container: errors are logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError
from perfbalance.model import KubeletState, Snapshot
from rebalancer.admit import NewContainer, Running, admit

from agent.nri.model import Ctr, Placement, Pod, View

log = logging.getLogger(__name__)
SHARES_PER_CPU = 1024  # the kubelet's cpu.shares for one requested CPU


def request_mcpu(ctr: Ctr) -> int:
    return ctr.cpu_shares * 1000 // SHARES_PER_CPU if ctr.cpu_shares > 2 else 0


class AdmitPolicy:
    def __init__(self, *, snapshot: Callable[[], Snapshot | None], kubelet: Callable[[], KubeletState],
                 classes: Callable[[Pod, Ctr], Mapping[str, str]] = lambda pod, ctr: {},
                 started: Callable[[Pod, Ctr], None] = lambda pod, ctr: None,
                 applied: Callable[[], Mapping[str, Placement]] = dict) -> None:
        self._snapshot, self._kubelet, self._classes, self._started = snapshot, kubelet, classes, started
        self._applied = applied  # what the agent's cpuset actuator applied, by container id
        self.decisions: dict[str, str] = {}  # container id -> why it was placed where (last few)

    def on_synchronize(self, view: View) -> Mapping[str, Placement]:
        """Our placements the runtime's record does not have (moved by cgroupfs while NRI was
        down, or before it came up): handed to the runtime now, so its later updates keep them.
        Everything else is the planner's business, from the next cycle on."""
        out = {}
        for cid, p in self._applied().items():
            c = view.containers.get(cid)
            if c is not None and c.state == "running" and c.cpus and _differ(c.cpus, p.cpus):
                out[cid] = p
        return out

    def on_create(self, pod: Pod, ctr: Ctr, view: View) -> Placement | None:
        classes = self._handed_over(pod, ctr)
        snap = self._snapshot()
        if snap is None:  # no topology yet: the runtime's default cpuset
            return Placement(rdt_class=classes.get("rdt", ""), blockio_class=classes.get("blockio", "")) \
                if classes else None
        snap = replace(snap, kubelet=self._kubelet())
        running = {c.id: Running(cpus=CpuSet.parse(c.cpus), annotations={**view.pods[c.pod_id].annotations,
                                                                          **c.annotations}
                                 if c.pod_id in view.pods else c.annotations)
                   for c in view.containers.values() if c.id != ctr.id and c.cpus}
        new = NewContainer(pod_uid=pod.uid, name=ctr.name, request_mcpu=request_mcpu(ctr),
                           annotations={**pod.annotations, **ctr.annotations})
        a = admit(snap, new, running)
        self.decisions[ctr.id] = a.reason
        while len(self.decisions) > 256:
            self.decisions.pop(next(iter(self.decisions)))
        if a.cpus is None and not classes:
            return None
        log.info("NRI: %s/%s/%s placed on %s (%s)%s", pod.namespace, pod.name, ctr.name, a.cpus, a.reason,
                 "".join(f", {k} class {v!r} set by the runtime" for k, v in sorted(classes.items())))
        return Placement(cpus=str(a.cpus or ""), mems=str(a.mems or ""), rdt_class=classes.get("rdt", ""),
                         blockio_class=classes.get("blockio", ""))

    def _handed_over(self, pod: Pod, ctr: Ctr) -> Mapping[str, str]:
        try:
            return self._classes(pod, ctr)
        except Exception:  # a bug here must not fail the container's creation
            log.exception("NRI: classes of %s/%s/%s at creation: left to the agent", pod.namespace, pod.name,
                          ctr.name)
            return {}

    def on_start(self, pod: Pod, ctr: Ctr) -> None:
        try:
            self._started(pod, ctr)
        except Exception:  # the agent's next cycle applies the classes instead
            log.exception("NRI: classes of %s/%s/%s at start: left to the next cycle", pod.namespace, pod.name,
                          ctr.name)

    def on_update(self, pod: Pod, ctr: Ctr, ours: Placement) -> Placement | None:
        if (pod.uid, ctr.name) in self._kubelet().exclusive:
            return None  # the kubelet now dedicates CPUs to it: its choice wins
        return Placement(cpus=ours.cpus, mems=ours.mems)


def _differ(runtime: str, ours: str) -> bool:
    try:
        return CpuSet.parse(runtime) != CpuSet.parse(ours)
    except ParseError as e:
        log.warning("NRI: the runtime reports a cpuset that is not a CPU list, left alone: %s", e)
        return False
