"""One class mechanism for every out-of-band resource control (RDT, block I/O, real-time budgets).

A controller knows how to put a container into one of its classes on this node; this module
decides, once per cycle and the same way for all of them (perfbalance.classes.decide), which
class each container should be in, applies changes, keeps a container in its previous class when
its annotation is bad or the controller refuses, reports each problem once (naming the pod, the
key and the value), counts containers per class for the metrics, and keeps what it applied in
`<run_dir>/classes.json` so that a restarted agent knows what it had done. Adding a controller is
one module implementing `ClassController` plus a section in docs/classes.md.

Tri-state per controller (`mode`): off never touches it; auto uses it when the node offers it;
on makes startup fail with the reason (ClassesUnavailable). `enforce` hard/soft is the
controller's own: whether a part of a class it cannot enforce is an error or a note.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from perfbalance.classes import ClassRules, decide
from perfbalance.errors import ContainerGone, FeatureUnavailable, PerfbalanceError
from perfbalance.model import Container

log = logging.getLogger("perfbalance.classes")

STATE_FILE = "classes.json"


class ClassController(Protocol):
    """What a class controller offers the class mechanism."""

    name: str
    reapply: bool  # re-apply the class every cycle (block I/O: devices that appeared since)

    def unavailable(self) -> str:
        """Why this node cannot use the controller ("" when it can)."""

    def begin_cycle(self) -> None:
        """Called once per cycle before any apply (e.g. re-resolve devices)."""

    def apply(self, container: Container, class_name: str | None) -> list[str]:
        """Put the container in `class_name` (None: in no class); notes back, ClassError on refusal."""

    def adopt(self, container_id: str, class_name: str | None) -> None:
        """Take over what a previous run applied (from the checkpoint)."""

    def forget(self, alive: Sequence[str]) -> None:
        """Drop state of containers that are gone."""


class ClassesUnavailable(FeatureUnavailable):
    pass


@dataclass(frozen=True, kw_only=True)
class Change:
    """One container moved between classes of one controller in this cycle."""

    controller: str
    container: str
    frm: str
    to: str
    source: str


@dataclass(frozen=True, kw_only=True)
class ClassCycle:
    changes: tuple[Change, ...] = ()
    errors: tuple[str, ...] = ()  # new problems only (each reported once while it lasts)
    notes: tuple[str, ...] = ()


@dataclass
class Slot:
    """One controller in the mechanism, with what the manager knows of its containers."""

    controller: ClassController
    rules: ClassRules
    current: dict[str, str | None] = field(default_factory=dict)
    planner: dict[str, str] = field(default_factory=dict)  # "" is the planner's "no class"
    problems: dict[str, str] = field(default_factory=dict)  # container -> the problem reported (its key)
    stale: set[str] = field(default_factory=set)  # classes whose settings changed: applied again once


def usable(controller: ClassController, *, mode: str) -> bool:
    """Tri-state: off -> False; auto -> whether available; on -> True or ClassesUnavailable."""
    if mode == "off":
        return False
    why = controller.unavailable()
    if why and mode == "on":
        raise ClassesUnavailable(controller.name, why)
    if why:
        log.info("%s classes not used: %s", controller.name, why)
    return not why


class ClassManager:
    """Every class controller of one agent."""

    def __init__(self, slots: Sequence[Slot], *, run_dir: str = "") -> None:
        self.slots = {s.controller.name: s for s in slots}
        self.run_dir = run_dir
        self._saved: str = ""
        self.errors_total: Counter[str] = Counter()

    # -- the cycle -------------------------------------------------------------------------------
    def sync(self, containers: Sequence[Container]) -> ClassCycle:
        return self._run(containers, forget_others=True)

    def admit(self, containers: Sequence[Container]) -> ClassCycle:
        """The classes of containers just started, between two cycles: decided and applied like
        a cycle's (`sync`), without forgetting the containers not named here."""
        return self._run(containers, forget_others=False)

    def _run(self, containers: Sequence[Container], *, forget_others: bool) -> ClassCycle:
        changes, errors, notes = [], [], []
        for slot in self.slots.values():
            slot.controller.begin_cycle()
            for c in containers:
                ch, err, nts = self._one(slot, c)
                changes += [ch] if ch else []
                errors += [err] if err else []
                notes += nts
            if forget_others:  # a whole cycle's containers: the rest are gone
                self._prune(slot, {c.id for c in containers})
                slot.stale = set()
        self._save()
        return ClassCycle(changes=tuple(changes), errors=tuple(errors), notes=tuple(notes))

    def _one(self, slot: Slot, c: Container) -> tuple[Change | None, str, list[str]]:
        d = decide(c, slot.rules, planner=slot.planner.get(c.id))
        had = slot.current.get(c.id)
        if d.wanted is None and had is None and not d.error:
            return None, "", []  # never put in a class by us: left as the runtime made it
        if d.error:  # a bad annotation: the container keeps the class it had
            return None, self._problem(slot, c.id, d.error), []
        if d.wanted == had and c.id in slot.current and not slot.controller.reapply and had not in slot.stale:
            slot.problems.pop(c.id, None)
            return None, "", []
        try:
            notes = slot.controller.apply(c, d.wanted)
        except ContainerGone:
            return None, "", []
        except PerfbalanceError as e:  # refused: the container keeps the class it had
            text = f"{e} (keeps class {had or 'none'!r}; chosen by {d.source})"
            # Once per refused choice, not per wording: the reason may change from cycle to
            # cycle (what the parents hold), the choice is still refused.
            return None, self._problem(slot, c.id, text, key=f"refused {d.wanted!r} by {d.source}"), []
        slot.problems.pop(c.id, None)
        slot.current[c.id] = d.wanted
        if d.wanted == had:
            return None, "", self._fresh_notes(slot, c.id, notes)
        return (Change(controller=slot.controller.name, container=c.id, frm=had or "", to=d.wanted or "",
                       source=d.source), "", notes)

    def _problem(self, slot: Slot, cid: str, text: str, *, key: str = "") -> str:
        key = key or text
        if slot.problems.get(cid) == key:
            return ""  # said once; it stays in problems (and the metrics) until it is gone
        slot.problems[cid] = key
        self.errors_total[slot.controller.name] += 1
        log.warning("%s", text)
        return text

    def _fresh_notes(self, slot: Slot, cid: str, notes: list[str]) -> list[str]:
        key = f"{cid}\x00notes"
        text = "; ".join(notes)
        if not notes or slot.problems.get(key) == text:
            return []
        slot.problems[key] = text
        return notes

    def _prune(self, slot: Slot, alive: set[str]) -> None:
        for d in (slot.current, slot.planner):
            for cid in [k for k in d if k not in alive]:
                del d[cid]
        slot.problems = {k: v for k, v in slot.problems.items() if k.split("\x00")[0] in alive}
        slot.controller.forget(sorted(alive))

    # -- the planner's choices -----------------------------------------------------------------------
    def choose(self, controller: str, container: Container, class_name: str | None) -> None:
        """The planner's class for a container (outranks annotations and QoS); applied at once."""
        slot = self.slots.get(controller)
        if slot is None:
            raise ClassesUnavailable(controller, "controller not in use on this node")
        slot.controller.apply(container, class_name)
        slot.planner[container.id] = class_name or ""
        slot.current[container.id] = class_name
        self._save()

    # -- what the exports read --------------------------------------------------------------------
    def class_of(self, controller: str, container_id: str) -> str:
        slot = self.slots.get(controller)
        return (slot.current.get(container_id) or "") if slot else ""

    def summary(self) -> dict[str, dict[str, object]]:
        """Per controller: containers per class, open problems, errors reported so far."""
        out: dict[str, dict[str, object]] = {}
        for name, slot in self.slots.items():
            counts = Counter(v or "" for v in slot.current.values())
            out[name] = {"containers": {k: counts.get(k, 0) for k in slot.rules.allow_annotation} | (
                {"": counts[""]} if counts.get("") else {}),
                "problems": sum(1 for k in slot.problems if "\x00" not in k),
                "errors_total": self.errors_total[name]}
        return out

    # -- checkpoint ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, object]:
        return {"version": 1, "controllers": {n: {"current": dict(s.current), "planner": dict(s.planner)}
                                              for n, s in self.slots.items()}}

    def restore(self, data: Mapping[str, object], alive: Sequence[str]) -> int:
        """Take back what the previous run applied for containers still here; returns how many."""
        n = 0
        ctls = data.get("controllers", {}) if data.get("version") == 1 else {}
        keep = set(alive)
        for name, slot in self.slots.items():
            got = ctls.get(name, {}) if isinstance(ctls, Mapping) else {}
            for cid, cls in dict(got.get("current", {})).items():
                if cid in keep and (cls is None or cls in slot.rules.allow_annotation):
                    slot.current[str(cid)] = cls
            for cid, cls in dict(got.get("planner", {})).items():
                if cid in keep and (cls == "" or cls in slot.rules.allow_annotation):
                    slot.planner[str(cid)] = str(cls)
            for cid, cls in slot.current.items():
                slot.controller.adopt(cid, cls)
                n += 1
        return n

    def load(self, alive: Sequence[str]) -> int:
        path = os.path.join(self.run_dir, STATE_FILE)
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as e:
            log.warning("%s unreadable, starting without it: %s", path, e)
            return 0
        return self.restore(data if isinstance(data, Mapping) else {}, alive)

    def _save(self) -> None:
        if not self.run_dir:
            return
        text = json.dumps(self.to_json(), sort_keys=True)
        if text == self._saved:
            return
        path = os.path.join(self.run_dir, STATE_FILE)
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._saved = text
        except OSError as e:
            log.warning("cannot write %s: %s", path, e.strerror)
