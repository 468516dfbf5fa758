"""Builders for planner tests: small synthetic nodes and snapshots."""

from __future__ import annotations

from collections.abc import Mapping

from perfbalance.cpuset import CpuSet
from perfbalance.model import Container, ContainerSample, KubeletState, Snapshot
from perfbalance.topology import Topology, synthetic

SKYLAKE = "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"


def topo(cores: int = 4, threads: int = 2, packages: int = 1, l3: int = 1, model: str = SKYLAKE) -> Topology:
    return synthetic(packages=packages, cores_per_node=cores, threads_per_core=threads,
                     l3_per_package=l3, cpu_model=model)


def sample(cid: str, cpus: str, *, request: int = 0, exclusive: bool = False, pod_uid: str = "",
           mems: str = "", rdt: str = "", sandbox: str = "", limit: int | None = None,
           **metrics: float) -> ContainerSample:
    return ContainerSample(
        container=Container(id=cid, name=cid, pod_uid=pod_uid or f"pod-{cid}", cgroup=f"test/{cid}",
                            cpuset=CpuSet.parse(cpus), mems=CpuSet.parse(mems), request_mcpu=request,
                            limit_mcpu=limit, exclusive=exclusive, rdt_class=rdt, sandbox=sandbox),
        metrics=metrics)


def snap(t: Topology, *samples: ContainerSample, reserved: str = "", time: float = 1000.0,
         exclusive: Mapping[tuple[str, str], str] | None = None, **kw: object) -> Snapshot:
    kubelet = KubeletState(policy="static" if exclusive else "none",
                           exclusive={k: CpuSet.parse(v) for k, v in (exclusive or {}).items()})
    return Snapshot(time=time, window=10.0, node="test", topology=t, containers=tuple(samples),
                    reserved=CpuSet.parse(reserved), kubelet=kubelet, **kw)  # type: ignore[arg-type]


def avx_vs_scalar(t: Topology | None = None, pool: str = "0-7", **kw: object) -> Snapshot:
    t = t or topo()
    return snap(t, sample("avx", pool, request=1000, cpu_usage_cores=1.5, avx512_heavy=1.0),
                sample("web-a", pool, request=500, cpu_usage_cores=1.0),
                sample("web-b", pool, request=500, cpu_usage_cores=1.0), **kw)

