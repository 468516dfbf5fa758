"""`perfbalance demo`: the agent separating an AVX-512 workload from scalar ones, for real.

It creates cgroups under `perfbalance-demo/` (in every hierarchy the cpuset actuator and the
collectors use), starts three workloads in them — a numpy `exp` loop using a whole CPU (real
512-bit instructions), a shell loop (scalar, but glibc's EVEX-256 string code) and a
cache-hungry random walk over 64 MiB, the last two at about 40 % of a CPU each — runs the agent
on them with `discovery.globs`, prints what it saw, planned and moved, and removes everything on
exit (also on Ctrl-C). A workload that dies (numpy missing: `pip install 'perfbalance[demo]'`)
stops the demo at once with its name, exit status and last stderr line, and exit status 1.

On a 2-CPU machine each CPU is its own core, so the AVX-512 island is one CPU and the scalar
and cache workloads share the other. When this CPU model loses no frequency to AVX-512
licences (AMD Zen 4, recent Intel client cores), the demo assumes a Skylake-SP-class 20% loss
(`rebalancer.avx512_license_loss`) so that there is a cost to avoid, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, Protocol, TextIO

from agent.config import Config, load_config, node_name
from agent.export.report import CycleReport
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.errors import ContainerGone

DEMO_BASE = "perfbalance-demo"
ASSUMED_LICENSE_LOSS = 0.2

# Busy loops (one CPU each): what the end-to-end tests use.
BUSY: dict[str, list[str]] = {
    "avx512": [sys.executable, "-c",
               "import numpy as np\na = np.random.rand(1 << 16)\nwhile True:\n    np.exp(a)"],
    "scalar": ["sh", "-c", "while :; do :; done"],
}
# The demo's services: an AVX-512 batch job using a whole CPU, and two latency-type services
# using about 40 % of a CPU each, so that the two fit on the CPU left beside the AVX-512 island.
# (Three busy loops on two CPUs would make any island cost more CPU than the licence saves, and
# the planner rightly refuses it.)
WORKLOADS: dict[str, list[str]] = {
    "avx512": BUSY["avx512"],
    "scalar": ["sh", "-c",  # dash arithmetic: glibc's EVEX-256 string code, no 512-bit
               "while :; do i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 0.05; done"],
    "cache": [sys.executable, "-c",  # random gathers over 64 MiB: LLC misses
              "import time\nimport numpy as np\na = np.zeros(8 << 20)\n"
              "idx = np.random.randint(0, a.size, 1 << 16)\nwhile True:\n"
              "    end = time.perf_counter() + 0.02\n    while time.perf_counter() < end:\n"
              "        a[idx] += 1.0\n    time.sleep(0.03)"],
}


@dataclasses.dataclass
class Workload:
    name: str
    cgroup: str
    proc: subprocess.Popen[bytes]
    stderr: IO[bytes] | None = None  # what it wrote to stderr, read back when it dies


def death(w: Workload) -> str | None:
    """One line naming `w`, how it ended and its last stderr line; None while it runs.

    A demo workload never ends by itself: any exit, status 0 included, leaves the table empty."""
    status = w.proc.poll()
    if status is None:
        return None
    how = (f"was killed by signal {signal.Signals(-status).name}" if status < 0
           else f"exited with status {status}")
    line = f"workload {w.name} (pid {w.proc.pid}, cgroup {w.cgroup}) {how}"
    last = _last_line(w.stderr)
    if last:
        line += f": {last}"
    if "No module named" in last:
        line += " (the demo's workloads need numpy: pip install 'perfbalance[demo]')"
    return line


def _last_line(f: IO[bytes] | None, limit: int = 4096) -> str:
    if f is None:
        return ""
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - limit))
    lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class Stoppable(Protocol):
    async def run(self) -> int: ...
    def request_stop(self) -> None: ...


async def supervised(agent: Stoppable, started: Sequence[Workload], *, poll: float = 0.2) -> list[str]:
    """Run `agent` while watching the workloads; stop it as soon as one dies.

    Returns one line per dead workload (empty when all ran to the end)."""
    task = asyncio.create_task(agent.run(), name="perfbalance-demo-agent")
    dead: list[str] = []
    while not task.done():
        dead = [d for d in map(death, started) if d]
        if dead:
            agent.request_stop()
            break
        await asyncio.wait({task}, timeout=poll)
    await task
    return dead or [d for d in map(death, started) if d]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=30.0, help="how long to run (default 30)")
    p.add_argument("--interval", type=float, default=2.0, help="agent interval in seconds (default 2)")
    p.add_argument("--config", metavar="FILE", help="base config (default: embedded defaults)")
    p.add_argument("--json", action="store_true", help="print the agent's JSON lines instead of the tables")


@contextmanager
def workloads(cgfs: Cgroupfs, commands: Mapping[str, list[str]] = WORKLOADS, *,
              base: str = DEMO_BASE) -> Iterator[list[Workload]]:
    """Start each command in its own cgroup `<base>/<name>`; always clean up."""
    started: list[Workload] = []
    created: list[str] = []
    lock = claim(cgfs, base)  # before anything of ours exists: a running demo's cgroups are its own
    try:
        created.append(base)
        for name, argv in commands.items():
            rel = f"{base}/{name}"
            cgfs.create(rel)
            created.append(rel)
            err = tempfile.TemporaryFile()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
            started.append(Workload(name=name, cgroup=rel, proc=proc, stderr=err))
            try:
                cgfs.attach(rel, proc.pid)
            except ContainerGone:  # died at once: death() reports it with its stderr
                pass
        yield started
    finally:
        for w in started:
            try:
                os.killpg(w.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            w.proc.wait()
            if w.stderr is not None:
                w.stderr.close()
        for rel in reversed(created):
            try:
                cgfs.remove(rel)
            except Exception as e:  # report, keep cleaning
                print(f"perfbalance demo: could not remove cgroup {rel}: {e}", file=sys.stderr)
        os.close(lock)


class DemoBusy(Exception):
    """Another demo holds the demo cgroups."""


def claim(cgfs: Cgroupfs, base: str) -> int:
    """Create `base` and hold an exclusive flock(2) on its directory for the demo's lifetime: a
    second demo at the same time would share and fight over the same cgroups (and remove them
    under the first one at its end). The lock goes with the process, so a killed demo leaves none."""
    cgfs.create(base)
    fd = cgfs.open_dir(base)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holders = ", ".join(str(p) for p in cgfs.pids(base, recursive=True)) or "none left"
        raise DemoBusy(f"another perfbalance demo is running in cgroup {base} (its workloads: pids {holders}); "
                       "wait for it to finish") from None
    return fd


def demo_config(base: Config, *, run_dir: str, interval: float) -> tuple[Config, str]:
    """The base config pointed at the demo cgroups; returns it with a note on assumptions."""
    note = ""
    reb = base.rebalancer
    model = _cpu_model()
    if reb.license_loss(model) <= 0.0:
        table = dict(reb.avx512_license_loss)
        table[model or "unknown"] = ASSUMED_LICENSE_LOSS
        reb = dataclasses.replace(reb, avx512_license_loss=table)
        note = (f"this CPU ({model or 'unknown model'}) loses no frequency to AVX-512 licences; "
                f"the demo assumes a {ASSUMED_LICENSE_LOSS:.0%} loss so there is a cost to avoid")
    cfg = dataclasses.replace(
        base,
        agent=dataclasses.replace(base.agent, run_dir=run_dir, interval_seconds=interval,
                                  log_format="text", log_level="warning"),
        discovery=dataclasses.replace(base.discovery, kubernetes=False, globs=(f"{DEMO_BASE}/*",)),
        metrics=dataclasses.replace(base.metrics, enabled=False),
        mqtt=dataclasses.replace(base.mqtt, enabled=False),
        rebalancer=dataclasses.replace(reb, dwell_seconds=min(reb.dwell_seconds, 4 * interval),
                                       settle_seconds=min(reb.settle_seconds, 3 * interval)),
    )
    return cfg, note


def _cpu_model() -> str:
    from agent.discover.sysfs import parse_cpu_model

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return parse_cpu_model(f.read(1 << 20))
    except OSError:
        return ""


class TableWriter:
    """Turns each cycle report into a short human account: what it saw, planned, moved."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, line: str) -> None:
        import json

        report = json.loads(line)
        p = self.out.write
        p(f"\n-- cycle {report['cycle']} ({report['window']:.1f}s window)\n")
        p(f"   {'container':<26} {'cpuset':<7} {'cpu':>5} {'avx512':>7} {'evex256':>8}  class\n")
        for c in report["containers"]:
            m = c["metrics"]
            heavy = "AVX-512-heavy" if m.get("avx512_heavy") else ""
            p(f"   {c['id']:<26} {c['cpuset']:<7} {m.get('cpu_usage_cores', 0):5.2f} "
              f"{m.get('avx512_active_ratio', 0):7.2f} {m.get('evex256_ratio', 0):8.2f}  {heavy}\n")
        for a in report["plan"]:
            p(f"   plan: {a['container']} {a['from']} -> {a['to']}: {a['reason']} "
              f"(benefit {a['benefit']:.4f}, cost {a['cost']:.4f} core-s/s)\n")
        for a in report["applied"]:
            status = "moved" if a["ok"] else f"FAILED: {a['error']}"
            p(f"   {status}: {a['container']} {a['from']} -> {a['to']}\n")
        for e in report["errors"]:
            p(f"   error: {e}\n")
        self.out.flush()

    def flush(self) -> None:
        self.out.flush()


