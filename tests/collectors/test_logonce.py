"""LogOnce: each distinct collector message is logged once, and what it remembers is bounded."""

from __future__ import annotations

import logging

import pytest

from collectors.base import LogOnce


def test_a_message_is_logged_once_and_another_one_too(caplog: pytest.LogCaptureFixture) -> None:
    once = LogOnce(logging.getLogger("t"))
    with caplog.at_level(logging.WARNING):
        for msg in ["cgroup_stats: a: EIO", "cgroup_stats: a: EIO", "cgroup_stats: b: EIO"]:
            once.warning(msg)
    assert [r.getMessage() for r in caplog.records] == ["cgroup_stats: a: EIO", "cgroup_stats: b: EIO"]


def test_messages_naming_containers_that_come_and_go_are_remembered_within_a_bound(caplog: pytest.LogCaptureFixture) -> None:
    once = LogOnce(logging.getLogger("t"), remember=3)
    with caplog.at_level(logging.WARNING):
        for i in range(10_000):
            once.warning(f"cgroup_stats: c{i}: EIO")
        assert len(once._seen) == 3
        caplog.clear()
        once.warning("cgroup_stats: c9999: EIO")  # still remembered: not logged again
        once.warning("cgroup_stats: c0: EIO")  # forgotten long ago: logged once more
    assert [r.getMessage() for r in caplog.records] == ["cgroup_stats: c0: EIO"]
