"""The coarse AVX-512 signal from `/proc/<pid>/arch_status`, for nodes where BPF is unavailable.

The kernel (arch/x86/kernel/fpu/xstate.c) stamps a task with jiffies whenever its saved FPU state
has opmask, ZMM_Hi256 or Hi16_ZMM in use (bits 5|6|7) and prints `AVX512_elapsed_ms` as the time
since then (-1: never; nothing at all on CPUs without AVX-512F). Bits 5 and 7 are set by glibc's
EVEX string functions, so this signal cannot tell real 512-bit execution from "EVEX-256": the
metrics it feeds carry `avx512_coarse = 1`. The BPF program (bpf/avx512.bpf.c) is the fine one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from perfbalance.errors import ParseError


@dataclass(frozen=True, kw_only=True)
class ArchStatus:
    supported: bool  # False: the CPU has no AVX-512F (the kernel prints nothing)
    avx512_elapsed_ms: int | None = None  # None: never used (-1)

    def used_within(self, seconds: float) -> bool:
        return self.avx512_elapsed_ms is not None and self.avx512_elapsed_ms <= seconds * 1000.0


def parse_arch_status(text: str, *, source: str = "arch_status") -> ArchStatus:
    """`AVX512_elapsed_ms:\\t<ms or -1>` (other keys ignored; an empty file: unsupported CPU)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or key.strip() != "AVX512_elapsed_ms":
            continue
        try:
            ms = int(value.strip())
        except ValueError:
            raise ParseError("AVX512_elapsed_ms", value.strip(), "not an integer", source=source) from None
        if ms < -1:
            raise ParseError("AVX512_elapsed_ms", ms, "must be -1 or >= 0", source=source)
        return ArchStatus(supported=True, avx512_elapsed_ms=None if ms == -1 else ms)
    return ArchStatus(supported=False)


def read_arch_status(procfs: str, tid: int) -> ArchStatus | None:
    """One thread's status; None when the thread exited (or the file does not exist here)."""
    path = os.path.join(procfs, str(tid), "arch_status")
    try:
        with open(path) as f:
            text = f.read(4096)
    except OSError:
        return None
    return parse_arch_status(text, source=path)


def supported(procfs: str) -> bool:
    """arch_status exists and reports AVX-512 on this host (x86 with AVX-512F, kernel 5.3+)."""
    status = read_arch_status(procfs, os.getpid())
    return status is not None and status.supported


@dataclass(frozen=True, kw_only=True)
class CoarseWindow:
    threads: int  # threads looked at
    active: int  # of which used AVX-512 (incl. EVEX-256) within the window

    @property
    def ratio(self) -> float | None:
        return self.active / self.threads if self.threads else None


def summarize(statuses: Iterable[ArchStatus | None], window: float) -> CoarseWindow:
    """How many of a container's threads used AVX-512 (the coarse kind) in the last `window` s."""
    seen = [s for s in statuses if s is not None and s.supported]
    return CoarseWindow(threads=len(seen), active=sum(1 for s in seen if s.used_within(window)))
