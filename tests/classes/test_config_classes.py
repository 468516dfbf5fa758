"""The blockio and rt config sections: a bad class name, default, device or budget is rejected at
load with one line naming the file, the key path and the value; a good one loads."""

from __future__ import annotations

import pytest

from agent.config import parse_config
from perfbalance.errors import ConfigError


@pytest.mark.parametrize("text, where, why", [
    ('blockio: {classes: {"a/b": {weight: 10}}}', "blockio.classes", "contains '/' or '..'"),
    ("blockio: {classes: {slow: {weight: 10}}, qos_classes: {besteffort: fast}}", "blockio",
     "qos_classes.besteffort: 'fast' is not a configured class (configured: slow)"),
    ("blockio: {qos_classes: {gold: slow}}", "blockio.qos_classes", "unknown QoS class 'gold'"),
    ("blockio: {classes: {s: {devices: [{path: /etc/passwd, write_bps: 1}]}}}", "blockio.classes.s.devices[0].path",
     "must be a device path or glob under /dev/"),
    ("blockio: {classes: {s: {devices: [{path: /dev/vda, write_bps: lots}]}}}", "blockio.classes.s.devices[0].write_bps",
     "rate 'lots' must be a number"),
    ("blockio: {classes: {s: {devices: [{path: /dev/vda}]}}}", "blockio.classes.s.devices[0]", "sets no limit"),
    ('blockio: {annotation: "not a key!"}', "blockio.annotation", "is not a Kubernetes annotation key"),
    ("rt: {classes: {a: {runtime_us: 2000000}}}", "rt.classes.a", "runtime_us 2000000 exceeds period_us 1000000"),
    ("rt: {mode: sometimes}", "rt.mode", "must be one of 'on', 'off', 'auto'"),
])
def test_bad_class_settings_name_file_key_and_value(text: str, where: str, why: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="node.yaml", node="n")
    msg = str(e.value)
    assert msg.startswith(f"node.yaml: {where}: ") and why in msg, msg


def test_good_class_settings_load() -> None:
    cfg = parse_config("""
blockio:
  mode: "on"
  classes:
    slow: {weight: 100, devices: [{path: "/dev/vd*", write_bps: 20MiB, read_iops: 500}]}
  qos_classes: {besteffort: slow}
rt:
  classes: {audio: {runtime_us: 100000}, locked: {runtime_us: 5000, allow_annotation: false}}
""", source="node.yaml", node="n")
    assert cfg.blockio.mode == "on"
    assert cfg.blockio.classes["slow"].devices[0].limits() == {"read_bps": 0, "write_bps": 20 << 20,
                                                               "read_iops": 500, "write_iops": 0}
    rules = cfg.rt.rules()
    assert rules.allow_annotation == {"audio": True, "locked": False} and rules.annotation == "rt.perfbalance.io/class"
