"""Resolution: configuration + what the node has -> the exact schemata of every class (pure).

Computing is kept apart from writing (intel/goresctrl's resolve() vs configureResctrl()): this
module does no I/O, so `perfbalance config check` and the tests can show what would be written on
any hardware variant, and a configuration the kernel would refuse fails here, at load, with the
key, the value and the kernel's own reason ("The mask 3c3 has non-consecutive 1-bits").

Placement rules (docs/resctrl.md has examples):
- partitions are laid out in the order written, sized ones (percent, bytes) packed from bit 0,
  explicit ones (mask, bit range, percent range) where they say; they must not overlap;
- a class's relative amounts (percent, range, bytes) are inside its partition, lowest ways first;
  absolute ones (mask, bits) must lie inside it; a class in a partition that sets a cache amount
  is confined to the partition even when the class sets no amount of its own;
- MB percent is relative to the partition's MB share, rounded up to bandwidth_gran as the kernel
  does, raised to min_bandwidth when below; MBps only with -o mba_MBps.
- an amount for a resource the node lacks is dropped with a warning (soft) unless the class lists
  it under `required` (hard: ConfigError).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from perfbalance.errors import ConfigError
from perfbalance.model import Container
from resctrl.amounts import CacheAmount, MbAmount, domain_keys, parse_cache_amount, parse_mb_amount
from resctrl.config import CACHE_KEYS, Allocation, ClassConfig, PartitionConfig, ResctrlConfig
from resctrl.info import CacheInfo, MbInfo, ResctrlInfo
from resctrl.schemata import Schemata, bits, lowest_bit, mask_problem, mask_range

FULL = CacheAmount("percent", 100.0)


@dataclass(frozen=True, kw_only=True)
class ResolvedClass:
    name: str
    partition: str
    schemata: Schemata
    allow_annotation: bool = True


@dataclass(frozen=True, kw_only=True)
class Resolution:
    classes: Mapping[str, ResolvedClass] = field(default_factory=dict)
    root: Schemata = field(default_factory=Schemata)
    partitions: Mapping[str, Schemata] = field(default_factory=dict)
    qos_classes: Mapping[str, str] = field(default_factory=dict)
    annotation: str = "rdt.perfbalance.io/class"
    warnings: tuple[str, ...] = ()

    def class_for(self, container: Container) -> tuple[str | None, str]:
        """(class name or None for the root group, why): annotation first, then the QoS default."""
        problem = ""
        for key in (f"{self.annotation}.container.{container.name}", self.annotation):
            if key not in container.annotations:
                continue
            wanted = container.annotations[key]
            cls = self.classes.get(wanted)  # looked up, never used as a path
            if cls is None:
                problem = f"annotation {key}={wanted!r} names no configured class; "
            elif not cls.allow_annotation:
                problem = f"annotation {key}={wanted!r}: class does not allow annotations; "
            else:
                return wanted, f"annotation {key}"
            break
        name = self.qos_classes.get(container.qos)
        if name is None:
            return None, problem + f"no class for QoS {container.qos}"
        return name, problem + f"QoS {container.qos}"


class _Ctx:
    """What one resolution works against, and the warnings it collects."""

    def __init__(self, info: ResctrlInfo, cache_bytes: Mapping[tuple[int, int], int], source: str) -> None:
        self.info, self.cache_bytes, self.source = info, cache_bytes, source
        self.warnings: list[str] = []

    def error(self, path: str, value: object, reason: str) -> ConfigError:
        return ConfigError(self.source, path, value, reason)


def resolve(cfg: ResctrlConfig, info: ResctrlInfo, *, cache_bytes: Mapping[tuple[int, int], int] | None = None,
            source: str = "config") -> Resolution:
    """Every class's schemata on this node; ConfigError names key, value and reason."""
    ctx = _Ctx(info, cache_bytes or {}, source)
    parts = cfg.partition_map()
    if not info.alloc_capable and parts:
        ctx.warnings.append(f"this node has no RDT allocation (resctrl offers: {info.describe()}); "
                            "classes are not created and containers stay in the root group")
    part_masks = {name: _partition(ctx, name, p, parts) for name, p in parts.items()} if info.alloc_capable else {}
    _check_overlaps(ctx, part_masks)
    classes = {}
    for pname, pcfg in parts.items():
        for cname, ccfg in pcfg.classes.items():
            sch = _class(ctx, cfg, cname, ccfg, pcfg, part_masks.get(pname)) if info.alloc_capable else Schemata()
            classes[cname] = ResolvedClass(name=cname, partition=pname, schemata=sch,
                                           allow_annotation=ccfg.allow_annotation)
    root = _root(ctx, cfg.root) if cfg.root is not None and info.alloc_capable else Schemata()
    _budget_warnings(ctx, cfg, classes, part_masks, root)
    return Resolution(classes=classes, root=root, partitions=part_masks, qos_classes=dict(cfg.qos_classes),
                      annotation=cfg.annotation, warnings=tuple(ctx.warnings))


