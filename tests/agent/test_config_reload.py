"""A config reload applies `agent.dry_run`, `agent.log_level` and the `vm:` section at once, on the
real agent (its loop, its parts, its config watcher), while `--dry-run` outlives reloads."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from agent.config import Config, load_config
from agent.loop import Agent
from agent.persist.instance import setup_logging

INTERVAL = 0.2


@pytest.fixture(autouse=True)
def root_logging(restore_root_logging: None) -> None:
    """The agent's logging set-up is undone after each test (tests/conftest.py)."""


def write(path: Path, tmp_path: Path, **sections: dict) -> None:
    cfg = {
        "agent": {"run_dir": str(tmp_path / "run"), "log_level": "info", "log_format": "text"},
        "discovery": {"kubernetes": False, "globs": ["perfbalance-reload-test-none/*"]},
        "kubernetes": {"api": "off"},
        "resctrl": {"rdt": "off"},
        "collectors": {"avx512": {"enabled": False}, "perf": {"mode": "off"}, "runqlat": {"enabled": False},
                       "resctrl_monitoring": False},
        "metrics": {"enabled": False},
    }
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    path.write_text(yaml.safe_dump(cfg))


def interval(c: Config) -> Config:  # like `--interval`
    return dataclasses.replace(c, agent=dataclasses.replace(c.agent, interval_seconds=INTERVAL))


async def run_with_reloads(agent: Agent, steps: list[Callable[[], None]]) -> list[tuple]:
    """Run the agent; after each reload it has taken, note (dry_run, root level, vm part) and
    take the next step (a rewrite of the file)."""
    seen: list[tuple] = []

    async def driver() -> None:
        while agent.state.latest is None:
            await asyncio.sleep(0.02)
        for n, step in enumerate(steps, start=1):
            step()
            while agent.state.config_reloads_total["ok"] < n:
                assert agent.state.config_valid, agent.state.config_error
                await asyncio.sleep(0.02)
            seen.append((agent.dry_run, logging.getLogger().level, agent.parts.vms))
        agent.request_stop()

    task = asyncio.create_task(driver())
    assert await asyncio.wait_for(agent.run(), 60) == 0
    await task
    return seen


async def test_reload_applies_dry_run_log_level_and_vm_at_once(tmp_path: Path) -> None:
    cfg = tmp_path / "perfbalance.yaml"
    write(cfg, tmp_path)
    agent = Agent(load_config(str(cfg), node="n"), node="n", config_path=str(cfg), overrides=interval)
    patterns = [r"^vcpu-(\d+)$"]
    seen = await run_with_reloads(agent, [
        lambda: write(cfg, tmp_path, agent={"dry_run": True, "log_level": "debug"},
                      vm={"vcpu_patterns": patterns}),
        lambda: write(cfg, tmp_path, agent={"dry_run": False, "log_level": "warning"}, vm={"enabled": False}),
        lambda: write(cfg, tmp_path, agent={"log_level": "error"}, vm={"enabled": True}),
    ])
    (dry1, level1, vms1), (dry2, level2, vms2), (_, level3, vms3) = seen
    assert dry1 is True and level1 == logging.DEBUG
    assert vms1 is not None and tuple(vms1.config.vcpu_patterns) == tuple(patterns)
    assert dry2 is False and level2 == logging.WARNING and vms2 is None
    assert level3 == logging.ERROR and vms3 is not None and vms3.config.enabled


async def test_command_line_dry_run_outlives_a_reload(tmp_path: Path) -> None:
    cfg = tmp_path / "perfbalance.yaml"
    write(cfg, tmp_path, agent={"dry_run": True})
    agent = Agent(load_config(str(cfg), node="n"), node="n", config_path=str(cfg), dry_run=True,
                  overrides=interval)
    ((dry, _, _),) = await run_with_reloads(agent, [lambda: write(cfg, tmp_path, agent={"dry_run": False})])
    assert dry is True and agent.config.agent.dry_run is False


async def test_reload_changes_the_format_of_the_agents_log_handler(tmp_path: Path) -> None:
    cfg = tmp_path / "perfbalance.yaml"
    write(cfg, tmp_path)
    stream = io.StringIO()
    setup_logging("info", "text", stream=stream)
    agent = Agent(load_config(str(cfg), node="n"), node="n", config_path=str(cfg), overrides=interval)
    await run_with_reloads(agent, [lambda: write(cfg, tmp_path, agent={"log_format": "json", "log_level": "debug"})])
    logging.getLogger("perfbalance.test").debug("after the reload")
    assert stream.getvalue().splitlines()[-1].startswith("{") and "after the reload" in stream.getvalue()
