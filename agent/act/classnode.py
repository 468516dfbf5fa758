"""The class controllers of one agent: which are used on this node, and their one ClassManager.

agent/act/classes.py is the mechanism (decide once per cycle, apply, keep the previous class on
a refusal, checkpoint); this module is its wiring, kept apart so agent/wiring.py only holds it:
each configured controller (block I/O, real time; RDT from the agent's RdtNode) is built from
its config section, the
tri-state `mode` decides whether it is used (`off` never, `auto` when the node offers it, `on`
or startup fails with the reason), the checkpoint of a previous run is taken back before the
first sync, and the cycle's classes per container and per-controller counts are given to the
report. Adding a controller is a module implementing ClassController, a config section, and one
entry in CONTROLLERS below.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from agent.act.blockio import BlockIoController
from agent.act.classes import ClassController, ClassCycle, ClassManager, Slot, usable
from agent.act.rdt import RdtClasses, RdtNode, rdt_rules
from agent.act.rt import RtController
from agent.config import Config
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.classes import decide
from perfbalance.errors import PerfbalanceError
from perfbalance.hints import problems as hint_problems
from perfbalance.model import Action, Container

log = logging.getLogger("perfbalance.classes")

Build = Callable[[Config, Cgroupfs], ClassController]

# controller name -> (config section attribute, how to build it on this node)
CONTROLLERS: dict[str, tuple[str, Build]] = {
    "blockio": ("blockio", lambda cfg, fs: BlockIoController(section=cfg.blockio, cgroupfs=fs,
                                                             dev_root=cfg.host.dev_root,
                                                             sysfs_root=cfg.host.sysfs_root)),
    "rt": ("rt", lambda cfg, fs: RtController(section=cfg.rt, cgroupfs=fs)),
}

# The planner's action kinds that choose a class, by controller (agent/act/dispatch.py). RDT
# (resctrl, its own section and tri-state `resctrl.rdt`) is a controller of the same mechanism,
# built from the agent's RdtNode.
ACTION_KINDS = {f"{name}_class": name for name in (*CONTROLLERS, "rdt")}


def availability(config: Config, cgfs: Cgroupfs) -> dict[str, dict[str, Any]]:
    """Per controller: whether this node offers it and why not (for `perfbalance doctor`)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (attr, build) in CONTROLLERS.items():
        section = getattr(config, attr)
        why = build(config, cgfs).unavailable()
        out[name] = {"available": not why, "mode": section.mode, "classes": sorted(section.classes),
                     "reason": why or _used_reason(section.mode, len(section.classes))}
    return out


def _used_reason(mode: str, classes: int) -> str:
    if mode == "off":
        return "available; not used (mode: off)"
    return f"available; {classes} class(es) configured" if classes else "available; no classes configured"


