"""The node's busy cores from /proc/stat (agent/snapshot/nodecpu.py): the unseen load of the
run-queue wait model."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.snapshot.nodecpu import NodeCpu, parse_stat

STAT = """cpu  {user} 10 {system} {idle} 40 5 6 7 0 0
cpu0 1 1 1 1 1 1 1 1 0 0
intr 12345
"""


def write(root: Path, **ticks: int) -> None:
    (root / "stat").write_text(STAT.format(**{"user": 100, "system": 50, "idle": 1000, **ticks}))


def test_busy_is_user_nice_system_irq_softirq_steal_and_not_idle_or_iowait() -> None:
    t = parse_stat(STAT.format(user=100, system=50, idle=1000))
    assert (t.busy, t.total) == (100 + 10 + 50 + 5 + 6 + 7, 100 + 10 + 50 + 1000 + 40 + 5 + 6 + 7)


def test_busy_cores_are_the_busy_ticks_of_the_window(tmp_path: Path) -> None:
    clock = iter([0.0, 2.0, 4.0]).__next__
    write(tmp_path)
    cpu = NodeCpu(procfs=str(tmp_path), clock=clock)  # the first reading starts the window
    write(tmp_path, user=100 + 300, idle=1000 + 100)  # 300 busy ticks in 2 s
    tick = os.sysconf("SC_CLK_TCK")
    assert cpu.metrics() == {"cpu_busy_cores": pytest.approx(300 / tick / 2.0)}
    write(tmp_path, user=400, idle=1100 + 200)  # control: only idle ticks
    assert cpu.metrics() == {"cpu_busy_cores": 0.0}


def test_an_unreadable_stat_gives_no_figure_and_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cpu = NodeCpu(procfs=str(tmp_path))  # no stat file
    assert cpu.metrics() == {} and cpu.metrics() == {}
    assert len([r for r in caplog.records if "node CPU" in r.getMessage()]) == 1


def test_the_real_proc_stat_reads(tmp_path: Path) -> None:
    t0 = time.monotonic()
    cpu = NodeCpu(procfs="/proc")
    sum(range(2_000_000))
    busy = cpu.metrics()["cpu_busy_cores"]
    window = time.monotonic() - t0
    # /proc/stat counts in ticks of 10 ms (USER_HZ): each CPU's count may be one tick off at
    # either end of a window this short, so the bound allows two ticks per CPU
    assert 0.0 <= busy <= (os.cpu_count() or 1) * (1.0 + 0.02 / window)
