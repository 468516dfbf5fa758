"""Long-running services beside the cycle loop: the HTTP endpoint, the MQTT publisher and the
Kubernetes status writer (agent/export/kubeservice.py).

Each is started guarded: a service that cannot start (port taken, broker down) is logged and
the agent runs on without it; stop is bounded by the loop's grace period.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.config import Config
from agent.export.http import NodeServer, serve_from_config
from agent.export.kubeservice import StatusService, open_status
from agent.export.mqtt import MqttPublisher
from agent.export.report import AgentState, CycleReport
from perfbalance.errors import ConfigError

log = logging.getLogger("perfbalance.services")

STATUS_STOP_SECONDS = 5.0  # of the loop's grace: the last status pass (PerfbalanceReady=False)


@dataclass
class Services:
    server: NodeServer | None = None
    publisher: MqttPublisher | None = None
    task: asyncio.Task[Any] | None = None
    status: StatusService | None = None

    def publish(self, report: CycleReport, config: Config | None = None) -> None:
        """A cycle's applied actions and realized gains as MQTT events, and its report to the
        Kubernetes status writer (on the loop's thread; neither waits for the network)."""
        if self.publisher is not None:
            self.publisher.publish(report)
        if self.status is not None:
            self.status.offer(report, config)

    def prerender(self) -> None:
        """Render the new report's /metrics body once, off the event loop (worker thread)."""
        if self.server is not None:
            self.server.exposition.prerender()

    async def stop(self) -> None:
        if self.status is not None:
            await asyncio.to_thread(self.status.stop, STATUS_STOP_SECONDS)
        if self.publisher is not None and self.task is not None:
            await self.publisher.stop()
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


async def start_services(state: AgentState, config: Config, *, env: Mapping[str, str] = os.environ) -> Services:
    services = Services()
    services.status = open_status(config, state=state, env=env)
    if services.status is not None:
        services.status.start()
    try:
        services.server = serve_from_config(state, config)
    except (ConfigError, OSError) as e:
        log.error("cannot serve on %s: %s; running without the HTTP endpoint", config.metrics.listen, e)
    if services.server is not None:
        log.info("serving metrics and the node view on %s", services.server.url)
    # Always run: with MQTT off it says so once and exports perfbalance_mqtt_configured 0.
    try:
        services.publisher = MqttPublisher(config.mqtt, node=state.node, state=state)
    except ConfigError as e:
        log.error("MQTT disabled: %s", e)
        return services
    services.task = asyncio.create_task(services.publisher.run(), name="mqtt-publisher")
    services.task.add_done_callback(_log_crash)
    return services


def _log_crash(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s crashed: %r", task.get_name(), task.exception())