# -- which schema lines a config key writes -----------------------------------------------------

def targets(key: str, info: ResctrlInfo) -> tuple[str, ...]:
    """Schema names written for a config key on this node (l3 -> L3, or L3CODE+L3DATA with CDP)."""
    level = key[1]
    plain, code, data = f"L{level}", f"L{level}CODE", f"L{level}DATA"
    if key.endswith("code"):
        return (code,) if code in info.caches else ()
    if key.endswith("data"):
        return (data,) if data in info.caches else ()
    if plain in info.caches:
        return (plain,)
    return tuple(n for n in (code, data) if n in info.caches)


def _missing(key: str, info: ResctrlInfo) -> str:
    offers = f"resctrl offers: {info.describe()}"
    if key == "mb":
        return f"this node has no memory bandwidth allocation (MB) ({offers})"
    if key.endswith(("code", "data")):
        opt = "cdp" if key.startswith("l3") else "cdpl2"
        return f"code/data prioritisation is off (mount resctrl with -o {opt}) ({offers})"
    return f"this node has no {key.upper()} cache allocation ({offers})"


def _cache_specs(ctx: _Ctx, alloc: Allocation, path: str, required: tuple[str, ...]) -> dict[str, tuple[str, object]]:
    """schema name -> (config key, amount) for the cache amounts `alloc` sets."""
    out: dict[str, tuple[str, object]] = {}
    for key in CACHE_KEYS:  # l3 before l3code/l3data: the specific ones override
        value = getattr(alloc, key)
        if value is None:
            continue
        names = targets(key, ctx.info)
        if not names:
            _unsupported(ctx, key, value, f"{path}.{key}", required, alt=_has_plain(alloc, key, ctx.info))
        for name in names:
            out[name] = (key, value)
    return out


def _has_plain(alloc: Allocation, key: str, info: ResctrlInfo) -> bool:
    plain = key[:2]
    return key != plain and getattr(alloc, plain) is not None and bool(targets(plain, info))


def _unsupported(ctx: _Ctx, key: str, value: object, path: str, required: tuple[str, ...], *, alt: bool = False) -> None:
    reason = _missing(key, ctx.info)
    if key in required:
        raise ctx.error(path, value, f"required, but {reason}")
    note = f"; {key[:2]} applies instead" if alt else ""
    ctx.warnings.append(f"{path}: ignored: {reason}{note}")


# -- per-domain values -------------------------------------------------------------------------

def _per_domain(ctx: _Ctx, value: object, domains: tuple[int, ...], path: str) -> dict[int, object]:
    if not isinstance(value, Mapping):
        return {d: value for d in domains}
    default, explicit = None, {}
    for key, amount in value.items():
        ids = domain_keys(key)
        if ids is None:
            default = amount
            continue
        for d in ids:
            if d not in domains:
                raise ctx.error(f"{path}.{key}", amount, f"cache id {d} does not exist on this node (ids: {_ids(domains)})")
            explicit[d] = amount
    out = {}
    for d in domains:
        if d not in explicit and default is None:
            raise ctx.error(path, dict(value), f"no amount for cache id {d} (add it or an 'all' entry)")
        out[d] = explicit.get(d, default)
    return out


