"""The MQTT publisher against a real mosquitto broker on 127.0.0.1 (started by the tests)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiomqtt
import ops_synth as s
import pytest

from agent.config import MqttSection
from agent.export.mqtt import MqttPublisher
from ops_servers import MOSQUITTO, Mosquitto

pytestmark = pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto not installed")
EVENTS, STATUS = "perfbalance/node-a/events/rebalance", "perfbalance/node-a/status"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    b = Mosquitto(tmp_path).start()
    try:
        yield b
    finally:
        b.stop()


class Subscriber:
    """A consumer as an operator would write it: persistent session, QoS 1, reconnects."""

    def __init__(self, port: int, client_id: str) -> None:
        self.port, self.client_id = port, client_id
        self.messages: list[aiomqtt.Message] = []
        self.subscribed = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"sub-{client_id}")

    async def _run(self) -> None:
        while True:
            try:
                async with aiomqtt.Client("127.0.0.1", self.port, identifier=self.client_id,
                                          clean_session=False) as c:
                    await c.subscribe("perfbalance/node-a/#", qos=1)
                    self.subscribed.set()
                    async for m in c.messages:
                        self.messages.append(m)
            except aiomqtt.MqttError:
                self.subscribed.clear()
                await asyncio.sleep(0.1)

    def payloads(self, topic: str) -> list[dict]:
        return [json.loads(m.payload) for m in self.messages if m.topic.matches(topic)]

    def event_ids(self) -> set[str]:
        return {p["event_id"] for p in self.payloads(EVENTS)}

    async def until(self, what: Callable[[], bool], timeout: float = 30.0) -> None:
        async def poll() -> None:
            while not what():
                await asyncio.sleep(0.05)
        await asyncio.wait_for(poll(), timeout)

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def sub(broker: Mosquitto, request: pytest.FixtureRequest) -> AsyncIterator[Subscriber]:
    sb = Subscriber(broker.port, f"pbtest-ops-{os.getpid()}-{request.node.name[:40]}")
    try:
        await asyncio.wait_for(sb.subscribed.wait(), 20)
        yield sb
    finally:
        await sb.close()


@pytest.fixture
async def pub(broker: Mosquitto) -> AsyncIterator[MqttPublisher]:
    conf = MqttSection(enabled=True, host="127.0.0.1", port=broker.port, queue_size=10, reconnect_max_seconds=0.5)
    p = MqttPublisher(conf, "node-a", s.state())
    task = asyncio.create_task(p.run(), name="mqtt")
    try:
        yield p
    finally:
        await p.stop()
        await asyncio.wait_for(task, 15)


def online(sub: Subscriber) -> bool:
    return any(p["state"] == "online" for p in sub.payloads(STATUS))


async def test_rebalance_event_arrives_with_qos1_not_retained(sub: Subscriber, pub: MqttPublisher) -> None:
    pub.publish_applied(s.applied(), s.report())
    await sub.until(lambda: "ev-1" in sub.event_ids())
    (msg,) = [m for m in sub.messages if m.topic.matches(EVENTS)]
    body = json.loads(msg.payload)
    assert msg.qos == 1 and not msg.retain
    assert body["container"]["display"] == "web/frontend-7d9f/nginx"
    assert (body["from"], body["to"], body["reason"]) == ("4-5", "2-3", s.MOVE_REASON)
    assert body["predicted"]["benefit"] == 0.35
    assert pub.stats["published"] == 1


async def test_status_is_retained_online_for_late_subscribers(broker: Mosquitto, pub: MqttPublisher) -> None:
    await asyncio.wait_for(_until(lambda: pub.stats["connected"] == 1), 20)
    async with aiomqtt.Client("127.0.0.1", broker.port) as c:
        await c.subscribe(STATUS, qos=1)
        msg = await asyncio.wait_for(anext(aiter(c.messages)), 20)
    assert msg.retain and json.loads(msg.payload)["state"] == "online"


async def test_clean_stop_marks_the_node_offline(sub: Subscriber, pub: MqttPublisher) -> None:
    await sub.until(lambda: online(sub))
    await pub.stop()
    await sub.until(lambda: sub.payloads(STATUS)[-1]["state"] == "offline")
    assert sub.payloads(STATUS)[-1]["reason"] == "agent stopped"


AGENT = """
import asyncio, sys
from agent.config import MqttSection
from agent.export.mqtt import MqttPublisher
from agent.export.report import AgentState
async def main():
    pub = MqttPublisher(MqttSection(enabled=True, host="127.0.0.1", port=int(sys.argv[1]), keepalive_seconds=5), "node-a", AgentState(node="node-a"))
    await pub.run()
