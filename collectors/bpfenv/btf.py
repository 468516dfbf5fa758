"""The running kernel's own type information (BTF, /sys/kernel/btf/vmlinux): struct member offsets
and raw-tracepoint prototypes, so a program can read kernel structs at this kernel's layout.

bcc compiles against a header tree that is often not the running kernel's (here Debian's 6.1
headers for a 6.18 kernel), so programs built on it never read a struct. BTF describes the
running kernel exactly: a program that takes its offsets from here as defines reads the right
fields, and the verifier checks every such load against the same BTF (a wrong offset is refused
at load, never read). Only what is asked for is looked up, in one pass over the type section;
nothing of the 5-6 MB blob is kept.

Format (Documentation/bpf/btf.rst): a header (magic 0xeB9F, version 1, flags, hdr_len, then
type_off/type_len and str_off/str_len relative to the header's end), a type section of
`struct btf_type` records (name_off, info, size_or_type) each followed by kind-specific data, and
a string section. Type ids number the records from 1 (0 is void).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from perfbalance.errors import FeatureUnavailable

MAGIC = 0xEB9F
VMLINUX = "kernel/btf/vmlinux"  # under sysfs
BTF_MAX_BYTES = 64 << 20  # vmlinux BTF is 5-6 MB on distribution kernels

# kinds (include/uapi/linux/btf.h)
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)
_FIXED = {INT: 4, ARRAY: 12, VAR: 4, DECL_TAG: 4}  # bytes after the record, whatever vlen is
_PER_VLEN = {STRUCT: 12, UNION: 12, ENUM: 8, FUNC_PROTO: 8, DATASEC: 12, ENUM64: 12}
_KNOWN = set(range(1, 20))
_QUALIFIERS = (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG)


@dataclass(frozen=True)
class Member:
    offset: int  # bytes from the start of the outermost struct
    size: int  # bytes of the member's type (qualifiers and typedefs resolved)
    kind: int  # its kind after resolving (INT, PTR, STRUCT, ...)


class Btf:
    """One parsed BTF blob: the type records' positions, looked up by name on demand."""

    def __init__(self, data: bytes, *, source: str = "btf") -> None:
        self.source = source
        if len(data) < 24:
            raise self._bad("header", f"{len(data)} bytes")
        magic, version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != MAGIC:
            raise self._bad("magic", hex(magic))
        if version != 1:
            raise self._bad("version", version)
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        ts, ss = hdr_len + type_off, hdr_len + str_off
        if hdr_len < 24 or ts + type_len > len(data) or ss + str_len > len(data):
            raise self._bad("section bounds", f"types {ts}+{type_len}, strings {ss}+{str_len} of {len(data)} bytes")
        self._data = data
        self._strings = data[ss:ss + str_len]
        self._pos: list[int] = [0]  # type id -> offset of its record (id 0: void)
        pos, end = ts, ts + type_len
        while pos < end:
            if pos + 12 > end:
                raise self._bad("type record", f"truncated at byte {pos}")
            info = struct.unpack_from("<I", data, pos + 4)[0]
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            if kind not in _KNOWN:
                raise self._bad(f"type {len(self._pos)} kind", kind)
            self._pos.append(pos)
            pos += 12 + _FIXED.get(kind, 0) + _PER_VLEN.get(kind, 0) * vlen
        if pos != end:
            raise self._bad("type section", f"records end at byte {pos}, the section at {end}")

    @classmethod
    def read(cls, path: str) -> Btf:
        try:
            with open(path, "rb") as f:
                data = f.read(BTF_MAX_BYTES + 1)
        except OSError as e:
            raise FeatureUnavailable("btf", f"{path}: {e.strerror or e}") from None
        if len(data) > BTF_MAX_BYTES:
            raise FeatureUnavailable("btf", f"{path}: larger than {BTF_MAX_BYTES} bytes")
        return cls(data, source=path)

    # -- records -------------------------------------------------------------------------------
    def _bad(self, field: str, value: object) -> FeatureUnavailable:
        return FeatureUnavailable("btf", f"{self.source}: {field} is {value}")

    def _record(self, tid: int) -> tuple[int, int, int, int, int, int]:
        """(name_off, kind, vlen, kind_flag, size_or_type, offset of the kind-specific data)."""
        if not 0 < tid < len(self._pos):
            raise self._bad("type id", tid)
        pos = self._pos[tid]
        name_off, info, size = struct.unpack_from("<III", self._data, pos)
        return name_off, (info >> 24) & 0x1F, info & 0xFFFF, info >> 31, size, pos + 12

    def name(self, name_off: int) -> str:
        end = self._strings.find(b"\0", name_off)
        if name_off >= len(self._strings) or end < 0:
            raise self._bad("string offset", name_off)
        return self._strings[name_off:end].decode(errors="replace")

    def _string_offset(self, name: str) -> int | None:
        """The string section's offset of `name` (BTF strings are deduplicated: one offset)."""
        raw = name.encode()
        i = 0
        while True:
            i = self._strings.find(raw + b"\0", i)
            if i < 0:
                return None
            if i == 0 or self._strings[i - 1] == 0:
                return i
            i += 1

    def find(self, name: str, kind: int) -> int:
        """The id of the first type of `kind` named `name`."""
        off = self._string_offset(name)
        if off is not None:
            for tid in range(1, len(self._pos)):
                name_off, info = struct.unpack_from("<II", self._data, self._pos[tid])
                if name_off == off and (info >> 24) & 0x1F == kind:
                    return tid
        raise FeatureUnavailable("btf", f"{self.source}: no {_KIND_NAMES.get(kind, kind)} {name}")

    def resolve(self, tid: int) -> int:
        """`tid` with typedefs and qualifiers stripped."""
        for _ in range(32):
            if tid == 0:
                return 0
            _, kind, _, _, ref, _ = self._record(tid)
            if kind not in _QUALIFIERS:
                return tid
            tid = ref
        raise self._bad("type chain", f"longer than 32 at type {tid}")

    def size(self, tid: int) -> int:
        tid = self.resolve(tid)
        if tid == 0:
            return 0
        _, kind, _, _, size, extra = self._record(tid)
        if kind == PTR:
            return 8
        if kind == ARRAY:
            elem, _index, n = struct.unpack_from("<III", self._data, extra)
            return self.size(elem) * n
        return size  # INT, STRUCT, UNION, ENUM, ENUM64, FLOAT: size_or_type is the size

    def _members(self, tid: int) -> list[tuple[str, int, int]]:
        """(name, type id, bit offset) of a struct's or union's members."""
        _, kind, vlen, kflag, _, extra = self._record(tid)
        if kind not in (STRUCT, UNION):
            raise self._bad(f"type {tid} kind", _KIND_NAMES.get(kind, kind))
        out = []
        for i in range(vlen):
            name_off, mtype, moff = struct.unpack_from("<III", self._data, extra + 12 * i)
            out.append((self.name(name_off) if name_off else "", mtype, moff & 0xFFFFFF if kflag else moff))
        return out

    def _member_in(self, tid: int, name: str) -> tuple[int, int] | None:
        """(type id, byte offset) of member `name` of struct/union `tid`, looking through
        anonymous struct and union members."""
        for mname, mtype, bits in self._members(tid):
            if mname == name:
                if bits % 8:
                    raise self._bad(f"member {name} bit offset", bits)
                return mtype, bits // 8
            if not mname:
                inner = self.resolve(mtype)
                if self._record(inner)[1] in (STRUCT, UNION):
                    found = self._member_in(inner, name)
                    if found is not None:
                        return found[0], bits // 8 + found[1]
        return None

    # -- what programs ask for -----------------------------------------------------------------
    def member(self, struct_name: str, path: str) -> Member:
        """Offset, size and kind of `path` ("sched_info.run_delay") in `struct struct_name`."""
        tid, offset = self.find(struct_name, STRUCT), 0
        for part in path.split("."):
            inner = self.resolve(tid)
            found = self._member_in(inner, part) if self._record(inner)[1] in (STRUCT, UNION) else None
            if found is None:
                raise FeatureUnavailable("btf", f"{self.source}: struct {struct_name} has no member {path}")
            tid, offset = found[0], offset + found[1]
        resolved = self.resolve(tid)
        return Member(offset=offset, size=self.size(resolved), kind=self._record(resolved)[1] if resolved else 0)

    def raw_tracepoint(self, event: str) -> tuple[int, list[str]]:
        """The id of typedef btf_trace_<event> (what a BTF raw-tracepoint program attaches to)
        and its arguments' type names after the leading `void *__data` (as the program sees them
        in ctx[0], ctx[1], ...): "bool", "struct task_struct *", "unsigned int"."""
        tid = self.find(f"btf_trace_{event}", TYPEDEF)
        ptr = self._record(tid)[4]
        _, pkind, _, _, proto, _ = self._record(ptr)
        _, fkind, vlen, _, _, extra = self._record(proto) if pkind == PTR else (0, 0, 0, 0, 0, 0)
        if pkind != PTR or fkind != FUNC_PROTO:
            raise self._bad(f"btf_trace_{event}", "not a pointer to a function prototype")
        names = [self.type_name(struct.unpack_from("<II", self._data, extra + 8 * i)[1]) for i in range(vlen)]
        if not names or names[0] != "void *":
            raise self._bad(f"btf_trace_{event} first argument", names[0] if names else "missing")
        return tid, names[1:]

    def type_name(self, tid: int) -> str:
        """A C-like name: "struct task_struct *", "unsigned int", "bool" (typedef names kept)."""
        if tid == 0:
            return "void"
        name_off, kind, _, _, ref, _ = self._record(tid)
        if kind == PTR:
            return self.type_name(ref) + " *"
        if kind in (CONST, VOLATILE, RESTRICT, TYPE_TAG):
            return self.type_name(ref)
        prefix = {STRUCT: "struct ", UNION: "union ", ENUM: "enum ", ENUM64: "enum "}.get(kind, "")
        return prefix + (self.name(name_off) if name_off else "(anon)")


_KIND_NAMES = {INT: "int", PTR: "pointer", ARRAY: "array", STRUCT: "struct", UNION: "union", ENUM: "enum",
               FWD: "forward", TYPEDEF: "typedef", FUNC: "function", FUNC_PROTO: "prototype",
               ENUM64: "enum64"}


def require(m: Member, what: str, *, size: Sequence[int], kind: Sequence[int], source: str) -> int:
    """m's offset, or FeatureUnavailable naming `what` when its size or kind is not as a program
    reading it assumes."""
    if m.size not in size or m.kind not in kind:
        raise FeatureUnavailable("btf", f"{source}: {what} is {m.size} bytes of kind "
                                        f"{_KIND_NAMES.get(m.kind, m.kind)}, not {'/'.join(map(str, size))}")
    return m.offset
