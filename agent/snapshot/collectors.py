"""Which collectors run on this node, built from the configuration.

Order matters only for derived metrics: rates from all collectors are merged per container first,
then agent/snapshot/derive.py adds what needs several sources (IPC, LLC MPKI, memory bandwidth
estimated from LLC misses when resctrl MBM is missing, bytes per instruction).
"""

from __future__ import annotations

from agent.config import Config
from collectors.avx512 import Avx512Collector
from collectors.base import Collector
from collectors.bpfenv.keys import KeyMaps
from perfbalance.cgroupfs import Cgroupfs
from collectors.cgroupstats import CgroupStatsCollector
from collectors.iostat import IoStatCollector
from collectors.perf import make_collector as make_perf_collector
from collectors.runqlat import RunqlatCollector
from perfbalance.host import HostPaths
from perfbalance.topology import Topology


def make_collectors(config: Config, host: HostPaths, cgfs: Cgroupfs, topology: Topology) -> list[Collector]:
    c = config.collectors
    keys = KeyMaps(cgfs, procfs=host.procfs)  # the BPF collectors walk the cgroups once per cycle
    return [
        CgroupStatsCollector(cgroupfs=cgfs, enabled=c.cgroup_stats),
        IoStatCollector(cgroupfs=cgfs, enabled=c.iostat, sysfs=host.sysfs, v1_accounting=c.iostat_v1_accounting),
        Avx512Collector(config=c.avx512, host=host, cgroupfs=cgfs, keymaps=keys),
        make_perf_collector(config=c.perf, host=host, cgroupfs=cgfs, keymaps=keys),
        RunqlatCollector(config=c.runqlat, host=host, cgroupfs=cgfs, keymaps=keys),
    ]
