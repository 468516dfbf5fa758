"""The ways a user can say "how much cache / memory bandwidth", parsed purely.

Cache: "50%" (share of the enclosing partition, lowest ways first), "20%-50%" (a slice of it),
"4MiB"/"512KiB" (ways = ceil(bytes / (cache size / ways))), "0x3f0" (an absolute bit mask) and
"4-11" (an absolute inclusive bit range). Memory bandwidth: "50%" (of the partition's share,
rounded up to the granularity as the kernel does, never below the minimum) or "2000MBps" (only
when resctrl is mounted with -o mba_MBps). A bare number is refused for both: `l3: 50` could mean
50%, ways or a bit, and guessing is how caches end up misallocated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_NUM = r"(\d+(?:\.\d+)?)"
_PERCENT = re.compile(rf"^{_NUM}\s*%$")
_RANGE = re.compile(rf"^{_NUM}\s*%\s*-\s*{_NUM}\s*%$")
_BYTES = re.compile(rf"^{_NUM}\s*(KiB|MiB|GiB|K|M|G)$")
_MASK = re.compile(r"^0[xX]([0-9a-fA-F]+)$")
_BITS = re.compile(r"^(\d+)\s*-\s*(\d+)$")
_MBPS = re.compile(r"^(\d+)\s*MBps$")
_UNITS = {"K": 1024, "KiB": 1024, "M": 1024 ** 2, "MiB": 1024 ** 2, "G": 1024 ** 3, "GiB": 1024 ** 3}

CacheKind = Literal["percent", "range", "bytes", "mask", "bits"]


@dataclass(frozen=True)
class CacheAmount:
    kind: CacheKind
    lo: float  # percent | range start % | bytes | mask | first bit
    hi: float = 0.0  # range end % | last bit

    @property
    def relative(self) -> bool:
        """Placed inside the enclosing partition (percent, range, bytes) vs absolute bits."""
        return self.kind in ("percent", "range", "bytes")


@dataclass(frozen=True)
class MbAmount:
    unit: Literal["percent", "MBps"]
    value: float


def parse_cache_amount(value: object) -> CacheAmount:
    """Parse one cache amount; ValueError says what is accepted."""
    if not isinstance(value, str):
        raise ValueError("a cache amount must be a string such as '50%', '20%-50%', '4MiB', '0xff0' or '4-11'")
    text = value.strip()
    if m := _PERCENT.match(text):
        pct = float(m.group(1))
        if not 0 < pct <= 100:
            raise ValueError("a percentage must be in (0%, 100%]")
        return CacheAmount("percent", pct)
    if m := _RANGE.match(text):
        lo, hi = float(m.group(1)), float(m.group(2))
        if not 0 <= lo < hi <= 100:
            raise ValueError("a percentage range must be 'a%-b%' with 0 <= a < b <= 100")
        return CacheAmount("range", lo, hi)
    if m := _BYTES.match(text):
        size = float(m.group(1)) * _UNITS[m.group(2)]
        if size <= 0:
            raise ValueError("a cache size must be positive")
        return CacheAmount("bytes", size)
    if m := _MASK.match(text):
        return CacheAmount("mask", int(m.group(1), 16))
    if m := _BITS.match(text):
        a, b = int(m.group(1)), int(m.group(2))
        if b < a:
            raise ValueError("a bit range must be 'first-last' with first <= last")
        return CacheAmount("bits", a, b)
    raise ValueError("not a cache amount: use '50%', '20%-50%', '4MiB'/'512KiB', a hex mask '0xff0' or a bit range '4-11'")


def parse_mb_amount(value: object) -> MbAmount:
    if not isinstance(value, str):
        raise ValueError("a memory bandwidth amount must be a string such as '50%' or '2000MBps'")
    text = value.strip()
    if m := _PERCENT.match(text):
        pct = float(m.group(1))
        if not 0 < pct <= 100:
            raise ValueError("a percentage must be in (0%, 100%]")
        return MbAmount("percent", pct)
    if m := _MBPS.match(text):
        mbps = int(m.group(1))
        if mbps <= 0:
            raise ValueError("MBps must be positive")
        return MbAmount("MBps", mbps)
    raise ValueError("not a memory bandwidth amount: use '50%' or '2000MBps'")


def domain_keys(key: object) -> tuple[int, ...] | None:
    """Domain ids named by a per-cache-id key: 1, "1", "0,2", "0-3"; None for "all"."""
    if isinstance(key, bool):
        raise ValueError("a cache id key must be 'all' or ids like 0, '0,2' or '0-3'")
    if isinstance(key, int):
        return (key,)
    text = str(key).strip()
    if text == "all":
        return None
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError("a cache id key must be 'all' or ids like 0, '0,2' or '0-3'")
        out.extend(range(int(lo), int(hi if sep else lo) + 1))
    return tuple(out)