asyncio.run(main())
"""


async def test_last_will_marks_a_killed_agent_offline(broker: Mosquitto, sub: Subscriber) -> None:
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(broker.port)])
    try:
        await sub.until(lambda: online(sub))
        agent.send_signal(signal.SIGKILL)
        await sub.until(lambda: sub.payloads(STATUS)[-1]["state"] == "offline")
    finally:
        agent.kill()
        agent.wait(10)
    last = [m for m in sub.messages if m.topic.matches(STATUS)][-1]
    assert json.loads(last.payload)["reason"] == "connection lost"


async def test_broker_restart_loses_no_event_that_fits_the_queue(broker: Mosquitto, sub: Subscriber,
                                                                   pub: MqttPublisher) -> None:
    pub.publish_applied(s.applied(event_id="ev-0"), s.report())
    await sub.until(lambda: "ev-0" in sub.event_ids())
    broker.stop()
    await _until(lambda: pub.stats["connected"] == 0)
    for i in range(1, 6):
        pub.publish_applied(s.applied(event_id=f"ev-{i}"), s.report())
    assert pub.stats["queue"] == 5
    broker.start()
    await sub.until(lambda: sub.event_ids() >= {f"ev-{i}" for i in range(6)})
    assert pub.stats["dropped"] == 0 and pub.stats["queue"] == 0


async def test_events_beyond_the_queue_are_dropped_oldest_first_during_an_outage(
        broker: Mosquitto, sub: Subscriber, pub: MqttPublisher) -> None:
    await sub.until(lambda: online(sub))
    broker.stop()
    await _until(lambda: pub.stats["connected"] == 0)
    for i in range(13):  # queue_size is 10
        pub.publish_applied(s.applied(event_id=f"ev-{i}"), s.report())
    broker.start()
    await sub.until(lambda: len(sub.event_ids()) >= 10)
    await asyncio.sleep(0.5)  # nothing else may arrive
    assert sub.event_ids() == {f"ev-{i}" for i in range(3, 13)}
    assert pub.stats["dropped"] == 3


async def _until(what: Callable[[], bool], timeout: float = 30.0) -> None:
    async def poll() -> None:
        while not what():
            await asyncio.sleep(0.05)
    await asyncio.wait_for(poll(), timeout)


async def test_events_reach_a_tls_broker_with_credentials_from_files(tmp_path: Path) -> None:
    from ops_servers import self_signed
    ca, cert, key = self_signed(tmp_path)
    users = tmp_path / "users"
    users.write_text("")
    subprocess.run(["mosquitto_passwd", "-b", str(users), "agent", "s3cret"], check=True, timeout=30)
    (tmp_path / "username").write_text("agent\n")
    (tmp_path / "password").write_text("s3cret\n")
    broker = Mosquitto(tmp_path, tls=(ca, cert, key), password_file=users).start()
    conf = MqttSection(enabled=True, host="127.0.0.1", port=broker.port, tls=True, ca_file=str(ca),
                       username_file=str(tmp_path / "username"), password_file=str(tmp_path / "password"),
                       reconnect_max_seconds=0.5)
    pub = MqttPublisher(conf, "node-a", s.state())
    task = asyncio.create_task(pub.run(), name="mqtt")
    try:
        tls = aiomqtt.TLSParameters(ca_certs=str(ca))
        async with aiomqtt.Client("127.0.0.1", broker.port, username="agent", password="s3cret", tls_params=tls) as c:
            await c.subscribe(EVENTS, qos=1)
            pub.publish_applied(s.applied(), s.report())
            msg = await asyncio.wait_for(anext(aiter(c.messages)), 30)
        assert json.loads(msg.payload)["event_id"] == "ev-1"
    finally:
        await pub.stop()
        await asyncio.wait_for(task, 15)
        broker.stop()


async def test_wrong_password_is_reported_not_fatal(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("")
    subprocess.run(["mosquitto_passwd", "-b", str(users), "agent", "right"], check=True, timeout=30)
    broker = Mosquitto(tmp_path, password_file=users).start()
    conf = MqttSection(enabled=True, host="127.0.0.1", port=broker.port, username="agent", password="wrong",
                       reconnect_max_seconds=0.2)
    pub = MqttPublisher(conf, "node-a", s.state())
    task = asyncio.create_task(pub.run(), name="mqtt")
    try:
        pub.publish_applied(s.applied(), s.report())
        await _until(lambda: pub.stats["errors"] >= 2)
        assert pub.stats["connected"] == 0 and pub.stats["queue"] == 1 and not task.done()
    finally:
        await pub.stop()
        await asyncio.wait_for(task, 15)
        broker.stop()
