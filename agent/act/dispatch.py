"""One way to apply a planned action: the Actuator protocol, dispatch by kind, and back-off.

The planner's actions name a kind (`cpuset`, `rdt_class`, or a `rollback` that undoes one); each
kind has one actuator that makes it so and does nothing else (no planning, no choice of target).
A container whose action failed with a permanent error is left alone for a while, doubling up to
ten minutes, so a kernel that keeps refusing is never retried in a hot loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from perfbalance.cpuset import CpuSet
from perfbalance.errors import PerfbalanceError
from perfbalance.model import Action, Container

BACKOFF_BASE_SECONDS = 10.0  # a container whose action failed is left alone 10 s, 20 s, ... up to
BACKOFF_MAX_SECONDS = 600.0  # ten minutes


class Actuator(Protocol):
    """Applies one kind of action to one container; raises PerfbalanceError (ContainerGone when
    the container vanished) and changes nothing else. Returns the path it took ("nri" or
    "cgroupfs") where a kind has more than one, else None."""

    def apply(self, action: Action, container: Container) -> str | None: ...


class CpusetMoves:
    """`cpuset` actions through the cpuset actuator (cgroupfs v1 or v2, or the runtime's
    UpdateContainers while NRI is connected); returns the path the move took."""

    def __init__(self, apply: Callable[[Container, CpuSet, CpuSet | None], Any]) -> None:
        self._apply = apply

    def apply(self, action: Action, container: Container) -> str | None:
        mems = CpuSet.parse(action.mems) if action.mems else None
        result = self._apply(container, CpuSet.parse(action.to), mems)
        return str(getattr(result, "path", "cgroupfs"))


class RdtMoves:
    """`rdt_class` actions through the resctrl actuator (the target is a configured class name)."""

    def __init__(self, apply: Callable[[Container, str], None]) -> None:
        self._apply = apply

    def apply(self, action: Action, container: Container) -> str | None:
        self._apply(container, action.to)
        return None


def kind_of(action: Action) -> str:
    """The kind an action changes: a rollback changes what it undoes."""
    return action.undoes if action.kind == "rollback" else action.kind


class Dispatch:
    """Routes each action to the actuator of its kind."""

    def __init__(self, actuators: Mapping[str, Actuator]) -> None:
        self.actuators = dict(actuators)

    def apply(self, action: Action, container: Container) -> str | None:
        actuator = self.actuators.get(kind_of(action))
        if actuator is None:
            raise PerfbalanceError(f"unknown action kind {action.kind!r} for {action.container}")
        return actuator.apply(action, container)


@dataclass
class Backoff:
    """Per container: how many actions failed in a row and when the next may be tried."""

    base: float = BACKOFF_BASE_SECONDS
    cap: float = BACKOFF_MAX_SECONDS
    failures: dict[str, tuple[int, float]] = field(default_factory=dict)  # container -> (count, retry after)

    def failed(self, container: str, now: float) -> None:
        count = self.failures.get(container, (0, 0.0))[0] + 1
        self.failures[container] = (count, now + min(self.cap, self.base * 2 ** (count - 1)))

    def succeeded(self, container: str) -> None:
        self.failures.pop(container, None)

    def waiting(self, container: str, now: float) -> str:
        """Why an action of this container is skipped now, or '' when it may be tried."""
        count, until = self.failures.get(container, (0, 0.0))
        if until <= now:
            return ""
        return f"backing off after {count} failed attempt(s), next try in {until - now:.0f}s"

    def retain(self, alive: Iterable[str]) -> None:
        """Forget containers that are gone."""
        keep = set(alive)
        self.failures = {k: v for k, v in self.failures.items() if k in keep}
