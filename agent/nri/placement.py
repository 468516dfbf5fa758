"""The agent's NRI policy: new containers placed by rebalancer.admit, our placements kept.

A thin adapter from NRI's pods and containers to the planner's pure admission function. The
snapshot (topology, reserved CPUs, exclusive containers) is the latest cycle's; the kubelet's CPU
manager state is read fresh at every creation, because the kubelet allocates a Guaranteed
container's dedicated CPUs just before it asks the runtime to create it.
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
                 rdt_class: Callable[[Pod, Ctr], str] = lambda pod, ctr: "",
                 applied: Callable[[], Mapping[str, Placement]] = dict) -> None:
        self._snapshot, self._kubelet, self._rdt_class = snapshot, kubelet, rdt_class
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
        snap = self._snapshot()
        if snap is None:
            return None  # no topology yet: the runtime's default
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
        rdt = self._rdt_class(pod, ctr)
        if a.cpus is None and not rdt:
            return None
        log.info("NRI: %s/%s/%s placed on %s (%s)", pod.namespace, pod.name, ctr.name, a.cpus, a.reason)
        return Placement(cpus=str(a.cpus or ""), mems=str(a.mems or ""), rdt_class=rdt)

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
