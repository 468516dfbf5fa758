"""The NRI Plugin service: registration answers, the event handlers and the plugin's view.

The runtime drives the plugin (containerd/nri pkg/adaptation): after RegisterPlugin it calls
Configure (we answer the events we subscribe to), then Synchronize with every existing pod and
container, then one request per lifecycle event. CreateContainer may adjust the container
before it starts (cpuset, mems, RDT and block-I/O class); StartContainer hands the started
container to the policy (the agent applies its classes then, not at its next cycle); UpdateContainer (the kubelet's
UpdateContainerResources) may answer updates, which is how a placement outlives a kubelet
rewrite. The decisions come from a `Policy`; this module only speaks the protocol.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any, Mapping, Protocol

from agent.nri.model import Ctr, Placement, Pod, View, ctr_from_pb, fill_resources, pod_from_pb

log = logging.getLogger(__name__)

# api.proto enum Event; a subscription mask has bit (event - 1) set (pkg/api/event.go)
RUN_POD_SANDBOX, STOP_POD_SANDBOX, REMOVE_POD_SANDBOX = 1, 2, 3
CREATE_CONTAINER, START_CONTAINER, UPDATE_CONTAINER = 4, 6, 8
STOP_CONTAINER, REMOVE_CONTAINER = 10, 11
SUBSCRIBED = (RUN_POD_SANDBOX, REMOVE_POD_SANDBOX, CREATE_CONTAINER, START_CONTAINER,
              UPDATE_CONTAINER, STOP_CONTAINER, REMOVE_CONTAINER)


def event_mask(events: tuple[int, ...]) -> int:
    mask = 0
    for e in events:
        mask |= 1 << (e - 1)
    return mask


class Policy(Protocol):
    """The agent's side: where new containers go, what to keep when the kubelet rewrites."""

    def on_synchronize(self, view: View) -> Mapping[str, Placement]: ...

    def on_create(self, pod: Pod, ctr: Ctr, view: View) -> Placement | None: ...

    def on_update(self, pod: Pod, ctr: Ctr, ours: Placement) -> Placement | None: ...

    def on_start(self, pod: Pod, ctr: Ctr) -> None: ...


