"""Load one function of a bcc-compiled object as a BTF raw-tracepoint program ("tp_btf") and
attach it: what bcc 0.26 cannot do itself (its loader picks the attach type from the function's
name prefix, and has none for tp_btf).

A tp_btf program receives the tracepoint's raw arguments typed by the kernel's BTF: ctx[i] is the
i-th argument of the tracepoint's prototype (for sched_switch: preempt, prev, next, prev_state),
and loads through its struct pointers are plain instructions that the verifier checks against
BTF (no bpf_probe_read_kernel call, which costs a helper call and return each). bcc compiles the
C and creates the maps; its instructions already hold the map fds, so BPF_PROG_LOAD takes them
as they are, with prog_type TRACING, expected_attach_type BPF_TRACE_RAW_TP and the BTF id of
typedef btf_trace_<event>. BPF_RAW_TRACEPOINT_OPEN with no name then attaches it to the event
that id names. Both fds belong to the returned object; close() detaches.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Any

from collectors.bpfenv.loader import load_error_line
from collectors.bpfenv.progstats import bpf_syscall
from perfbalance.errors import FeatureUnavailable

BPF_PROG_LOAD, BPF_RAW_TRACEPOINT_OPEN = 5, 17
BPF_PROG_TYPE_TRACING, BPF_TRACE_RAW_TP = 26, 23
ATTR_BYTES = 160  # union bpf_attr as far as PROG_LOAD reaches, zero beyond (the kernel checks)
LOG_BYTES = 1 << 20
TP_BTF = "tp_btf"  # the "category" of a BTF raw tracepoint where programs are named (category, event)


class RawTracepoint:
    """A loaded and attached tp_btf program: `fd` (its run statistics are in its fdinfo)."""

    def __init__(self, fd: int, link: int, event: str) -> None:
        self.fd, self.link, self.event = fd, link, event

    def close(self) -> None:
        for fd in (self.link, self.fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = self.link = -1


def _prog_load(name: bytes, insns: int | None, count: int, license: ctypes.Array[ctypes.c_char], btf_id: int,
               log: ctypes.Array[ctypes.c_char] | None) -> tuple[int, int]:
    attr = ctypes.create_string_buffer(ATTR_BYTES)
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf (include/uapi/linux/bpf.h)
    struct.pack_into("<IIQQIIQ", attr, 0, BPF_PROG_TYPE_TRACING, count, insns or 0, ctypes.addressof(license),
                     1 if log is not None else 0, len(log) if log is not None else 0,
                     ctypes.addressof(log) if log is not None else 0)
    attr[48:48 + min(15, len(name))] = name[:15]  # prog_name
    struct.pack_into("<I", attr, 68, BPF_TRACE_RAW_TP)  # expected_attach_type
    struct.pack_into("<I", attr, 108, btf_id)  # attach_btf_id
    return bpf_syscall(BPF_PROG_LOAD, attr)


def attach(module: Any, function: str, *, btf_id: int, event: str) -> RawTracepoint:
    """Load `function` of the bcc object `module` (a bcc.BPF) as a tp_btf program for the
    tracepoint typedef `btf_id` (btf_trace_<event>) and attach it."""
    from bcc import lib  # noqa: PLC0415 (optional dependency, as in loader.py)

    name = function.encode()
    start = lib.bpf_function_start(module.module, name)
    size = lib.bpf_function_size(module.module, name)
    if not start or size <= 0:
        raise FeatureUnavailable("bpf", f"tp_btf program {function}: not in the compiled object")
    license = ctypes.create_string_buffer(lib.bpf_module_license(module.module) or b"GPL")
    insns = ctypes.cast(start, ctypes.c_void_p).value
    fd, err = _prog_load(name, insns, size // 8, license, btf_id, None)
    if fd < 0:  # again with the verifier's log, for the reason (a log costs time on success)
        log = ctypes.create_string_buffer(LOG_BYTES)
        fd, err = _prog_load(name, insns, size // 8, license, btf_id, log)
    if fd < 0:
        why = load_error_line(log.value.decode(errors="replace"))
        raise FeatureUnavailable("bpf", f"tp_btf program {function} for {event} not loaded: {os.strerror(err)}"
                                        + (f": {why}" if why else ""))
    open_attr = ctypes.create_string_buffer(16)
    struct.pack_into("<QI", open_attr, 0, 0, fd)  # raw_tracepoint.name = NULL: the BTF id names it
    link, err = bpf_syscall(BPF_RAW_TRACEPOINT_OPEN, open_attr)
    if link < 0:
        os.close(fd)
        raise FeatureUnavailable("bpf", f"tp_btf program {function} not attached to {event}: {os.strerror(err)}")
    return RawTracepoint(fd, link, event)
