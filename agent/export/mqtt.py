"""Rebalance events and node status over MQTT, from one supervised task.

Why this shape (aiomqtt docs/reconnection.md; house style section 7): the agent must never wait
for a broker. The loop calls `publish(report)` with each cycle's report, which only appends that
cycle's events to a bounded queue (the oldest event is dropped and counted when it is full).
Everything an event says comes from the report it is handed (container names from its snapshot)
and from the applied events this publisher queued earlier (a realized gain repeats its move); it
never reads the agent's live state. One task, `run()`,
owns one client in a reconnect loop with exponential backoff and jitter; it takes an event off the
queue only after the broker acknowledged it (QoS 1), so a broker restart loses nothing that fits
the queue (delivery is at least once; consumers dedupe on `event_id`). A retained status message
says `online`, and a retained Last Will says `offline` when the agent dies without saying goodbye.
With no broker configured or reachable the agent runs on; it logs that once and exports it
(perfbalance_mqtt_* from AgentState.extra["mqtt"]).

Topics: <prefix>/<node>/events/rebalance (QoS 1, not retained), <prefix>/<node>/status (retained).
Payloads are documented in docs/metrics.md ("MQTT").
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiomqtt

from agent.config import MqttSection
from agent.export.prometheus import display_name, json_safe
from agent.export.report import AgentState, Applied, CycleReport, Realized, reason_code
from perfbalance import __version__
from perfbalance.errors import ConfigError
from perfbalance.safefs import read_file

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 10.0  # seconds to wait for a PUBACK before treating the session as lost
BACKOFF_START = 0.5
MAX_SECRET_BYTES = 4096
REMEMBERED_MOVES = 1000  # applied events kept so that their realized follow-up can repeat the move


def topics(prefix: str, node: str) -> tuple[str, str]:
    """(events topic, status topic) for a node; the node name may not break the topic tree."""
    if not node or any(ch in node for ch in "/+#\0"):
        raise ConfigError("NODE_NAME", "", node, "not usable as an MQTT topic level")
    return (f"{prefix}/{node}/events/rebalance", f"{prefix}/{node}/status")


def container_of(report: CycleReport, cid: str) -> dict[str, str]:
    """How an event names a container: its id, plus the names the report's snapshot knows."""
    sample = report.snapshot.by_id().get(cid)
    if sample is None:
        return {"id": cid}
    c = sample.container
    return {"id": cid, "namespace": c.namespace, "pod": c.pod, "name": c.name, "display": display_name(sample)}


def read_secret(path: str, what: str) -> str:
    """A credential from a mounted Secret file (trailing newline stripped)."""
    try:
        raw = read_file(path, MAX_SECRET_BYTES)
    except OverflowError:
        raise ConfigError(f"mqtt.{what}", "", path, f"larger than {MAX_SECRET_BYTES} bytes") from None
    except OSError as e:
        raise ConfigError(f"mqtt.{what}", "", path, f"cannot read ({e.strerror})") from None
    return raw.decode("utf-8", "replace").rstrip("\r\n")


