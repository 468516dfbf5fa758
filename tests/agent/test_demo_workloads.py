"""`perfbalance demo` supervises its workloads: one that dies stops the demo, named with its exit
status and last stderr line, instead of leaving a table of 0.00 CPU (real processes in real
cgroups; the agent is a stand-in that runs until told to stop)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from agent.cli.demo import DemoBusy, supervised, workloads
from perfbalance.cgroupfs import Cgroupfs

pytestmark = [pytest.mark.root]

MISSING_MODULE = [sys.executable, "-c", "import numpyy_not_installed"]
SLEEPER = ["sh", "-c", "exec sleep 60"]


class UntilStopped:
    """Runs until request_stop() (what the demo asks of the agent) or, like its last cycle, `limit` seconds."""

    def __init__(self, limit: float = 20.0) -> None:
        self.limit, self.stopped = limit, False
        self._event: asyncio.Event | None = None

    async def run(self) -> int:
        self._event = asyncio.Event()
        if self.stopped:
            return 0
        try:
            await asyncio.wait_for(self._event.wait(), self.limit)
        except TimeoutError:  # ran its cycles to the end
            pass
        return 0

    def request_stop(self) -> None:
        self.stopped = True
        if self._event is not None:
            self._event.set()


@pytest.fixture
def cgfs() -> Cgroupfs:
    return Cgroupfs(root="/sys/fs/cgroup")


def run(cgfs: Cgroupfs, commands: dict[str, list[str]], agent: UntilStopped) -> list[str]:
    with workloads(cgfs, commands, base=f"pbtest-demo-{os.getpid()}") as started:
        return asyncio.run(supervised(agent, started, poll=0.05))


def test_workload_exiting_1_stops_the_demo_named_with_status_and_stderr(cgfs: Cgroupfs) -> None:
    agent = UntilStopped()
    dead = run(cgfs, {"sleeper": SLEEPER, "avx512": MISSING_MODULE}, agent)
    assert agent.stopped
    assert len(dead) == 1, dead
    assert dead[0].startswith("workload avx512 (pid "), dead
    assert "exited with status 1: ModuleNotFoundError: No module named 'numpyy_not_installed'" in dead[0]
    assert "pip install 'perfbalance[demo]'" in dead[0]


def test_workload_killed_by_a_signal_is_named_with_the_signal(cgfs: Cgroupfs) -> None:
    dead = run(cgfs, {"cache": ["sh", "-c", "echo leaving >&2; kill -KILL $$"]}, UntilStopped())
    assert len(dead) == 1 and dead[0].startswith("workload cache "), dead
    assert "was killed by signal SIGKILL: leaving" in dead[0]


def test_running_workloads_let_the_agent_finish_and_report_nothing(cgfs: Cgroupfs) -> None:
    agent = UntilStopped(limit=0.3)
    assert run(cgfs, {"scalar": SLEEPER}, agent) == []
    assert not agent.stopped


def test_a_second_demo_at_the_same_time_is_refused_and_leaves_the_first_alone(cgfs: Cgroupfs) -> None:
    base = f"pbtest-demo-busy-{os.getpid()}"
    with workloads(cgfs, {"sleeper": SLEEPER}, base=base) as first:
        with pytest.raises(DemoBusy, match=rf"another perfbalance demo is running in cgroup {base} .*pids {first[0].proc.pid}"):
            with workloads(cgfs, {"sleeper": SLEEPER}, base=base):
                pass
        assert first[0].proc.poll() is None and cgfs.pids(f"{base}/sleeper") == [first[0].proc.pid]
    with workloads(cgfs, {"sleeper": SLEEPER}, base=base) as again:  # control: free once the first is done
        assert again[0].proc.poll() is None
    assert not cgfs.exists(base)
