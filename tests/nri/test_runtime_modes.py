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
