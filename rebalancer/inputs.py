"""Planner inputs: the metrics the cost model uses, smoothed, with missing signals made harmless.

Each metric is an EWMA over cycles (kept in PlannerState). A metric a collector did not report
is absent, never zero-by-accident: an absent LLC miss rate means "no LLC signal", which the cost
model turns into "no LLC benefit", not into an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from perfbalance.avx512 import avx512_heavy
from perfbalance.model import ContainerSample, Snapshot
from perfbalance.hints import HintKeys, avx512_hint
from rebalancer.config import RebalancerConfig
from rebalancer.health import HEALTH_METRICS
from rebalancer.state import frozen_map

USED_METRICS = (
    "cpu_usage_cores", "avx512_heavy", "avx512_active_ratio", "llc_misses_per_second",
    "llc_mpki", "llc_occupancy_bytes", "memory_bandwidth_bytes_per_second",
    "instructions_per_second", "ipc", "memory_bytes", *HEALTH_METRICS,
)


class View(NamedTuple):
    """One container as the cost model sees it (smoothed; units as in docs/cost-model.md).

    A NamedTuple rather than a frozen dataclass: the planner builds one per container per cycle
    (1000s), and tuple construction is several times cheaper; it is just as immutable.
    """

    id: str
    usage: float  # CPU-seconds per second
    request_mcpu: int
    heavy: bool  # AVX-512-heavy
    misses: float  # LLC misses per second (0: unknown)
    mpki: float
    occupancy: float | None  # LLC bytes (None: no resctrl)
    bandwidth: float  # memory bytes per second (0: unknown)
    memory_bytes: int
    ips_per_core: float | None  # instructions per CPU-second (None: no PMU)
    exclusive: bool
    rdt_class: str
    cpuset: frozenset[int]
    mems: frozenset[int]
    sandbox_pod: str = ""  # pod key (Container.pod_key) when it runs in a VM sandbox


_BW = View._fields.index("bandwidth")


def with_bandwidth(v: View, bandwidth: float) -> View:
    """v._replace(bandwidth=...) without its keyword machinery (a thousand per cycle)."""
    return View._make((*v[:_BW], bandwidth, *v[_BW + 1:]))


_SORTED_METRICS = tuple(sorted(USED_METRICS))  # a smoothed mapping is in key order (frozen_map)


def ewma(old: Mapping[str, float] | None, new: Mapping[str, float], alpha: float,
         names: dict[tuple[str, ...], list[str]] | None = None) -> dict[str, float]:
    """Smooth every used metric present now; keep nothing for metrics that vanished. In key
    order, as frozen_map would sort it. `names`: a memo for `_present` (one per call)."""
    present = _present(new, {} if names is None else names)
    if not old:
        return {name: float(new[name]) for name in present}
    out: dict[str, float] = {}
    for name in present:
        x = float(new[name])
        prev = old.get(name)
        out[name] = x if prev is None or prev == x else prev + alpha * (x - prev)
    return out


def smooth(snapshot: Snapshot, previous: Mapping[str, Mapping[str, float]],
           alpha: float, *, avx512_key: str = "") -> Mapping[str, Mapping[str, float]]:
    keys = HintKeys(avx512=avx512_key) if avx512_key else None
    out = {}
    names: dict[tuple[str, ...], list[str]] = {}  # the containers' metrics mostly share their names
    for s in snapshot.containers:
        prev = previous.get(s.id)
        new = _hinted(s, prev, keys)
        # ewma's dict is already in key order: frozen_map's sort would change nothing
        out[s.id] = MappingProxyType(ewma(prev, new, alpha, names))
    return frozen_map(out)


def _present(new: Mapping[str, float], memo: dict[tuple[str, ...], list[str]]) -> list[str]:
    """The used metrics `new` has, in key order; remembered by its names for one call."""
    key = tuple(new)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = [name for name in _SORTED_METRICS if name in new]
    return hit


def _hinted(s: ContainerSample, prev: Mapping[str, float] | None, keys: HintKeys | None) -> Mapping[str, float]:
    """The metrics with an AVX-512 annotation applied: a container annotated heavy counts as fully
    heavy in its first window (no measurement yet to smooth), and whenever no AVX-512 signal is
    measured at all; otherwise the measurement is smoothed from there and takes over."""
    if keys is None or not s.container.annotations or avx512_hint(s.container, keys) is not True:
        return s.metrics
    if prev is None or "avx512_heavy" not in s.metrics:
        return {**s.metrics, "avx512_heavy": 1.0}
    return s.metrics


def view(sample: ContainerSample, m: Mapping[str, float], config: RebalancerConfig,
         sandbox_pod: str = "") -> View:
    c = sample.container
    get = m.get
    # `x if x > 0.0 else 0.0` is max(0.0, x) (max keeps the first unless the second is larger),
    # without a builtin call per field (1000s per cycle)
    usage = get("cpu_usage_cores", 0.0)
    usage = usage if usage > 0.0 else 0.0
    misses = get("llc_misses_per_second", 0.0)
    misses = misses if misses > 0.0 else 0.0
    mpki = get("llc_mpki", 0.0)
    bandwidth = get("memory_bandwidth_bytes_per_second", 0.0)  # measured or estimated when the snapshot was built
    ips = get("instructions_per_second")
    request, memory = c.request_mcpu, get("memory_bytes", 0.0)
    # tuple.__new__: View._make without its length check (the fields in order, as below)
    return _new_view(View, (
        c.id, usage, request if request > 0 else 0,
        avx512_heavy(m, config.avx512_heavy_threshold),
        misses, mpki if mpki > 0.0 else 0.0, get("llc_occupancy_bytes"), bandwidth if bandwidth > 0.0 else 0.0,
        int(memory if memory > c.memory_bytes else c.memory_bytes),
        ips / usage if ips is not None and usage > 0.01 else None,
        c.exclusive, c.rdt_class, c.cpuset.ids, c.mems.ids, sandbox_pod,
    ))


_new_view = tuple.__new__
