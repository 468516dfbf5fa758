"""Kubernetes status as a running service: the StatusWriter and the NodeWatch in their own threads.

The API client is blocking (http.client) and an API server may be slow, throttling or gone, so
a cycle must never wait for it: the loop only hands each cycle's report over (a lock, a list
append for the Events of its moves, latest-wins for the rest) and two named daemon threads do
the requests. `kube-status` turns the latest report into a StatusInput and runs one writer
pass per report, and once a second for heartbeats, series flushes and the end of a back-off;
`kube-node-watch` (only with a Node item on) runs the NodeWatch in a loop with back-off, so
status the kubelet or a person removed is written again at once. Each pass is guarded: an
exception is logged once and the thread runs on. On stop the writer makes one last pass that
sets PerfbalanceReady=False (`StatusWriter.stopping`), bounded by the caller's grace, and the
watch's connection is shut so its read returns.

The client is the pod-metadata client (agent/discover/podmeta.py: the service-account token,
re-read on rotation, the CA bundle, `kubernetes.timeout_seconds`), a second instance of it so
the two threads share no connection state.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.config import Config
from agent.discover import podmeta
from agent.export.kubestatus import (
    ApiProblem, ClientTransport, EventSpec, NodeWatch, StatusOptions, StatusWriter, move_events, status_input,
)
from agent.export.report import AgentState, CycleReport
from perfbalance.errors import PerfbalanceError

log = logging.getLogger("perfbalance.kubestatus")

DEFAULT_NAMESPACE = "perfbalance"
MAX_PENDING_EVENTS = 1000  # a storm keeps its newest; the writer bounds its own queue the same
TICK_SECONDS = 1.0
WATCH_BACKOFF_START = 1.0


def options_of(config: Config, env: Mapping[str, str]) -> StatusOptions:
    """`kubernetes.status` (and `kubernetes.backoff_max_seconds`) as the writer's options; the
    ConfigMap's namespace from POD_NAMESPACE (the downward API) when the setting is empty."""
    s = config.kubernetes.status
    namespace = s.configmap_namespace or env.get("POD_NAMESPACE", "").strip() or DEFAULT_NAMESPACE
    return StatusOptions(events=s.events, node_conditions=s.node_conditions, node_labels=s.node_labels,
                         extended_resources=s.extended_resources, config_events=s.config_events,
                         configmap_namespace=namespace, configmap_name=s.configmap_name,
                         series_window_seconds=s.series_window_seconds, series_flush_seconds=s.series_flush_seconds,
                         spam_burst=s.spam_burst, spam_refill_seconds=s.spam_refill_seconds,
                         resync_seconds=s.resync_seconds, backoff_max_seconds=config.kubernetes.backoff_max_seconds)


def open_status(config: Config, *, state: AgentState, env: Mapping[str, str] = os.environ) -> StatusService | None:
    """The status service per `kubernetes.status`, not started; None (said once) when nothing is
    on or the API cannot be used. Never fails the agent: status is a report, not a duty."""
    options = options_of(config, env)
    if not options.any:
        return None
    if config.kubernetes.api == "off":
        log.error("kubernetes.status is on but kubernetes.api is off: no status is sent to the API server")
        return None
    try:
        client = podmeta.client_from_config(config, env)
    except PerfbalanceError as e:
        log.error("kubernetes.status is on but the API cannot be used, no status is sent: %s", e)
        return None
    writer = StatusWriter(transport=ClientTransport(client), node=state.node, options=options)
    return StatusService(writer=writer, state=state, config=config)


class _Waking:
    """What NodeWatch calls `writer`: the real writer, waking its thread when a rewrite is due."""

    def __init__(self, writer: StatusWriter, wake: threading.Event) -> None:
        self.writer, self.wake = writer, wake

    def node_seen(self, node: Mapping[str, Any]) -> bool:
        due = self.writer.node_seen(node)
        if due:
            self.wake.set()
        return due


