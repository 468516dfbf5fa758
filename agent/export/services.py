"""Long-running services beside the cycle loop: the HTTP endpoint and the MQTT publisher.

Each is started guarded: a service that cannot start (port taken, broker down) is logged and
the agent runs on without it; stop is bounded by the loop's grace period.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from agent.config import Config
from agent.export.http import NodeServer, serve_from_config
from agent.export.mqtt import MqttPublisher
from agent.export.report import AgentState, CycleReport
from perfbalance.errors import ConfigError

log = logging.getLogger("perfbalance.services")


@dataclass
class Services:
    server: NodeServer | None = None
    publisher: MqttPublisher | None = None
    task: asyncio.Task[Any] | None = None

    def publish(self, report: CycleReport) -> None:
        """A cycle's applied actions and realized gains as MQTT events (on the loop's thread)."""
        if self.publisher is not None:
            self.publisher.publish(report)

    def prerender(self) -> None:
        """Render the new report's /metrics body once, off the event loop (worker thread)."""
        if self.server is not None:
            self.server.exposition.prerender()

    async def stop(self) -> None:
        if self.publisher is not None and self.task is not None:
            await self.publisher.stop()
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


async def start_services(state: AgentState, config: Config) -> Services:
    services = Services()
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
