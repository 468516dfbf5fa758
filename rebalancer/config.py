"""Configuration of the planner (the `rebalancer:` section). Pure data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from perfbalance.settings import setting


@dataclass(frozen=True, kw_only=True)
class RebalancerConfig:
    enabled: bool = setting(True, "Plan moves at all (false: collect and report only).")
    margin: float = setting(0.02, "A move is made only when benefit - cost exceeds this many core-seconds per second.", min=0.0)
    dwell_seconds: float = setting(60.0, "Minimum time a container stays where it was put before it may move again.", min=0.0)
    cooldown_seconds: float = setting(30.0, "Time after a container's move or rollback before it is considered again.", min=0.0)
    max_moves_per_cycle: int = setting(2, "Cap on actions applied per cycle.", min=0)