class StatusService:
    """The writer's thread and the node watch's thread, fed by `offer()` from the loop."""

    def __init__(self, *, writer: StatusWriter, state: AgentState, config: Config,
                 tick_seconds: float = TICK_SECONDS) -> None:
        self.writer, self.state, self.tick = writer, state, tick_seconds
        self.section = config.kubernetes.status  # bound at start: the RBAC granted matches it
        self._config = config
        self._wake = threading.Event()
        o = writer.options
        self.watch = (NodeWatch(transport=writer.api, node=writer.node, writer=_Waking(writer, self._wake))
                      if o.node_conditions or o.node_labels or o.extended_resources else None)
        self._latest: tuple[CycleReport, Config] | None = None
        self._events: list[EventSpec] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._logged: set[str] = set()
        self._reload_said = False

    # -- the loop's side (never blocks on the API) ----------------------------------------
    def start(self) -> None:
        self._spawn("kube-status", self._write_loop)
        if self.watch is not None:
            self._spawn("kube-node-watch", self._watch_loop)
        o = self.writer.options
        on = [k for k in ("events", "node_conditions", "node_labels", "extended_resources", "config_events")
              if getattr(o, k)]
        log.info("kubernetes status to the API server: %s%s", ", ".join(on),
                 f" (ConfigMap {o.configmap_namespace}/{o.configmap_name})" if o.config_events else "")

    def offer(self, report: CycleReport, config: Config | None = None) -> None:
        """A cycle's report: its moves' Events are queued (bounded), the rest is latest-wins."""
        config = config or self._config
        if config.kubernetes.status != self.section and not self._reload_said:
            self._reload_said = True
            log.warning("config changes in kubernetes.status take effect at the next start of the agent")
        events: list[EventSpec] = []
        if self.writer.options.events and (report.applied or report.realized):
            containers = {s.id: s.container for s in report.snapshot.containers}
            events = move_events(report.applied, report.realized, containers)
        with self._lock:
            self._latest = (report, config)
            self._events.extend(events)
            del self._events[:-MAX_PENDING_EVENTS]
        self._wake.set()

    def stop(self, timeout: float) -> bool:
        """Stop both threads within `timeout` s, after one last pass (PerfbalanceReady=False)."""
        self._stop.set()
        self._wake.set()
        self.writer.api.close()  # type: ignore[attr-defined]  # ClientTransport: the watch's read returns
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("kubernetes status: %s did not stop within %.0f s (the API server does not answer)",
                        ", ".join(alive), timeout)
        return not alive

    # -- the threads --------------------------------------------------------------------------
    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _write_loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            self._guarded("preparing the status", self._feed)
            if stopping:
                self.writer.stopping()
            self._guarded("writing the status", self.writer.sync)
            if stopping:
                return
            self._wake.wait(self.tick)
            self._wake.clear()

    def _feed(self) -> None:
        """The latest report as a StatusInput, with every queued Event, into the writer."""
        with self._lock:
            latest, events, self._latest, self._events = self._latest, self._events, None, []
        if latest is None:
            return
        report, config = latest
        with self.state.lock:
            valid, error, extra = self.state.config_valid, self.state.config_error, dict(self.state.extra)
        status = status_input(report, config=config, config_valid=valid, config_error=error, extra=extra)
        self.writer.offer(dataclasses.replace(status, events=tuple(events)))

    def _watch_loop(self) -> None:
        assert self.watch is not None
        delay = 0.0
        while not self._stop.is_set():
            try:
                ended = self.watch.run_once()
                delay = 0.0 if ended in ("closed", "gone") else min(self._max_delay(), max(WATCH_BACKOFF_START, 2 * delay))
            except ApiProblem as e:
                delay = min(self._max_delay(), max(WATCH_BACKOFF_START, 2 * delay))
                if not self._stop.is_set():
                    self._log_once(f"kubernetes status: watch of node {self.writer.node}: {e.message} "
                                   f"(watching again in {delay:g} s)", key=e.message)
            except Exception as e:  # a bug must not end the watch for good
                delay = min(self._max_delay(), max(WATCH_BACKOFF_START, 2 * delay))
                self._log_once(f"kubernetes status: watch of node {self.writer.node} failed: {type(e).__name__}: {e}",
                               key=f"watch {type(e).__name__}")
            if self._stop.wait(delay):
                return

    def _max_delay(self) -> float:
        return self.writer.options.backoff_max_seconds

    def _guarded(self, what: str, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as e:  # a bug in one pass must not end the status for good
            self._log_once(f"kubernetes status: {what} failed: {type(e).__name__}: {e}", key=f"{what} {type(e).__name__}",
                           exc=True)

    def _log_once(self, message: str, *, key: str, exc: bool = False) -> None:
        if key in self._logged or len(self._logged) >= 64:
            return
        self._logged.add(key)
        log.error("%s", message, exc_info=exc)
