"""How long the agent takes from exec to serving `/readyz` (its first finished cycle).

The agent is started for real (`perfbalance run` through this Python, dry run, a private run directory, a
free loopback port, a 1 s interval) with the embedded collectors, so the figure includes Python's
imports, the header set-up, bcc's compilation of every BPF program and the priming read. The
first start of a series also warms what the kernel and the page cache keep (bcc keeps no object
cache of its own), so the median of the later starts is the "warm" figure.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

TIMEOUT_SECONDS = 60.0
MAIN = "import sys; from agent.cli import main; sys.exit(main(sys.argv[1:]))"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_start(*, timeout: float = TIMEOUT_SECONDS) -> float:
    """Seconds from exec to a 200 from /readyz; raises RuntimeError when the agent never gets there."""
    tmp = tempfile.mkdtemp(prefix="pb-bench-start-")
    port = free_port()
    cfg = os.path.join(tmp, "config.yaml")
    with open(cfg, "w") as f:
        f.write(f"agent:\n  run_dir: {tmp}/run\n  dry_run: true\nmetrics:\n  listen: 127.0.0.1:{port}\n")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", MAIN, "run", "--config", cfg, "--interval", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip().splitlines() if proc.stderr else []
                raise RuntimeError(f"agent exited with {proc.returncode} before ready: {err[-1] if err else ''}")
            if _ready(port):
                return time.monotonic() - t0
            time.sleep(0.02)
        raise RuntimeError(f"agent not ready within {timeout:.0f} s")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def measure_start(runs: int = 3) -> dict[str, Any]:
    times = [one_start() for _ in range(max(1, runs))]
    warm = times[1:] or times
    return {"runs": len(times), "first_seconds": round(times[0], 2),
            "warm_median_seconds": round(statistics.median(warm), 2)}
