"""The agent's image, built by scripts/build-image.sh and run with podman the way
deploy/daemonset.yaml runs it.

The image is tagged with a hash of what the build reads (deploy/Containerfile, its COPY sources
and the build script), so a test session builds it only when the code changed and otherwise
reuses the cached one. `pod_args()` turns the DaemonSet's pod spec into `podman run` options
(hostPID, the security context, each volume mount with its read-only flag and propagation),
so a test runs the manifest, not a copy of it: a mount or capability added to the manifest is
used here too. Only what a lone podman cannot be is substituted: the ConfigMap becomes a
directory, `fieldRef` a fixed node name, and host paths the tests must not share (the run
directory, the kubelet's, which this host lacks) are given as overrides.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.node.containerd import CGROUP_ROOT, own_cgroup

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "Containerfile"
BUILD = REPO / "scripts" / "build-image.sh"
CACHE = Path(os.environ.get("PERFBALANCE_IMAGE_CACHE", "/var/cache/perfbalance/image"))
REPO_NAME = "localhost/perfbalance"
TOOLS = ("podman", "mmdebstrap", "runc")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _build_inputs() -> list[Path]:
    """deploy/Containerfile, the build script and every file the Containerfile COPYs from the context."""
    out = [CONTAINERFILE, BUILD]
    for line in CONTAINERFILE.read_text().splitlines():
        words = shlex.split(line) if line.upper().startswith("COPY ") else []
        if not words or any(w.startswith("--from") for w in words):
            continue
        for src in words[1:-1]:
            p = REPO / src
            out += sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts) if p.is_dir() else [p]
    return out


def input_hash() -> str:
    h = hashlib.sha256()
    for f in _build_inputs():
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """podman with the build script's private configuration (runc, cgroupfs, this host's ulimits)."""
    env = {**os.environ, "CONTAINERS_CONF": str(CACHE / "containers.conf")}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=check, timeout=timeout)


def image_exists(name: str) -> bool:
    return (CACHE / "containers.conf").exists() and podman("image", "exists", name, check=False).returncode == 0


def build(name: str, timeout: float = 600) -> float:
    """scripts/build-image.sh for `name`; returns the seconds it took. Older test tags are removed."""
    start = time.monotonic()
    r = subprocess.run([str(BUILD)], cwd=REPO, env={**os.environ, "IMAGE": name, "VERSION": "0.0.0+test"},
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"scripts/build-image.sh failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    took = time.monotonic() - start
    tags = podman("images", "--format", "{{.Repository}}:{{.Tag}}", REPO_NAME).stdout.split()
    stale = [t for t in tags if t.startswith(f"{REPO_NAME}:test-") and t != name]
    if stale:
        podman("rmi", *stale, check=False)
    return took


def config(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """deploy/configmap.yaml's config.yaml with sections updated from `overrides`."""
    cm = yaml.safe_load((REPO / "deploy" / "configmap.yaml").read_text())
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    for section, values in overrides.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def pod_spec() -> dict[str, Any]:
    ds = yaml.safe_load((REPO / "deploy" / "daemonset.yaml").read_text())
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def pod_args(*, config_dir: Path, hosts: Mapping[str, str | None], node: str = "image-test",
             recursive: bool = True) -> list[str]:
    """`podman run` options for the DaemonSet's agent container. `hosts` replaces a hostPath
    volume's path by name (None leaves the volume out); `recursive=False` binds host paths
    without their submounts."""
    spec = pod_spec()
    ctr = spec["containers"][0]
    args = ["--pid=host"] if spec.get("hostPID") else []
    args += _security_args(ctr.get("securityContext", {}))
    for e in ctr.get("env", []):
        args += ["--env", f"{e['name']}={e['value'] if 'value' in e else node}"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in ctr.get("volumeMounts", []):
        args += _mount_args(m, volumes[m["name"]], config_dir=config_dir, hosts=hosts, recursive=recursive)
    return args


def _security_args(sc: Mapping[str, Any]) -> list[str]:
    if sc.get("privileged"):
        return ["--privileged"]
    caps = sc.get("capabilities", {})
    args = [f"--cap-drop={c}" for c in caps.get("drop", [])] + [f"--cap-add={c}" for c in caps.get("add", [])]
    if "runAsUser" in sc:
        args.append(f"--user={sc['runAsUser']}")
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    return args  # seccompProfile RuntimeDefault: podman's default profile


_PROPAGATION = {"HostToContainer": "rslave", "Bidirectional": "rshared"}


def _mount_args(m: Mapping[str, Any], vol: Mapping[str, Any], *, config_dir: Path,
                hosts: Mapping[str, str | None], recursive: bool) -> list[str]:
    dest = m["mountPath"]
    if "emptyDir" in vol:
        size = vol["emptyDir"].get("sizeLimit", "")
        return ["--tmpfs", f"{dest}:size={size.lower().removesuffix('i')}" if size else dest]
    if "configMap" in vol:
        return ["-v", f"{config_dir}:{dest}:ro"]
    if "secret" in vol:
        return []  # optional and unused by the test configuration
    path, kind = vol["hostPath"]["path"], vol["hostPath"].get("type", "")
    if m["name"] in hosts:
        path = hosts[m["name"]]
        if path is None:
            return []
    elif kind == "DirectoryOrCreate":
        os.makedirs(path, exist_ok=True)
    elif not os.path.exists(path):
        if kind:
            raise AssertionError(f"hostPath {path} ({m['name']}, type {kind}) is missing on this host: pass it in hosts")
        return []  # type "": optional (resctrl, NRI where absent)
    opts = ["ro" if m.get("readOnly") else "rw", "rbind" if recursive else "bind"]
    if m.get("mountPropagation") in _PROPAGATION:
        opts.append(_PROPAGATION[m["mountPropagation"]])
    return ["-v", f"{path}:{dest}:{','.join(opts)}"]


class TestCgroup:
    """`<hierarchy>/<own cgroup>/<top>/<leaf>` in every mounted hierarchy holding one process:
    a container as discovery's globs see it. The cgroup path relative to the root is `path`."""

    __test__ = False  # not a pytest class

    CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")

    def __init__(self, top: str, leaf: str, argv: Sequence[str]) -> None:
        self.top, self.leaf = top, leaf
        self.proc = subprocess.Popen(list(argv))
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        self.path = f"{top}/{leaf}" if v2 else f"{own_cgroup('cpu')}/{top}/{leaf}".lstrip("/")
        dirs = [CGROUP_ROOT / top / leaf] if v2 else self._v1_dirs()
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
            (d / "cgroup.procs").write_text(str(self.proc.pid))

    def _v1_dirs(self) -> list[Path]:
        out = []
        for ctl in self.CONTROLLERS:
            base = CGROUP_ROOT / ctl
            if not (base / "cgroup.procs").exists():
                continue
            d = base / own_cgroup(ctl)
            for part in (self.top, self.leaf):
                d = d / part
                d.mkdir(exist_ok=True)
                if ctl == "cpuset":  # a v1 cpuset takes no task until it has CPUs and memory nodes
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((d.parent / f).read_text())
            out.append(d)
        return out

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
