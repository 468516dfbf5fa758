"""The planner: a pure function from a Snapshot (plus config, its own state and `now`) to a Plan.

No I/O, no asyncio, no globals: import-linter enforces that this package imports none of the
I/O packages (see pyproject.toml). `plan()` is the entry point; `PlannerState` is what it
remembers between cycles (pass `Plan.state` back in).
"""

from rebalancer.config import RebalancerConfig
from rebalancer.planner import plan
from rebalancer.state import PlannerState

__all__ = ["PlannerState", "RebalancerConfig", "plan"]
