"""Synthetic cycle reports for the ops tests, built from the real value types.

A node of 4 cores x 2 threads (siblings i and i+4): an AVX-512-heavy trainer on CPUs 0-1, a web
server on their SMT siblings 4-5 (so fully contaminated), and a memory-hungry database on 2-3,6-7.
"""

from __future__ import annotations

from typing import Any

from agent.export import selfmem
from agent.export.report import AgentState, Applied, CycleReport, Realized, reason_code
from agent.snapshot.derive import derive
from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, CollectorStatus, Container, ContainerSample, Plan, Snapshot
from perfbalance.topology import synthetic

T0 = 1_700_000_000.0
MOVE_REASON = "avx512_isolation: web/frontend/nginx shares cores 0-1 with ml/trainer/train"


def container(cid: str, ns: str, pod: str, name: str, cpus: str, cls: str = "", **kw: object) -> Container:
    return Container(id=cid, name=name, namespace=ns, pod=pod, pod_uid=f"uid-{cid}",
                     cgroup=f"kubepods/burstable/pod-uid-{cid}/{cid}", qos="burstable",
                     cpuset=CpuSet.parse(cpus), rdt_class=cls, **kw)  # type: ignore[arg-type]


TRAINER = ContainerSample(container=container("c-train", "ml", "trainer-0", "train", "0-1", "batch"), metrics={
    "cpu_usage_cores": 1.9, "cpu_seconds_total": 1200.5, "avx512_active_ratio": 0.62, "evex256_ratio": 0.3,
    "avx512_heavy": 1.0, "instructions_total": 9.1e12, "cycles_total": 8.0e12, "llc_misses_total": 3.3e9,
    "ipc": 1.1, "llc_mpki": 0.4, "memory_bandwidth_bytes_per_second": 1.0e9, "mbm_total_bytes_total": 4.0e12,
    "llc_occupancy_bytes": 8 << 20})
WEB_MEASURED = {  # what the collectors report; the Snapshot carries it with the derived values
    "cpu_usage_cores": 0.7, "cpu_seconds_total": 300.25, "avx512_active_ratio": 0.0, "evex256_ratio": 0.9,
    "avx512_heavy": 0.0, "instructions_per_second": 2.0e9, "cycles_per_second": 2.5e9,
    "llc_misses_per_second": 4.0e6}
WEB = ContainerSample(container=container("c-web", "web", "frontend-7d9f", "nginx", "4-5"), metrics=derive(WEB_MEASURED))
DB = ContainerSample(container=container("c-db", "db", "postgres-0", "pg", "2-3,6-7", "lc"), metrics={
    "cpu_usage_cores": 3.1, "cpu_seconds_total": 5000.0, "avx512_active_ratio": 0.01, "ipc": 0.6,
    "llc_mpki": 12.5, "memory_bandwidth_bytes_per_second": 9.0e9, "mbm_total_bytes_total": 7.5e13,
    "mbm_local_bytes_total": 7.0e13, "llc_occupancy_bytes": 20 << 20, "llc_references_total": 4.0e11,
    "cpu_throttled_ratio": 0.05, "cpu_throttled_seconds_total": 12.0, "psi_cpu_some": 0.02,
    "psi_memory_some": 0.01, "memory_bytes": 8 << 30, "runqueue_wait_seconds_per_second": 0.03,
    "runqueue_latency_p50_seconds": 2e-5, "runqueue_latency_p99_seconds": 4e-3,
    "runqueue_latency_mean_seconds": 1e-4})


def snapshot(samples: tuple[ContainerSample, ...] = (TRAINER, WEB, DB), *, cycle: int = 7,
             node_metrics: dict[str, float] | None = None) -> Snapshot:
    return Snapshot(time=T0 + cycle * 10, window=10.0, node="node-a", cycle=cycle,
                    topology=synthetic(packages=1, cores_per_node=4, threads_per_core=2),
                    containers=samples,
                    collectors={"cgroup": CollectorStatus(up=True), "pmu": CollectorStatus(up=False, reason="no PMU")},
                    node_metrics=node_metrics if node_metrics is not None else {
                        "resctrl_closids_free": 3.0, "resctrl_closids_total": 16.0,
                        "resctrl_rmids_free": 200.0, "resctrl_rmids_total": 256.0})


MOVE = Action(kind="cpuset", container="c-web", frm="4-5", to="2-3", reason=MOVE_REASON,
              benefit=0.35, cost=0.05, victims=("c-web",))


def applied(action: Action = MOVE, *, event_id: str = "ev-1", time: float = T0 + 70) -> Applied:
    return Applied(event_id=event_id, kind=action.kind, container=action.container, frm=action.frm,
                   to=action.to, reason=action.reason, ok=True, predicted_benefit=action.benefit,
                   predicted_cost=action.cost, time=time)


def report(samples: tuple[ContainerSample, ...] = (TRAINER, WEB, DB), *, cycle: int = 7,
           with_move: bool = True) -> CycleReport:
    snap = snapshot(samples, cycle=cycle)
    plan = Plan(time=snap.time, actions=(MOVE,) if with_move else ())
    return CycleReport(cycle=cycle, time=snap.time, snapshot=snap, plan=plan,
                       applied=(applied(),) if with_move else (), plan_seconds=0.004,
                       collect_seconds=0.12,
                       actuation={"path": "cgroupfs", "connected": False, "mode": "auto", "sessions": 0,
                                  "reason": "cannot connect to /var/run/nri/nri.sock: No such file or directory"})


def state(rep: CycleReport | None = None) -> AgentState:
    """An AgentState as the loop would leave it after the move of `report()`."""
    st = AgentState(node="node-a")
    st.publish(rep if rep is not None else report())
    st.moves_total[("cpuset", reason_code(MOVE_REASON))] += 1
    st.realized.append(Realized(event_id="ev-1", container="c-web", predicted=0.3, realized=0.27,
                                rolled_back=False))
    st.config_reloads_total["ok"] += 1
    st.config_loaded_time = T0
    return st


def hold_memory(monkeypatch: Any) -> None:
    """The agent's own memory (agent/export/selfmem.py) is read at each render and moves between
    two; tests that compare two renders hold it at one reading."""
    mem = selfmem.read()
    monkeypatch.setattr(selfmem, "read", lambda: mem)
