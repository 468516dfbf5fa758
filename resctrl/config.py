"""Configuration of RDT (the `resctrl:` section).

The section is checked in two steps. At load (this module) every value's syntax and every name:
amounts parse, class and partition names are safe directory names, required resources are ones
the class sets, QoS defaults name configured classes. Against the node (resctrl.resolve) every
amount becomes a mask or bandwidth value the kernel will accept, or the load fails naming the key,
the value and the kernel's reason. docs/resctrl.md is the reference with examples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from perfbalance.model import QOS_CLASSES
from perfbalance.names import CLASS, GROUP_PREFIX, name_problem
from perfbalance.settings import setting
from resctrl.amounts import domain_keys, parse_cache_amount, parse_mb_amount

# A group name becomes `<prefix><name>`, one resctrl directory level: the prefix is a
# names.GROUP_PREFIX, the class a names.CLASS (no '/', no dots of its own).
CACHE_KEYS = ("l3", "l3code", "l3data", "l2", "l2code", "l2data")
RESOURCE_KEYS = CACHE_KEYS + ("mb",)

Amount = str | int | float | dict[str | int, str | int | float] | None  # numbers are refused by the checks, with the reason


def _amount_check(parse: object) -> object:
    def check(value: object) -> str | None:
        if value is None:
            return None
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for key, amount in items:
            try:
                if key is not None:
                    domain_keys(key)
                parse(amount)  # type: ignore[operator]
            except ValueError as e:
                return f"{e} (at cache id key {key!r})" if key is not None else str(e)
        if isinstance(value, Mapping) and not value:
            return "an empty per-cache-id mapping"
        return None
    return check


_cache = _amount_check(parse_cache_amount)
_mb = _amount_check(parse_mb_amount)


def _cache_setting(doc: str) -> Amount:
    return setting(None, doc, check=_cache)  # type: ignore[no-any-return]


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """Amounts of cache and memory bandwidth (a class, a partition or the root group)."""

    l3: Amount = _cache_setting("L3 cache: '50%', '20%-50%', '4MiB', '0xff0', '4-11', or per cache id {all: .., 1: ..}. With CDP it sets both code and data.")
    l3code: Amount = _cache_setting("L3 code ways when CDP is on (mounted with -o cdp); ignored with a warning otherwise.")
    l3data: Amount = _cache_setting("L3 data ways when CDP is on.")
    l2: Amount = _cache_setting("L2 cache, same forms as l3.")
    l2code: Amount = _cache_setting("L2 code ways when L2 CDP is on (-o cdpl2).")
    l2data: Amount = _cache_setting("L2 data ways when L2 CDP is on.")
    mb: Amount = setting(None, "Memory bandwidth: '50%' (rounded up to the granularity, never below the minimum) or '2000MBps' (needs -o mba_MBps); per cache id allowed.", check=_mb)

    def set_keys(self) -> tuple[str, ...]:
        return tuple(k for k in RESOURCE_KEYS if getattr(self, k) is not None)


def _required(value: tuple[str, ...]) -> str | None:
    bad = [v for v in value if v not in RESOURCE_KEYS]
    return f"unknown resource {bad[0]!r} (known: {', '.join(RESOURCE_KEYS)})" if bad else None


def _names(value: Mapping[str, object]) -> str | None:
    for name in value:
        problem = name_problem(name, CLASS)
        if problem:
            return f"name {problem} (it becomes a resctrl directory name)"
    return None


@dataclass(frozen=True, kw_only=True)
class ClassConfig(Allocation):
    required: tuple[str, ...] = setting(factory=tuple, doc="Resources that must be enforced (hard): startup fails when the node cannot. Others are soft: enforced where supported, warned about otherwise.", check=_required)
    allow_annotation: bool = setting(True, "Whether a pod/container annotation may select this class.")

    def __post_init__(self) -> None:
        for r in self.required:
            if r not in self.set_keys() and not (r == "l3" and (self.l3code or self.l3data)):
                raise ValueError(f"required: {r!r} is required but the class sets no {r} amount")


@dataclass(frozen=True, kw_only=True)
class PartitionConfig(Allocation):
    """An exclusive share of the caches; its classes share it (their amounts are relative to it)."""

    classes: dict[str, ClassConfig] = setting(factory=dict, doc="The classes in this partition.", check=_names)


def _qos(value: Mapping[str, str]) -> str | None:
    for k in value:
        if k not in QOS_CLASSES:
            return f"unknown QoS class {k!r} (known: {', '.join(QOS_CLASSES)})"
    return None


def _prefix(value: str) -> str | None:
    return name_problem(value, GROUP_PREFIX)


@dataclass(frozen=True, kw_only=True)
class ResctrlConfig:
    rdt: Literal["on", "off", "auto"] = setting("auto", "on: fail startup when RDT is unusable; auto: use it when present; off: never touch resctrl.")
    group_prefix: str = setting("perfbalance.", "Prefix of every resctrl group perfbalance creates; it touches no other group.", check=_prefix)
    classes: dict[str, ClassConfig] = setting(factory=dict, doc="RDT classes sharing the whole cache (one implicit partition). Use either classes or partitions.", check=_names)
    partitions: dict[str, PartitionConfig] = setting(factory=dict, doc="Exclusive, non-overlapping partitions of the caches, each with its classes.", check=_names)
    root: Allocation | None = setting(None, "Schemata of the root group (tasks in no class), absolute amounts; null leaves it as it is.")
    qos_classes: dict[str, str] = setting(factory=dict, doc="Default class per QoS class (guaranteed, burstable, besteffort); unmapped QoS classes stay in the root group.", check=_qos)
    annotation: str = setting("rdt.perfbalance.io/class", "Pod annotation naming a class; '<annotation>.container.<name>' sets one container. Only configured classes that allow annotations are accepted.")
    monitor_containers: bool = setting(True, "Create a monitoring group per container (LLC occupancy, MBM) while RMIDs last; then monitor by class.")
    max_mon_groups: int = setting(0, "At most this many per-container monitoring groups (0: as many as RMIDs allow).", min=0)

    def __post_init__(self) -> None:
        if self.classes and self.partitions:
            raise ValueError("classes and partitions: use either top-level classes or partitions, not both")
        seen: dict[str, str] = {}
        for part, pcfg in self.partitions.items():
            for name in pcfg.classes:
                if name in seen:
                    raise ValueError(f"partitions.{part}.classes.{name}: class {name!r} is also in partition {seen[name]!r}")
                seen[name] = part
        known = set(self.class_names())
        for qos, name in self.qos_classes.items():
            if name not in known:
                raise ValueError(f"qos_classes.{qos}: {name!r} is not a configured class (configured: {', '.join(sorted(known)) or 'none'})")

    def partition_map(self) -> dict[str, PartitionConfig]:
        """Partitions in order; top-level classes form one implicit partition 'default'."""
        if self.partitions:
            return dict(self.partitions)
        return {"default": PartitionConfig(classes=dict(self.classes))} if self.classes else {}

    def class_names(self) -> list[str]:
        return [c for p in self.partition_map().values() for c in p.classes]

    def class_path(self, name: str, key: str = "") -> str:
        """The config key path of a class (for error messages)."""
        for part, pcfg in self.partitions.items():
            if name in pcfg.classes:
                base = f"resctrl.partitions.{part}.classes.{name}"
                return f"{base}.{key}" if key else base
        base = f"resctrl.classes.{name}"
        return f"{base}.{key}" if key else base
