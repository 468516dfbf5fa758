"""The agent's configuration: one YAML file, defaults embedded, per-node overrides, hot reload.

The file is validated as a whole against the dataclasses below (and the sections each package
declares); an unknown key or a bad value is an error naming file, key path and value. A new file
that fails validation is rejected and the last good configuration stays in force.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from agent.config.status import StatusSection
from collectors.config import CollectorsConfig
from perfbalance.cgroupfs import check_glob
from perfbalance.classes import BlockIoSection, RtSection
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ConfigError, ParseError
from perfbalance.names import CLASS, name_problem
from perfbalance.settings import build, setting
from perfbalance.safefs import read_file
from rebalancer.config import RebalancerConfig
from resctrl.config import ResctrlConfig

MAX_CONFIG_BYTES = 1 << 20


def _cpulist(value: Any) -> str | None:
    try:
        CpuSet.parse(value)
    except ParseError as e:
        return f"not a CPU list ({e.reason})"
    return None


@dataclass(frozen=True, kw_only=True)
class AgentSection:
    interval_seconds: float = setting(10.0, "Length of one sample window / cycle.", min=0.1, max=3600)
    run_dir: str = setting("/run/perfbalance", "Run directory (lock, checkpoint, private kernel-header tree); created if missing.")
    log_level: Literal["debug", "info", "warning", "error"] = setting("info", "Log level.")
    log_format: Literal["json", "text"] = setting("json", "Structured JSON logs or human text.")
    dry_run: bool = setting(False, "Plan but never act (same as `perfbalance run --dry-run`).")


@dataclass(frozen=True, kw_only=True)
class HostSection:
    sysfs_root: str = setting("/sys", "Where the host's sysfs is mounted.")
    procfs_root: str = setting("/proc", "Where the host's procfs is mounted (hostPID needed for container PIDs).")
    cgroup_root: str = setting("/sys/fs/cgroup", "Where the host's cgroup filesystems are mounted (v1 controllers, v2, or hybrid).")
    kubelet_root: str = setting("/var/lib/kubelet", "The kubelet's root directory (cpu_manager_state is read from here, never written).")
    tracefs_root: str = setting("/sys/kernel/tracing", "tracefs mount point (mounted by the agent if missing).")
    modules_root: str = setting("/lib/modules", "Kernel modules/headers directory of the host.")
    headers_search: tuple[str, ...] = setting(factory=lambda: ("/usr/src",), doc="Where packaged kernel headers may be found.")
    dev_root: str = setting("/dev", "Where the host's device nodes are (block-I/O class device paths and globs are resolved here).")


def _globs(value: Any) -> str | None:
    for g in value:
        try:
            check_glob(g)
        except ParseError as e:
            return f"bad glob {g!r} ({e.reason})"
    return None


@dataclass(frozen=True, kw_only=True)
class DiscoverySection:
    kubernetes: bool = setting(True, "Find Kubernetes containers under kubepods (systemd and cgroupfs drivers, containerd and CRI-O).")
    globs: tuple[str, ...] = setting(factory=tuple, doc="Extra cgroup path globs (relative to the cgroup root) treated as containers, e.g. 'perfbalance-demo/*'.", check=_globs)


def _prefixes(value: Any) -> str | None:
    if any(not p or p != p.strip() for p in value):
        return "annotation prefixes must be non-empty and without surrounding spaces"
    return None


@dataclass(frozen=True, kw_only=True)
class KubernetesSection:
    api: Literal["auto", "on", "off"] = setting("auto", "Pod metadata (names, namespace, annotations, runtime class) from the API server: auto uses it when running in a pod with a service-account token; on (true) fails startup when it is unusable; off (false) never asks.")
    refresh_seconds: float = setting(30.0, "Re-list this node's pods at most this often.", min=1.0, max=3600)
    unknown_refresh_seconds: float = setting(5.0, "Re-list sooner, at most this often, when a container belongs to a pod UID not yet seen.", min=0.5, max=3600)
    backoff_max_seconds: float = setting(300.0, "Upper bound of the exponential backoff after API errors (the last good pod list stays in use).", min=1.0, max=86400)
    timeout_seconds: float = setting(5.0, "Timeout of one API request (connect, TLS, whole response).", min=0.1, max=120)
    max_response_bytes: int = setting(32 << 20, "Largest pod-list response accepted.", min=1024)
    token_file: str = setting("/var/run/secrets/kubernetes.io/serviceaccount/token", "Service-account token (re-read when it rotates).")
    ca_file: str = setting("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "CA bundle of the API server.")
    annotation_prefixes: tuple[str, ...] = setting(factory=lambda: ("perfbalance.io/", "rdt.perfbalance.io/"), doc="Pod annotations copied onto containers: only keys starting with one of these (the resctrl.annotation key is always copied).", check=_prefixes)
    annotation_max_value_bytes: int = setting(256, "Annotation values longer than this are not copied.", min=1, max=65536)
    kata_runtime_classes: str = setting("^kata", "Regex on spec.runtimeClassName marking Kata (VM-sandboxed) pods; KubeVirt pods are recognised by the label kubevirt.io=virt-launcher.", check=lambda v: _regex(v))
    status: StatusSection = setting(factory=StatusSection)  # node status and Events (agent/config/status.py)


@dataclass(frozen=True, kw_only=True)
class CpusetSection:
    reserved_cpus: str = setting("", "CPUs reserved for the system (the kubelet's reservedSystemCPUs); never given to containers.", check=_cpulist)
    allow_isolated: bool = setting(False, "Allow placing containers on isolcpus CPUs.")
    reassert_drift: bool = setting(True, "Re-apply our cpuset when the kubelet or runtime rewrote it (counted; backs off).")


def _plugin_index(value: Any) -> str | None:
    return None if len(value) == 2 and value.isdigit() else "must be two digits (NRI orders plugins by it), e.g. '50'"


def _plugin_name(value: Any) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", value) else "not a plugin name (letters, digits, '_', '.', '-')"


def _class_list(value: Any) -> str | None:
    for name in value:
        problem = name_problem(name, CLASS)
        if problem:
            return f"class name {problem}"
    return None


@dataclass(frozen=True, kw_only=True)
class RuntimeSection:
    nri: Literal["auto", "on", "off"] = setting("auto", "Act through the container runtime as an NRI plugin (placement at creation, moves by UpdateContainers, pod metadata): auto uses it when the socket answers and keeps retrying; on (true) the same, reporting a missing socket or protocol modules as errors; off (false) writes cgroupfs only. Read at start.")
    nri_socket: str = setting("/var/run/nri/nri.sock", "The runtime's NRI socket (containerd 1.7+/2.x, CRI-O 1.26+). Read at start.")
    nri_plugin_name: str = setting("perfbalance", "Plugin name registered with the runtime. Read at start.", check=_plugin_name)
    nri_plugin_index: str = setting("50", "Plugin index, two digits as a quoted string (e.g. '50'): the runtime calls plugins in this order. Read at start.", check=_plugin_index)
    nri_backoff_max_seconds: float = setting(30.0, "Upper bound of the reconnect back-off (0.5 s doubling) after the runtime went away; meanwhile cgroupfs is written. Read at start.", min=0.5, max=3600)
    nri_blockio_classes: tuple[str, ...] = setting(factory=tuple, doc="Block-I/O class names the runtime's own class config defines the same as perfbalance's blockio.classes (containerd 1.7: blockio_config_file of its tasks service): a new container whose class is one of them is created in it by the runtime (CreateContainer adjustment); any other class is applied by the agent right after the container starts. Empty: never handed to the runtime (a name it does not know fails the container's creation). Read at start.", check=_class_list)
    nri_rdt_classes: tuple[str, ...] = setting(factory=tuple, doc="The same for RDT classes (containerd's rdt_config_file must define them; its own resctrl groups then): handed to the runtime at CreateContainer; others applied by the agent right after start. Read at start.", check=_class_list)


@dataclass(frozen=True, kw_only=True)
class MetricsSection:
    enabled: bool = setting(True, "Serve Prometheus metrics, /healthz, /readyz and the node view.")
    listen: str = setting("0.0.0.0:9847", "Listen address host:port (use 127.0.0.1 behind kube-rbac-proxy).")
    node_view: bool = setting(True, "Serve the live node view at / (the JSON at /api/state is always served).")
    stale_after_seconds: float = setting(0.0, "/healthz fails when the last cycle is older than this; 0: 3 x agent.interval_seconds, at least 30 s.", min=0.0)
    memory_bandwidth_peak_bytes_per_second: float = setting(0.0, "Sustainable memory bandwidth of one NUMA node, for perfbalance_memory_bandwidth_saturation_ratio; 0: take node_metrics 'memory_bandwidth_peak_bytes_per_second' or leave the ratio out.", min=0.0)


def _topic_prefix(value: Any) -> str | None:
    if not value or any(ch in value for ch in "+#\0") or "" in value.split("/"):
        return "not a usable MQTT topic prefix (no wildcards, no empty levels)"
    return None


@dataclass(frozen=True, kw_only=True)
class MqttSection:
    enabled: bool = setting(False, "Publish rebalance events and status over MQTT.")
    host: str = setting("localhost", "Broker host.")
    port: int = setting(1883, "Broker port.", min=1, max=65535)
    topic_prefix: str = setting("perfbalance", "Topics are <prefix>/<node>/events/rebalance and <prefix>/<node>/status.", check=_topic_prefix)
    queue_size: int = setting(1000, "Bounded event queue; the oldest event is dropped (and counted) when full.", min=1)
    username: str = setting("", "User name.")
    username_file: str = setting("", "File holding the user name (a mounted Secret); overrides username.")
    password: str = setting("", "Password inline (prefer password_file).")
    password_file: str = setting("", "File holding the password (a mounted Secret); overrides password.")
    client_id: str = setting("", "MQTT client id; empty: perfbalance-<node>.")
    keepalive_seconds: int = setting(30, "MQTT keepalive; the broker sends the Last Will after 1.5 x this without traffic.", min=5, max=3600)
    reconnect_max_seconds: float = setting(30.0, "Upper bound of the exponential reconnect backoff.", min=0.1, max=3600)
    tls_insecure: bool = setting(False, "Skip the broker host name check (test brokers only).")
    tls: bool = setting(False, "Use TLS.")
    ca_file: str = setting("", "CA bundle for TLS.")
    cert_file: str = setting("", "Client certificate for TLS.")
    key_file: str = setting("", "Client key for TLS.")


def _vcpu_regexes(value: Any) -> str | None:
    for pattern in value:
        problem = _regex(pattern)
        if problem:
            return problem
        if re.compile(pattern).groups < 1:
            return f"pattern {pattern!r} has no group 1 for the vCPU index"
    return None


def _regexes(value: Any) -> str | None:
    for pattern in value:
        problem = _regex(pattern)
        if problem:
            return problem
    return None


def _regex(pattern: str) -> str | None:
    try:
        re.compile(pattern)
    except re.error as e:
        return f"pattern {pattern!r} is not a regular expression ({e})"
    return None


@dataclass(frozen=True, kw_only=True)
class VmSection:
    enabled: bool = setting(True, "Recognise VM-sandboxed pods (Kata, KubeVirt) and act on their VMM's vCPU threads.")
    vcpu_patterns: tuple[str, ...] = setting(factory=lambda: (r"^CPU (\d+)/KVM$", r"^vcpu(\d+)$", r"^fc_vcpu (\d+)$"), doc="Regexes on thread names (comm) that mark vCPU threads; group 1 is the vCPU index.", check=_vcpu_regexes)
    vmm_patterns: tuple[str, ...] = setting(factory=lambda: (r"^qemu-system-", r"^qemu-kvm$", r"^cloud-hyperviso", r"^firecracker$"), doc="Regexes on a process's comm or executable name that mark a VMM (comm is cut to 15 characters).", check=_regexes)
    vmm_overhead_mcpu: int = setting(0, "VMM overhead added when sizing a sandbox's vCPUs, in milli-CPU.", min=0)
    detect_unlabelled: bool = setting(True, "Also look for a VMM in pods whose containers are not marked as VM-sandboxed (one comm read per process).")
    pin_exclusive: bool = setting(True, "Pin one vCPU per CPU dedicated to a container (1:1) and keep the host CPU <-> vCPU mapping.")
    system_vcpus: int = setting(1, "Lowest vCPU indices left unpinned for the guest's own work when the VM has enough vCPUs.", min=0)
    max_cgroup_depth: int = setting(4, "How deep below a pod's cgroup to look for the VMM's processes.", min=0, max=16)


@dataclass(frozen=True, kw_only=True)
class Config:
    agent: AgentSection = setting(factory=AgentSection)
    host: HostSection = setting(factory=HostSection)
    discovery: DiscoverySection = setting(factory=DiscoverySection)
    kubernetes: KubernetesSection = setting(factory=KubernetesSection)
    cpuset: CpusetSection = setting(factory=CpusetSection)
    runtime: RuntimeSection = setting(factory=RuntimeSection)
    collectors: CollectorsConfig = setting(factory=CollectorsConfig)
    rebalancer: RebalancerConfig = setting(factory=RebalancerConfig)
    resctrl: ResctrlConfig = setting(factory=ResctrlConfig)
    metrics: MetricsSection = setting(factory=MetricsSection)
    mqtt: MqttSection = setting(factory=MqttSection)
    vm: VmSection = setting(factory=VmSection)
    blockio: BlockIoSection = setting(factory=BlockIoSection, doc="Block-I/O classes (docs/classes.md).")
    rt: RtSection = setting(factory=RtSection, doc="Real-time classes (docs/classes.md).")


def node_name() -> str:
    """The node's name: NODE_NAME (the DaemonSet sets it from spec.nodeName) or the hostname."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `over` into `base` (mappings merge, everything else replaces)."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_config(text: str, *, source: str, node: str) -> Config:
    """Parse YAML text into a Config, applying `nodes: {<node>: {...}}` overrides for `node`."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(source, "", where, f"not valid YAML ({getattr(e, 'problem', e)})") from None
    except RecursionError:
        raise ConfigError(source, "", f"{len(text)} bytes", "YAML nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, "", data, "top level must be a mapping")
    data = dict(data)
    nodes = data.pop("nodes", {}) or {}
    if not isinstance(nodes, Mapping):
        raise ConfigError(source, "nodes", nodes, "must be a mapping of node name to overrides")
    for name, over in nodes.items():
        if not isinstance(over, Mapping):
            raise ConfigError(source, f"nodes.{name}", over, "must be a mapping")
        # Every override is validated, not only ours: a typo for another node is still a typo.
        reconcile(build(Config, merge(data, over), source=source, path=""), source=source)
    if node in nodes:
        data = merge(data, nodes[node])
    return reconcile(build(Config, data, source=source), source=source)


def reconcile(cfg: Config, *, source: str) -> Config:
    """Settings that two sections read must agree (checked after each section on its own)."""
    _check_aggressor_class(cfg, source=source)
    return _one_vmm_overhead(cfg, source=source)


def _check_aggressor_class(cfg: Config, *, source: str) -> None:
    """The planner's aggressor class is one the RDT actuator has (when it has any)."""
    wanted, known = cfg.rebalancer.rdt_aggressor_class, cfg.resctrl.class_names()
    if wanted and known and wanted not in known:
        raise ConfigError(source, "rebalancer.rdt_aggressor_class", wanted,
                          f"is not a configured resctrl class (configured: {', '.join(sorted(known))})")


