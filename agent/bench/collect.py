"""`perfbalance bench collect`: what collection costs, measured on this node with real cgroups.

The design promise is a cost independent of the number of containers (cadvisor needed 8.65 s per
scrape at 60 containers). This measures, with the real collectors:
- bpf_ns_per_event: average run time of each BPF program per event (BPF_ENABLE_STATS, else the
  kernel.bpf_stats_enabled sysctl; fdinfo run_time_ns / run_cnt): `avx512`, `pmu` and runqlat's
  probes (`runqlat_sched_switch` alone with its sched_info method, a BTF raw tracepoint; with
  wakeup stamps also `runqlat_sched_wakeup`, `runqlat_sched_wakeup_new`), each beside its floor
  (bpf_ns_floor: an empty program on the same tracepoint, of the same kind) and its key floor
  (bpf_ns_key_floor: a program that only reads the cgroup id into a per-CPU slot, the least any
  per-cgroup attribution costs here) and its clock floor (bpf_ns_clock_floor: the key floor plus
  one bpf_ktime_get_ns, the least a per-cgroup latency measurement costs); the same under a
  two-cgroup load (bpf_ns_per_event_two_cgroups: consecutive events on a CPU change cgroup); and
  the PMU program's split (pmu_ns_split: with_reads, without_reads, reads); runqlat's two methods
  loaded alone in turn (runqlat_methods: per probe, and per switch over all its probes),
- cycle_cpu_seconds: CPU time (user + system, of the collecting thread) of one steady-state
  collection cycle of all collectors (the agent's five: avx512, perf, cgroup_stats, iostat,
  runqlat) with 10, 100 and 1000 real cgroups, each holding a `sleep`,
- perf_fds: perf event fds opened by the PMU collector, at each container count,
- rss_bytes: resident memory of this process after the run; memory: its RSS, PSS and anonymous
  bytes (smaps_rollup),
- scrape: one /metrics scrape at 1000 synthetic containers, rendered (once per cycle) and served
  from memory (agent/bench/scrape.py),
- start: seconds from exec to /readyz of a real (dry-run) agent, first and warm (agent/bench/start.py).
Results go to docs/benchmarks.md. Needs root (cgroups, BPF).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import bpf
from agent.bench.scrape import measure_scrape, memory
from agent.bench.start import measure_start
from collectors import perf
from collectors.bpfenv import rawtp
from collectors.bpfenv.rawtp import TP_BTF
from collectors.bpfenv.btf import VMLINUX, Btf
from collectors.bpfenv.keys import KeyMaps
from collectors.bpfenv.loader import prepare
from collectors.bpfenv.progstats import bpf_stats_enable, prog_stats
from collectors.avx512 import Avx512Collector
from perfbalance.cgroupfs import Cgroupfs
from collectors.cgroupstats import CgroupStatsCollector
from collectors.config import Avx512Config, PerfConfig, RunqlatConfig
from collectors.iostat import IoStatCollector
from collectors.runqlat import RunqlatCollector
from perfbalance.errors import FeatureUnavailable
from perfbalance.host import HostPaths
from perfbalance.model import Container

SIZES = (10, 100, 1000)
QUICK_SIZES = (10, 100)
PREFIX = "pbbench-collect"
CONTROLLERS = ("cpuset", "cpu", "cpuacct", "memory", "blkio", "io")  # what the collectors read (those mounted)

def _programs(program: str) -> dict[str, tuple[str, str]]:
    """Report name -> tracepoint of one BPF program's main probe, under the program's name (the
    PMU's fork and cgroup-move probes are not its per-event cost)."""
    return {program: bpf.PROGRAMS[program].tracepoint}


# Each collector's own programs, looked up in that collector's loaded object only: the PMU and
# the runqlat programs both attach to sched_switch and bcc names both functions alike. runqlat
# names its own (program_fds: which ones depend on its method).
COLLECTOR_PROGRAMS: dict[str, dict[str, tuple[str, str]]] = {
    "avx512": _programs("avx512"),
    "perf": _programs("pmu"),
}


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("perfbalance bench collect: needs root (real cgroups and BPF)")
        return 2
    run_dir = tempfile.mkdtemp(prefix="pb-bench-")
    try:
        result = measure(HostPaths(run_dir=run_dir), QUICK_SIZES if args.quick else SIZES)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(json.dumps(result, indent=None if args.json else 2, sort_keys=True))
    return 0


def measure(host: HostPaths, sizes: Sequence[int], *, rounds: int = 5, seconds: float = 1.0,
            scrape_containers: int = 1000, start_runs: int = 3) -> dict[str, Any]:
    fs = Cgroupfs(root=host.cgroup)
    collectors = start_collectors(host, fs)
    out: dict[str, Any] = {"collectors": {c.name: {"up": c.status().up, "reason": c.status().reason}
                                          for c in collectors},
                           "cycle_cpu_seconds": {}, "cycle_cpu_seconds_by_collector": {},
                           "perf_fds_by_containers": {}}
    try:
        (out["bpf_ns_per_event"], out["bpf_ns_floor"], out["bpf_events"],
         out["bpf_ns_key_floor"], out["bpf_ns_clock_floor"]) = _costs(host, collectors, rounds=rounds, seconds=seconds)
        out["bpf_ns_per_event_two_cgroups"] = two_cgroup_costs(host, fs, collectors, rounds=rounds, seconds=seconds)
        out["pmu_ns_split"] = pmu_split(host, collectors, rounds=rounds, seconds=seconds)
        out["runqlat_methods"] = runqlat_methods(host, fs, rounds=rounds, seconds=seconds)
        for n in sizes:
            with sleeping_cgroups(fs, n) as containers:
                total, by = cycle_cost(collectors, containers)
            out["cycle_cpu_seconds"][str(n)] = total
            out["cycle_cpu_seconds_by_collector"][str(n)] = by
            out["perf_fds_by_containers"][str(n)] = perf_fds(collectors)
        out["perf_fds"] = perf_fds(collectors)
        out["pmu_events"] = _events_note(collectors)
        out["rss_bytes"] = rss_bytes(host.procfs)
        out["memory"] = memory(host.procfs)  # after the collectors compiled and ran: RSS, PSS, anonymous
        out["scrape"] = measure_scrape(scrape_containers)
    finally:
        for c in collectors:
            c.close()
    if start_runs:  # with this run's programs detached: the agent's own start, exec to /readyz
        out["start"] = measure_start(start_runs)
    return out


def start_collectors(host: HostPaths, fs: Cgroupfs) -> list[Any]:
    keys = KeyMaps(fs, procfs=host.procfs)  # as the agent builds them (agent/snapshot/collectors.py)
    cols: list[Any] = [
        Avx512Collector(config=Avx512Config(), host=host, cgroupfs=fs, keymaps=keys),
        perf.make_collector(config=PerfConfig(), host=host, cgroupfs=fs, keymaps=keys),
        CgroupStatsCollector(cgroupfs=fs),
        IoStatCollector(cgroupfs=fs),
        RunqlatCollector(config=RunqlatConfig(), host=host, cgroupfs=fs, keymaps=keys),
    ]
    for c in cols:
        c.start()
    return cols


def perf_fds(collectors: Sequence[Any]) -> int:
    return sum(int(getattr(c, "perf_fds", 0)) for c in collectors)


def rss_bytes(procfs: str) -> int:
    with open(os.path.join(procfs, "self", "statm")) as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --- BPF cost per event -------------------------------------------------------------------------


FLOOR_FUNCTION = "pb_floor"  # the function of a floor program on a BTF raw tracepoint


def _probe(tracepoint: tuple[str, str]) -> str:
    if tracepoint[0] == TP_BTF:
        return f"int {FLOOR_FUNCTION}(unsigned long long *ctx)"
    return f"TRACEPOINT_PROBE({tracepoint[0]}, {tracepoint[1]})"


def floor_program(tracepoint: tuple[str, str]) -> str:
    """An empty program on `tracepoint`: what the run-time accounting itself costs there."""
    return f"{_probe(tracepoint)} {{ return 0; }}"


def key_floor_program(tracepoint: tuple[str, str], *, clock: bool = False) -> str:
    """The least a per-cgroup program does: read the cgroup id and add it to a per-CPU slot.
    What attributing anything to a cgroup costs on this host, beside the empty floor. With
    `clock`, one bpf_ktime_get_ns as well: the least a per-cgroup latency measurement costs."""
    value = "bpf_get_current_cgroup_id() + bpf_ktime_get_ns()" if clock else "bpf_get_current_cgroup_id()"
    return ("BPF_PERCPU_ARRAY(key_floor, u64, 1);\n"
            f"{_probe(tracepoint)} {{\n"
            "    int idx = 0;\n    u64 *v = key_floor.lookup(&idx);\n"
            f"    if (v)\n        *v += {value};\n    return 0;\n}}\n")


@contextmanager
def floor_fd(env: Any, text: str, tracepoint: tuple[str, str], btf_id: int | None) -> Iterator[int]:
    """`text` (a floor program) loaded and attached on `tracepoint`: its program fd. `btf_id`:
    the typedef btf_trace_<event> a TP_BTF tracepoint's floor attaches to."""
    b = env.load(text)
    raw = None
    try:
        if btf_id is not None:
            raw = rawtp.attach(b, FLOOR_FUNCTION, btf_id=btf_id, event=tracepoint[1])
            yield raw.fd
        else:
            yield b.funcs[bpf.probe_function(tracepoint)].fd
    finally:
        if raw is not None:
            raw.close()
        b.cleanup()


def bpf_costs(host: HostPaths, collectors: Sequence[Any], *, rounds: int = 5,
              seconds: float = 1.0) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """Median ns per event of each loaded program, and of an empty program on the same
    tracepoint (the floor, per program name)."""
    return _costs(host, collectors, rounds=rounds, seconds=seconds)[:3]


def _costs(host: HostPaths, collectors: Sequence[Any], *, rounds: int = 5, seconds: float = 1.0
           ) -> tuple[dict[str, float], dict[str, float], dict[str, int], dict[str, float], dict[str, float]]:
    """bpf_costs, plus the key floor and the clock floor (key_floor_program) per program name."""
    progs = loaded_programs(collectors)
    floors: dict[str, dict[str, float]] = {"floor": {}, "key_floor": {}, "clock_floor": {}}
    with stats_enabled(host.procfs):
        ns, events = _measure(host, {n: fd for n, (fd, _) in progs.items()}, rounds, seconds)
        try:
            env = prepare(host)
            for tp in dict.fromkeys(tp for _, tp in progs.values()):
                btf_id = (Btf.read(os.path.join(host.sysfs, VMLINUX)).raw_tracepoint(tp[1])[0]
                          if tp[0] == TP_BTF else None)  # read once for the tracepoint's three floors
                for kind, text in (("floor", floor_program(tp)), ("key_floor", key_floor_program(tp)),
                                   ("clock_floor", key_floor_program(tp, clock=True))):
                    with floor_fd(env, text, tp, btf_id) as fd:
                        cost = _measure(host, {kind: fd}, rounds, seconds)[0]
                    floors[kind].update({n: cost[kind] for n, (_, t) in progs.items() if t == tp and kind in cost})
        except FeatureUnavailable:
            pass
    return ns, floors["floor"], events, floors["key_floor"], floors["clock_floor"]


def two_cgroup_costs(host: HostPaths, fs: Cgroupfs, collectors: Sequence[Any], *, rounds: int = 5,
                     seconds: float = 1.0) -> dict[str, float]:
    """Median ns per event of each loaded program under the two-cgroup load: the busy loop and
    the sleep loop in two cgroups sharing CPU 0, so that consecutive events on a CPU mostly
    change cgroup (the case the per-CPU pending counts and the PMU's same-cgroup skip do not help)."""
    progs = loaded_programs(collectors)
    parent = f"{PREFIX}-{os.getpid()}-mixed"
    made = [parent, f"{parent}/busy", f"{parent}/sleepy"]
    try:
        for rel in made:
            fs.create(rel, ("cpuset", "cpu", "cpuacct", "memory"))
        with stats_enabled(host.procfs):
            return _measure(host, {n: fd for n, (fd, _) in progs.items()}, rounds, seconds,
                            load=lambda secs: _two_cgroup_load(fs, made[1], made[2], secs))[0]
    finally:
        fs.remove(parent)


def pmu_split(host: HostPaths, collectors: Sequence[Any], *, rounds: int = 5,
              seconds: float = 1.0) -> dict[str, float]:
    """What the PMU program's counter reads cost: the program as loaded, and the same program
    built with PB_NO_READS (everything but the reads), side by side under the default load."""
    perf_col = next((c for c in collectors if c.name == "perf"), None)
    progs = loaded_programs([perf_col]) if perf_col is not None else {}
    if "pmu" not in progs:
        return {}
    fd, tp = progs["pmu"]
    try:
        b = prepare(host).load(bpf.render("pmu", {**getattr(perf_col, "inner", perf_col).defines,
                                                  "PB_NO_READS": True}))
    except FeatureUnavailable:
        return {}
    try:
        with stats_enabled(host.procfs):
            got = _measure(host, {"with_reads": fd, "without_reads": b.funcs[bpf.probe_function(tp)].fd},
                           rounds, seconds)[0]
    finally:
        b.cleanup()
    if "with_reads" in got and "without_reads" in got:
        got["reads"] = round(got["with_reads"] - got["without_reads"], 1)
    return got


def runqlat_methods(host: HostPaths, fs: Cgroupfs, *, rounds: int = 5, seconds: float = 1.0
                    ) -> dict[str, dict[str, float]]:
    """runqlat's two methods measured apart, each loaded alone, alternating, under the default
    load: per method its probes' median ns per event and `per_switch`, the run time of all its
    probes over the switches (the wakeup stamps also pay a probe per wakeup; the sched_info
    method has none). A method this node cannot load is absent."""
    per: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for method in ("sched_info", "wakeup_stamps"):
            col = RunqlatCollector(config=RunqlatConfig(method=method), host=host, cgroupfs=fs)
            try:
                if not col.start().up:
                    continue
                fds = {event: fd for event, (fd, _) in col.program_fds().items()}
                with stats_enabled(host.procfs):
                    before = {e: prog_stats(host.procfs, fd) for e, fd in fds.items()}
                    _load(seconds)
                    after = {e: prog_stats(host.procfs, fd) for e, fd in fds.items()}
            finally:
                col.close()
            got = per.setdefault(method, {})
            delta = {e: (after[e][0] - before[e][0], after[e][1] - before[e][1]) for e in fds}
            for e, (t, n) in delta.items():
                if n > 0:
                    got.setdefault(e, []).append(t / n)
            switches = delta.get("sched_switch", (0, 0))[1]
            if switches > 0:
                got.setdefault("per_switch", []).append(sum(t for t, _ in delta.values()) / switches)
    return {m: {e: round(_median(v), 1) for e, v in got.items()} for m, got in per.items()}


def _measure(host: HostPaths, progs: dict[str, int], rounds: int, seconds: float,
             load: Any = None) -> tuple[dict[str, float], dict[str, int]]:
    per: dict[str, list[float]] = {n: [] for n in progs}
    events: dict[str, int] = {n: 0 for n in progs}
    for _ in range(rounds):
        before = {n: prog_stats(host.procfs, fd) for n, fd in progs.items()}
        (load or _load)(seconds)
        for n, fd in progs.items():
            t, cnt = (a - b for a, b in zip(prog_stats(host.procfs, fd), before[n]))
            events[n] += cnt
            if cnt > 0:
                per[n].append(t / cnt)
    return {n: round(_median(v), 1) for n, v in per.items() if v}, events


def _load(seconds: float) -> None:
    """A busy shell plus a sleep loop: context switches and FPU-state saves, bounded in time."""
    load = subprocess.Popen(["timeout", "-s", "KILL", str(seconds), "sh", "-c",
                             "while :; do :; done & while :; do sleep 0.001; done"],
                            start_new_session=True)
    load.wait()
    if _alive_group(load.pid):
        os.killpg(load.pid, signal.SIGKILL)


def _two_cgroup_load(fs: Cgroupfs, busy: str, sleepy: str, seconds: float) -> None:
    """The busy shell in one cgroup and the sleep loop in another, both on CPU 0."""
    def enter(rel: str) -> Any:
        def f() -> None:
            fs.attach(rel, os.getpid())
            os.sched_setaffinity(0, {0})
        return f
    procs = [subprocess.Popen(["timeout", "-s", "KILL", str(seconds), "sh", "-c", script],
                              start_new_session=True, preexec_fn=enter(rel))
             for rel, script in ((busy, "while :; do :; done"), (sleepy, "while :; do sleep 0.001; done"))]
    for p in procs:
        p.wait()
        if _alive_group(p.pid):
            os.killpg(p.pid, signal.SIGKILL)


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def loaded_programs(collectors: Sequence[Any]) -> dict[str, tuple[int, tuple[str, str]]]:
    """Report name -> (program fd, tracepoint) of every BPF program the collectors loaded, each
    collector's looked up in its own loaded object (COLLECTOR_PROGRAMS)."""
    out = {}
    for c in collectors:
        inner = getattr(c, "inner", c)
        b = getattr(inner, "_bpf", None)
        if b is None:
            continue
        for name, tp in COLLECTOR_PROGRAMS.get(c.name, {}).items():
            func = bpf.probe_function(tp)
            if func in b.funcs:
                out[name] = (b.funcs[func].fd, tp)
        if hasattr(inner, "program_fds"):
            out.update({f"{c.name}_{event}": got for event, got in inner.program_fds().items()})
    return out


@contextmanager
def stats_enabled(procfs: str) -> Iterator[None]:
    """BPF_ENABLE_STATS while inside (an fd; the kernel counts while any such fd is open)."""
    fd = bpf_stats_enable()
    sysctl = os.path.join(procfs, "sys/kernel/bpf_stats_enabled")
    old = None
    if fd < 0:
        with open(sysctl) as f:
            old = f.read().strip()
        with open(sysctl, "w") as f:
            f.write("1")
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)
        elif old is not None:
            with open(sysctl, "w") as f:
                f.write(old)


