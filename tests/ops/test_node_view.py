"""The live node view, loaded by a real headless Chromium from the agent's HTTP server."""

from __future__ import annotations

import dataclasses
import html
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import ops_synth as s
import pytest

from agent.export.http import NodeServer, serve_http

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="chromium not installed")


def chromium(url: str, *extra: str) -> str:
    with tempfile.TemporaryDirectory(prefix="pbtest-ops-chromium-") as profile:
        cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--virtual-time-budget=5000", *extra, url]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        return done.stdout


@pytest.fixture
def server() -> Iterator[NodeServer]:
    state = s.state()
    state.rollbacks_total = 1
    state.realized[0] = dataclasses.replace(state.realized[0], realized=-0.02, rolled_back=True)
    srv = serve_http(state, "127.0.0.1:0")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def dom(server: NodeServer) -> str:
    return html.unescape(chromium(server.url + "/", "--dump-dom"))


def cell(dom: str, cpu: int, metric: str) -> str:
    m = re.search(rf'<td class="cell[^"]*" data-cpu="{cpu}" data-metric="{metric}"[^>]*>([^<]*)</td>', dom)
    assert m, f"no {metric} cell for CPU {cpu}"
    return m.group(1)


def test_heatmap_has_one_cell_per_cpu_and_metric(dom: str) -> None:
    for metric in ("avx512", "mpki", "bandwidth", "class"):
        assert len(re.findall(rf'data-metric="{metric}"', dom)) == 8


def test_heatmap_shows_avx512_use_mpki_and_class_where_containers_sit(dom: str) -> None:
    assert cell(dom, 0, "avx512") == "62 %"
    assert cell(dom, 6, "mpki") == "12.5"
    assert cell(dom, 1, "class") == "batch"
    assert re.search(r'class="cell heavy" data-cpu="5" data-metric="avx512"', dom)  # sibling of an AVX-512 core


def test_page_names_every_container(dom: str) -> None:
    for name in ("ml/trainer-0/train", "web/frontend-7d9f/nginx", "db/postgres-0/pg"):
        assert name in dom


def test_last_decision_shows_reason_and_rollback(dom: str) -> None:
    row = re.search(r'<tr data-event="ev-1">(.*?)</tr>', dom, re.S)
    assert row and s.MOVE_REASON in row.group(1)
    assert "4-5 → 2-3" in row.group(1) and "rolled back" in row.group(1)


def test_screenshot_is_saved_as_an_artifact(server: NodeServer) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "node-view.png"
    shot.unlink(missing_ok=True)
    chromium(server.url + "/", "--window-size=1400,1000", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(data[16:20], "big") == 1400  # IHDR width
