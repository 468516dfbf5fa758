"""The agent's own memory, for its metrics (`perfbalance_agent_memory_bytes`).

RSS alone does not tell a leak from the allocator. After the BPF compiles glibc's arenas hold tens
of MB of freed chunks whose pages malloc_trim gave back (collectors/bpfenv/memory.py); when later
allocations reuse those chunks, their pages fault in again, so anonymous RSS climbs in steps to a
plateau while nothing more is in use (measured under churn: docs/benchmarks.md, "## churn"). The
in-use figures grow only with live data: glibc's `mallinfo2` (bytes handed out and not freed:
`uordblks` in the arenas plus `hblkhd` mmapped) and CPython's count of allocated object blocks.

`read()` costs one /proc/self/status read and one mallinfo2 (a walk of malloc's free lists: 0.14 ms
in the agent at start here, 37 ms for a heap of 200,000 free chunks); the exporter runs it once per
cycle, when it renders the cycle's report.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from dataclasses import dataclass
from typing import Any

STATUS = "/proc/self/status"
_STATUS_FIELDS = {"VmRSS": "resident", "RssAnon": "anonymous"}


class _Mallinfo2(ctypes.Structure):
    """glibc >= 2.33 <malloc.h> struct mallinfo2 (all size_t)."""
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@dataclass(frozen=True, kw_only=True)
class SelfMemory:
    resident: int | None = None     # bytes, VmRSS
    anonymous: int | None = None    # bytes, RssAnon
    malloc_inuse: int | None = None  # bytes glibc malloc handed out and not freed (None: no mallinfo2)
    malloc_free: int | None = None   # bytes free inside malloc's arenas (resident or not)
    python_blocks: int = 0           # CPython object blocks allocated (sys.getallocatedblocks)

    def by_kind(self) -> dict[str, int]:
        """The byte figures that are known, by the `kind` label of the metric."""
        kinds = {"resident": self.resident, "anonymous": self.anonymous,
                 "malloc_inuse": self.malloc_inuse, "malloc_free": self.malloc_free}
        return {k: v for k, v in kinds.items() if v is not None}


def parse_status(text: str) -> dict[str, int]:
    """/proc/<pid>/status -> {resident, anonymous} in bytes (fields missing or odd are left out)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        name = _STATUS_FIELDS.get(key)
        parts = value.split()
        if name and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name] = int(parts[0]) * 1024
    return out


def read(status_path: str = STATUS) -> SelfMemory:
    try:
        with open(status_path) as f:
            status = parse_status(f.read(64 << 10))
    except OSError:
        status = {}
    info = _mallinfo2()
    return SelfMemory(resident=status.get("resident"), anonymous=status.get("anonymous"),
                      malloc_inuse=None if info is None else info.uordblks + info.hblkhd,
                      malloc_free=None if info is None else info.fordblks,
                      python_blocks=sys.getallocatedblocks())


@functools.cache
def _mallinfo2_function() -> Any:
    """glibc's mallinfo2, looked up once; None where the libc has none (musl, glibc < 2.33)."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [], _Mallinfo2
    return fn


def _mallinfo2() -> _Mallinfo2 | None:
    fn = _mallinfo2_function()
    return None if fn is None else fn()
