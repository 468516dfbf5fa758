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

    def __init__(self, workdir: Path, *, tls: tuple[Path, Path, Path] | None = None,
                 password_file: Path | None = None) -> None:
        """tls: (ca, cert, key) for a TLS-only listener; password_file: require these users."""
        self.dir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        (workdir / "data").mkdir(exist_ok=True)
        self.conf = workdir / "mosquitto.conf"
        auth = f"allow_anonymous false\npassword_file {password_file}\n" if password_file else "allow_anonymous true\n"
        certs = f"cafile {tls[0]}\ncertfile {tls[1]}\nkeyfile {tls[2]}\n" if tls else ""
        self.conf.write_text(
            f"per_listener_settings false\nlistener {self.port} 127.0.0.1\n{certs}{auth}user root\n"
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


def self_signed(workdir: Path, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for `host` (IP SAN), made with openssl."""
    ca_key, ca, key, csr, cert = (workdir / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt"))
    ext = workdir / "san.ext"
    ext.write_text(f"subjectAltName=IP:{host}\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, timeout=60)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=pbtest-ca",
        "-keyout", str(ca_key), "-out", str(ca))
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}", "-keyout", str(key), "-out", str(csr))
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "1", "-extfile", str(ext), "-out", str(cert))
    return ca, cert, key
