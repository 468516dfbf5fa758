"""Compile and load BPF C with bcc, quoting clang's or the verifier's reason when it fails.

`prepare()` checks everything bcc needs on this host (bcc importable, kernel minimums, tracefs
and the programs' tracepoints, headers) and returns a `BpfEnv` that loads rendered programs.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from collectors.bpfenv.headers import Headers, find_headers
from collectors.bpfenv.memory import release_compiler_pages, release_freed_heap
from collectors.bpfenv.kernel import KernelVersion, kernel_ok, parse_release, running_release
from collectors.bpfenv.tracefs import ensure_tracefs, missing_tracepoint
from perfbalance.errors import FeatureUnavailable
from perfbalance.host import HostPaths


@dataclass(frozen=True, kw_only=True)
class BpfEnv:
    """What `prepare()` found: a compile environment for bcc on this host."""

    release: str
    version: KernelVersion
    headers: Headers
    bcc_version: str
    cgroup_keys: bool  # bpf_get_current_cgroup_id usable (and a v2 hierarchy exists)
    batch_reads: bool
    procfs: str = "/proc"  # the agent's own /proc/self (its memory after a compile)

    def load(self, text: str, cflags: Sequence[str] = ()) -> Any:
        """Compile and load BPF C with bcc; FeatureUnavailable quoting why it failed.

        bcc's exception says only "Failed to compile BPF module" or "Failed to load BPF program
        ...: Permission denied"; clang's diagnostics and the verifier log go to fd 2 from C++.
        That output is captured while bcc runs (then written to stderr unchanged), and the line
        that says why (clang's first `error:`, or the verifier's complaint) joins the reason.
        """
        bcc = _import_bcc()
        os.environ["BCC_KERNEL_SOURCE"] = self.headers.path
        error: Exception | None = None
        with _fd2_captured() as log:
            try:
                prog = bcc.BPF(text=text.encode(), cflags=list(cflags))
            except Exception as e:  # bcc raises bare Exception for compile/load/attach failures
                error = e
        release_freed_heap()  # what the compile freed, and the compiler's pages (bpfenv/memory.py)
        release_compiler_pages(self.procfs)
        if error is None:
            return prog
        why = load_error_line(log.text)
        raise FeatureUnavailable("bpf", f"bcc could not load the program: {_first_line(error)}"
                                        + (f": {why}" if why else ""))


LOAD_LOG_MAX_BYTES = 1 << 20  # what clang and the verifier print while bcc loads (kept from the start)


class _Captured:
    text = ""


@contextmanager
def _fd2_captured() -> Iterator[_Captured]:
    """Point fd 2 at a temporary file for the block; afterwards restore it, echo what was
    written (bounded) and keep it as `.text`. Only around program loads, at collector start."""
    out = _Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read(LOAD_LOG_MAX_BYTES)
            if data:
                os.write(2, data)
            out.text = data.decode("utf-8", errors="replace")


_VERIFIER_END = re.compile(r"^processed \d+ insns")


def load_error_line(log: str) -> str:
    """The line of a bcc load log that says why: clang's first error, else the verifier's last
    complaint (the line before its "processed N insns" summary), else ""."""
    lines = [line.strip() for line in log.splitlines()]
    for line in lines:
        if ": error: " in line or line.startswith("error: "):
            return line[:300]
    for prev, line in zip(lines, lines[1:]):
        if _VERIFIER_END.match(line) and prev:
            return f"verifier: {prev[:300]}"
    return ""


def _import_bcc() -> Any:
    try:
        import bcc  # noqa: PLC0415 (optional dependency, imported where used)
    except ImportError as e:
        raise FeatureUnavailable("bpf", f"bcc is not importable ({e})") from None
    return bcc


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def bcc_version() -> str:
    try:
        return str(getattr(_import_bcc(), "__version__", "unknown"))
    except FeatureUnavailable:
        return ""


def prepare(host: HostPaths, *, mount_tracefs: bool = True, need: Sequence[str] = ()) -> BpfEnv:
    """Everything bcc needs, or FeatureUnavailable with the reason. `need`: names of bpf.PROGRAMS
    whose tracepoints must exist."""
    if not bcc_version():
        _import_bcc()
    release = running_release(host)
    version = parse_release(release)
    if not kernel_ok(version, "tracepoint programs"):
        raise FeatureUnavailable("bpf", f"kernel {release} is older than 4.7 (no BPF tracepoint programs)")
    ensure_tracefs(host.tracefs, mount=mount_tracefs)
    missing = missing_tracepoint(host.tracefs, need)
    if missing is not None:
        raise FeatureUnavailable("bpf", f"tracepoint {missing} not in {host.tracefs}/events")
    headers = find_headers(host, release)
    return BpfEnv(release=release, version=version, headers=headers, bcc_version=bcc_version(),
                  cgroup_keys=cgroup_keys_usable(host, version),
                  batch_reads=kernel_ok(version, "BPF_MAP_LOOKUP_BATCH"), procfs=host.procfs)


def cgroup_keys_usable(host: HostPaths, version: KernelVersion) -> bool:
    """Map keys can be v2 cgroup ids (bpf_get_current_cgroup_id, and a v2 hierarchy exists);
    otherwise the programs key by process id."""
    return kernel_ok(version, "bpf_get_current_cgroup_id") and _has_v2(host)


def _has_v2(host: HostPaths) -> bool:
    """A cgroup v2 hierarchy exists (pure v2 at the root, or hybrid's unified/)."""
    return any(os.path.isfile(os.path.join(host.cgroup, sub, "cgroup.controllers"))
               for sub in ("", "unified"))
