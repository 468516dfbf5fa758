"""The one AVX-512-heavy rule, shared by the planner and the exports.

The AVX-512 collector classifies each container with hysteresis (collectors/avx512.py) and
reports the outcome as the metric `avx512_heavy`: 1 heavy, 0 not. The exports read that flag as
it is; the planner smooths it over cycles and compares with `rebalancer.avx512_heavy_threshold`.
Both ask this function. A container without the flag has no AVX-512 signal and is not heavy.
"""

from __future__ import annotations

from collections.abc import Mapping

HEAVY_THRESHOLD = 0.5  # the flag is 0 or 1; smoothed, above one half means heavy most of the time


def avx512_heavy(metrics: Mapping[str, float], threshold: float = HEAVY_THRESHOLD) -> bool:
    """True when the (possibly smoothed) `avx512_heavy` flag is above `threshold`."""
    return metrics.get("avx512_heavy", 0.0) > threshold