def main(args: argparse.Namespace) -> int:
    from agent.loop import Agent

    if os.geteuid() != 0:
        print("perfbalance demo: needs root (it creates cgroups and loads BPF programs)", file=sys.stderr)
        return 2
    base = load_config(args.config, node=node_name())
    run_dir = tempfile.mkdtemp(prefix="perfbalance-demo-")
    cfg, note = demo_config(base, run_dir=run_dir, interval=args.interval)
    cycles = max(1, int(args.seconds / args.interval))
    cgfs = Cgroupfs(root=cfg.host.cgroup_root)
    print(f"perfbalance demo: {', '.join(WORKLOADS)} workloads in cgroups {DEMO_BASE}/*, "
          f"{cycles} cycles of {args.interval:g}s")
    if note:
        print(f"note: {note}")
    out = sys.stdout if args.json else TableWriter(sys.stdout)
    try:
        with workloads(cgfs) as started:
            print("started: " + ", ".join(f"{w.name} (pid {w.proc.pid})" for w in started))
            agent = Agent(cfg, node=node_name(), cycles=cycles, json_out=out)  # type: ignore[arg-type]
            dead = asyncio.run(supervised(agent, started))
            for line in dead:
                print(f"perfbalance demo: {line}", file=sys.stderr)
            if dead:
                return 1
            summarize(agent.state.latest, started)
    except DemoBusy as e:
        print(f"perfbalance demo: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; cleaning up")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def summarize(report: CycleReport | None, started: Sequence[Workload]) -> None:
    if report is None:
        return
    print("\nwhere the workloads run now (from /proc/<pid>/status):")
    for w in started:
        try:
            with open(f"/proc/{w.proc.pid}/status", encoding="utf-8") as f:
                allowed = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("Cpus_allowed_list")), "?")
        except OSError:
            allowed = "(exited)"
        print(f"   {w.name:<8} pid {w.proc.pid:<7} CPUs {allowed}")
