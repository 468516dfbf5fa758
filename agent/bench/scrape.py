"""What a `/metrics` scrape costs at 1000 containers, and the agent's memory.

A synthetic report built from the real value types (every container metric the collectors can
fill, 256 CPUs), published into an AgentState like the loop does. Measured in one run, so the two
figures share the machine's load:
- `render`: turning the report into the exposition, which is what every scrape did before
  agent/export/exposition.py and what it now does once per report;
- `served`: a scrape of an already rendered report (the agent's own totals rendered, the
  report's bytes reused), as the HTTP handler serves it.
Memory (`memory`): RSS, PSS and anonymous memory of this process from /proc/self/smaps_rollup.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from agent.export.exposition import Exposition
from agent.export.prometheus import CONTAINER_COUNTERS, CONTAINER_GAUGES
from agent.export.report import AgentState, CycleReport
from agent.snapshot.derive import derive
from perfbalance.cpuset import CpuSet
from perfbalance.model import CollectorStatus, Container, ContainerSample, Plan, Snapshot
from perfbalance.topology import synthetic

QOS = ("guaranteed", "burstable", "besteffort")


def synthetic_report(containers: int = 1000, *, cycle: int = 1) -> CycleReport:
    """A node of 2 x 64 cores x 2 threads with `containers` containers, each with every metric."""
    topo = synthetic(packages=2, nodes_per_package=1, cores_per_node=64, threads_per_core=2)
    cpus = sorted(topo.online)
    samples = []
    for i in range(containers):
        c = Container(id=f"{i:064x}", name=f"c{i % 3}", namespace=f"ns{i % 20}", pod=f"pod-{i // 3}",
                      pod_uid=f"uid-{i // 3}", cgroup=f"kubepods/burstable/poduid-{i // 3}/{i:064x}",
                      qos=QOS[i % 3], cpuset=CpuSet([cpus[(2 * i) % len(cpus)], cpus[(2 * i + 1) % len(cpus)]]))
        metrics = {key: float(i + k) for k, (_, key, _) in enumerate(CONTAINER_COUNTERS + CONTAINER_GAUGES)}
        samples.append(ContainerSample(container=c, metrics=derive(metrics)))
    snap = Snapshot(time=time.time(), window=10.0, node="bench", cycle=cycle, topology=topo,
                    containers=tuple(samples), collectors={"cgroup": CollectorStatus(up=True)})
    return CycleReport(cycle=cycle, time=snap.time, snapshot=snap, plan=Plan(time=snap.time))


def measure_scrape(containers: int = 1000, *, runs: int = 15) -> dict[str, Any]:
    state = AgentState(node="bench")
    exp = Exposition(state)
    render: list[float] = []
    for cycle in range(1, runs + 1):  # a fresh report each time: the once-per-cycle render
        state.publish(synthetic_report(containers, cycle=cycle))
        t0 = time.perf_counter()
        exp.prerender()
        render.append(time.perf_counter() - t0)
    served = []
    for _ in range(runs):
        t0 = time.perf_counter()
        body, _, _ = exp.render()
        served.append(time.perf_counter() - t0)
    packed, _, _ = exp.render("", "gzip")
    return {"containers": containers, "bytes": len(body), "gzip_bytes": len(packed),
            "series": sum(1 for line in body.splitlines() if line and not line.startswith(b"#")),
            "render_ms_median": round(1e3 * statistics.median(render), 2),
            "served_ms_median": round(1e3 * statistics.median(served), 3)}


def memory(procfs: str = "/proc") -> dict[str, int]:
    """RSS, PSS and anonymous bytes of this process (smaps_rollup; {} where the kernel lacks it)."""
    want = {"Rss:": "rss_bytes", "Pss:": "pss_bytes", "Anonymous:": "anonymous_bytes"}
    out: dict[str, int] = {}
    try:
        with open(os.path.join(procfs, "self", "smaps_rollup")) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] in want:
                    out[want[parts[0]]] = int(parts[1]) * 1024
    except OSError:
        return {}
    return out