class ClassNode:
    """Every class controller the agent uses on this node, behind one ClassManager."""

    def __init__(self, config: Config, cgfs: Cgroupfs, *, rdt: RdtNode | None = None) -> None:
        self.config = config
        self.reasons: dict[str, str] = {}  # controller -> why not used ("" when used)
        slots = [slot for name in CONTROLLERS if (slot := self._slot(name, config, cgfs)) is not None]
        if rdt is not None:
            slots += self._rdt_slot(rdt)
        self.manager = ClassManager(slots, run_dir=config.agent.run_dir)
        # the agent's cycle and agent/act/early.py (a container just started, between cycles)
        self.lock = threading.RLock()
        self._restored = False
        # (container, line) of placement annotations that do not parse: in a report / pending / logged
        self._hint_reported: set[tuple[str, str]] = set()
        self._hint_pending: set[tuple[str, str]] = set()
        self._hint_logged: set[tuple[str, str]] = set()

    def _slot(self, name: str, config: Config, cgfs: Cgroupfs) -> Slot | None:
        attr, build = CONTROLLERS[name]
        section = getattr(config, attr)
        controller = build(config, cgfs)
        if not usable(controller, mode=section.mode):  # `on` and unusable: ClassesUnavailable
            self.reasons[name] = "mode: off" if section.mode == "off" else controller.unavailable()
            return None
        if not section.classes and section.mode == "auto":
            self.reasons[name] = "no classes configured"
            return None
        self.reasons[name] = ""
        log.info("%s classes in use: %s", name, ", ".join(sorted(section.classes)) or "none")
        return Slot(controller=controller, rules=section.rules())

    def _rdt_slot(self, rdt: RdtNode) -> list[Slot]:
        controller = RdtClasses(rdt)
        self.reasons["rdt"] = controller.unavailable()
        return [] if self.reasons["rdt"] else [Slot(controller=controller, rules=rdt.rules)]

    def uses(self, controller: str) -> bool:
        return controller in self.manager.slots

    @property
    def ready(self) -> bool:
        """The previous run's classes are taken back: containers started now can be admitted."""
        return self._restored

    # -- per cycle ------------------------------------------------------------------------------
    def sync(self, containers: Sequence[Container]) -> list[str]:
        """Decide and apply every container's classes; the new problems, one line each."""
        if not self.manager.slots:
            return []
        with self.lock:
            self.restore(containers)
            return self._log(self.manager.sync(containers))

    def admit(self, containers: Sequence[Container]) -> list[str]:
        """The classes of containers just started, applied now rather than at the next cycle."""
        with self.lock:
            if not self.manager.slots or not self._restored:
                return []  # before the first cycle took back the previous run's classes: that cycle does it
            return self._log(self.manager.admit(containers))

    def at_creation(self, container: Container, known: Mapping[str, Collection[str]]) -> dict[str, str]:
        """{controller: class} to hand to the runtime for a container being created: the classes
        decided for it that the runtime's own class config also has (`known`, the operator's
        runtime.nri_*_classes). Others are left to `admit` after start: a name the runtime does
        not know would fail the creation."""
        out: dict[str, str] = {}
        for name, names in known.items():
            slot = self.manager.slots.get(name)
            if slot is None or not names:
                continue
            d = decide(container, slot.rules)
            if d.wanted and not d.error and d.wanted in names:
                out[name] = d.wanted
            elif d.wanted and not d.error:
                log.info("%s class %r of %s is not among the runtime's classes (runtime.nri_%s_classes): "
                         "applied by the agent after start", name, d.wanted, container.id[:12], name)
        return out

    def wants_class(self, container: Container) -> bool:
        """Whether any controller would put the container in a class (or report its annotation):
        a container that no rule concerns is not worth a discovery at start."""
        return any((d := decide(container, slot.rules)).wanted or d.error for slot in self.manager.slots.values())

    def unknown_names(self, known: Mapping[str, Collection[str]]) -> list[str]:
        """Runtime class names (runtime.nri_*_classes) that name no class here: never handed
        over, since no decision picks them; said once at start, as a likely typo."""
        out = []
        for name, names in known.items():
            slot = self.manager.slots.get(name)
            configured = slot.rules.allow_annotation if slot is not None else {}
            bad = sorted(set(names) - set(configured))
            if bad:
                where = "configured: " + (", ".join(sorted(configured)) or "none") if slot is not None \
                    else f"{name} classes not in use on this node ({self.reasons.get(name, 'unknown')})"
                out.append(f"{name}_classes: {', '.join(bad)} never handed to the runtime ({where})")
        return out

    def _log(self, cycle: ClassCycle) -> list[str]:
        for ch in cycle.changes:
            log.info("%s class of %s: %r -> %r (%s)", ch.controller, ch.container, ch.frm or None,
                     ch.to or None, ch.source)
        for note in cycle.notes:
            log.info("%s", note)
        return list(cycle.errors)

    def restore(self, containers: Sequence[Container]) -> None:
        """Once, at the first discovery: take back what a previous run applied (classes.json) for
        the containers still here, so nothing is moved out of its class and back (reads only)."""
        with self.lock:
            if self._restored or not self.manager.slots:
                return
            self._restored = True
            n = self.manager.load([c.id for c in containers])
        if n:
            log.info("restart: %d class assignment(s) of the previous run taken back", n)

    def annotation_problems(self, containers: Sequence[Container]) -> list[str]:
        """Placement annotations (AVX-512, affinity) that do not parse; the planner ignores them
        (perfbalance.hints). Each is returned until a cycle's report carried it (`report()`), so
        one found by the agent's priming discovery, whose errors go nowhere, is not lost."""
        keys = self.config.rebalancer.hint_keys()
        now = {(c.id, line) for c in containers for line in hint_problems(c, keys)}
        self._hint_reported &= now  # a problem gone and back is reported again
        self._hint_pending = now - self._hint_reported
        for _, line in sorted(self._hint_pending - self._hint_logged, key=lambda p: p[1]):
            log.warning("%s", line)
        self._hint_logged = (self._hint_logged & now) | self._hint_pending
        return [line for _, line in sorted(self._hint_pending, key=lambda p: p[1])]

    def apply(self, action: Action, container: Container) -> None:
        """The Actuator of the planner's class actions (agent/act/dispatch.py): an action of kind
        `<controller>_class` (target: a configured class, "" none)."""
        controller = ACTION_KINDS.get(action.undoes if action.kind == "rollback" else action.kind, "")
        if controller not in self.manager.slots:
            raise PerfbalanceError(f"{action.kind} of {container.id}: {controller or action.kind} classes "
                                   f"not in use on this node ({self.reasons.get(controller, 'unknown')})")
        with self.lock:
            self.manager.choose(controller, container, action.to or None)

    def reconfigure(self, config: Config) -> None:
        """Classes, annotation keys and QoS defaults follow a reload (containers in a class whose
        settings changed get them at the next sync); `mode` at the next start."""
        with self.lock:
            self._reconfigure(config)

    def _reconfigure(self, config: Config) -> None:
        for name, slot in self.manager.slots.items():
            if name == "rdt":
                slot.rules = rdt_rules(config.resctrl)
                continue
            section = getattr(config, CONTROLLERS[name][0])
            old = slot.controller.section  # type: ignore[attr-defined]
            slot.stale |= {k for k, v in section.classes.items() if old.classes.get(k, v) != v}
            slot.controller.section = section  # type: ignore[attr-defined]
            slot.rules = section.rules()
        for name, (attr, _) in CONTROLLERS.items():
            if getattr(config, attr).mode != getattr(self.config, attr).mode:
                log.warning("config change of %s.mode takes effect at the next start of the agent", attr)
        self.config = config

    # -- what the report reads --------------------------------------------------------------------
    def report(self, containers: Sequence[Container]) -> dict[str, Any]:
        """{"controllers": {name: {used, reason, containers per class, problems, errors_total}},
        "containers": {id: {controller: class}}} (docs/run-json.md)."""
        self._hint_reported |= self._hint_pending  # this cycle's errors carry them
        self._hint_pending = set()
        with self.lock:
            return self._report(containers)

    def _report(self, containers: Sequence[Container]) -> dict[str, Any]:
        summary = self.manager.summary()
        controllers = {name: {"used": not why, "reason": why, **summary.get(name, {})}
                       for name, why in self.reasons.items()}
        per: dict[str, dict[str, str]] = {}
        for c in containers:
            got = {n: cls for n in self.manager.slots if (cls := self.manager.class_of(n, c.id))}
            if got:
                per[c.id] = got
        return {"controllers": controllers, "containers": per}
