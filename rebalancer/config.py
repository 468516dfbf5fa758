"""Configuration of the planner (the `rebalancer:` section). Pure data, no I/O.

Every constant of the cost model (docs/cost-model.md) is a setting here, so that a node with a
different CPU, memory system or tolerance for moves is tuned in YAML, not in code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfbalance.hints import HintKeys
from perfbalance.names import name_problem
from perfbalance.settings import setting

# Expected core-frequency loss while a core holds an AVX-512 license, by CPU model name (matched
# as a case-insensitive substring of topology.cpu_model, longest key first). Travis Downs 2020:
# Skylake-SP L2 = 62-91% of L0; Cascade Lake a little better; Ice Lake server and Sapphire
# Rapids lose little; client Ice/Tiger/Rocket Lake and AMD Zen 4 have no license at all.
DEFAULT_LICENSE_LOSS: Mapping[str, float] = {
    "Xeon(R) Gold 51": 0.25, "Xeon(R) Silver 41": 0.25, "Xeon(R) Bronze 31": 0.25,
    "Xeon(R) Gold 61": 0.20, "Xeon(R) Platinum 81": 0.20, "Xeon(R) W-21": 0.20,
    "Core(TM) i9-79": 0.20, "Core(TM) i7-78": 0.20,
    "Xeon(R) Gold 52": 0.15, "Xeon(R) Gold 62": 0.15, "Xeon(R) Platinum 82": 0.15,
    "Xeon(R) Silver 42": 0.15,
    "Xeon(R) Gold 63": 0.05, "Xeon(R) Platinum 83": 0.05, "Xeon(R) Silver 43": 0.05,
    "Xeon(R) Gold 64": 0.03, "Xeon(R) Platinum 84": 0.03, "Xeon(R) Gold 65": 0.03,
    "Core(TM) i7-10": 0.0, "Core(TM) i7-11": 0.0, "Core(TM) i9-11": 0.0, "Core(TM) i5-11": 0.0,
    "AMD": 0.0,
}


@dataclass(frozen=True, kw_only=True)
class RebalancerConfig:
    enabled: bool = setting(True, "Plan moves at all (false: collect and report only).")
    policy: str = setting("costmodel", "The planner: a policy registered under the Python entry-point group perfbalance.policies (built in: costmodel, spread; docs/policies.md). The other keys of this section are the costmodel's settings.", check=lambda v: None if v.strip() else "must name a policy")
    policies: Mapping[str, Mapping[str, Any]] = setting(factory=dict, doc="Settings of the other policies, by policy name (e.g. policies: {spread: {tolerance_cores: 1.0}}); each is validated against the policy's own settings when the config is loaded.")
    policy_budget_seconds: float = setting(2.0, "Time one planning call may take; a policy that runs longer (or raises) is reported, its state kept from its last good call, and the cycle makes no moves.", min=0.01, max=600)
    margin: float = setting(0.02, "A move is made only when benefit - amortized cost exceeds this many core-seconds per second.", min=0.0)
    dwell_seconds: float = setting(60.0, "Minimum time a container stays where it was put before it may move again.", min=0.0)
    cooldown_seconds: float = setting(300.0, "After a rollback, the containers involved are left alone this long.", min=0.0)
    max_moves_per_cycle: int = setting(2, "Cap on move decisions per cycle (one decision may move several containers, e.g. an AVX-512 island and the containers it evicts).", min=0)
    max_actions_per_cycle: int = setting(1024, "Cap on container actions per cycle; a decision needing more is skipped.", min=1)
    smoothing_alpha: float = setting(0.5, "Weight of the newest window in the EWMA of every planner input.", min=0.01, max=1.0)
    amortize_seconds: float = setting(60.0, "One-time move costs (core-seconds) are spread over this many seconds to compare with benefits (core-seconds per second).", min=1.0)
    # AVX-512
    avx512_heavy_threshold: float = setting(0.5, "Smoothed avx512_heavy above which a container is treated as AVX-512-heavy.", min=0.0, max=1.0)
    avx512_license_loss: Mapping[str, float] = setting(factory=lambda: dict(DEFAULT_LICENSE_LOSS), doc="Frequency loss (0..1) while a core holds an AVX-512 license, by substring of the CPU model name (longest match wins).")
    avx512_default_loss: float = setting(0.10, "Frequency loss for CPU models not in the table.", min=0.0, max=1.0)
    avx512_annotation: str = setting("perfbalance.io/avx512", "Pod annotation ('true'/'false'; '<key>.container.<name>' for one container) that pre-classifies a container as AVX-512-heavy from its first cycle; measurement takes over after the usual smoothing.")
    affinity_annotation: str = setting("perfbalance.io/affinity", "Pod annotation listing containers to keep on the same core/L3/NUMA node, e.g. 'app=web@l3*0.2' (docs/classes.md).")
    anti_affinity_annotation: str = setting("perfbalance.io/anti-affinity", "Pod annotation listing containers to keep apart, e.g. 'app=db@numa*0.5; container=cache@core!' ('!': hard).")
    island_headroom: float = setting(0.0, "Extra CPU capacity, as a fraction of smoothed usage, given to a container the allocator places (AVX-512 islands, relocations).", min=0.0, max=4.0)
    size_tolerance_cores: float = setting(0.10, "Usage this close above a whole CPU does not round up to one more CPU (a busy loop measured at 1.03 cores needs 1 CPU).", min=0.0, max=1.0)
    # SMT
    smt_speed: float = setting(0.6, "Throughput of one SMT thread, as a fraction of its physical core's, while its sibling thread is busy too (0.6: two busy siblings deliver 1.2 cores of work; 1.0: every hyperthread counts as a full CPU). The cost model charges the rest as lost CPU time, so it prefers separate physical cores for busy containers while idle ones exist.", min=0.05, max=1.0)
    # LLC
    llc_alpha: float = setting(0.5, "Exponent of the miss-rate curve M(C) = M0 (C/C0)^-alpha (the sqrt-2 rule).", min=0.0, max=2.0)
    llc_aggressor_misses_per_second: float = setting(5e6, "Smoothed LLC misses per second above which a container is a cache aggressor.", min=0.0)
    llc_aggressor_mpki: float = setting(10.0, "... and smoothed LLC MPKI above this (streaming code misses whatever its cache share).", min=0.0)
    llc_aggressor_occupancy_fraction: float = setting(0.25, "... and (when resctrl reports it) LLC occupancy above this fraction of an L3 domain.", min=0.0, max=1.0)
    llc_victim_mpki: float = setting(1.0, "Smoothed LLC MPKI above which a non-aggressor is cache-sensitive.", min=0.0)
    llc_max_gain: float = setting(16.0, "Cap on the predicted cache-share ratio after a move (working sets are unknown).", min=1.0)
    rdt_aggressor_class: str = setting("", "RDT class for cache aggressors (empty: never change RDT classes); one of the resctrl classes when any are configured.", check=lambda v: name_problem(v) if v else None)
    rdt_aggressor_fraction: float = setting(0.2, "Fraction of an L3 domain the aggressor class may fill.", min=0.0, max=1.0)
    # memory
    memory_latency_seconds: float = setting(90e-9, "Idle memory latency.", min=0.0)
    memory_parallelism: float = setting(2.0, "Average outstanding misses per stalled core (MLP).", min=0.1)
    memory_bandwidth_per_node: float = setting(60e9, "Sustainable memory bandwidth of one NUMA node, bytes per second.", min=1.0)
    memory_bandwidth_per_node_overrides: Mapping[int, float] = setting(factory=dict, doc="Per-NUMA-node sustainable bandwidth, bytes per second, overriding the default.")
    bandwidth_knee_low: float = setting(0.4, "Utilization up to which loaded latency stays at the idle latency.", min=0.0, max=1.0)
    bandwidth_knee_high: float = setting(0.8, "Utilization where loaded latency reaches 1.5x idle; it rises 5x idle per unit beyond.", min=0.0, max=1.0)
    # move costs
    refill_bandwidth: float = setting(10e9, "Bytes per second at which a moved container refills its LLC footprint.", min=1.0)
    migration_bandwidth: float = setting(2e9, "Bytes per second at which the kernel migrates memory when cpuset.mems changes.", min=1.0)
    disruption_core_seconds: float = setting(0.01, "Fixed cost of any move (cold L1/L2, scheduler churn), core-seconds.", min=0.0)
    # VM sandboxes (Kata, KubeVirt)
    vm_overhead_mcpu: int = setting(0, "VMM overhead, in milli-CPU, added to a VM-sandboxed pod's CPU limits when sizing its vCPUs for the capacity constraint (the same meaning as vm.vmm_overhead_mcpu; keep the two equal).", min=0)
    # evaluation after a move
    settle_seconds: float = setting(30.0, "Time after a move before the victims' measured gain is compared with the prediction.", min=0.0)
    rollback_fraction: float = setting(0.25, "A move judged by the model or the PMU (not by measured victim health) is rolled back when the realized gain is below this fraction of the predicted gain; one judged by measured health and helping less than this is kept, the shortfall noted, when its measured drop is at least `health_clear_bands` noise bands.", min=0.0, max=1.0)
    # victim health and latency targets (rebalancer/health.py, rebalancer/latency.py)
    latency_targets: Mapping[str, float] = setting(factory=dict, doc="Latency-sensitive containers: selector (a glob on namespace/pod/container, or a container id) -> run-queue p99 target in seconds. The pod annotation perfbalance.io/runqueue-p99-target (e.g. 2ms) wins over these.")
    latency_sensitive_target: float = setting(0.005, "Run-queue p99 target, seconds, of a container annotated perfbalance.io/latency-sensitive: \"true\" without a target of its own.", min=1e-6)
    latency_breach_cost: float = setting(0.05, "Cost, core-seconds per second, of a latency-sensitive container's predicted run-queue p99 at twice its target (linear in p99/target - 1).", min=0.0)
    latency_breach_cap: float = setting(10.0, "Cap on p99/target - 1 in the breach cost.", min=0.0)
    latency_base_load: float = setting(0.05, "Co-runner load (CPUs per CPU) standing for what neither the containers nor the node's busy CPUs show (kernel threads, interrupts): the floor of the run-queue wait model, added to the measured unseen load (busy cores no container accounts for, per CPU).", min=0.001, max=10.0)
    victim_health_threshold: float = setting(0.5, "A container whose measured health score (CPU time got / wanted) is below this, and whose co-runners take more of its CPUs than it does, is a victim the planner relieves, target or not (0: only latency-sensitive containers).", min=0.0, max=1.0)
    health_min_waits: int = setting(20, "Run-queue waits a window needs before its p99 is used.", min=1)
    health_windows: int = setting(8, "Windows of each container's measured wait kept to estimate its window-to-window noise.", min=3, max=100)
    health_noise_sigmas: float = setting(2.0, "Half-width of the noise band around a predicted health change, in standard deviations of the window-to-window variation.", min=0.0)
    health_noise_floor: float = setting(0.002, "Smallest window-to-window noise assumed for a victim's wait, seconds per second.", min=0.0)
    health_clear_bands: float = setting(2.0, "A predicted drop of the victims' health loss at least this many noise bands wide is a clear prediction: if the measurement then shows no drop beyond the band, or only one under this many bands and under `rollback_fraction` of the prediction, the move is rolled back (a narrower prediction with such a measurement is left to the model or PMU check).", min=1.0)

    def hint_keys(self) -> HintKeys:
        return HintKeys(avx512=self.avx512_annotation, affinity=self.affinity_annotation,
                        anti_affinity=self.anti_affinity_annotation)

    def license_loss(self, cpu_model: str) -> float:
        """Frequency loss for `cpu_model`: the longest table key it contains, else the default."""
        model = cpu_model.lower()
        for key in sorted(self.avx512_license_loss, key=lambda k: (-len(k), k)):
            if key.lower() in model:
                return float(self.avx512_license_loss[key])
        return self.avx512_default_loss

    def bandwidth_of(self, node: int) -> float:
        return float(self.memory_bandwidth_per_node_overrides.get(node, self.memory_bandwidth_per_node))
