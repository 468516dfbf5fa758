"""The planner's own memory between cycles: smoothed inputs, move times, pending evaluations.

The planner is a pure function; whatever it must remember is returned in `Plan.state` and passed
back on the next call. Everything is frozen (tuples of pairs instead of dicts where the value is
kept as-is) so that a state can be compared, hashed into a test and never mutated by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeVar

from perfbalance.model import PolicyState

EMPTY: Mapping[str, Any] = MappingProxyType({})


def frozen_map(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only copy of `d` in key order. Mostly `d` already is (the planner builds its maps
    in snapshot order, which is id order): then the keys alone are sorted, to check, and no
    (key, value) pair per entry is made for the garbage collector to count."""
    keys = list(d)
    if keys == sorted(keys):
        return MappingProxyType(dict(d))
    return MappingProxyType(dict(sorted(d.items())))


T = TypeVar("T")
_FIELDS: dict[type, frozenset[str]] = {}


def built(cls: type[T], values: dict[str, Any]) -> T:
    """`cls(**values)` for a frozen dataclass without a `__post_init__`, given every field,
    without the generated `__init__` (which sets each field through `object.__setattr__`: a
    few µs for an Action, and one plan at 1000 containers makes 1000 Actions and Moveds).
    `values` must name exactly the fields of `cls` (TypeError otherwise) and is taken over by
    the instance: the caller passes a fresh dict and keeps no reference to it."""
    names = _FIELDS.get(cls)
    if names is None:
        if hasattr(cls, "__post_init__"):
            raise TypeError(f"{cls.__name__} has a __post_init__: build it with its __init__")
        names = _FIELDS[cls] = frozenset(f.name for f in fields(cls))  # type: ignore[arg-type]
    if values.keys() != names:
        raise TypeError(f"{cls.__name__} fields {sorted(names ^ values.keys())} missing or unknown")
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", values)  # `values` becomes the instance's dict: no copy
    return obj


@dataclass(frozen=True, kw_only=True)
class Moved:
    """One container's part of a decision: where it was and where it went."""

    container: str
    frm: str  # cpuset list (or RDT class for kind "rdt_class")
    to: str
    mems_frm: str = ""
    mems_to: str = ""
    kind: str = "cpuset"


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A decision waiting to be judged once `settle_seconds` have passed."""

    decision: str  # e.g. "d17"
    time: float
    reason: str
    moves: tuple[Moved, ...]
    victims: tuple[str, ...]
    predicted: float  # core-seconds per second the victims should gain
    # victim -> instructions per CPU-second before the move (when the PMU reports it)
    baseline_ips: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    # victim -> modelled loss (core-s/s) before the move, from the measurements at that time
    baseline_loss: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    # measured victims (rebalancer/latency.py) -> run-queue wait before, and predicted after, s/s
    health_before: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    health_predicted: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    health_band: float = 0.0  # noise band of the victims' summed wait, s/s
    cycle: int = 0  # Snapshot.cycle of the decision (0: not known), to count the windows since


@dataclass(frozen=True, kw_only=True)
class PlannerState(PolicyState):
    """The cost model's state: dwell times and cooldowns (PolicyState) and what it judges by."""

    time: float = 0.0
    seq: int = 0  # decisions made so far (for decision ids)
    smoothed: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: EMPTY)
    pending: tuple[Pending, ...] = ()
    # container -> its measured run-queue wait (s/s) in the last windows, oldest first
    health_history: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: EMPTY)
