"""Shared value types of perfbalance: CPU sets, topology, containers, snapshots and plans.

Everything that crosses a boundary between collectors, the planner and the actuators is one of
these immutable types, so that data flows one way and the planner can stay a pure function.
This package imports nothing else of perfbalance.
"""

__version__ = "0.1.0"
