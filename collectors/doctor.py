"""What `perfbalance doctor` shows about BPF and perf on this node, and `--dump-bpf`.

Kept apart from collectors.bpfenv because it looks at the collectors too (perf events, the
defines each collector renders its program with); bpfenv itself knows no collector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import bpf
from collectors import avx512, perf, runqlat
from collectors.bpfenv.kernel import check_kernel, parse_release, running_release
from collectors.bpfenv.loader import bcc_version, cgroup_keys_usable, prepare
from collectors.bpfenv.tracefs import tracefs_mounted, tracepoints
from collectors.config import CollectorsConfig
from collectors.events import parse_events
from perfbalance import cpus
from perfbalance.errors import FeatureUnavailable, ParseError
from perfbalance.host import HostPaths


def probe(host: HostPaths, *, mount_tracefs: bool = False) -> dict[str, Any]:
    """What `perfbalance doctor` shows about BPF on this node. Never raises."""
    try:
        release = running_release(host)
    except ParseError as e:
        release = f"unreadable ({e})"
    out: dict[str, Any] = {"available": False, "reason": "", "bcc_version": bcc_version(),
                           "kernel": {"release": release}, "tracefs": host.tracefs}
    try:
        version = parse_release(release)
        out["kernel"]["requirements"] = check_kernel(version)
        out["tracepoints"] = tracepoints(host.tracefs) if tracefs_mounted(host.tracefs) else {}
        env = prepare(host, mount_tracefs=mount_tracefs)
        out["headers"] = env.headers.to_json()
        out["cgroup_keys"] = env.cgroup_keys
        out["batch_reads"] = env.batch_reads
        out["tracepoints"] = tracepoints(host.tracefs)
        out["available"] = True
        out["reason"] = f"bcc {out['bcc_version']} with {env.headers.source} headers {env.headers.release}"
    except (FeatureUnavailable, ParseError, OSError) as e:
        out["reason"] = getattr(e, "reason", str(e))
    out["perf_events"] = perf.probe_events()
    return out


@dataclass(frozen=True, kw_only=True)
class RenderedProgram:
    """One BPF program as the agent would hand it to bcc: its flags and the exact C text."""

    name: str
    collector: str
    cflags: tuple[str, ...]
    text: str


def rendered_programs(config: CollectorsConfig, host: HostPaths) -> list[RenderedProgram]:
    """Every program the collectors would load with `config` on this host, rendered by their
    pure define functions; nothing is compiled or loaded. Map keys are cgroup ids where the
    kernel and a v2 hierarchy allow it, else process ids (as at load time); the pmu program's
    event count is that of the configured events that open here (perf events are opened and
    closed at once to find out, as the collector does)."""
    pid_keys = not cgroup_keys_usable(host, parse_release(running_release(host)))
    wanted: list[tuple[str, str, dict[str, bpf.DefineValue]]] = []
    if config.avx512.enabled and config.avx512.source in ("auto", "bpf"):
        wanted.append(("avx512", "avx512", avx512.bpf_defines(config.avx512, pid_keys=pid_keys)))
    ncpu = cpus.possible_cpus(host.sysfs)  # the stride of the pmu's and runqlat's per-CPU arrays
    if config.perf.mode in ("auto", "bpf"):
        events, _ = perf.choose_events(parse_events(config.perf.events), cpu=perf.online_cpus(host.sysfs)[0])
        wanted.append(("pmu", "perf", perf.bpf_defines(config.perf, nevents=len(events), ncpu=ncpu,
                                                       pid_keys=pid_keys)))
    if config.runqlat.enabled:
        try:
            layout, _ = runqlat.choose_layout(config.runqlat, host)
        except FeatureUnavailable:  # sched_info asked for and unavailable: the collector won't start
            layout = None
        wanted.append(("runqlat", "runqlat", runqlat.bpf_defines(config.runqlat, pid_keys=pid_keys, ncpu=ncpu,
                                                                       layout=layout)))
    return [RenderedProgram(name=name, collector=collector, cflags=tuple(bpf.cflags(name, defines)),
                            text=bpf.render(name, defines)) for name, collector, defines in wanted]


def dump_text(programs: list[RenderedProgram]) -> str:
    """`doctor --dump-bpf`: each program with its -D flags, then the C source bcc compiles."""
    parts = []
    for p in programs:
        parts.append(f"/* ===== {p.name} (collector {p.collector}): {bpf.PROGRAMS[p.name].doc} =====\n"
                     f" * cflags: {' '.join(p.cflags) or '(none)'}\n */\n{p.text}")
    return "\n".join(parts) if parts else "/* no BPF program would be loaded with this configuration */\n"
