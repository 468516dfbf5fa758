"""The agent's NRI session: dial, register, stay connected, reconnect with back-off.

One thread owns the session. While connected, the plugin's view is the source of pod metadata
and moves go through `update()` (the runtime's UpdateContainers); while not, `connected` is
False and the agent falls back to cgroupfs writes. The runtime restarting or this process's
connection dying are the same event here: the next session re-registers and the runtime's
Synchronize hands back every pod and container, so nothing is lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent.nri import api
from agent.nri.conn import CallError, Closed, Connection
from agent.nri.model import Placement, View
from agent.nri.plugin import Plugin, Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Status:
    path: str  # "nri" while connected and synchronized, else "cgroupfs"
    connected: bool
    runtime: str = ""
    reason: str = ""
    sessions: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    first: float = 0.5
    cap: float = 30.0

    def delay(self, failures: int) -> float:
        return min(self.cap, self.first * 2 ** max(0, failures - 1))


class NriClient:
    def __init__(self, *, socket_path: str, name: str, index: str, policy: Policy,
                 backoff: Backoff = Backoff(), request_timeout: float = 5.0,
                 dial: Callable[..., Connection] = Connection.dial) -> None:
        if not (len(index) == 2 and index.isdigit()):
            raise ValueError(f"runtime.nri_index: must be two digits, got {index!r}")
        self._pb = api.load_nri()
        self._path, self._name, self._index = socket_path, name, index
        self._policy, self._backoff, self._timeout, self._dial = policy, backoff, request_timeout, dial
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._plugin: Plugin | None = None
        self._status = Status(path="cgroupfs", connected=False, reason="not started")
        self._thread = threading.Thread(target=self._run, name="nri-session", daemon=True)

    # -- what the agent reads and calls -------------------------------------------------------
    @property
    def status(self) -> Status:
        return self._status

    @property
    def view(self) -> View | None:
        """The runtime's pods and containers while connected and synchronized, else None."""
        plugin = self._plugin
        if plugin is None or not self._status.connected:
            return None
        return plugin.view

    def update(self, placements: Mapping[str, Placement]) -> dict[str, str]:
        """Apply placements through UpdateContainers; returns {container id: why it failed}."""
        conn, plugin = self._conn, self._plugin
        if conn is None or plugin is None or not self._status.connected:
            raise Closed("NRI not connected")
        # containerd drops updates of containers it does not know without saying so: check first
        known = plugin.view.containers
        failed = {cid: "container not known to the runtime" for cid in placements if cid not in known}
        todo = {cid: p for cid, p in placements.items() if cid in known}
        if not todo:
            return failed
        req = self._pb.UpdateContainersRequest(update=[plugin.container_update(c, p) for c, p in todo.items()])
        try:
            raw = conn.call(api.RUNTIME_SERVICE, "UpdateContainers", req.SerializeToString(), timeout=self._timeout)
        except CallError as e:
            return {**failed, **{cid: str(e) for cid in todo}}
        failed |= {u.container_id: "runtime refused the update"
                   for u in self._pb.UpdateContainersResponse.FromString(raw).failed}
        for cid, p in todo.items():
            if cid not in failed:
                plugin.record_update(cid, p)
        return failed

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            conn.close("agent stopping")
        self._thread.join(timeout)

    def wait_connected(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._status.connected and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)
        return self._status.connected

    # -- the session loop ---------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            was_connected, reason = self._session()
            failures = 1 if was_connected else failures + 1
            self._set_status(connected=False, reason=reason)
            self._stop.wait(self._backoff.delay(failures))

    def _session(self) -> tuple[bool, str]:
        closed = threading.Event()
        plugin = Plugin(pb=self._pb, policy=self._policy)
        try:
            conn = self._dial(self._path, serve=plugin.serve, on_close=lambda _r: closed.set())
        except OSError as e:
            return False, f"cannot connect to {self._path}: {e.strerror or e}"
        self._conn, self._plugin = conn, plugin
        conn.start()
        try:
            reg = self._pb.RegisterPluginRequest(plugin_name=self._name, plugin_idx=self._index)
            conn.call(api.RUNTIME_SERVICE, "RegisterPlugin", reg.SerializeToString(), timeout=self._timeout)
            if not plugin.synchronized.wait(self._timeout * 2):
                conn.close("runtime did not synchronize")
                return False, "registered but the runtime did not synchronize"
        except (CallError, Closed, TimeoutError) as e:
            conn.close(str(e))
            return False, f"registration failed: {e}"
        log.info("NRI: connected to %s as %s-%s", plugin.runtime, self._index, self._name)
        self._set_status(connected=True, runtime=plugin.runtime, reason="", sessions=self._status.sessions + 1)
        closed.wait()
        conn.join(1.0)
        log.warning("NRI: connection closed (%s); falling back to cgroupfs", conn.reason or "unknown")
        return True, f"connection closed: {conn.reason or 'unknown'}"

    def _set_status(self, *, connected: bool, reason: str, runtime: str = "", sessions: int | None = None) -> None:
        with self._lock:
            s = self._status
            self._status = Status(path="nri" if connected else "cgroupfs", connected=connected,
                                  runtime=runtime or s.runtime, reason=reason,
                                  sessions=s.sessions if sessions is None else sessions)
