"""The MQTT publisher without a broker: queueing, dropping, degrading, payloads."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import ops_synth as s
import pytest

from agent.config import MqttSection
from agent.export.mqtt import MqttPublisher, read_secret, topics
from agent.export.report import AgentState, Realized
from perfbalance.errors import ConfigError
from ops_servers import free_port


def publisher(**cfg: object) -> MqttPublisher:
    conf = MqttSection(**{"enabled": True, "host": "127.0.0.1", "port": free_port(), "reconnect_max_seconds": 0.2, **cfg})  # type: ignore[arg-type]
    return MqttPublisher(conf, "node-a", s.state(), clock=lambda: s.T0 + 80)


def test_topics_follow_prefix_and_node() -> None:
    assert topics("pb", "node-a") == ("pb/node-a/events/rebalance", "pb/node-a/status")


@pytest.mark.parametrize("node", ["", "a/b", "a+", "#"])
def test_node_names_that_break_the_topic_tree_are_rejected(node: str) -> None:
    with pytest.raises(ConfigError):
        topics("pb", node)


def test_event_carries_id_container_move_reason_and_prediction() -> None:
    pub = publisher()
    pub.publish_applied(s.applied(), s.report())
    (ev,) = pub._queue
    assert ev["event_id"] == "ev-1" and ev["phase"] == "applied"
    assert ev["container"] == {"id": "c-web", "namespace": "web", "pod": "frontend-7d9f", "name": "nginx",
                               "display": "web/frontend-7d9f/nginx"}
    assert (ev["from"], ev["to"], ev["reason"]) == ("4-5", "2-3", s.MOVE_REASON)
    assert ev["predicted"] == {"benefit": 0.35, "cost": 0.05, "net": pytest.approx(0.3)}
    assert ev["realized"] is None


def test_events_name_containers_from_the_report_not_the_agent_state() -> None:
    conf = MqttSection(enabled=True, host="127.0.0.1", port=free_port())
    pub = MqttPublisher(conf, "node-a", AgentState(node="node-a"))  # no report published to the state
    pub.publish(s.report())
    (ev,) = pub._queue
    assert ev["event_id"] == "ev-1" and ev["container"]["display"] == "web/frontend-7d9f/nginx"


def test_realized_event_repeats_the_move_with_the_measured_gain() -> None:
    pub = publisher()
    pub.publish_applied(s.applied(), s.report())
    later = s.report(cycle=9, with_move=False)
    pub.publish_realized(Realized(event_id="ev-1", container="c-web", predicted=0.3, realized=0.1, rolled_back=True), later)
    ev = pub._queue[-1]
    assert ev["event_id"] == "ev-1" and ev["phase"] == "realized" and ev["to"] == "2-3"
    assert ev["realized"] == {"gain": 0.1, "predicted": 0.3, "rolled_back": True}


def test_realized_event_of_a_move_made_before_a_restart_names_the_container_only() -> None:
    pub = publisher()
    pub.publish_realized(Realized(event_id="ev-0", container="c-web", predicted=0.3, realized=0.2, rolled_back=False),
                         s.report(with_move=False))
    (ev,) = pub._queue
    assert ev["container"]["display"] == "web/frontend-7d9f/nginx" and "to" not in ev


def test_full_queue_drops_the_oldest_and_counts_it() -> None:
    pub = publisher(queue_size=3)
    for i in range(5):
        pub.publish_applied(s.applied(event_id=f"ev-{i}"), s.report())
    assert [e["event_id"] for e in pub._queue] == ["ev-2", "ev-3", "ev-4"]
    assert pub.state.extra["mqtt"]["dropped"] == 2 and pub.state.extra["mqtt"]["queue"] == 3


def test_unconfigured_publisher_queues_nothing_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        pub = publisher(enabled=False)
        task = asyncio.create_task(pub.run(), name="mqtt")
        pub.publish_applied(s.applied(), s.report())
        await asyncio.sleep(0.05)
        await pub.stop()
        await asyncio.wait_for(task, 5)
        assert len(pub._queue) == 0 and pub.state.extra["mqtt"]["configured"] == 0

    with caplog.at_level(logging.INFO, logger="agent.export.mqtt"):
        asyncio.run(go())
    assert sum("not configured" in r.message for r in caplog.records) == 1


async def test_unreachable_broker_is_retried_logged_once_and_events_wait(caplog: pytest.LogCaptureFixture) -> None:
    pub = publisher()
    caplog.set_level(logging.WARNING, logger="agent.export.mqtt")
    task = asyncio.create_task(pub.run(), name="mqtt")
    pub.publish_applied(s.applied(), s.report())
    for _ in range(200):
        if pub.state.extra["mqtt"]["errors"] >= 3:
            break
        await asyncio.sleep(0.05)
    await pub.stop()
    await asyncio.wait_for(task, 5)
    stats = pub.state.extra["mqtt"]
    assert stats["errors"] >= 3 and stats["connected"] == 0 and stats["queue"] == 1
    assert sum("unreachable" in r.message for r in caplog.records) == 1


def test_credentials_are_read_from_files(tmp_path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    assert read_secret(str(tmp_path / "pw"), "password_file") == "s3cret"
    with pytest.raises(ConfigError, match="password_file"):
        read_secret(str(tmp_path / "missing"), "password_file")


def test_publish_queues_the_applied_then_the_realized_events_of_a_report() -> None:
    pub = publisher()
    pub.publish(s.report())
    gain = Realized(event_id="ev-1", container="c-web", predicted=0.3, realized=0.27, rolled_back=False)
    pub.publish(dataclasses.replace(s.report(cycle=9, with_move=False), realized=(gain,)))
    assert [(e["event_id"], e["phase"]) for e in pub._queue] == [("ev-1", "applied"), ("ev-1", "realized")]