def _one_vmm_overhead(cfg: Config, *, source: str) -> Config:
    """The VMM overhead is `vm.vmm_overhead_mcpu` for the VMM-thread actuator and
    `rebalancer.vm_overhead_mcpu` for the (pure) planner's capacity rule. Either may be set;
    both set and different is an error."""
    vm, reb = cfg.vm.vmm_overhead_mcpu, cfg.rebalancer.vm_overhead_mcpu
    if vm == reb:
        return cfg
    if vm and reb:
        raise ConfigError(source, "rebalancer.vm_overhead_mcpu", reb,
                          f"differs from vm.vmm_overhead_mcpu ({vm}); set one of them")
    value = vm or reb
    return dataclasses.replace(cfg, vm=dataclasses.replace(cfg.vm, vmm_overhead_mcpu=value),
                               rebalancer=dataclasses.replace(cfg.rebalancer, vm_overhead_mcpu=value))


def load_config(path: str | None, *, node: str | None = None) -> Config:
    """Load the file at `path` (None: the embedded defaults)."""
    node = node or node_name()
    if path is None:
        return Config()
    try:
        raw = read_file(path, MAX_CONFIG_BYTES)
    except OverflowError:
        raise ConfigError(path, "", f"{MAX_CONFIG_BYTES + 1}+ bytes", f"larger than {MAX_CONFIG_BYTES} bytes") from None
    except OSError as e:
        raise ConfigError(path, "", path, f"cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(path, "", f"byte {e.start}", "not UTF-8") from None
    return parse_config(text, source=path, node=node)


class ConfigWatcher:
    """Notices when the config file changes (a ConfigMap swaps a symlink: follow it).

    `poll()` returns a new Config when the file changed and is valid, raises ConfigError when it
    changed and is invalid (the caller keeps the last good one), and returns None otherwise.

    A file replaced whole (a ConfigMap's symlink swap, a rename over it: a new inode) is read at
    the first poll that sees it. A file written in place (same inode, new size or mtime) is read
    only once a poll finds it as the previous one did, so that a write still under way is never
    read half-written (a shorter valid YAML would otherwise be taken for the new config).
    """

    def __init__(self, path: str, *, node: str | None = None) -> None:
        self.path, self.node = path, node
        self._seen = self._stamp()
        self._settling: tuple[Any, ...] | None = None  # an in-place change seen once

    def _stamp(self) -> tuple[Any, ...]:
        try:
            st = os.stat(self.path)  # follows ..data symlink swaps
            return (os.path.realpath(self.path), st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError as e:
            return ("missing", e.errno)

    def poll(self) -> Config | None:
        stamp = self._stamp()
        if stamp == self._seen:
            self._settling = None
            return None
        in_place = len(stamp) == len(self._seen) == 4 and stamp[:2] == self._seen[:2]
        if in_place and stamp != self._settling:
            self._settling = stamp  # written in place: read when the next poll finds it unchanged
            return None
        self._seen, self._settling = stamp, None
        return load_config(self.path, node=self.node)
