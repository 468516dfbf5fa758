"""The NRI path as the rest of the agent sees it: started from settings, fed each cycle's
snapshot, asked for metadata and moves, and saying which path (nri or cgroupfs) is in use.

`runtime.nri: auto` starts the session when the socket exists and keeps trying with back-off;
`on` does the same but reports a missing socket or missing protocol modules as errors; `off`
never starts it. Placement at creation needs a topology, so until the first cycle's snapshot
arrives new containers keep the runtime's default.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from perfbalance.model import KubeletState, Snapshot

from agent.nri.api import NRI_VERSION, NriUnavailable
from agent.nri.client import Backoff, NriClient, Status
from agent.nri.model import Ctr, Placement, Pod, View
from agent.nri.placement import AdmitPolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class NriSettings:
    mode: str = "auto"  # auto | on | off
    socket: str = "/var/run/nri/nri.sock"
    plugin_name: str = "perfbalance"
    plugin_index: str = "50"
    backoff_max_seconds: float = 30.0


class NriRuntime:
    def __init__(self, settings: NriSettings, *, kubelet: Callable[[], KubeletState],
                 rdt_class: Callable[[Pod, Ctr], str] = lambda pod, ctr: "") -> None:
        self.settings = settings
        self._snapshot: Snapshot | None = None
        self.policy = AdmitPolicy(snapshot=lambda: self._snapshot, kubelet=kubelet, rdt_class=rdt_class)
        self._client: NriClient | None = None
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
                log.info("NRI: %s does not exist (yet); writing cgroupfs, retrying with back-off",
                         self.settings.socket)
            self._client.start()

    def stop(self) -> None:
        if self._client is not None:
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

    def status(self) -> dict[str, object]:
        """For the report, doctor and the metrics: which path, why, with what."""
        s = self._client.status if self._client is not None else Status(path="cgroupfs", connected=False,
                                                                          reason=self.problem)
        return {"mode": self.settings.mode, "path": s.path, "connected": s.connected, "runtime": s.runtime,
                "reason": s.reason, "sessions": s.sessions, "socket": self.settings.socket,
                "api": f"nri.pkg.api.v1alpha1 (containerd/nri {NRI_VERSION})"}