def _ids(domains: tuple[int, ...]) -> str:
    return ",".join(map(str, domains)) or "none"


# -- cache masks -------------------------------------------------------------------------------

def _partition(ctx: _Ctx, name: str, p: PartitionConfig, parts: Mapping[str, PartitionConfig]) -> Schemata:
    path = f"resctrl.partitions.{name}"
    specs = _cache_specs(ctx, p, path, ())
    lines: dict[str, dict[int, int]] = {}
    for sname, cache in ctx.info.caches.items():
        if sname not in specs:
            if len(parts) > 1 and any(_cache_specs_quiet(ctx, q).get(sname) for q in parts.values()):
                raise ctx.error(path, None, f"partition sets no amount for {sname} while others do; partitions must not overlap")
            continue
        key, value = specs[sname]
        lines[sname] = {}
        for d, amount in _per_domain(ctx, value, cache.domains, f"{path}.{key}").items():
            lines[sname][d] = _partition_mask(ctx, name, key, amount, cache, d, parts, lines, f"{path}.{key}")
    return Schemata(lines)


def _cache_specs_quiet(ctx: _Ctx, alloc: Allocation) -> dict[str, object]:
    return {n: getattr(alloc, k) for k in CACHE_KEYS if getattr(alloc, k) is not None for n in targets(k, ctx.info)}


def _partition_mask(ctx: _Ctx, name: str, key: str, raw: object, cache: CacheInfo, d: int,
                    parts: Mapping[str, PartitionConfig], done: dict[str, dict[int, int]], path: str) -> int:
    amount = parse_cache_amount(raw)
    if amount.relative and amount.kind != "range":
        cursor = _cursor(ctx, cache, d, parts, name)
        width = cache.cbm_len - cursor
        n = _ways(ctx, amount, cache, d, cache.cbm_len, raw, path)
        if n > width:
            raise ctx.error(path, raw, f"needs {n} ways of {cache.name} cache id {d} but only {width} are left "
                                       f"after the partitions before it ({cache.cbm_len} in all)")
        mask = mask_range(cursor, n)
    else:
        mask = _place(ctx, amount, cache, d, cache.cbm_mask, raw, path)
    _check_mask(ctx, mask, cache, d, raw, path)
    return mask


def _cursor(ctx: _Ctx, cache: CacheInfo, d: int, parts: Mapping[str, PartitionConfig], upto: str) -> int:
    """First free bit after the sized partitions written before `upto`."""
    cursor = 0
    for pname, p in parts.items():
        if pname == upto:
            break
        raw = _cache_specs_quiet(ctx, p).get(cache.name)
        if raw is None:
            continue
        value = _per_domain(ctx, raw, cache.domains, "")[d]
        amount = parse_cache_amount(value)
        if amount.relative and amount.kind != "range":
            cursor += _ways(ctx, amount, cache, d, cache.cbm_len, value, "")
    return cursor


def _ways(ctx: _Ctx, amount: CacheAmount, cache: CacheInfo, d: int, width: int, raw: object, path: str) -> int:
    if amount.kind == "percent":
        n = math.floor(amount.lo / 100 * width + 0.5)
        if n < max(1, cache.min_cbm_bits):
            n = max(1, cache.min_cbm_bits)
            ctx.warnings.append(f"{path}: {raw} of {width} ways is less than min_cbm_bits; using {n}")
        return n
    size = ctx.cache_bytes.get((cache.level, d))
    if not size:
        raise ctx.error(path, raw, f"the size of the L{cache.level} cache with id {d} is unknown "
                                   "(no sysfs cache information); use a percentage or a mask")
    way = size / cache.cbm_len
    return max(1, math.ceil(amount.lo / way - 1e-9))


