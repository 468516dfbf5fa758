"""The `vm:` configuration section: patterns are validated when the file is loaded."""

from __future__ import annotations

import pytest

from agent.config import parse_config
from perfbalance.errors import ConfigError


def test_extra_vcpu_pattern_is_accepted():
    cfg = parse_config("vm:\n  vcpu_patterns: ['^vcpu_(\\d+)$']\n", source="c.yaml", node="n")
    assert cfg.vm.vcpu_patterns == (r"^vcpu_(\d+)$",)


@pytest.mark.parametrize("text,why", [
    ("vm:\n  vcpu_patterns: ['^vcpu$']\n", "no group 1"),
    ("vm:\n  vcpu_patterns: ['(']\n", "not a regular expression"),
    ("vm:\n  vmm_patterns: ['[']\n", "not a regular expression"),
    ("vm:\n  system_vcpus: -1\n", ">= 0"),
])
def test_bad_vm_settings_name_the_key(text, why):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="c.yaml", node="n")
    assert "vm." in str(e.value) and why in str(e.value)