class Plugin:
    """Answers the runtime's Plugin-service requests and keeps the view of pods and containers."""

    def __init__(self, *, pb: Any, policy: Policy) -> None:
        self._pb = pb
        self._policy = policy
        self._lock = threading.Lock()
        self._view = View()
        self._ours: dict[str, Placement] = {}  # what we set (at creation or by a move), per container
        self.configured = threading.Event()
        self.synchronized = threading.Event()
        self.runtime = ""

    @property
    def view(self) -> View:
        return self._view

    def serve(self, service: str, method: str, payload: bytes) -> bytes:
        handler = getattr(self, "_" + method, None)
        if handler is None:
            raise NotImplementedError(method)
        return bytes(handler(payload).SerializeToString())

    def _Configure(self, payload: bytes) -> Any:
        req = self._pb.ConfigureRequest.FromString(payload)
        self.runtime = f"{req.runtime_name} {req.runtime_version}"
        log.info("NRI: configured by %s", self.runtime)
        self.configured.set()
        return self._pb.ConfigureResponse(events=event_mask(SUBSCRIBED))

    def _Synchronize(self, payload: bytes) -> Any:
        req = self._pb.SynchronizeRequest.FromString(payload)
        pods = {p.id: pod_from_pb(p) for p in req.pods}
        ctrs = {c.id: ctr_from_pb(c) for c in req.containers}
        with self._lock:
            self._view = View(pods=pods, containers=ctrs, synchronized=True)
        updates = self._policy.on_synchronize(self._view)
        for cid, p in updates.items():
            self.record_update(cid, p)
        self.synchronized.set()
        log.info("NRI: synchronized %d pods, %d containers", len(pods), len(ctrs))
        return self._pb.SynchronizeResponse(update=[self.container_update(cid, p) for cid, p in updates.items()])

    def _Shutdown(self, payload: bytes) -> Any:
        log.info("NRI: runtime asked the plugin to shut down")
        return self._pb.Empty()

    def _CreateContainer(self, payload: bytes) -> Any:
        req = self._pb.CreateContainerRequest.FromString(payload)
        pod, ctr = self._remember(req.pod, req.container)
        placement = self._policy.on_create(pod, ctr, self._view)
        resp = self._pb.CreateContainerResponse()
        if placement is not None:
            fill_resources(resp.adjust.linux.resources, placement)
            self.record_update(ctr.id, placement)
        return resp

    def _UpdateContainer(self, payload: bytes) -> Any:
        req = self._pb.UpdateContainerRequest.FromString(payload)
        pod, ctr = self._remember(req.pod, req.container)
        ours = self._ours.get(ctr.id)
        keep = None if ours is None else self._policy.on_update(pod, ctr, ours)
        resp = self._pb.UpdateContainerResponse()
        if keep is not None:
            # the kubelet's new values and ours are merged by the runtime; ours win for the
            # fields we set (containerd/nri pkg/adaptation result.go)
            resp.update.append(self.container_update(ctr.id, keep))
        return resp

    def _StopContainer(self, payload: bytes) -> Any:
        req = self._pb.StopContainerRequest.FromString(payload)
        self._remember(req.pod, req.container)
        return self._pb.StopContainerResponse()

    def _StateChange(self, payload: bytes) -> Any:
        evt = self._pb.StateChangeEvent.FromString(payload)
        with self._lock:
            pods, ctrs = dict(self._view.pods), dict(self._view.containers)
            if evt.event == REMOVE_POD_SANDBOX:
                pods.pop(evt.pod.id, None)
            elif evt.event == REMOVE_CONTAINER:
                ctrs.pop(evt.container.id, None)
                self._ours.pop(evt.container.id, None)
            else:
                if evt.pod.id:
                    pods[evt.pod.id] = pod_from_pb(evt.pod)
                if evt.container.id:
                    ctrs[evt.container.id] = ctr_from_pb(evt.container)
            self._view = replace(self._view, pods=pods, containers=ctrs)
        if evt.event == START_CONTAINER and evt.container.id:  # outside the lock: the policy reads the view
            self._policy.on_start(pod_from_pb(evt.pod), ctr_from_pb(evt.container))
        return self._pb.Empty()

    def _remember(self, pb_pod: Any, pb_ctr: Any) -> tuple[Pod, Ctr]:
        pod, ctr = pod_from_pb(pb_pod), ctr_from_pb(pb_ctr)
        with self._lock:
            self._view = replace(self._view, pods={**self._view.pods, pod.id: pod})
        self._set(ctr)
        return pod, ctr

    def _set(self, ctr: Ctr) -> None:
        with self._lock:
            self._view = replace(self._view, containers={**self._view.containers, ctr.id: ctr})

    def record_update(self, cid: str, placement: Placement) -> None:
        """After the runtime applied a placement: keep the view what the cgroup now is."""
        self._ours[cid] = Placement(cpus=placement.cpus or self._ours.get(cid, placement).cpus,
                                    mems=placement.mems or self._ours.get(cid, placement).mems,
                                    rdt_class=placement.rdt_class or self._ours.get(cid, placement).rdt_class,
                                    blockio_class=placement.blockio_class or self._ours.get(cid, placement).blockio_class)
        ctr = self._view.containers.get(cid)
        if ctr is not None:
            self._set(replace(ctr, cpus=placement.cpus or ctr.cpus, mems=placement.mems or ctr.mems))

    def container_update(self, cid: str, placement: Placement) -> Any:
        u = self._pb.ContainerUpdate(container_id=cid)
        fill_resources(u.linux.resources, placement)
        return u
