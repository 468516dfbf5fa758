"""Class-based resource control, the parts every controller shares: names, settings, decisions.

A *class controller* (RDT, block I/O, real-time budgets) puts each container into one of its
configured classes. Which class a container should be in is decided here, purely, once per cycle
and the same way for every controller: the planner's choice first, then a container-level
annotation (`<key>.container.<name>`), then a pod-level annotation (`<key>`), then the default of
the container's QoS class. Annotation values are names looked up among the configured classes and
never used as paths; a bad one is reported naming the pod, the key and the value, and the
container keeps the class it had (containers/nri-plugins' `blockio`/`rdt` class annotations, with
the bad-value handling they lack). docs/classes.md is the reference.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from perfbalance.errors import PerfbalanceError
from perfbalance.model import QOS_CLASSES, Container
from perfbalance.names import CLASS, QUALIFIED_NAME, name_problem
from perfbalance.settings import setting

Mode = Literal["on", "off", "auto"]
Enforce = Literal["soft", "hard"]


def check_class_names(value: Mapping[str, object]) -> str | None:
    for name in value:
        problem = name_problem(name, CLASS)
        if problem:
            return f"class name {problem}"
    return None


def check_annotation_key(value: str) -> str | None:
    if name_problem(value, QUALIFIED_NAME):
        return f"{value!r} is not a Kubernetes annotation key ([prefix/]name)"
    return None


def check_qos_map(value: Mapping[str, str]) -> str | None:
    for k, v in value.items():
        if k not in QOS_CLASSES:
            return f"unknown QoS class {k!r} (known: {', '.join(QOS_CLASSES)})"
        problem = name_problem(v, CLASS)
        if problem:
            return f"{k}: class name {problem}"
    return None


@dataclass(frozen=True, kw_only=True)
class ClassRules:
    """What a controller's decision needs: its annotation key, classes, QoS defaults."""

    controller: str
    annotation: str
    allow_annotation: Mapping[str, bool]  # configured class -> whether annotations may pick it
    qos_defaults: Mapping[str, str]  # QoS class -> class name


@dataclass(frozen=True, kw_only=True)
class ClassDecision:
    """The class one container should be in for one controller, and why.

    `wanted` None means "in no class" (the controller leaves the container as the runtime made
    it). With `error` set, the annotation was refused: the caller keeps the previous class.
    """

    controller: str
    container: str
    wanted: str | None
    source: str  # "planner" | "annotation <key>" | "qos <qos>" | "none"
    error: str = ""


class ClassError(PerfbalanceError):
    """A container could not be put into a class; the message names who, the key and the value."""

    def __init__(self, controller: str, container: Container, key: str, value: str, reason: str) -> None:
        self.controller, self.container, self.key, self.value = controller, container.id, key, value
        super().__init__(f"{controller}: {who(container)}: {key}={value!r}: {reason}")


def annotation_keys(key: str, container: Container) -> tuple[str, ...]:
    """Container-level key first (it names this container), then the pod-level key."""
    return (f"{key}.container.{container.name}", key) if container.name else (key,)


def who(container: Container) -> str:
    """How an error names a container: namespace/pod container, else its id."""
    if container.pod:
        pod = f"{container.namespace}/{container.pod}" if container.namespace else container.pod
        return f"pod {pod} container {container.name or container.id[:12]}"
    return f"container {container.id[:64]}"


def decide(container: Container, rules: ClassRules, *, planner: str | None = None) -> ClassDecision:
    """The class `container` should be in (pure: a function of its annotations, QoS, the rules)."""
    base = {"controller": rules.controller, "container": container.id}
    if planner is not None:
        return ClassDecision(**base, wanted=planner or None, source="planner")
    for key in annotation_keys(rules.annotation, container):
        if key not in container.annotations:
            continue
        value = container.annotations[key]
        problem = _annotation_problem(value, rules)
        if problem:
            return ClassDecision(**base, wanted=None, source=f"annotation {key}",
                                 error=f"{rules.controller}: {who(container)}: annotation {key}={value!r}: {problem}")
        return ClassDecision(**base, wanted=value, source=f"annotation {key}")
    qos_class = rules.qos_defaults.get(container.qos)
    if qos_class:
        return ClassDecision(**base, wanted=qos_class, source=f"qos {container.qos}")
    return ClassDecision(**base, wanted=None, source="none")


def _annotation_problem(value: str, rules: ClassRules) -> str:
    bad = name_problem(value, CLASS)
    if bad:
        return bad
    if value not in rules.allow_annotation:
        known = ", ".join(sorted(rules.allow_annotation)) or "none"
        return f"no configured class {value!r} (configured: {known})"
    if not rules.allow_annotation[value]:
        return f"class {value!r} does not allow annotations"
    return ""


# -- block I/O settings ------------------------------------------------------------------------

_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?", re.IGNORECASE)


def parse_rate(value: object, *, what: str = "rate") -> int:
    """Bytes (or operations) per second: 10485760, '10MiB' (binary), '10MB' (decimal), '500'."""
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} must be a number or a size like '10MiB'")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE_RE.fullmatch(value.strip())):
        base = 1024 if m.group(3) else 1000
        n = int(float(m.group(1)) * base ** " KMGT".index(m.group(2).upper() or " "))
    else:
        raise ValueError(f"{what} {value!r} must be a number or a size like '10MiB'")
    if n <= 0:
        raise ValueError(f"{what} {value!r} must be positive")
    return n


def _dev_pattern(value: str) -> str | None:
    if not value.startswith("/dev/") or ".." in value.split("/") or any(ord(c) < 32 for c in value):
        return f"{value!r} must be a device path or glob under /dev/ (e.g. /dev/vd*, /dev/loop0), without '..'"
    return None