# --- one collection cycle with N real cgroups ---------------------------------------------------


def cycle_cost(collectors: Sequence[Any], containers: Sequence[Container], cycles: int = 3) -> tuple[float, dict[str, float]]:
    """Median CPU time of a steady-state cycle (after a warm-up cycle that builds state); every
    collector of a cycle gets the same time, as in the agent's loop."""
    up = [c for c in collectors if c.status().up]
    now = time.time()
    for c in up:
        c.collect(containers, now)
    samples: list[float] = []
    by: dict[str, list[float]] = {c.name: [] for c in up}
    for _ in range(cycles):
        total = 0.0
        now = time.time()
        for c in up:
            t0 = time.thread_time()
            c.collect(containers, now)
            dt = time.thread_time() - t0
            by[c.name].append(dt)
            total += dt
        samples.append(total)
    return _median(samples), {k: round(_median(v), 6) for k, v in by.items()}


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return round(s[len(s) // 2], 6) if s else 0.0


def _events_note(collectors: Sequence[Any]) -> list[str]:
    for c in collectors:
        if c.name == "perf":
            return [e["name"] for e in c.status().detail.get("events", [])]
    return []


@contextmanager
def sleeping_cgroups(fs: Cgroupfs, n: int) -> Iterator[list[Container]]:
    """N cgroups under one parent, each with one `sleep` (cheap: one fork+exec per cgroup), in
    every hierarchy a container has one in (CONTROLLERS and the unified one)."""
    parent = f"{PREFIX}-{os.getpid()}-{n}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fs.create(parent, CONTROLLERS)
        containers = []
        for i in range(n):
            rel = f"{parent}/c{i}"
            fs.create(rel, CONTROLLERS)
            procs.append(subprocess.Popen(["sleep", "3600"], preexec_fn=_attach(fs, rel)))
            containers.append(Container(id=f"c{i}", name=f"c{i}", cgroup=rel))
        yield containers
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        fs.remove(parent)


def _attach(fs: Cgroupfs, rel: str) -> Any:
    return lambda: fs.attach(rel, os.getpid())
