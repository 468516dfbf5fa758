"""Long-running services beside the cycle loop: the HTTP endpoint and the MQTT publisher.

Each is started guarded: a service that cannot start (port taken, broker down) is logged and
the agent runs on without it; stop is bounded by the loop's grace period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent.config import Config
from agent.report import AgentState
from perfbalance.errors import ConfigError

if TYPE_CHECKING:
    from agent.parts import Parts

log = logging.getLogger("perfbalance.services")


async def start_services(parts: Parts, state: AgentState, config: Config) -> list[Any]:
    services: list[Any] = []
    from agent.http import serve_from_config
    from agent.mqtt import MqttPublisher

    try:
        server = serve_from_config(state, config)
    except (ConfigError, OSError) as e:
        log.error("cannot serve on %s: %s; running without the HTTP endpoint", config.metrics.listen, e)
        server = None
    if server is not None:
        log.info("serving metrics and the node view on %s", server.url)
        services.append(server)
    # Always run: with MQTT off it says so once and exports perfbalance_mqtt_configured 0.
    try:
        publisher = MqttPublisher(config.mqtt, node=state.node, state=state)
    except ConfigError as e:
        log.error("MQTT disabled: %s", e)
        return services
    task = asyncio.create_task(publisher.run(), name="mqtt-publisher")
    task.add_done_callback(_log_crash)
    parts._mqtt = publisher
    services.append((publisher, task))
    return services


def _log_crash(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s crashed: %r", task.get_name(), task.exception())


async def stop_services(services: Sequence[Any]) -> None:
    for s in services:
        if isinstance(s, tuple):
            publisher, task = s
            await publisher.stop()
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        else:
            await asyncio.to_thread(s.stop)
