"""Real servers for the ops end-to-end tests: mosquitto and Prometheus on 127.0.0.1, free ports.

Each server runs as a child process in a temporary directory and is stopped (SIGTERM, then
SIGKILL) by the fixture that started it.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server not listening on {port} after {timeout} s: {log.read_text()[-2000:]}")


def terminate(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class Mosquitto:
    """A mosquitto broker with on-disk persistence, restartable on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        (workdir / "data").mkdir(exist_ok=True)
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nuser root\n"
            f"persistence true\npersistence_location {workdir / 'data'}/\nautosave_interval 1\n"
            f"log_dest file {workdir / 'mosquitto.log'}\nlog_type all\n")

    def start(self) -> Mosquitto:
        log = self.dir / "mosquitto.log"
        log.touch()
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc, log)
        return self

    def stop(self) -> None:
        terminate(self.proc)
        self.proc = None


class Prometheus:
    """A Prometheus server scraping `targets` every second and evaluating `rules` every second."""

    def __init__(self, workdir: Path, *, targets: list[str], rules: Path) -> None:
        self.dir, self.port = workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.conf = workdir / "prometheus.yml"
        self.conf.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {rules}\n"
            "scrape_configs:\n  - job_name: perfbalance\n    static_configs:\n"
            f"      - targets: {targets!r}\n")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        log = self.dir / "prometheus.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.conf}", f"--storage.tsdb.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
                 "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc, log)
        self._wait_ready(log)
        return self

    def _wait_ready(self, log: Path, timeout: float = 60.0) -> None:
        """The web port opens before the TSDB is loaded; /-/ready says 200 when queries work."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready after {timeout} s: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        terminate(self.proc)
        self.proc = None
