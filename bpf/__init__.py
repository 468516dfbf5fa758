"""BPF programs (bpf/*.bpf.c) and the pure function that renders them for bcc.

The C files are templates only in the sense of `#ifndef` defaults: `render()` prepends `#define`
lines (the same effect as `-D` flags), so `perfbalance doctor --dump-bpf` shows exactly the text
bcc compiles. Programs read tracepoint fields and helpers only, never a layout from the header
tree bcc compiles with; the one struct reader (runqlat's sched_info method) takes every offset
from the running kernel's BTF as a define (collectors/bpfenv/btf.py), and the verifier checks
each of its loads against that BTF.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from perfbalance.errors import ParseError
from perfbalance.names import C_IDENTIFIER, is_name


@dataclass(frozen=True, kw_only=True)
class Program:
    name: str
    file: str
    tracepoint: tuple[str, str]  # (category, event)
    defines: tuple[str, ...]  # the defines it understands
    doc: str
    also: tuple[tuple[str, str], ...] = ()  # further tracepoints of the same program

    @property
    def tracepoints(self) -> tuple[tuple[str, str], ...]:
        """Every (category, event) the program attaches to: all must exist to load it."""
        return (self.tracepoint, *self.also)


# runqlat's sched_info method: the struct offsets it reads, from the running kernel's BTF.
SCHEDINFO_OFFSETS = ("PB_OFF_LAST_QUEUED", "PB_OFF_SE_CFS_RQ", "PB_OFF_CFS_RQ_RQ", "PB_OFF_RQ_CLOCK",
                     "PB_OFF_CGROUPS", "PB_OFF_DFL_CGRP", "PB_OFF_KN", "PB_OFF_KN_ID", "PB_OFF_POPULATED",
                     "PB_OFF_TGID")
SCHEDINFO_FUNCTION = "pb_runqlat_switch"  # its tp_btf program on sched_switch (not a bcc auto-attach name)

PROGRAMS: dict[str, Program] = {
    "avx512": Program(
        name="avx512", file="avx512.bpf.c", tracepoint=("x86_fpu", "x86_fpu_regs_deactivated"),
        defines=("PB_MAX_KEYS", "PB_KEY_PID", "PB_FLUSH"),
        doc="FPU-state switches per cgroup: ZMM_Hi256 (512-bit), EVEX-256 only, all"),
    "pmu": Program(
        name="pmu", file="pmu.bpf.c", tracepoint=("sched", "sched_switch"),
        also=(("sched", "sched_process_fork"), ("cgroup", "cgroup_attach_task")),
        defines=("PB_NEVENTS", "PB_NCPU", "PB_MAX_KEYS", "PB_KEY_PID", "PB_TASK_BITS", "PB_NO_READS"),
        doc="per-CPU perf counters attributed to the outgoing task's cgroup at sched_switch"),
    "runqlat": Program(
        name="runqlat", file="runqlat.bpf.c", tracepoint=("sched", "sched_switch"),
        also=(("sched", "sched_wakeup"), ("sched", "sched_wakeup_new")),
        defines=("PB_MAX_KEYS", "PB_TASK_BITS", "PB_KEY_PID", "PB_FLUSH", "PB_NCPU", "PB_SCHEDINFO",
                 *SCHEDINFO_OFFSETS),
        doc="run-queue latency (wakeup or preemption -> switch-in) per cgroup, log2 histogram"),
}


def all_tracepoints() -> tuple[tuple[str, str], ...]:
    """The tracepoints of every program, each once, in program order."""
    return tuple(dict.fromkeys(tp for p in PROGRAMS.values() for tp in p.tracepoints))


def probe_function(tracepoint: tuple[str, str]) -> bytes:
    """bcc's name for the TRACEPOINT_PROBE(category, event) function: tracepoint__<cat>__<event>."""
    return f"tracepoint__{tracepoint[0]}__{tracepoint[1]}".encode()


DefineValue = int | bool | str


@cache
def template(name: str) -> str:
    """The C source of program `name` as shipped in this package."""
    if name not in PROGRAMS:
        raise ParseError("bpf program", name, f"unknown (known: {', '.join(sorted(PROGRAMS))})")
    return resources.files(__name__).joinpath(PROGRAMS[name].file).read_text()


def render_text(text: str, defines: Mapping[str, DefineValue], *, name: str = "bpf") -> str:
    """Prepend `#define`s to `text`. True -> `#define X`, False -> omitted, ints and identifiers as is."""
    lines = [f"// rendered by perfbalance: {name}"]
    for key in sorted(defines):
        value = defines[key]
        if not is_name(key, C_IDENTIFIER):
            raise ParseError(f"{name} define", key, "not a C identifier")
        if value is False:
            continue
        if value is True:
            lines.append(f"#define {key}")
        elif isinstance(value, int):
            lines.append(f"#define {key} {value}")
        elif isinstance(value, str) and is_name(value, C_IDENTIFIER):
            lines.append(f"#define {key} {value}")
        else:
            raise ParseError(f"{name} define {key}", value, "must be a bool, an int or a C identifier")
    return "\n".join(lines) + "\n\n" + text


def render(name: str, defines: Mapping[str, DefineValue]) -> str:
    """The exact text bcc will compile for program `name` with these defines."""
    unknown = sorted(set(defines) - set(PROGRAMS[name].defines)) if name in PROGRAMS else []
    if unknown:
        raise ParseError(f"{name} define", unknown[0], f"unknown (known: {', '.join(PROGRAMS[name].defines)})")
    return render_text(template(name), defines, name=name)


def cflags(name: str, defines: Mapping[str, DefineValue]) -> list[str]:
    """The `-D` flags with the same effect as the `#define` lines render() prepends."""
    lines = render(name, defines).split("\n\n", 1)[0].splitlines()
    out = []
    for line in lines:
        if line.startswith("#define "):
            key, _, value = line.removeprefix("#define ").partition(" ")
            out.append(f"-D{key}={value}" if value else f"-D{key}")
    return out