def _place(ctx: _Ctx, amount: CacheAmount, cache: CacheInfo, d: int, within: int, raw: object, path: str) -> int:
    """A mask for `amount` inside the contiguous mask `within` (relative forms) or absolute."""
    base, width = lowest_bit(within), bits(within)
    if amount.kind == "percent" or amount.kind == "bytes":
        n = _ways(ctx, amount, cache, d, width, raw, path)
        if n > width:
            raise ctx.error(path, raw, f"needs {n} ways but its partition has {width} on {cache.name} cache id {d}")
        return mask_range(base, n)
    if amount.kind == "range":
        lo = math.floor(amount.lo / 100 * width + 1e-9)
        hi = math.ceil(amount.hi / 100 * width - 1e-9)
        return mask_range(base + lo, max(0, hi - lo))
    mask = int(amount.lo) if amount.kind == "mask" else mask_range(int(amount.lo), int(amount.hi - amount.lo) + 1)
    if mask & ~within and within != cache.cbm_mask:  # outside the cache itself: the kernel's "Mask out of range"
        raise ctx.error(path, raw, f"mask {mask:x} reaches outside its partition ({within:x}) on {cache.name} cache id {d}")
    return mask


def _check_mask(ctx: _Ctx, mask: int, cache: CacheInfo, d: int, raw: object, path: str) -> None:
    problem = mask_problem(mask, cbm_mask=cache.cbm_mask, min_cbm_bits=cache.min_cbm_bits, sparse=cache.sparse_masks)
    if problem:
        raise ctx.error(path, raw, f"the kernel would refuse it: {problem} ({cache.name} cache id {d}, "
                                   f"cbm_mask {cache.cbm_mask:x}, min_cbm_bits {cache.min_cbm_bits})")


def _check_overlaps(ctx: _Ctx, part_masks: Mapping[str, Schemata]) -> None:
    names = list(part_masks)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for res, doms in part_masks[a].lines.items():
                for d, mask in doms.items():
                    other = part_masks[b].lines.get(res, {}).get(d, 0)
                    if mask & other:
                        raise ctx.error(f"resctrl.partitions.{b}", f"{res}:{d}={other:x}",
                                        f"overlaps partition {a!r} ({res}:{d}={mask:x}); partitions are exclusive")


def _class(ctx: _Ctx, cfg: ResctrlConfig, name: str, c: ClassConfig, p: PartitionConfig, part: Schemata | None) -> Schemata:
    path = cfg.class_path(name)
    specs = _cache_specs(ctx, c, path, c.required)
    lines: dict[str, dict[int, int]] = {}
    for sname, cache in ctx.info.caches.items():
        within = part.lines.get(sname) if part is not None else None
        if sname not in specs and within is None:
            continue
        key, value = specs.get(sname, ("l" + sname[1], "100%"))
        lines[sname] = {}
        for d, raw in _per_domain(ctx, value, cache.domains, f"{path}.{key}").items():
            box = within[d] if within else cache.cbm_mask
            mask = _place(ctx, parse_cache_amount(raw), cache, d, box, raw, f"{path}.{key}")
            _check_mask(ctx, mask, cache, d, raw, f"{path}.{key}")
            lines[sname][d] = mask
    mb = _mb_line(ctx, c.mb, p.mb, f"{path}.mb", c.required)
    if mb:
        lines["MB"] = mb
    return Schemata(lines)


def _root(ctx: _Ctx, alloc: Allocation) -> Schemata:
    specs = _cache_specs(ctx, alloc, "resctrl.root", ())
    lines: dict[str, dict[int, int]] = {}
    for sname, (key, value) in specs.items():
        cache = ctx.info.caches[sname]
        lines[sname] = {}
        for d, raw in _per_domain(ctx, value, cache.domains, f"resctrl.root.{key}").items():
            mask = _place(ctx, parse_cache_amount(raw), cache, d, cache.cbm_mask, raw, f"resctrl.root.{key}")
            _check_mask(ctx, mask, cache, d, raw, f"resctrl.root.{key}")
            lines[sname][d] = mask
    mb = _mb_line(ctx, alloc.mb, None, "resctrl.root.mb", ())
    if mb:
        lines["MB"] = mb
    return Schemata(lines)


