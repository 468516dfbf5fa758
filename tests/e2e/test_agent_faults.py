"""The agent under faults: it keeps its last good state and keeps running."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent.config import load_config
from agent.loop import Agent
from agent.wiring import Parts
from perfbalance.model import Action, Container
from tests.e2e.conftest import PERFBALANCE, run_agent

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.slow]


def _swap(path: Path, text: str) -> None:
    """Replace the config file whole, as a ConfigMap update does (write aside, rename): an
    in-place write can be read half-written, a shorter but valid YAML that the agent then loads."""
    aside = path.with_name(path.name + ".new")
    aside.write_text(text)
    os.replace(aside, path)


def _agent(cfg_path: Path, cycles: int, interval: float = 0.5, **kw) -> tuple[Agent, io.StringIO]:
    import dataclasses

    def overrides(c):  # like `--interval`: survives reloads
        return dataclasses.replace(c, agent=dataclasses.replace(c.agent, interval_seconds=interval))

    config = load_config(str(cfg_path), node="e2e-node")
    out = io.StringIO()
    return Agent(config, node="e2e-node", config_path=str(cfg_path), cycles=cycles, json_out=out,
                 overrides=overrides, **kw), out


async def test_config_turning_invalid_at_run_time_keeps_the_last_good_one(demo_workloads, write_config):
    cfg = write_config({"rebalancer": {"margin": 0.5}})
    agent, out = _agent(cfg, cycles=6)

    async def break_then_fix() -> None:
        while agent.state.latest is None:
            await asyncio.sleep(0.05)
        _swap(cfg, cfg.read_text().replace("margin: 0.5", "margin: lots"))
        while agent.state.config_valid:
            await asyncio.sleep(0.05)
        assert agent.config.rebalancer.margin == 0.5  # last good one in force
        _swap(cfg, cfg.read_text().replace("margin: lots", "margin: 0.25"))

    fixer = asyncio.create_task(break_then_fix())
    assert await agent.run() == 0
    await fixer
    reports = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(reports) == 6  # it never stopped
    rejected = [e for r in reports for e in r["errors"] if "config rejected" in e]
    assert rejected and "rebalancer.margin" in rejected[0] and "lots" in rejected[0]
    assert agent.config.rebalancer.margin == 0.25 and agent.state.config_valid
    assert agent.config.agent.interval_seconds == 0.5  # the --interval override outlives reloads
    assert agent.state.config_reloads_total["invalid"] == 1 and agent.state.config_reloads_total["ok"] == 1


@pytest.mark.avx512
async def test_container_exiting_between_plan_and_act_is_reported_not_fatal(demo_workloads, write_config, cgfs):
    killed: list[str] = []

    class VanishingParts(Parts):
        def apply(self, action: Action, container: Container) -> None:
            if not killed:  # the first target dies right before we act on it
                for pid in cgfs.pids(container.cgroup, recursive=True):
                    os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
                cgfs.remove(container.cgroup)
                killed.append(container.id)
            super().apply(action, container)

    agent, out = _agent(write_config(), cycles=3, parts_factory=lambda c, n, s: VanishingParts(c, n, config_source=s))
    assert await agent.run() == 0
    reports = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(reports) == 3
    failed = [a for r in reports for a in r["applied"] if a["container"] == killed[0]]
    assert failed and not failed[0]["ok"] and "gone" in failed[0]["error"]
    assert all(c["id"] != killed[0] for c in reports[-1]["containers"])


async def test_a_collector_crash_is_an_error_line_not_a_dead_agent(demo_workloads, write_config):
    class Boom:
        name = "boom"

        def start(self):
            from perfbalance.model import CollectorStatus
            return CollectorStatus(up=True)

        def collect(self, containers, now):
            raise RuntimeError("collector bug")

        def status(self):
            from perfbalance.model import CollectorStatus
            return CollectorStatus(up=True)

        def close(self) -> None:
            pass

    class BoomParts(Parts):
        def _make_collectors(self) -> None:
            super()._make_collectors()
            self.collectors.append(Boom())

    agent, out = _agent(write_config(), cycles=2, parts_factory=lambda c, n, s: BoomParts(c, n, config_source=s))
    assert await agent.run() == 0
    reports = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(reports) == 2
    assert any("collector boom" in e and "collector bug" in e for e in reports[-1]["errors"])
    assert reports[-1]["containers"][0]["metrics"]  # the other collectors still delivered


def test_second_instance_is_refused_naming_the_first(write_config):
    cfg = write_config()
    first = subprocess.Popen([PERFBALANCE, "run", "--config", str(cfg), "--interval", "1", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        first.stdout.readline()  # running: one cycle done
        second = run_agent("run", "--config", str(cfg), "--cycles", "1")
        assert second.returncode == 1
        assert str(first.pid) in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=30)


def test_sigterm_stops_cleanly_within_the_grace_period(write_config):
    cfg = write_config()
    proc = subprocess.Popen([PERFBALANCE, "run", "--config", str(cfg), "--interval", "1", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "BPF programs detached" in err
    lock = Path(load_config(str(cfg)).agent.run_dir) / "perfbalance.lock"
    # the lock is released: a new instance can start at once
    res = run_agent("run", "--config", str(cfg), "--cycles", "1", "--interval", "0.5")
    assert res.returncode == 0, res.stderr
    assert lock.parent.is_dir()


@pytest.mark.avx512
async def test_a_permanently_failing_move_backs_off_instead_of_retrying_every_cycle(demo_workloads, write_config):
    import errno as _errno

    from perfbalance.errors import CpusetError

    calls: list[str] = []

    class RefusingParts(Parts):
        def apply(self, action: Action, container: Container) -> None:
            calls.append(container.id)
            raise CpusetError(_errno.EINVAL, container.id, "cpuset.cpus", action.to)

    cfg = write_config({"rebalancer": {"dwell_seconds": 0.0, "cooldown_seconds": 0.0}})
    agent, out = _agent(cfg, cycles=8, interval=0.3,
                        parts_factory=lambda c, n, s: RefusingParts(c, n, config_source=s))
    assert await agent.run() == 0
    reports = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(reports) == 8
    per_container = {cid: calls.count(cid) for cid in set(calls)}
    assert per_container and max(per_container.values()) == 1, per_container  # 10 s backoff > 8 x 0.3 s
    assert any("backing off" in e for r in reports for e in r["errors"])
    assert agent.state.action_errors_total["CpusetError"] >= 1


async def test_scrapes_during_config_reloads_always_answer(demo_workloads, write_config):
    import threading
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    cfg = write_config()
    agent, _ = _agent(cfg, cycles=30, interval=0.2)
    results: list[int] = []
    stop = threading.Event()

    def scrape() -> None:  # until cycle 29 of 30: the server closes when the agent stops
        while not stop.is_set() and (agent.state.latest is None or agent.state.latest.cycle < 29):
            port = agent.config.metrics.listen.rsplit(":", 1)[1]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    list(text_string_to_metric_families(r.read().decode()))  # parses
                    results.append(r.status)
            except OSError:
                if agent.state.ready:
                    results.append(-1)

    async def flip() -> None:  # each version lives longer than a cycle, so every one is seen
        while agent.state.latest is None:
            await asyncio.sleep(0.05)
        good = cfg.read_text()
        for i in range(12):
            _swap(cfg, good.replace("dwell_seconds: 0.0", f"dwell_seconds: {i}.5") if i % 2 else "agent: [broken\n")
            await asyncio.sleep(0.25)
        _swap(cfg, good)

    t = threading.Thread(target=scrape, daemon=True)
    t.start()
    flipper = asyncio.create_task(flip())
    try:
        assert await agent.run() == 0
    finally:
        stop.set()
        await flipper
        t.join(timeout=10)
    assert results and set(results) == {200}, results[-5:]
    assert agent.state.config_reloads_total["invalid"] >= 1 and agent.state.config_reloads_total["ok"] >= 1


async def test_doctor_shows_that_the_running_agent_rejected_its_config(demo_workloads, write_config):
    from agent.cli.doctor import report

    cfg = write_config()
    agent, _ = _agent(cfg, cycles=4)

    async def corrupt() -> None:
        while agent.state.latest is None:
            await asyncio.sleep(0.05)
        _swap(cfg, cfg.read_text() + "bogus_section: {}\n")

    task = asyncio.create_task(corrupt())
    assert await agent.run() == 0
    await task
    section = report(agent.config)["config"]
    assert not section["available"]
    assert "rejected" in section["reason"] and "bogus_section" in section["reason"]
    assert section["running_agent"]["pid"] == os.getpid()
