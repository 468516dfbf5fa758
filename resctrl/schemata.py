"""Schemata text and cache bit masks: the value types every other resctrl module speaks.

The kernel prints `L3:0=000ff;1=fffff` (hex masks zero-padded, names right-aligned to the widest
one) and `MB:0= 50;1=100` (decimal, padded to three), and accepts any subset of lines and domains
on write, each write ending in a newline (resctrl.rst, "Schemata files - general concepts").
Parsing here is tolerant of that padding; formatting produces the minimal form the kernel accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from perfbalance.errors import ParseError

BANDWIDTH_RESOURCES = ("MB", "SMBA")  # decimal values; every other resource is a hex bit mask


def is_bandwidth(resource: str) -> bool:
    return resource in BANDWIDTH_RESOURCES


@dataclass(frozen=True)
class Schemata:
    """resource name -> domain id -> value (a cache bit mask, or MB percent/MBps)."""

    lines: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        frozen = {r: MappingProxyType(dict(d)) for r, d in self.lines.items()}
        object.__setattr__(self, "lines", MappingProxyType(frozen))

    @classmethod
    def parse(cls, text: str, *, source: str = "schemata") -> Schemata:
        lines: dict[str, dict[int, int]] = {}
        for raw in text.splitlines():
            if not raw.strip():
                continue
            name, sep, rest = raw.partition(":")
            name = name.strip()
            if not sep or not name:
                raise ParseError("schemata line", raw, "expected 'RESOURCE:id=value;...'", source=source)
            if name in lines:
                raise ParseError("schemata line", raw, f"resource {name} appears twice", source=source)
            lines[name] = _parse_domains(name, rest, raw, source)
        return cls(lines)

    def format(self) -> str:
        """The text to write: one line per resource, newline-terminated ("" when empty)."""
        out = []
        for name, doms in self.lines.items():
            fmt = "{}={}" if is_bandwidth(name) else "{}={:x}"
            out.append(f"{name}:" + ";".join(fmt.format(d, v) for d, v in sorted(doms.items())))
        return "".join(line + "\n" for line in out)

    def __str__(self) -> str:
        return self.format().rstrip("\n").replace("\n", " ")

    def __bool__(self) -> bool:
        return any(self.lines.values())

    def resources(self) -> tuple[str, ...]:
        return tuple(self.lines)

    def only(self, resources: Iterable[str]) -> Schemata:
        keep = set(resources)
        return Schemata({r: d for r, d in self.lines.items() if r in keep})

    def merged(self, other: Schemata) -> Schemata:
        """self with other's values replacing matching (resource, domain) entries."""
        out: dict[str, dict[int, int]] = {r: dict(d) for r, d in self.lines.items()}
        for r, doms in other.lines.items():
            out.setdefault(r, {}).update(doms)
        return Schemata(out)

    def differs(self, current: Schemata) -> Schemata:
        """The entries of self whose value `current` does not already have."""
        out: dict[str, dict[int, int]] = {}
        for r, doms in self.lines.items():
            cur = current.lines.get(r, {})
            changed = {d: v for d, v in doms.items() if cur.get(d) != v}
            if changed:
                out[r] = changed
        return Schemata(out)


def _parse_domains(name: str, rest: str, raw: str, source: str) -> dict[int, int]:
    doms: dict[int, int] = {}
    base = 10 if is_bandwidth(name) else 16
    for part in rest.split(";"):
        ident, eq, value = part.partition("=")
        try:
            dom, val = int(ident.strip(), 10), int(value.strip(), base)
        except ValueError:
            raise ParseError("schemata domain", part, "expected 'id=value'", source=source) from None
        if not eq or dom < 0 or val < 0:
            raise ParseError("schemata domain", part, "expected 'id=value'", source=source)
        if dom in doms:
            raise ParseError("schemata line", raw, f"domain {dom} appears twice", source=source)
        doms[dom] = val
    return doms


# -- cache bit masks --------------------------------------------------------------------------

def bits(mask: int) -> int:
    return bin(mask).count("1")


def lowest_bit(mask: int) -> int:
    return (mask & -mask).bit_length() - 1 if mask else -1


def is_contiguous(mask: int) -> bool:
    """True for a single run of 1-bits (Intel CAT requires it; the kernel: "non-consecutive")."""
    if not mask:
        return False
    run = mask >> lowest_bit(mask)
    return not run & (run + 1)


def mask_range(lo: int, count: int) -> int:
    """`count` 1-bits starting at bit `lo`."""
    return ((1 << count) - 1) << lo if count > 0 else 0


def mask_problem(mask: int, *, cbm_mask: int, min_cbm_bits: int, sparse: bool = False) -> str:
    """Why the kernel would refuse `mask` for this cache ('' if it would not), in its words."""
    if (min_cbm_bits > 0 and mask == 0) or mask & ~cbm_mask:
        return "Mask out of range"
    if mask and not sparse and not is_contiguous(mask):
        return f"The mask {mask:x} has non-consecutive 1-bits"
    run = mask >> lowest_bit(mask) if mask else 0
    length = (~run & (run + 1)).bit_length() - 1 if mask else 0
    if length < min_cbm_bits:
        return f"Need at least {min_cbm_bits} bits in the mask"
    return ""
