"""The NRI path as the rest of the agent sees it: started from settings, fed each cycle's
snapshot, asked for metadata and moves, and saying which path (nri or cgroupfs) is in use.

`runtime.nri: auto` starts the session when the socket exists and keeps trying with back-off;
`on` does the same but reports a missing socket or missing protocol modules as errors; `off`
never starts it. Placement at creation needs a topology, so until the first cycle's snapshot
arrives new containers keep the runtime's default.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent.config import RuntimeSection
from agent.persist.checkpoint import write_atomic
from perfbalance.model import KubeletState, Snapshot

from agent.nri.api import NRI_VERSION, NriUnavailable
from agent.nri.client import Backoff, NriClient, Status
from agent.nri.conn import Closed
from agent.nri.model import Ctr, Placement, Pod, View
from agent.nri.placement import AdmitPolicy

log = logging.getLogger(__name__)
ACTUATION_STATUS_FILE = "actuation-status.json"  # in agent.run_dir, read by `perfbalance doctor`


@dataclass(frozen=True, kw_only=True)
class NriSettings:
    mode: str = "auto"  # auto | on | off
    socket: str = "/var/run/nri/nri.sock"
    plugin_name: str = "perfbalance"
    plugin_index: str = "50"
    backoff_max_seconds: float = 30.0

    @classmethod
    def from_config(cls, runtime: RuntimeSection) -> NriSettings:
        """The `runtime:` section of the agent's configuration."""
        return cls(mode=runtime.nri, socket=runtime.nri_socket, plugin_name=runtime.nri_plugin_name,
                   plugin_index=runtime.nri_plugin_index, backoff_max_seconds=runtime.nri_backoff_max_seconds)


class NriRuntime:
    def __init__(self, settings: NriSettings, *, kubelet: Callable[[], KubeletState],
                 classes: Callable[[Pod, Ctr], Mapping[str, str]] = lambda pod, ctr: {},
                 started: Callable[[Pod, Ctr], None] = lambda pod, ctr: None,
                 applied: Callable[[], Mapping[str, Placement]] = dict) -> None:
        self.settings = settings
        self._snapshot: Snapshot | None = None
        self.policy = AdmitPolicy(snapshot=lambda: self._snapshot, kubelet=kubelet, classes=classes,
                                  started=started, applied=applied)
        self._client: NriClient | None = None
        self._started = False
        self.problem = ""
        if settings.mode == "off":
            self.problem = "runtime.nri is off"
            return
        try:
            self._client = NriClient(socket_path=settings.socket, name=settings.plugin_name,
                                     index=settings.plugin_index, policy=self.policy,
                                     backoff=Backoff(cap=settings.backoff_max_seconds))
        except NriUnavailable as e:
            self.problem = str(e)
            log.log(logging.ERROR if settings.mode == "on" else logging.INFO, "NRI: %s", e)

    def start(self) -> None:
        if self._client is not None:
            if not os.path.exists(self.settings.socket):
                log.log(logging.ERROR if self.settings.mode == "on" else logging.INFO,
                        "NRI: %s does not exist (yet); writing cgroupfs, retrying with back-off",
                        self.settings.socket)
            self._client.start()
            self._started = True

    def stop(self) -> None:
        if self._client is not None and self._started:
            self._client.stop()

    def observe(self, snapshot: Snapshot) -> None:
        """The latest cycle's snapshot: topology, reserved and exclusive CPUs for placement."""
        self._snapshot = snapshot

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.status.connected

    @property
    def view(self) -> View | None:
        return None if self._client is None else self._client.view

    def update(self, placements: Mapping[str, Placement]) -> dict[str, str]:
        if self._client is None:
            raise NriUnavailable(self.problem)
        return self._client.update(placements)

    # -- the cpuset actuator's runtime route (agent/act/cpuset.py RuntimeRoute) -----------------
    @property
    def path(self) -> str:
        """"nri" while connected and synchronized: moves go as UpdateContainers; else "cgroupfs"."""
        return "nri" if self.connected else "cgroupfs"

    def knows(self, container_id: str) -> bool:
        view = self.view
        return view is not None and container_id in view.containers

    def move(self, container_id: str, cpus: str, mems: str) -> str:
        """One container through UpdateContainers: "" when applied, else the runtime's reason.
        Raises ConnectionError when the session went away meanwhile (the caller writes cgroupfs)."""
        try:
            failed = self.update({container_id: Placement(cpus=cpus, mems=mems)})
        except (Closed, NriUnavailable) as e:
            raise ConnectionError(f"NRI: {e or 'not connected'}") from None
        except TimeoutError:
            return "the runtime did not answer UpdateContainers in time"
        return failed.get(container_id, "")

    def status(self) -> dict[str, object]:
        """For the report, doctor and the metrics: which path, why, with what."""
        s = self._client.status if self._client is not None else Status(path="cgroupfs", connected=False,
                                                                          reason=self.problem)
        return {"mode": self.settings.mode, "path": s.path, "connected": s.connected, "runtime": s.runtime,
                "reason": s.reason, "sessions": s.sessions, "socket": self.settings.socket,
                "api": f"nri.pkg.api.v1alpha1 (containerd/nri {NRI_VERSION})"}


def write_status(path: str, status: Mapping[str, object]) -> bool:
    """The running agent's actuation path for `perfbalance doctor`; a failed write is logged."""
    try:
        write_atomic(path, json.dumps({"pid": os.getpid(), "time": time.time(), **status}))
    except OSError as e:
        log.warning("cannot write %s: %s", path, e.strerror)
        return False
    return True
