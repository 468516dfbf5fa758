"""`perfbalance doctor`: what this node offers and what the agent will use, and why not.

Each section (kernel, bpf, perf, avx512, resctrl, blockio, rt, cgroup, kubelet, runtime, config) answers `available`
and `reason`, plus the details a platform engineer needs to fix it. Doctor never raises on a
missing feature and never changes the node, except that it may mount tracefs (as the agent
does) when `--mount-tracefs` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

from agent.config import Config, load_config, node_name
from agent.wiring import host_paths
from perfbalance.errors import ConfigError, PerfbalanceError
from perfbalance.host import HostPaths
from perfbalance.safefs import read_text
from perfbalance.settings import to_dict

SECTIONS = ("kernel", "bpf", "perf", "avx512", "resctrl", "blockio", "rt", "cgroup", "kubelet", "runtime", "config")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--config", metavar="FILE", help="config file to check and take host roots from")
    p.add_argument("--mount-tracefs", action="store_true", help="mount tracefs if missing, as the agent does")
    p.add_argument("--dump-bpf", action="store_true",
                   help="print the C source and -D flags of each BPF program the agent would load (loads nothing)")


def _guard(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as e:  # doctor must report, not crash
        return {"available": False, "reason": f"probe failed: {type(e).__name__}: {e}"}


def kernel(host: HostPaths, bpf: dict[str, Any]) -> dict[str, Any]:
    release = platform.release()
    btf = os.path.exists(os.path.join(host.sysfs, "kernel", "btf", "vmlinux"))
    reqs = bpf.get("kernel", {}).get("requirements", {})
    failing = [f"{name} needs >= {r.get('minimum')}" for name, r in reqs.items() if not r.get("ok", True)]
    return {"available": not failing, "release": release, "btf": btf, "requirements": reqs,
            "reason": "; ".join(failing) if failing else f"{release} meets every minimum"}


def perf(bpf: dict[str, Any]) -> dict[str, Any]:
    events = bpf.get("perf_events", {})
    software = {"task_clock", "context_switches", "cpu_migrations"}
    hw = sorted(k for k, v in events.items() if v == "ok" and k not in software)
    sw = sorted(k for k, v in events.items() if v == "ok" and k in software)
    if hw:
        reason = f"hardware events open: {', '.join(hw)}"
    elif sw:
        reason = f"no hardware PMU (a VM?): software events {', '.join(sw)} will be used for attribution"
    else:
        reason = "no perf events can be opened (perf_event_paranoid or missing CAP_PERFMON?)"
    return {"available": bool(hw or sw), "hardware_pmu": bool(hw), "events": events, "reason": reason}


def avx512(host: HostPaths, bpf: dict[str, Any]) -> dict[str, Any]:
    flags: list[str] = []
    try:
        with open(os.path.join(host.procfs, "cpuinfo"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = sorted(x for x in line.split(":", 1)[1].split() if x.startswith("avx512"))
                    break
    except OSError as e:
        return {"available": False, "reason": f"cannot read cpuinfo: {e.strerror}"}
    tp = bpf.get("tracepoints", {}).get("x86_fpu/x86_fpu_regs_deactivated")
    if not flags:
        reason, ok = "the CPU has no AVX-512: nothing to detect", False
    elif bpf.get("available") and tp:
        reason, ok = "eBPF on x86_fpu_regs_deactivated (ZMM_Hi256 vs EVEX-256)", True
    else:
        reason, ok = "BPF unavailable: falling back to /proc/<pid>/arch_status (coarser: includes EVEX-256)", True
    return {"available": ok, "cpu_flags": flags, "tracepoint": bool(tp), "source": "bpf" if bpf.get("available") and tp else "arch_status", "reason": reason}


def resctrl(host: HostPaths) -> dict[str, Any]:
    from resctrl.info import find_mount, read_info

    mount = find_mount(host.procfs)
    if mount is None:
        return {"available": False, "reason": "resctrl is not mounted (no RDT on this CPU, or mount -t resctrl resctrl /sys/fs/resctrl)"}
    info = read_info(mount)
    return {"available": True, "reason": f"mounted at {mount.path}", "info": to_dict(info)}


def class_controllers(config: Config) -> dict[str, dict[str, Any]]:
    """Block-I/O and real-time classes: whether the node offers each controller, and why not."""
    from agent.act.classnode import CONTROLLERS, availability
    from perfbalance.cgroupfs import Cgroupfs

    try:
        return availability(config, Cgroupfs(root=config.host.cgroup_root))
    except Exception as e:  # doctor must report, not crash
        return {name: {"available": False, "reason": f"probe failed: {type(e).__name__}: {e}"} for name in CONTROLLERS}


def cgroup(host: HostPaths) -> dict[str, Any]:
    from perfbalance.cgroupfs import Cgroupfs

    cg = Cgroupfs(root=host.cgroup)
    ctl = cg.controllers()
    missing = [c for c in ("cpuset", "cpu") if c not in ctl]
    return {"available": not missing, "layout": cg.layout, "controllers": list(ctl),
            "root": host.cgroup,
            "reason": f"{cg.layout} layout" + (f"; missing controllers: {', '.join(missing)}" if missing else "")}


def kubelet(host: HostPaths) -> dict[str, Any]:
    from agent.discover.kubelet import read_cpu_manager_state, state_path

    path = state_path(host.kubelet)
    if not os.path.exists(path):
        return {"available": False, "path": path, "policy": "none",
                "reason": "no cpu_manager_state: not a kubelet node, or the kubelet root differs (host.kubelet_root)"}
    try:
        st = read_cpu_manager_state(host.kubelet)
    except Exception as e:
        return {"available": False, "path": path, "reason": str(e)}
    return {"available": True, "path": path, "policy": st.policy,
            "default_cpuset": str(st.default_cpuset), "exclusive": len(st.exclusive),
            "reason": f"CPU manager policy {st.policy}; {len(st.exclusive)} exclusive assignment(s) left untouched"}


def runtime(config: Config) -> dict[str, Any]:
    """The actuation path (docs/nri.md): what the running agent uses, else what it would use.
    Doctor never dials the socket itself (that would register a second plugin)."""
    from agent.nri.api import NRI_VERSION, NriUnavailable, load_nri
    from agent.nri.runtime import ACTUATION_STATUS_FILE

    r = config.runtime
    out: dict[str, Any] = {"mode": r.nri, "socket": r.nri_socket, "socket_exists": os.path.exists(r.nri_socket),
                           "api": f"nri.pkg.api.v1alpha1 (containerd/nri {NRI_VERSION})"}
    try:
        load_nri()
    except NriUnavailable as e:
        out["protocol"] = str(e)
    running = _running_status(os.path.join(config.agent.run_dir, ACTUATION_STATUS_FILE))
    if running is not None:
        out["running_agent"] = running
        path = running.get("path", "cgroupfs")
        why = running.get("reason") or f"connected to {running.get('runtime')}"
        return {**out, "available": path == "nri", "path": path,
                "reason": f"the running agent (pid {running.get('pid')}) moves by {path}: {why}"}
    if r.nri == "off":
        why = "runtime.nri is off: cgroupfs writes"
    elif "protocol" in out:
        why = out["protocol"]
    elif not out["socket_exists"]:
        why = f"{r.nri_socket} does not exist (NRI not enabled in the runtime?): cgroupfs writes, retried with back-off"
    else:
        why = f"{r.nri_socket} exists: the agent will register as {r.nri_plugin_index}-{r.nri_plugin_name}"
    ok = r.nri != "off" and "protocol" not in out and out["socket_exists"]
    return {**out, "available": ok, "path": "nri" if ok else "cgroupfs", "reason": why}


def _running_status(path: str) -> dict[str, Any] | None:
    """The running agent's status file, when that agent is alive."""
    try:
        data = json.loads(read_text(path, CONFIG_STATUS_MAX_BYTES, "agent actuation status"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    try:
        os.kill(data["pid"], 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return data


def report(config: Config, *, config_error: str = "", mount_tracefs: bool = False) -> dict[str, Any]:
    from collectors.doctor import probe

    host = host_paths(config)
    bpf = _guard(lambda: probe(host, mount_tracefs=mount_tracefs))
    out = {
        "kernel": _guard(lambda: kernel(host, bpf)),
        "bpf": bpf,
        "perf": _guard(lambda: perf(bpf)),
        "avx512": _guard(lambda: avx512(host, bpf)),
        "resctrl": _guard(lambda: resctrl(host)),
        **class_controllers(config),
        "cgroup": _guard(lambda: cgroup(host)),
        "kubelet": _guard(lambda: kubelet(host)),
        "runtime": _guard(lambda: runtime(config)),
        "config": _guard(lambda: config_status(config, config_error)),
    }
    return out


CONFIG_STATUS_MAX_BYTES = 1 << 16  # one JSON object the agent writes itself


def config_status(config: Config, file_error: str) -> dict[str, Any]:
    """The file given to doctor, and what the agent running with this run directory reports."""
    from agent.loop import CONFIG_STATUS_FILE

    out: dict[str, Any] = {"available": not file_error, "reason": file_error or "valid"}
    path = os.path.join(config.agent.run_dir, CONFIG_STATUS_FILE)
    try:
        running = json.loads(read_text(path, CONFIG_STATUS_MAX_BYTES, "agent config status"))
    except (OSError, ValueError):  # ParseError (too large) is a ValueError too
        return out
    if not isinstance(running, dict):  # not what the agent writes: as unreadable
        return out
    pid = running.get("pid")
    if not (isinstance(pid, int) and pid > 0 and os.path.isdir(os.path.join(config.host.procfs_root, str(pid)))):
        out["stale_agent_status"] = running  # left by an agent that is gone: not the running one's
        return out
    out["running_agent"] = running
    if not running.get("valid", True):
        out["available"] = False
        said = (f"the running agent (pid {pid}) rejected its config and keeps "
                f"the last good one: {running.get('error')}")
        out["reason"] = f"{file_error}; {said}" if file_error else said
    return out


def dump_bpf(config: Config, config_error: str) -> int:
    """`--dump-bpf`: what bcc would compile, rendered by the collectors' pure functions."""
    from collectors.doctor import dump_text, rendered_programs

    if config_error:
        print(f"perfbalance doctor: {config_error}", file=sys.stderr)
        return 2
    try:
        programs = rendered_programs(config.collectors, host_paths(config))
    except (PerfbalanceError, OSError) as e:
        print(f"perfbalance doctor --dump-bpf: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(dump_text(programs))
    return 0


def main(args: argparse.Namespace) -> int:
    config_error = ""
    try:
        config = load_config(args.config, node=node_name())
    except ConfigError as e:
        config, config_error = Config(), str(e)
    if args.dump_bpf:
        return dump_bpf(config, config_error)
    out = report(config, config_error=config_error, mount_tracefs=args.mount_tracefs)
    if args.json:
        json.dump(out, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
        return 0
    for name in SECTIONS:
        sec = out[name]
        mark = "ok " if sec.get("available") else "-- "
        print(f"{mark}{name:8s} {sec.get('reason') or ('ok' if sec.get('available') else '')}")
    hdr = out["bpf"].get("headers")
    if hdr:
        print(f"    bcc {out['bpf'].get('bcc_version')} compiles against {hdr.get('path')} ({hdr.get('source')}, {hdr.get('release')})")
    return 0
