"""A tiny BTF encoder for tests: the types a kernel's vmlinux BTF would hold, laid out as the
format says (Documentation/bpf/btf.rst), so the parser is tested on blobs whose truth is known."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

INT, PTR, STRUCT, UNION, TYPEDEF, FUNC_PROTO = 1, 2, 4, 5, 8, 13


@dataclass
class BtfBuilder:
    strings: bytearray = field(default_factory=lambda: bytearray(b"\0"))
    types: list[bytes] = field(default_factory=list)

    def _str(self, name: str) -> int:
        if not name:
            return 0
        raw = name.encode() + b"\0"
        i = self.strings.find(raw)
        if i > 0 and self.strings[i - 1] == 0:
            return i
        self.strings += raw
        return len(self.strings) - len(raw)

    def _add(self, name: str, kind: int, vlen: int, size_or_type: int, extra: bytes = b"") -> int:
        self.types.append(struct.pack("<III", self._str(name), (kind << 24) | vlen, size_or_type) + extra)
        return len(self.types)  # type ids start at 1

    def int_(self, name: str, size: int) -> int:
        return self._add(name, INT, 0, size, struct.pack("<I", size * 8))

    def ptr(self, to: int) -> int:
        return self._add("", PTR, 0, to)

    def typedef(self, name: str, to: int) -> int:
        return self._add(name, TYPEDEF, 0, to)

    def _members(self, members: list[tuple[str, int, int]]) -> bytes:
        """members: (name, type id, byte offset), as a struct's member records."""
        return b"".join(struct.pack("<III", self._str(n), t, off * 8) for n, t, off in members)

    def struct_(self, name: str, size: int, members: list[tuple[str, int, int]], *, union: bool = False) -> int:
        return self._add(name, UNION if union else STRUCT, len(members), size, self._members(members))

    def placeholder_struct(self, name: str) -> int:
        """A struct to be filled in later (for self-referencing pointers): returns its id."""
        self.types.append(b"")
        self._pending = getattr(self, "_pending", {})
        self._pending[len(self.types)] = name
        return len(self.types)

    def fill(self, tid: int, size: int, members: list[tuple[str, int, int]]) -> None:
        self.types[tid - 1] = (struct.pack("<III", self._str(self._pending[tid]), (STRUCT << 24) | len(members), size)
                               + self._members(members))

    def proto(self, ret: int, params: list[tuple[str, int]]) -> int:
        extra = b"".join(struct.pack("<II", self._str(n), t) for n, t in params)
        return self._add("", FUNC_PROTO, len(params), ret, extra)

    def blob(self, *, magic: int = 0xEB9F) -> bytes:
        type_sec = b"".join(self.types)
        header = struct.pack("<HBBIIIII", magic, 1, 0, 24, 0, len(type_sec), len(type_sec), len(self.strings))
        return header + type_sec + bytes(self.strings)


def kernel_like(*, with_sched_info: bool = True, prev_state: bool = True) -> bytes:
    """The structs runqlat's sched_info method reads, at made-up offsets, with sched_info inside
    an anonymous union as a member layout might put it, and btf_trace_sched_switch."""
    b = BtfBuilder()
    u64, u32, i32 = b.int_("long long unsigned int", 8), b.int_("unsigned int", 4), b.int_("int", 4)
    boolean, ulong = b.int_("bool", 1), b.int_("long unsigned int", 8)
    kernfs = b.struct_("kernfs_node", 128, [("id", u64, 96)])
    cgroup = b.struct_("cgroup", 512, [("nr_populated_csets", i32, 236), ("kn", b.ptr(kernfs), 256)])
    css_set = b.struct_("css_set", 256, [("dfl_cgrp", b.ptr(cgroup), 112)])
    rq = b.struct_("rq", 4096, [("clock", u64, 2776)])
    cfs_rq = b.struct_("cfs_rq", 512, [("rq", b.ptr(rq), 312)])
    task = b.placeholder_struct("task_struct")
    se = b.struct_("sched_entity", 256, [("cfs_rq", b.ptr(cfs_rq), 72)])
    members = [("tgid", b.typedef("pid_t", i32), 1268), ("cgroups", b.ptr(css_set), 2376), ("se", se, 224)]
    if with_sched_info:
        sched_info = b.struct_("sched_info", 48, [("pcount", ulong, 0), ("run_delay", u64, 8),
                                                  ("last_queued", u64, 40)])
        anon = b.struct_("", 64, [("sched_info", sched_info, 8)], union=True)
        members.append(("", anon, 1000))
    b.fill(task, 4096, members)
    ptask = b.ptr(task)
    void_ptr = b.ptr(0)
    params = [("__data", void_ptr), ("preempt", boolean), ("prev", ptask), ("next", ptask)]
    if prev_state:
        params.append(("prev_state", u32))
    b.typedef("btf_trace_sched_switch", b.ptr(b.proto(0, params)))
    return b.blob()