def _rate_check(value: object) -> str | None:
    try:
        parse_rate(value)
    except ValueError as e:
        return str(e)
    return None


def _rate(doc: str) -> int | str:
    return setting(0, doc, check=lambda v: None if v == 0 else _rate_check(v))  # type: ignore[no-any-return]


@dataclass(frozen=True, kw_only=True)
class DeviceLimit:
    """Throttling of one device (or every device a glob matches) for the containers of a class."""

    path: str = setting("", "Block device path or glob under /dev (/dev/loop0, /dev/vd*), resolved to major:minor when applied, so devices that appear later are picked up.", check=_dev_pattern)
    read_bps: int | str = _rate("Read bytes per second: 10485760, '10MiB' or '10MB'; 0: no limit.")
    write_bps: int | str = _rate("Write bytes per second; 0: no limit.")
    read_iops: int | str = _rate("Read operations per second; 0: no limit.")
    write_iops: int | str = _rate("Write operations per second; 0: no limit.")

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path: a device path or glob is required")
        if not any(self.limits().values()):
            raise ValueError(f"{self.path} sets no limit (read_bps, write_bps, read_iops, write_iops)")

    def is_glob(self) -> bool:
        return any(ch in self.path for ch in "*?[")

    def limits(self) -> dict[str, int]:
        """read_bps/write_bps/read_iops/write_iops as numbers (0: unlimited)."""
        return {k: (0 if getattr(self, k) == 0 else parse_rate(getattr(self, k)))
                for k in ("read_bps", "write_bps", "read_iops", "write_iops")}


@dataclass(frozen=True, kw_only=True)
class BlockIoClass:
    weight: int = setting(0, "Proportional weight (BFQ: v1 blkio.bfq.weight, v2 io.bfq.weight or io.weight), 1-1000; 0 leaves the weight alone.", min=0, max=1000)
    devices: tuple[DeviceLimit, ...] = setting(factory=tuple, doc="Per-device read/write bps and iops limits (v1 blkio.throttle.*, v2 io.max).")
    allow_annotation: bool = setting(True, "Whether a pod/container annotation may select this class.")


@dataclass(frozen=True, kw_only=True)
class BlockIoSection:
    mode: Mode = setting("auto", "on: fail startup when block-I/O control is unusable; auto: use it when the blkio (v1) or io (v2) controller is there; off: never touch it.")
    enforce: Enforce = setting("soft", "hard: a class part the node cannot enforce (a weight without BFQ) is an error; soft: enforced where possible, reported once otherwise.")
    annotation: str = setting("blockio.perfbalance.io/class", "Pod annotation naming a block-I/O class; '<annotation>.container.<name>' sets one container.", check=check_annotation_key)
    classes: dict[str, BlockIoClass] = setting(factory=dict, doc="Block-I/O classes by name.", check=check_class_names)
    qos_classes: dict[str, str] = setting(factory=dict, doc="Default class per QoS class (guaranteed, burstable, besteffort).", check=check_qos_map)

    def __post_init__(self) -> None:
        _known_defaults(self.qos_classes, self.classes)

    def rules(self) -> ClassRules:
        return ClassRules(controller="blockio", annotation=self.annotation, qos_defaults=dict(self.qos_classes),
                          allow_annotation={k: v.allow_annotation for k, v in self.classes.items()})


# -- real-time settings -------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class RtClass:
    runtime_us: int = setting(0, "SCHED_FIFO/RR time per period for the container's group (cpu.rt_runtime_us).", min=0)
    period_us: int = setting(1000000, "The period (cpu.rt_period_us).", min=1000, max=1000000)
    allow_annotation: bool = setting(True, "Whether a pod/container annotation may select this class.")

    def __post_init__(self) -> None:
        if self.runtime_us > self.period_us:
            raise ValueError(f"runtime_us {self.runtime_us} exceeds period_us {self.period_us}")


@dataclass(frozen=True, kw_only=True)
class RtSection:
    mode: Mode = setting("auto", "on: fail startup when RT group scheduling is unusable; auto: use it when the v1 cpu controller has cpu.rt_runtime_us; off: never touch it.")
    # No `enforce`: a real-time budget has no partial form (the kernel takes the whole runtime or
    # refuses it), so a budget the parents cannot give is always refused and reported, and the
    # container keeps its class. Block I/O has one (a weight without BFQ, the limits still apply).
    annotation: str = setting("rt.perfbalance.io/class", "Pod annotation naming a real-time class; '<annotation>.container.<name>' sets one container.", check=check_annotation_key)
    classes: dict[str, RtClass] = setting(factory=dict, doc="Real-time classes by name.", check=check_class_names)
    qos_classes: dict[str, str] = setting(factory=dict, doc="Default class per QoS class.", check=check_qos_map)

    def __post_init__(self) -> None:
        _known_defaults(self.qos_classes, self.classes)

    def rules(self) -> ClassRules:
        return ClassRules(controller="rt", annotation=self.annotation, qos_defaults=dict(self.qos_classes),
                          allow_annotation={k: v.allow_annotation for k, v in self.classes.items()})


def _known_defaults(qos: Mapping[str, str], classes: Mapping[str, object]) -> None:
    for q, name in qos.items():
        if name not in classes:
            raise ValueError(f"qos_classes.{q}: {name!r} is not a configured class "
                             f"(configured: {', '.join(sorted(classes)) or 'none'})")


__all__ = ["BlockIoClass", "BlockIoSection", "ClassDecision", "ClassError", "ClassRules", "DeviceLimit", "Enforce",
           "Mode", "RtClass", "RtSection", "decide", "parse_rate", "who"]