class MqttPublisher:
    """Create once, start `run()` as one named task, feed it with `publish()`, end with `stop()`.

    The `publish*` methods must be called from the event loop's thread; they never block.
    """

    def __init__(self, config: MqttSection, node: str, state: AgentState, *,
                 clock: Callable[[], float] = time.time, rng: Callable[[], float] = random.random) -> None:
        self.config, self.node, self.state = config, node, state
        self.topic_events, self.topic_status = topics(config.topic_prefix, node)
        self.clock, self.rng = clock, rng
        self.started = clock()
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._moves: collections.OrderedDict[str, tuple[Applied, dict[str, str]]] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._outage_logged = False
        self._was_connected = False
        self._stats = {"configured": int(config.enabled), "connected": 0, "published": 0,
                       "dropped": 0, "queue": 0, "errors": 0, "broker": f"{config.host}:{config.port}"}
        self._export()

    # -- feeding the queue (called by the loop) -----------------------------------------------
    def publish(self, report: CycleReport) -> None:
        """Queue one cycle's events: its applied (or failed) actions, then its realized gains."""
        for applied in report.applied:
            self.publish_applied(applied, report)
        for realized in report.realized:
            self.publish_realized(realized, report)

    def publish_applied(self, applied: Applied, report: CycleReport) -> None:
        """Queue the event of an applied (or failed) action of `report`."""
        container = container_of(report, applied.container)
        self._moves[applied.event_id] = (applied, container)
        while len(self._moves) > REMEMBERED_MOVES:
            self._moves.popitem(last=False)
        self._enqueue(self.event(applied, None, container))

    def publish_realized(self, realized: Realized, report: CycleReport) -> None:
        """Queue the follow-up of a settled move: same event_id, phase "realized", the move repeated
        when this publisher queued it (not after a restart)."""
        applied, container = self._moves.pop(realized.event_id, (None, container_of(report, realized.container)))
        self._enqueue(self.event(applied, realized, container))

    def event(self, applied: Applied | None, realized: Realized | None, container: Mapping[str, str]) -> dict[str, Any]:
        """The JSON body of one event (pure apart from the clock)."""
        body: dict[str, Any] = {
            "event_id": applied.event_id if applied is not None else (realized.event_id if realized else ""),
            "type": "rebalance", "phase": "realized" if realized is not None else "applied",
            "node": self.node, "time": self.clock(), "container": dict(container),
        }
        if applied is not None:
            body.update({
                "kind": applied.kind, "from": applied.frm, "to": applied.to, "reason": applied.reason,
                "reason_code": reason_code(applied.reason), "ok": applied.ok, "error": applied.error,
                "applied_time": applied.time,
                "predicted": {"benefit": applied.predicted_benefit, "cost": applied.predicted_cost,
                              "net": applied.predicted_benefit - applied.predicted_cost},
            })
        body["realized"] = None if realized is None else {
            "gain": realized.realized, "predicted": realized.predicted, "rolled_back": realized.rolled_back}
        return json_safe(body)

    def _enqueue(self, event: dict[str, Any]) -> None:
        if not self.config.enabled:
            return
        self._queue.append(event)
        while len(self._queue) > self.config.queue_size:
            self._queue.popleft()
            self._stats["dropped"] += 1
        self._export()
        self._wake.set()

    # -- the task -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Publish until `stop()`; never raises for broker trouble (it is logged and counted)."""
        self._task = asyncio.current_task()
        if not self.config.enabled:
            log.info("MQTT not configured: rebalance events are not published (mqtt.enabled is false)")
            await self._stopping.wait()
            return
        backoff = BACKOFF_START
        while not self._stopping.is_set():
            self._was_connected = False
            try:
                await self._session()
                return
            except (aiomqtt.MqttError, ConfigError, OSError) as e:
                self._lost(e)
            if self._was_connected:  # a session that worked restarts the backoff
                backoff = BACKOFF_START
            await self._sleep(min(backoff, self.config.reconnect_max_seconds) * (0.5 + self.rng()))
            backoff = min(backoff * 2, self.config.reconnect_max_seconds)

    async def stop(self, timeout: float = 5.0) -> None:
        """Flush what the broker takes within `timeout`, mark the node offline, disconnect."""
        self._stopping.set()
        self._wake.set()
        task = self._task
        if task is None or task.done() or task is asyncio.current_task():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            task.cancel()

    async def _session(self) -> None:
        async with self._client() as client:
            self._was_connected = True
            self._connected(True)
            await client.publish(self.topic_status, self._status("online"), qos=1, retain=True,
                                 timeout=PUBLISH_TIMEOUT)
            watcher = asyncio.create_task(self._watch(client), name="mqtt-disconnect-watch")
            try:
                await self._drain(client, watcher)
            finally:
                watcher.cancel()
            await client.publish(self.topic_status, self._status("offline", reason="agent stopped"),
                                 qos=1, retain=True, timeout=PUBLISH_TIMEOUT)
        self._connected(False)

    async def _drain(self, client: aiomqtt.Client, watcher: asyncio.Task[None]) -> None:
        """Publish the queue head until stopping (flushing first); a lost session raises."""
        while True:
            while self._queue:
                event = self._queue[0]
                await client.publish(self.topic_events, json.dumps(event, allow_nan=False), qos=1,
                                     retain=False, timeout=PUBLISH_TIMEOUT)
                if self._queue and self._queue[0] is event:  # it may have been dropped meanwhile
                    self._queue.popleft()
                self._stats["published"] += 1
                self._export()
            if self._stopping.is_set():
                return
            self._wake.clear()
            waker = asyncio.create_task(self._wake.wait())
            done, _ = await asyncio.wait({waker, watcher}, return_when=asyncio.FIRST_COMPLETED)
            waker.cancel()
            if watcher in done:
                watcher.result()  # re-raises the disconnect
                raise aiomqtt.MqttError("disconnected")

    @staticmethod
    async def _watch(client: aiomqtt.Client) -> None:
        """Returns (by raising MqttError) when the broker connection is lost."""
        async for _ in client.messages:  # we subscribe to nothing; this only ends on disconnect
            pass

    def _client(self) -> aiomqtt.Client:
        cfg = self.config
        username = read_secret(cfg.username_file, "username_file") if cfg.username_file else cfg.username
        password = read_secret(cfg.password_file, "password_file") if cfg.password_file else cfg.password
        tls = aiomqtt.TLSParameters(ca_certs=cfg.ca_file or None, certfile=cfg.cert_file or None,
                                    keyfile=cfg.key_file or None) if cfg.tls else None
        will = aiomqtt.Will(self.topic_status, self._status("offline", reason="connection lost"), qos=1, retain=True)
        return aiomqtt.Client(cfg.host, cfg.port, username=username or None, password=password or None,
                              identifier=cfg.client_id or f"perfbalance-{self.node}", will=will,
                              keepalive=cfg.keepalive_seconds, timeout=PUBLISH_TIMEOUT, tls_params=tls,
                              tls_insecure=cfg.tls_insecure if cfg.tls else None, clean_session=True)

    def _status(self, state: str, *, reason: str = "") -> str:
        body = {"node": self.node, "state": state, "time": self.clock(), "started": self.started,
                "version": __version__}
        if reason:
            body["reason"] = reason
        return json.dumps(body)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    # -- bookkeeping --------------------------------------------------------------------------
    def _connected(self, up: bool) -> None:
        if up and self._outage_logged:
            log.info("MQTT connected again", extra={"broker": self._stats["broker"], "queued": len(self._queue)})
        elif up:
            log.info("MQTT connected", extra={"broker": self._stats["broker"]})
        if up:
            self._outage_logged = False
        self._stats["connected"] = int(up)
        self._export()

    def _lost(self, error: BaseException) -> None:
        self._stats["errors"] += 1
        self._connected(False)
        if not self._outage_logged:  # once per outage, not once per retry
            self._outage_logged = True
            log.warning("MQTT broker unreachable; the agent runs on and queues events "
                        "(the oldest are dropped beyond mqtt.queue_size)",
                        extra={"broker": self._stats["broker"], "error": str(error)})

    def _export(self) -> None:
        self._stats["queue"] = len(self._queue)
        with self.state.lock:
            self.state.extra["mqtt"] = dict(self._stats)

    @property
    def stats(self) -> Mapping[str, Any]:
        return dict(self._stats)
