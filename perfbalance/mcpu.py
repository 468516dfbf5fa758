"""CPU amounts as milli-CPU integers, rounded up once at the end.

Kata's fractional vCPU sizing: summing 0.5 + 0.25 CPUs must need 1 CPU, not
1 + ceil(0.25) = 2. Every amount stays an integer number of milli-CPUs until a whole number
of CPUs is needed, then `to_cpus` rounds up exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable

MILLI = 1000


def from_cores(cores: float) -> int:
    """Convert a (possibly fractional) core count from a spec or cgroup into milli-CPUs."""
    if cores < 0:
        raise ValueError(f"negative CPU amount: {cores!r}")
    return int(round(cores * MILLI))


def total(amounts: Iterable[int]) -> int:
    return sum(int(a) for a in amounts)


def to_cpus(mcpu: int) -> int:
    """Whole CPUs needed for `mcpu` milli-CPUs: ceil, done once."""
    if mcpu < 0:
        raise ValueError(f"negative CPU amount: {mcpu!r} mCPU")
    return -(-mcpu // MILLI)