# -- memory bandwidth --------------------------------------------------------------------------

def _mb_line(ctx: _Ctx, value: object, part_value: object, path: str, required: tuple[str, ...]) -> dict[int, int]:
    if value is None:
        return {}
    mb = ctx.info.mb
    if mb is None:
        _unsupported(ctx, "mb", value, path, required)
        return {}
    part = _per_domain(ctx, part_value, mb.domains, path.rsplit(".classes.", 1)[0] + ".mb") if part_value is not None else {}
    out = {}
    for d, raw in _per_domain(ctx, value, mb.domains, path).items():
        amount = parse_mb_amount(raw)
        cap = parse_mb_amount(part[d]) if d in part else None
        problem = _mb_mode_problem(mb, amount) or (_mb_mode_problem(mb, cap) if cap else "")
        if problem:
            if "mb" in required:
                raise ctx.error(path, raw, f"required, but {problem}")
            ctx.warnings.append(f"{path}: ignored: {problem}")
            return {}
        out[d] = _mb_value(ctx, mb, amount, cap, raw, path)
    return out


def _mb_mode_problem(mb: MbInfo, amount: MbAmount) -> str:
    if mb.mbps and amount.unit == "percent":
        return "memory bandwidth is in MBps mode (resctrl mounted with -o mba_MBps); give 'NMBps'"
    if not mb.mbps and amount.unit == "MBps":
        return "memory bandwidth is in percent mode; MBps needs resctrl mounted with -o mba_MBps"
    return ""


def _mb_value(ctx: _Ctx, mb: MbInfo, amount: MbAmount, cap: MbAmount | None, raw: object, path: str) -> int:
    if amount.unit == "MBps":
        if cap is not None and amount.value > cap.value:
            raise ctx.error(path, raw, f"exceeds its partition's {int(cap.value)}MBps")
        return int(amount.value)
    pct = amount.value * (cap.value if cap else 100.0) / 100
    value = math.ceil(pct / mb.bandwidth_gran - 1e-9) * mb.bandwidth_gran  # the kernel rounds up too
    if value < mb.min_bandwidth:
        ctx.warnings.append(f"{path}: {raw} is below min_bandwidth {mb.min_bandwidth}%; using {mb.min_bandwidth}")
        value = mb.min_bandwidth
    return min(value, 100)


# -- budget ------------------------------------------------------------------------------------

def _budget_warnings(ctx: _Ctx, cfg: ResctrlConfig, classes: Mapping[str, ResolvedClass],
                     part_masks: Mapping[str, Schemata], root: Schemata) -> None:
    info = ctx.info
    if not info.alloc_capable:
        return
    active = [n for n, c in classes.items() if c.schemata]
    free = info.num_closids - 1
    if len(active) > free:
        ctx.warnings.append(f"{len(active)} classes but only {free} CLOSIDs besides the root group: "
                            f"{', '.join(active[free:])} will degrade to the root group")
    for n, c in classes.items():
        if not c.schemata:
            ctx.warnings.append(f"{cfg.class_path(n)}: sets nothing this node supports; its containers stay in the root group")
    if len(part_masks) > 1 and not root:
        ctx.warnings.append("partitions are exclusive among perfbalance classes only; the root group (tasks in no "
                            "class) still uses the whole cache unless resctrl.root confines it")
    for pname, sch in part_masks.items():
        for res, doms in sch.lines.items():
            shared = info.caches[res].shareable_bits
            if len(part_masks) > 1 and any(m & shared for m in doms.values()):
                ctx.warnings.append(f"resctrl.partitions.{pname}: overlaps {res} shareable_bits {shared:x} "
                                    "(ways other agents such as I/O may use)")
