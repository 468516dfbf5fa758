"""CpuSet: the one value type for sets of CPU (or NUMA node) ids.

Parses and prints the kernel's list format ("0-3,8") used by cpuset.cpus, sysfs cpulists and
/proc/<pid>/status Cpus_allowed_list, and the hex mask format ("ff,00000001") of *_mask files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from perfbalance.errors import ParseError

MAX_CPU_ID = 1 << 16  # a bound for hostile input; Linux NR_CPUS tops out at 8192


class CpuSet:
    """An immutable set of non-negative integer ids with the kernel's list syntax."""

    __slots__ = ("_ids",)

    def __init__(self, ids: Iterable[int] = ()) -> None:
        ids = frozenset(int(i) for i in ids)
        for i in ids:
            if i < 0 or i >= MAX_CPU_ID:
                raise ParseError("cpu id", i, f"out of range 0..{MAX_CPU_ID - 1}")
        self._ids: frozenset[int] = ids

    @classmethod
    def parse(cls, text: str, *, source: str = "") -> CpuSet:
        """Parse "0-3,8,10-11" (whitespace and an empty string allowed)."""
        ids: set[int] = set()
        for part in text.strip().split(","):
            part = part.strip()
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                a = int(lo)
                b = int(hi) if sep else a
            except ValueError:
                raise ParseError("cpu list", text, f"bad element {part!r}", source=source) from None
            if a < 0 or b < a or b >= MAX_CPU_ID:
                raise ParseError("cpu list", text, f"bad range {part!r}", source=source)
            ids.update(range(a, b + 1))
        return cls(ids)

    @classmethod
    def parse_mask(cls, text: str, *, source: str = "") -> CpuSet:
        """Parse a hex mask as in /proc/<pid>/status Cpus_allowed or sysfs *_mask files."""
        digits = text.strip().replace(",", "")
        if digits.startswith("0x"):
            digits = digits[2:]
        if not digits:
            return cls()
        try:
            value = int(digits, 16)
        except ValueError:
            raise ParseError("cpu mask", text, "not hexadecimal", source=source) from None
        if value.bit_length() > MAX_CPU_ID:
            raise ParseError("cpu mask", text, "too wide", source=source)
        return cls(i for i in range(value.bit_length()) if value >> i & 1)

    def mask(self) -> int:
        return sum(1 << i for i in self._ids)

    def __str__(self) -> str:
        parts: list[str] = []
        ids = sorted(self._ids)
        i = 0
        while i < len(ids):
            j = i
            while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
                j += 1
            parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
            i = j + 1
        return ",".join(parts)

    def __repr__(self) -> str:
        return f"CpuSet({str(self)!r})"

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._ids))

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self._ids

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CpuSet) and self._ids == other._ids

    def __hash__(self) -> int:
        return hash(self._ids)

    def __or__(self, other: CpuSet) -> CpuSet:
        return CpuSet(self._ids | other._ids)

    def __and__(self, other: CpuSet) -> CpuSet:
        return CpuSet(self._ids & other._ids)

    def __sub__(self, other: CpuSet) -> CpuSet:
        return CpuSet(self._ids - other._ids)

    def __le__(self, other: CpuSet) -> bool:
        return self._ids <= other._ids

    def __lt__(self, other: CpuSet) -> bool:
        return self._ids < other._ids

    def isdisjoint(self, other: CpuSet) -> bool:
        return self._ids.isdisjoint(other._ids)

    @property
    def ids(self) -> frozenset[int]:
        return self._ids


def union(sets: Iterable[CpuSet]) -> CpuSet:
    out: set[int] = set()
    for s in sets:
        out |= s.ids
    return CpuSet(out)
