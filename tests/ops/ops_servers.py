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
