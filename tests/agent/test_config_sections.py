"""Malformed discovery/cpuset configuration is rejected at load, naming file, key path and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import load_config
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ConfigError


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "perfbalance.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,key,fragment", [
    ("discovery:\n  globs: ['../etc/*']\n", "discovery.globs", "'..'"),
    ("discovery:\n  globs: 'perfbalance-demo/*'\n", "discovery.globs", "must be a list"),
    ("discovery:\n  globs: ['a/**/b']\n", "discovery.globs", "**"),
    ("discovery:\n  kubernetes: maybe\n", "discovery.kubernetes", "true or false"),
    ("discovery:\n  glob: ['x/*']\n", "discovery.glob", "unknown key"),
    ("cpuset:\n  reserved_cpus: '0-x'\n", "cpuset.reserved_cpus", "not a CPU list"),
])
def test_bad_discovery_and_cpuset_settings(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_config(path, node="n1")
    assert ei.value.path == key and fragment in str(ei.value) and path in str(ei.value)


def test_good_discovery_settings_load(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "discovery:\n  globs: ['perfbalance-demo/*', 'system.slice/docker-*.scope']\n"
                                      "cpuset:\n  reserved_cpus: '0'\n"), node="n1")
    assert cfg.discovery.globs == ("perfbalance-demo/*", "system.slice/docker-*.scope")
    assert CpuSet.parse(cfg.cpuset.reserved_cpus) == CpuSet([0])
