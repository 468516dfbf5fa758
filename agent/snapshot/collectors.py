"""Which collectors run on this node, built from the configuration.

Order matters only for derived metrics: rates from all collectors are merged per container first,
then `derive()` adds what needs several sources (memory bandwidth estimated from LLC misses when
resctrl MBM is missing, labelled as an estimate).
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.config import Config
from collectors.avx512 import Avx512Collector
from collectors.base import Collector
from perfbalance.cgroupfs import Cgroupfs
from collectors.cgroupstats import CgroupStatsCollector
from collectors.perf import make_collector as make_perf_collector
from collectors.resctrl_mon import with_bandwidth_estimate
from perfbalance.host import HostPaths
from perfbalance.topology import Topology


def make_collectors(config: Config, host: HostPaths, cgfs: Cgroupfs, topology: Topology) -> list[Collector]:
    c = config.collectors
    return [
        CgroupStatsCollector(cgroupfs=cgfs, enabled=c.cgroup_stats),
        Avx512Collector(config=c.avx512, host=host, cgroupfs=cgfs),
        make_perf_collector(config=c.perf, host=host, cgroupfs=cgfs),
    ]


def derive(metrics: Mapping[str, float]) -> dict[str, float]:
    """Metrics computed from several collectors' output for one container."""
    return with_bandwidth_estimate(metrics)
