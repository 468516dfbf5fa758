"""Derived metrics: the one place IPC, LLC MPKI, the memory bandwidth estimate and bytes per
instruction are computed.

Collectors report what they measure: rates of PMU events, resctrl MBM bandwidth, the AVX-512
collector's hysteresis flag `avx512_heavy`. The agent merges them per container and calls
`derive()` once when it builds the Snapshot, so every reader downstream (planner, exporter,
report, MQTT) reads the same values and none computes them again. `perfbalance plan` calls it on
a saved snapshot too, which may come from an older agent that did not store them.

A derived value is added only when all its inputs are present and nothing measured it already:
resctrl MBM measures bandwidth (`memory_bandwidth_estimated` 0), a saved snapshot keeps the values
it holds. Whether a container is AVX-512-heavy is not derived here: the collector's flag is the
measurement and `perfbalance.avx512.avx512_heavy` the one rule that reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from perfbalance.model import Snapshot

CACHE_LINE_BYTES = 64  # an LLC miss fills one cache line from memory
BANDWIDTH = "memory_bandwidth_bytes_per_second"


def derive(metrics: Mapping[str, float]) -> dict[str, float]:
    """One container's metrics with ipc, llc_mpki, the bandwidth estimate and bytes_per_instruction
    added where their inputs exist and the metrics do not hold them yet."""
    out = dict(metrics)
    _put(out, "ipc", _ratio(out, "instructions_per_second", "cycles_per_second"))
    _put(out, "llc_mpki", _ratio(out, "llc_misses_per_second", "instructions_per_second", per=1000.0))
    if BANDWIDTH not in out and "llc_misses_per_second" in out:
        out[BANDWIDTH] = out["llc_misses_per_second"] * CACHE_LINE_BYTES
        out["memory_bandwidth_estimated"] = 1.0
    _put(out, "bytes_per_instruction", _ratio(out, BANDWIDTH, "instructions_per_second"))
    return out


def with_derived(snapshot: Snapshot) -> Snapshot:
    """`snapshot` with `derive` applied to every container: for saved snapshots, which may come
    from an agent that stored fewer derived values or from a tool that stores none."""
    samples = tuple(dataclasses.replace(s, metrics=derive(s.metrics)) for s in snapshot.containers)
    return dataclasses.replace(snapshot, containers=samples)


def _ratio(m: Mapping[str, float], num: str, den: str, *, per: float = 1.0) -> float | None:
    """m[num] per `per` units of m[den]; None when either is missing or the denominator is not positive."""
    if num not in m or m.get(den, 0.0) <= 0:
        return None
    return m[num] / (m[den] / per)


def _put(out: dict[str, float], key: str, value: float | None) -> None:
    if key not in out and value is not None:
        out[key] = value
