"""runtime.nri modes without a runtime: off never starts, auto/on without a socket fall back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.nri.runtime import NriRuntime, NriSettings
from perfbalance.model import KubeletState

pytest.importorskip("pbgen.nri.api_pb2", reason="NRI modules not generated: run scripts/setup.sh")


def test_off_never_connects_and_says_cgroupfs() -> None:
    rt = NriRuntime(NriSettings(mode="off"), kubelet=KubeletState)
    rt.start()
    s = rt.status()
    assert (s["path"], s["connected"], s["reason"]) == ("cgroupfs", False, "runtime.nri is off")
    rt.stop()


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_missing_socket_falls_back_and_says_why(tmp_path: Path, mode: str) -> None:
    sock = tmp_path / "nri-missing.sock"
    rt = NriRuntime(NriSettings(mode=mode, socket=str(sock), backoff_max_seconds=0.2), kubelet=KubeletState)
    rt.start()
    try:
        deadline = time.monotonic() + 10
        while "cannot connect" not in str(rt.status()["reason"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        s = rt.status()
        assert s["path"] == "cgroupfs" and not rt.connected and rt.view is None
        assert str(sock) in str(s["reason"])
    finally:
        rt.stop()


def test_bad_plugin_index_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="nri_index: must be two digits, got 'x1'"):
        NriRuntime(NriSettings(plugin_index="x1"), kubelet=KubeletState)


# -- the `runtime:` section ------------------------------------------------------------------------

def test_runtime_section_maps_to_the_nri_settings() -> None:
    from agent.config import parse_config

    cfg = parse_config("runtime: {nri: off, nri_socket: /run/x/nri.sock, nri_plugin_name: pb, "
                       "nri_plugin_index: '07', nri_backoff_max_seconds: 5}", source="t.yaml", node="n")
    assert NriSettings.from_config(cfg.runtime) == NriSettings(
        mode="off", socket="/run/x/nri.sock", plugin_name="pb", plugin_index="07", backoff_max_seconds=5.0)
    assert NriSettings.from_config(parse_config("", source="t.yaml", node="n").runtime) == NriSettings()


@pytest.mark.parametrize("text, message", [
    ("runtime: {nri: maybe}", "t.yaml: runtime.nri: must be one of 'auto', 'on', 'off' (got 'maybe')"),
    ("runtime: {nri_plugin_index: '5'}", "t.yaml: runtime.nri_plugin_index: must be two digits"),
    ("runtime: {nri_plugin_index: 50}", "t.yaml: runtime.nri_plugin_index: must be a string (got 50)"),
    ("runtime: {nri_plugin_name: 'a/b'}", "t.yaml: runtime.nri_plugin_name: not a plugin name"),
    ("runtime: {nri_backoff_max_seconds: 0}", "t.yaml: runtime.nri_backoff_max_seconds: must be >= 0.5"),
    ("runtime: {nri_sock: /x}", "t.yaml: runtime.nri_sock: unknown key"),
])
def test_bad_runtime_settings_are_one_clear_error(text: str, message: str) -> None:
    from agent.config import parse_config
    from perfbalance.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_config(text, source="t.yaml", node="n")
    assert str(e.value).startswith(message), str(e.value)


def test_a_reload_that_changes_the_runtime_section_applies_at_the_next_start(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    import dataclasses

    from agent.config import AgentSection, Config, RuntimeSection
    from agent.wiring import Parts

    same = Config(agent=AgentSection(run_dir=str(tmp_path)), runtime=RuntimeSection(nri="off"))
    parts = Parts(same, "node-a")
    try:
        with caplog.at_level("WARNING", logger="perfbalance.parts"):
            parts.reconfigure(same)  # control: nothing changed, nothing said
            assert not [r for r in caplog.records if "runtime" in r.getMessage()]
            parts.reconfigure(dataclasses.replace(same, runtime=RuntimeSection(nri="on")))
        assert any("runtime take effect at the next start" in r.getMessage() for r in caplog.records)
        assert parts.nri.settings.mode == "off" and parts.actuation()["path"] == "cgroupfs"
        assert '"path": "cgroupfs"' in (tmp_path / "actuation-status.json").read_text()  # for doctor
    finally:
        parts.close()
