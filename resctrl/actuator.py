"""The actuator for the planner's "rdt_class" actions, and the per-cycle class sweep.

`apply_class` records the planner's choice (it outranks the annotation/QoS default until the
container leaves or `clear_override` is called) and moves every thread now. `sweep` runs every
cycle for every container: it re-applies the effective class so threads created since the last
cycle (the fork race, see manager.py) are caught, and garbage-collects what departed containers
left behind. Kernel refusals come out as ResctrlError carrying info/last_cmd_status.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from perfbalance.errors import ContainerGone, ResctrlError
from perfbalance.model import Container
from resctrl.manager import MoveResult, ResctrlManager

TidsOf = Callable[[Container], Sequence[int]]


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    moves: tuple[MoveResult, ...] = ()
    errors: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # annotation problems, degraded classes (one line each)


class ResctrlActuator:
    def __init__(self, *, manager: ResctrlManager, decides: bool = True) -> None:
        """`decides` False: the class of every container is set from outside through
        `apply_class` (the agent's class mechanism, agent/act/classes.py); the sweep keeps each
        container in the class set last and leaves the others where they are."""
        self.manager = manager
        self.decides = decides
        self.overrides: dict[str, str | None] = {}

    def effective_class(self, container: Container) -> tuple[str | None, str]:
        if container.id in self.overrides:
            return self.overrides[container.id], "planner" if self.decides else "class set"
        if not self.decides:
            return None, "no class set yet"
        return self.manager.resolution.class_for(container)

    def apply_class(self, container: Container, class_name: str | None, tids: Iterable[int]) -> MoveResult:
        """Move the container's threads to `class_name` (None: the root group). Raises ResctrlError."""
        if class_name is not None and class_name not in self.manager.resolution.classes:
            raise ResctrlError(f"assign {container.id} to class", class_name, errno.EINVAL, "class is not configured")
        self.overrides[container.id] = class_name
        return self.manager.assign(container.id, class_name, tids)

    def adopt(self, container_id: str, class_name: str | None) -> bool:
        """Take back the planner's choice of a previous run (from the checkpoint): it outranks the
        annotation/QoS default again and the next sweep moves the threads. False (nothing
        changed) when that class is no longer configured."""
        if class_name is not None and class_name not in self.manager.resolution.classes:
            return False
        self.overrides[container_id] = class_name
        return True

    def clear_override(self, container_id: str) -> None:
        self.overrides.pop(container_id, None)

    def sweep(self, containers: Sequence[Container], tids_of: TidsOf) -> SweepReport:
        """Re-apply every container's effective class (new threads caught), then collect garbage."""
        items, notes = [], []
        for c in containers:
            cls, why = self.effective_class(c)
            if "annotation" in why and ";" in why:
                notes.append(f"{c.id}: {why}")
            try:
                items.append((c.id, cls, tids_of(c)))
            except ContainerGone:
                continue
        results = self.manager.assign_many(items)
        errors = tuple(f"{r.container}: {r.error}" for r in results if r.error)
        notes += [f"{r.container}: {r.degraded}" for r in results if r.degraded]
        alive = {c.id for c in containers}
        for cid in [k for k in self.overrides if k not in alive]:
            del self.overrides[cid]
        removed, _ = self.manager.gc(alive)
        return SweepReport(moves=tuple(r for r in results if not r.error), errors=errors, removed=tuple(removed),
                           notes=tuple(notes))
