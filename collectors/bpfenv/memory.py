"""Memory the BPF compiler leaves behind, given back once programs are loaded.

bcc compiles in-process with clang and LLVM. After the few compiles at start the agent never runs
them again, yet their traces stay in its memory: the C heap they freed (glibc keeps it in its
arenas) and the pages of libLLVM/libclang-cpp they executed or read (about 80 MB of the agent's
RSS on this VM, docs/benchmarks.md). Both are released here:

- `release_freed_heap`: glibc's malloc_trim(0) returns free heap pages to the kernel.
- `release_compiler_pages`: MADV_DONTNEED on the compiler libraries' mappings that hold only
  pages straight from the file (no private copy: `Anonymous: 0 kB`, nothing dirty). The kernel
  drops those page-table entries; the file pages stay in the page cache, and a later compile
  (there is none until a restart) faults them back in unchanged. A mapping with any private page
  (relocated data, RELRO) is never touched: dropping it would revert the relocations.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass

COMPILER_LIBRARIES = ("libLLVM", "libclang")  # basename prefixes: libLLVM-14.so.1, libclang-cpp.so.14
MADV_DONTNEED = 4  # <asm-generic/mman-common.h>
SMAPS_MAX_BYTES = 8 << 20


@dataclass(frozen=True, kw_only=True)
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    rss_kb: int = 0
    anonymous_kb: int = 0
    dirty_kb: int = 0

    @property
    def clean_file_pages(self) -> bool:
        """Only pages straight from the file: safe to drop and fault back in."""
        return "w" not in self.perms and self.anonymous_kb == 0 and self.dirty_kb == 0


def parse_smaps(text: str) -> list[Mapping]:
    """/proc/<pid>/smaps -> its mappings with the fields needed here (others ignored)."""
    out: list[Mapping] = []
    head: dict[str, object] | None = None
    fields = {"Rss:": "rss_kb", "Anonymous:": "anonymous_kb", "Private_Dirty:": "dirty_kb", "Shared_Dirty:": "dirty_kb"}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
            if head is not None:
                out.append(Mapping(**head))  # type: ignore[arg-type]
            lo, _, hi = parts[0].partition("-")
            head = {"start": int(lo, 16), "end": int(hi, 16), "perms": parts[1],
                    "path": parts[5] if len(parts) > 5 else ""}
        elif head is not None and parts[0] in fields and len(parts) >= 2 and parts[1].isdigit():
            key = fields[parts[0]]
            head[key] = int(head.get(key, 0)) + int(parts[1])  # type: ignore[call-overload]
    if head is not None:
        out.append(Mapping(**head))  # type: ignore[arg-type]
    return out


def droppable(maps: Sequence[Mapping], libraries: Sequence[str] = COMPILER_LIBRARIES) -> list[Mapping]:
    return [m for m in maps if m.rss_kb and m.clean_file_pages
            and os.path.basename(m.path).startswith(tuple(libraries))]


def release_compiler_pages(procfs: str, libraries: Sequence[str] = COMPILER_LIBRARIES) -> int:
    """Drop the clean resident pages of the compiler libraries; the kB released (0 on failure)."""
    try:
        with open(os.path.join(procfs, "self", "smaps"), "rb") as f:
            text = f.read(SMAPS_MAX_BYTES).decode(errors="replace")
        madvise = _libc().madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    released = 0
    for m in droppable(parse_smaps(text), libraries):
        if madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            released += m.rss_kb
    return released


def release_freed_heap() -> bool:
    """glibc's malloc_trim(0); False where the libc has none (e.g. musl)."""
    try:
        trim = _libc().malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
