"""Load: the real agent (`perfbalance run`, 1 s interval) under container churn on real cgroups.

The issue's figure: 1000 containers with 50 created and 50 destroyed per second for 60 s, what
this runs; PB_CHURN_SECONDS=N churns for N s instead (at least 40; figures in docs/benchmarks.md,
"## churn").

One module-scoped run, several assertions on it:
- no crash: the agent runs throughout, keeps cycling, exits 0 on SIGTERM, no collector crashed;
- no leaked fds, BPF hash-map entries, or metric series once the containers are gone (compared
  with the agent's own figures before any container existed);
- no leaked cgroups (the prefix is gone from every hierarchy after cleanup);
- no memory leak: the agent's heap in use (glibc's and CPython's, from its own metrics) is flat
  during churn, and RSS stays within bounds (see HEAP_SLOPE_BOUND_KIB_PER_S for why not RSS's slope).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from churn import (Churn, HeapSample, ProcSample, dead_keys, hash_map_entries, heap_sample, keys_among, proc_sample,
                   robust_slope, scrape, series_total, series_with)
from perfbalance.cgroupfs import Cgroupfs

REPO = Path(__file__).resolve().parents[2]
PERFBALANCE = str(REPO / ".venv" / "bin" / "perfbalance")
CONTAINERS = 1000
RATE = 50  # created and destroyed per second
CHURN_SECONDS = int(os.environ.get("PB_CHURN_SECONDS", 60))
# Leaks are judged by what the allocators hold in use, RSS only by a bound. Measured over 180 s of
# churn (docs/benchmarks.md "## churn"): anonymous RSS climbs in steps of 1-2 MiB to a plateau
# 6-8 MiB up after about 60 s, while glibc's heap in use stays within 0.1 MiB and CPython's object
# blocks within 1 %: the ~40 MiB of heap freed after the BPF compiles (trimmed, so not resident)
# fault back in as allocations reuse them. An RSS slope over 15 s of churn measured that warm-up
# (-39 to 284 KiB/s from run to run, with the code unchanged), so it judged noise. The heap's in-use
# figures have a bounded warm-up of their own (10-25 KiB/s for the first 30-40 s of churn, then
# under 1 KiB/s), so they are judged after SETTLE_SECONDS. The slopes are Theil-Sen (robust to one
# sample taken before a cycle's report replaced the one before).
HEAP_SLOPE_BOUND_KIB_PER_S = 50.0  # 1 KiB of malloc per created container (see the runs in docs)
BLOCKS_SLOPE_BOUND_PER_S = 1000.0  # 20 object blocks per created container
RSS_GROWTH_BOUND_KIB = 16 << 10  # anonymous RSS, end of churn over before it: the plateau, twice
RSS_BOUND_KIB = 120 << 10  # issue #16's memory goal at 1000 containers
SETTLE_SECONDS = 30
SLACK_FDS = 8  # sockets of a scrape in flight, a log file rotation
SLACK_MAP_ENTRIES = 16  # cgroups of other helpers' processes that ran meanwhile

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.slow]


@dataclass
class Run:
    prefix: str
    baseline: ProcSample | None = None
    baseline_maps: dict[int, int] = field(default_factory=dict)
    baseline_series: int = 0
    warm: list[ProcSample] = field(default_factory=list)  # at 1000 containers, before churn
    during: list[ProcSample] = field(default_factory=list)
    heap: list[HeapSample] = field(default_factory=list)  # the agent's allocators, each churn second
    after: ProcSample | None = None
    after_maps: dict[int, int] = field(default_factory=dict)
    after_dead: dict[int, int] = field(default_factory=dict)  # entries naming vanished cgroups
    later_dead: dict[int, int] = field(default_factory=dict)  # the same, 10 cycles later
    ours_after: dict[int, int] = field(default_factory=dict)  # keys of our (all gone) containers
    peak_maps: dict[int, int] = field(default_factory=dict)
    series_per_container: float = 0.0
    series_peak: int = 0
    after_series: int = 0
    after_ours: int = 0
    cycles_before_churn: int = 0
    cycles_after_churn: int = 0
    alive_after_churn: bool = False
    exit_code: int | None = None
    leftover: list[str] = field(default_factory=list)
    lines: list[dict] = field(default_factory=list)
    created: int = 0
    destroyed: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cycles(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the last line may be cut by SIGTERM
    return out


def _wait_cycles(path: Path, n: int, timeout: float) -> int:
    """Wait until the agent printed `n` more cycle lines; returns the cycle count seen."""
    start = len(_cycles(path))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = len(_cycles(path))
        if seen >= start + n:
            return seen
        time.sleep(0.5)
    raise AssertionError(f"agent printed {len(_cycles(path)) - start} of {n} cycles in {timeout} s")


def _start_agent(tmp: Path, prefix: str, port: int) -> subprocess.Popen[bytes]:
    cfg = {"agent": {"run_dir": str(tmp / "run"), "log_format": "text"},
           "discovery": {"kubernetes": False, "globs": [f"{prefix}/*"]},
           "metrics": {"listen": f"127.0.0.1:{port}"}}
    (tmp / "config.yaml").write_text(yaml.safe_dump(cfg))
    return subprocess.Popen([PERFBALANCE, "run", "--config", str(tmp / "config.yaml"), "--interval", "1", "--json"],
                            stdout=open(tmp / "cycles.jsonl", "wb"), stderr=open(tmp / "agent.log", "wb"),
                            cwd=str(REPO))


def _churn_for(ch: Churn, seconds: int, run: Run, pid: int, metrics: str) -> None:
    """RATE destroyed + RATE created each second, on a fixed schedule (no catching up)."""
    start = time.monotonic()
    for i in range(seconds):
        ch.step(RATE, RATE)
        run.during.append(proc_sample(pid))
        run.heap.append(heap_sample(scrape(metrics)))
        delay = start + i + 1 - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _maps_max(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b)}


@pytest.fixture(scope="module")
def churn_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("churn")
    prefix = f"pbtest-churn-{os.getpid()}"
    port = _free_port()
    run = Run(prefix=prefix)
    cgfs = Cgroupfs(root="/sys/fs/cgroup")
    ch = Churn(cgfs, prefix)
    agent = _start_agent(tmp, prefix, port)
    metrics = f"http://127.0.0.1:{port}/metrics"
    cycles = tmp / "cycles.jsonl"
    try:
        _wait_cycles(cycles, 3, 120)
        run.baseline, run.baseline_maps = proc_sample(agent.pid), hash_map_entries(agent.pid)
        run.baseline_series = series_total(scrape(metrics))
        ch.create(CONTAINERS)
        _wait_cycles(cycles, 5, 300)  # the fd cache and BPF maps fill, allocator warms up
        for _ in range(5):
            run.warm.append(proc_sample(agent.pid))
            time.sleep(1)
        text = scrape(metrics)
        run.series_per_container = series_with(text, 'container="c') / CONTAINERS
        run.cycles_before_churn = len(_cycles(cycles))
        _churn_for(ch, CHURN_SECONDS, run, agent.pid, metrics)
        run.peak_maps = hash_map_entries(agent.pid)
        run.series_peak = series_with(scrape(metrics), 'container="c')
        run.cycles_after_churn = len(_cycles(cycles))
        run.alive_after_churn = agent.poll() is None
        run.created, run.destroyed = ch.created, ch.destroyed
        ch.destroy(len(ch.live))
        _wait_cycles(cycles, 4, 300)  # let discovery notice and collectors prune
        run.after, run.after_maps = proc_sample(agent.pid), hash_map_entries(agent.pid)
        run.after_dead = dead_keys(agent.pid, cgfs.hierarchy(None).path)
        text = scrape(metrics)
        run.after_series, run.after_ours = series_total(text), series_with(text, 'container="c')
        _wait_cycles(cycles, 10, 300)
        run.later_dead = dead_keys(agent.pid, cgfs.hierarchy(None).path)
        run.ours_after = keys_among(agent.pid, ch.ids)
        agent.send_signal(signal.SIGTERM)
        run.exit_code = agent.wait(timeout=60)
        run.lines = _cycles(cycles)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)
        ch.close()
        run.leftover = ch.leftover_cgroups()
    _report(run, tmp)
    yield run


def _report(run: Run, tmp: Path) -> None:
    """Figures for docs/benchmarks.md (printed with -s; also left in the temp dir)."""
    durations = [b["time"] - a["time"] for a, b in zip(run.lines, run.lines[1:])]
    warm = statistics.median(s.rss_kib for s in run.warm)
    doc = {
        "containers": CONTAINERS, "rate_per_second": RATE, "churn_seconds": CHURN_SECONDS,
        "created": run.created, "destroyed": run.destroyed, "cycles": len(run.lines),
        "cycle_seconds_median": statistics.median(durations) if durations else None,
        "cycle_seconds_max": max(durations) if durations else None,
        "fds": {"baseline": run.baseline.fds if run.baseline else None,
                "at_1000": run.warm[-1].fds, "after": run.after.fds if run.after else None},
        "rss_kib": {"baseline": run.baseline.rss_kib if run.baseline else None, "warm_median": warm,
                    "churn_first": run.during[0].rss_kib, "churn_last": run.during[-1].rss_kib,
                    "anon_growth_kib": _anon_growth(run), "after": run.after.rss_kib if run.after else None,
                    "anon_each_churn_second": [s.anon_kib for s in run.during]},
        "heap": {"malloc_inuse_slope_kib_per_s": round(_heap_slope(run, "malloc_inuse_kib"), 1),
                 "python_blocks_slope_per_s": round(_heap_slope(run, "python_blocks"), 1),
                 "malloc_inuse_kib_each_churn_second": [round(h.malloc_inuse_kib) for h in run.heap],
                 "python_blocks_each_churn_second": [int(h.python_blocks) for h in run.heap]},
        "bpf_hash_entries": {"baseline": run.baseline_maps, "peak": run.peak_maps, "after": run.after_maps,
                             "after_dead": run.after_dead, "later_dead": run.later_dead,
                             "ours_after": run.ours_after},
        "series": {"baseline": run.baseline_series, "per_container": run.series_per_container,
                   "ours_at_end_of_churn": run.series_peak, "after_total": run.after_series,
                   "ours_after": run.after_ours},
        "errors_during_run": sum(len(line["errors"]) for line in run.lines),
        "exit_code": run.exit_code,
    }
    (tmp / "churn-result.json").write_text(json.dumps(doc, indent=1))
    print("churn result:", json.dumps(doc, indent=1))


def _anon_growth(run: Run) -> int:
    """KiB: median anonymous RSS of the last 5 churn samples minus its median at 1000 containers before churn."""
    return int(statistics.median(s.anon_kib for s in run.during[-5:]) -
               statistics.median(s.anon_kib for s in run.warm))


def _heap_slope(run: Run, field: str) -> float:
    """Per second: Theil-Sen slope of one heap figure over the churn after SETTLE_SECONDS."""
    pts = run.heap[SETTLE_SECONDS:]
    return robust_slope([p.time for p in pts], [float(getattr(p, field)) for p in pts])


pytestmark.append(pytest.mark.timeout(600 + 2 * CHURN_SECONDS))


def test_agent_survives_churn_and_stops_cleanly(churn_run: Run) -> None:
    assert churn_run.alive_after_churn
    assert churn_run.cycles_after_churn > churn_run.cycles_before_churn + 2  # it kept cycling
    assert churn_run.exit_code == 0


def test_no_collector_crashed_during_churn(churn_run: Run) -> None:
    # parts.collect turns a collector exception into "collector <name>: <Type>: ..." errors;
    # a container vanishing between discovery and a read is normal and not reported that way.
    crashed = [e for line in churn_run.lines for e in line["errors"] if e.startswith("collector ")]
    assert crashed == []


def test_every_collector_stayed_up(churn_run: Run) -> None:
    last = churn_run.lines[-1]["collectors"]
    first = churn_run.lines[0]["collectors"]
    assert {k for k, v in last.items() if v["up"]} == {k for k, v in first.items() if v["up"]}


def test_no_leaked_file_descriptors(churn_run: Run) -> None:
    assert churn_run.baseline is not None and churn_run.after is not None
    assert churn_run.warm[-1].fds > churn_run.baseline.fds  # the fd cache did hold files
    assert churn_run.after.fds <= churn_run.baseline.fds + SLACK_FDS


def test_bpf_map_entries_are_pruned_with_their_containers(churn_run: Run) -> None:
    """Keys of our churned cgroups (all gone at the end): at most the few never discovered.

    Only our cgroups are counted: other processes on the node create and remove cgroups too.
    """
    assert churn_run.ours_after, "the agent holds no BPF hash maps (collectors down?)"
    for map_id, peak in churn_run.peak_maps.items():
        assert peak > churn_run.baseline_maps.get(map_id, 0) + SLACK_MAP_ENTRIES  # they did fill
    bound = churn_run.destroyed // 20  # ~5%: containers created and destroyed between two discoveries
    for map_id, n in churn_run.ours_after.items():
        assert n <= bound, (map_id, n)


def test_no_bpf_map_entry_outlives_its_cgroup(churn_run: Run) -> None:
    assert all(n == 0 for n in churn_run.later_dead.values()), churn_run.later_dead


def test_no_leaked_metric_series(churn_run: Run) -> None:
    assert churn_run.series_per_container > 0  # there were per-container series to leak
    live_max = CONTAINERS + RATE  # a scrape may land between a discovery and the next one
    assert churn_run.series_peak <= live_max * churn_run.series_per_container
    assert churn_run.after_ours == 0
    assert churn_run.after_series <= churn_run.baseline_series + 10


def test_no_leaked_cgroups(churn_run: Run) -> None:
    assert churn_run.created == CONTAINERS + RATE * CHURN_SECONDS
    assert churn_run.leftover == []


def test_heap_in_use_is_flat_under_churn(churn_run: Run) -> None:
    assert len(churn_run.heap) >= SETTLE_SECONDS + 10
    assert churn_run.heap[0].malloc_inuse_kib > 0 and churn_run.heap[0].python_blocks > 0  # it measured
    assert _heap_slope(churn_run, "malloc_inuse_kib") < HEAP_SLOPE_BOUND_KIB_PER_S
    assert _heap_slope(churn_run, "python_blocks") < BLOCKS_SLOPE_BOUND_PER_S


def test_rss_stays_within_its_bounds_under_churn(churn_run: Run) -> None:
    assert _anon_growth(churn_run) < RSS_GROWTH_BOUND_KIB
    assert max(s.rss_kib for s in churn_run.during) < RSS_BOUND_KIB
