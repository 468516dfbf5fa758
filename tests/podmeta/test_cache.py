"""PodMetadata: schedule, unknown-UID refresh, backoff, last good list, logging once.

Requests go to the real HTTPS server and are counted there; time is a fake monotonic clock so
the schedule is checked without sleeping.
"""

from __future__ import annotations

import json
import logging

import pytest
from podmeta_api import NODE, Answer, FakeApi, FakeClock, pod_list, status_body

from agent.discover.podmeta import KubeClient, PodMetadata
from perfbalance.model import Container

WEB_UID = "3f2b6c1e-8a4d-4b7e-9c15-2d6e0a1b7f93"
PG_UID = "a9e04c27-51b3-4f0d-8e62-7b3c9d18e4f5"
NEW_UID = "11111111-2222-3333-4444-555555555555"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def meta(client: KubeClient, clock: FakeClock) -> PodMetadata:
    return PodMetadata(source=client, node=NODE, refresh_seconds=30, unknown_refresh_seconds=5,
                       backoff_initial_seconds=2, backoff_max_seconds=60, clock=clock)


def test_first_call_lists_then_serves_from_cache_until_refresh_is_due(api: FakeApi, meta, clock):
    for _ in range(10):
        assert WEB_UID in meta.pods([WEB_UID])
        clock.advance(2.9)
    assert len(api.seen) == 1
    clock.advance(1)  # 30 s after the first list
    meta.pods([WEB_UID])
    assert len(api.seen) == 2


def test_unknown_pod_uid_triggers_an_early_refresh_rate_limited(api: FakeApi, meta, clock):
    meta.pods([WEB_UID])
    clock.advance(1)
    meta.pods([WEB_UID, NEW_UID])  # new UID, but only 1 s since the last request
    assert len(api.seen) == 1
    clock.advance(4)
    meta.pods([WEB_UID, NEW_UID])
    assert len(api.seen) == 2


def test_uid_still_unknown_after_a_refresh_does_not_cause_more_requests(api: FakeApi, meta, clock):
    meta.pods([NEW_UID])
    for _ in range(5):  # 25 s of cycles asking for the same missing pod
        clock.advance(5)
        meta.pods([NEW_UID])
    assert len(api.seen) == 1


def test_new_pod_appears_after_unknown_uid_refresh(api: FakeApi, meta, clock):
    api.answer = Answer(body=pod_list("burstable-containerd"))
    assert PG_UID not in meta.pods([WEB_UID])
    api.answer = Answer(body=pod_list())
    clock.advance(5)
    assert meta.pods([WEB_UID, PG_UID])[PG_UID].name == "postgres-0"


def test_last_good_list_kept_on_error(api: FakeApi, meta, clock):
    meta.pods([])
    api.answer = Answer(status=500, body=status_body(500, "InternalError", "boom"))
    clock.advance(31)
    pods = meta.pods([])
    assert len(api.seen) == 2
    assert pods[WEB_UID].namespace == "shop"
    assert "HTTP 500" in meta.last_error and f"127.0.0.1:{api.port}/api/v1/pods" in meta.last_error
    assert meta.status().up is False and meta.status().detail["pods"] == 4


def test_errors_back_off_exponentially_no_request_storm(api: FakeApi, meta, clock):
    api.answer = Answer(status=503, body=b"")
    for _ in range(200):  # 200 s of 1-second cycles, each asking for an unknown pod
        meta.pods([NEW_UID])
        clock.advance(1)
    # attempts at 0, 2, 6, 14, 30, 62 (backoff 2, 4, 8, 16, 32), then every 60 s (the cap): 122, 182
    assert len(api.seen) == 8
    assert meta.status().detail["failures"] == 8


def test_recovery_resets_the_backoff(api: FakeApi, meta, clock):
    api.answer = Answer(status=503, body=b"")
    for _ in range(4):
        meta.refresh()
    api.answer = Answer(body=pod_list())
    assert meta.refresh() is True
    assert meta.last_error == "" and meta.status().up is True
    api.answer = Answer(status=503, body=b"")
    clock.advance(30)
    meta.pods([])
    clock.advance(2)  # first backoff step again, not 2**5
    meta.pods([])
    assert len(api.seen) == 7


def test_each_distinct_error_is_logged_once(api: FakeApi, meta, clock, caplog):
    caplog.set_level(logging.WARNING, logger="agent.discover.podmeta")
    api.answer = Answer(status=500, body=status_body(500, "InternalError", "boom"))
    for _ in range(5):
        meta.refresh()
    api.answer = Answer(status=403, body=status_body(403, "Forbidden", "pods is forbidden"))
    for _ in range(5):
        meta.refresh()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "HTTP 500 boom" in messages[0] and "HTTP 403 pods is forbidden" in messages[1]


def test_enrich_method_uses_the_cache(api: FakeApi, meta):
    c = Container(id="x", pod_uid=WEB_UID.upper(), cgroup="kubepods/burstable/podX/x", qos="burstable")
    (out,) = meta.enrich([c])
    assert (out.namespace, out.pod) == ("shop", "web-7d9f8b6c5-x2k4p")


def test_enrich_never_raises_when_the_api_is_down(api: FakeApi, meta):
    api.answer = Answer(status=500, body=b"")
    c = Container(id="x", pod_uid=WEB_UID, cgroup="x")
    assert meta.enrich([c]) == [c]
    assert meta.status().up is False


def test_unusable_pod_object_is_logged_once_not_every_refresh(api: FakeApi, meta, clock, caplog):
    caplog.set_level(logging.WARNING, logger="agent.discover.podmeta")
    body = json.loads(pod_list())
    del body["items"][0]["metadata"]["uid"]
    api.answer = Answer(body=json.dumps(body).encode())
    for _ in range(3):
        assert meta.refresh() is True
    assert [r.getMessage() for r in caplog.records if "pod skipped" in r.getMessage()] == \
        ["pod skipped: pod uid in https://127.0.0.1:%d/api/v1/pods items[0]: missing: None" % api.port]
