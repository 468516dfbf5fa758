"""The agent's image, built from deploy/Containerfile on this machine (scripts/build-image.sh:
podman, a Debian base made with mmdebstrap, no registry) and run the way deploy/daemonset.yaml
runs it: hostPID, the DaemonSet's capabilities (not privileged), read-only root, its host mounts,
the ConfigMap's configuration, on the host network.

The build (about a minute, less from podman's layer cache) happens once per session and only
when the image's inputs changed; the image stays cached. This host's kernel has no matching
headers, so bcc compiles against the nearest packaged set: the host's /usr/src, or the image's
own when /usr/src has none. The workload is a `sleep` in a cgroup this module makes on the host,
found through discovery.globs; the control runs without the host's cgroups and must not see it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.node import image as img
from tests.node.agentproc import free_port
from tests.node.containerd import remove_cgroups

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.slow]

IMAGE_HEADERS = "/usr/share/perfbalance/kernel-headers"
BEFORE_MB = 614  # the single-stage image this one replaced
PREFIX = f"pbimage-{os.getpid()}-"  # this session's podman containers


@pytest.fixture(scope="module", autouse=True)
def no_container_left() -> Iterator[None]:
    yield
    if img.missing_tools() or not (img.CACHE / "containers.conf").exists():
        return
    left = img.podman("ps", "-a", "--filter", f"name=^{PREFIX}", "--format", "{{.Names}}", check=False).stdout.split()
    if left:
        img.podman("rm", "-f", "--ignore", *left, check=False)
    assert not left, f"containers left behind: {left}"


@pytest.fixture(scope="session")
def image() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root: podman runs the agent with host mounts and capabilities")
    missing = img.missing_tools()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/setup.sh test installs them)")
    name = f"{img.REPO_NAME}:test-{img.input_hash()}"
    if not img.image_exists(name):
        took = img.build(name)
        print(f"built {name} in {took:.0f} s")
    return name


@pytest.fixture(scope="module")
def workload() -> Iterator[img.TestCgroup]:
    top = f"pbimage-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cg = None
    try:
        cg = img.TestCgroup(top, f"sleep-{uuid.uuid4().hex[:6]}", ["sleep", "100000"])
        yield cg
    finally:
        if cg is not None:
            cg.close()
        left = remove_cgroups(top)
        assert not left, f"cgroups left behind: {left}"


@pytest.fixture
def tmp_hosts(tmp_path: Path) -> dict[str, str | None]:
    """Host directories the test must not share with the machine: a private run directory (lock,
    checkpoint, header tree) and an empty kubelet directory (this host runs no kubelet)."""
    for d in ("run", "kubelet"):
        (tmp_path / d).mkdir()
    return {"run": str(tmp_path / "run"), "kubelet": str(tmp_path / "kubelet")}


class Agent:
    """One `podman run` of the image with the DaemonSet's options; containers are always removed."""

    def __init__(self, image: str, tmp: Path, hosts: Mapping[str, str | None], *, recursive: bool = True,
                 overrides: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.image, self.port = image, free_port()
        self.name = f"{PREFIX}{uuid.uuid4().hex[:10]}"
        cfg_dir = tmp / f"config-{self.name}"
        cfg_dir.mkdir()
        cfg = img.config({"kubernetes": {"api": "off"}, "metrics": {"listen": f"127.0.0.1:{self.port}"},
                          **(overrides or {})})
        (cfg_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
        self.args = ["--name", self.name, "--network=host",
                     *img.pod_args(config_dir=cfg_dir, hosts=hosts, recursive=recursive)]

    def run(self, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        try:
            return img.podman("run", "--rm", *self.args, self.image, *argv, check=False, timeout=timeout)
        finally:
            self.remove()

    def start(self) -> None:
        img.podman("run", "-d", *self.args, self.image, "run", "--config", "/etc/perfbalance/config.yaml")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def logs(self) -> str:
        return img.podman("logs", self.name, check=False).stderr[-3000:]

    def remove(self) -> None:
        img.podman("rm", "-f", "--ignore", "-t", "5", self.name, check=False)


def doctor(agent: Agent) -> dict[str, Any]:
    r = agent.run("doctor", "--json", "--config", "/etc/perfbalance/config.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def cycles(agent: Agent, n: int = 3) -> list[dict[str, Any]]:
    r = agent.run("run", "--cycles", str(n), "--dry-run", "--json", "--interval", "1",
                  "--config", "/etc/perfbalance/config.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    reports = [json.loads(line) for line in r.stdout.splitlines()]
    assert [c["cycle"] for c in reports] == list(range(1, n + 1)), r.stderr[-3000:]
    return reports


def glob(cg: img.TestCgroup) -> dict[str, Mapping[str, Any]]:
    return {"discovery": {"globs": [cg.path.rsplit("/", 1)[0] + "/*"]}}


def test_final_stage_has_no_compiler_pip_or_build_tool(image: str) -> None:
    r = img.podman("run", "--rm", "--entrypoint", "sh", image, "-c",
                   "for t in gcc cc clang c++ make pip pip3 protoc; do command -v $t; done; "
                   "ls -d /root/.cache/pip /opt/perfbalance/venv/lib/*/site-packages/grpc_tools 2>/dev/null; true")
    assert r.stdout.split() == []


def test_image_is_smaller_than_the_single_stage_one(image: str) -> None:
    size = int(img.podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
    assert size < BEFORE_MB * 10**6 * 0.75, f"{image} is {size / 1e6:.0f} MB"


def test_image_records_the_version_it_was_built_with(image: str) -> None:
    r = img.podman("run", "--rm", image, "--version")
    label = img.podman("image", "inspect", "--format",
                       '{{index .Labels "org.opencontainers.image.version"}}', image).stdout.strip()
    assert (r.stdout.strip(), label) == ("perfbalance 0.0.0+test", "0.0.0+test")


def test_doctor_in_the_pod_finds_bcc_tracepoints_and_host_cgroups(
        image: str, tmp_path: Path, tmp_hosts: dict[str, str | None]) -> None:
    d = doctor(Agent(image, tmp_path, tmp_hosts))
    assert d["bpf"]["available"], d["bpf"]["reason"]
    assert all(d["bpf"]["tracepoints"].values()), d["bpf"]["tracepoints"]
    assert (d["cgroup"]["available"], d["cgroup"]["root"]) == (True, "/host/sys/fs/cgroup")
    assert "cpuset" in d["cgroup"]["controllers"]


def test_headers_come_from_the_image_when_the_host_has_none(
        image: str, tmp_path: Path, tmp_hosts: dict[str, str | None]) -> None:
    release = os.uname().release
    if (Path("/lib/modules") / release / "build").is_dir():
        pytest.skip(f"this host has headers for {release}: the agent would use them")
    (tmp_path / "no-headers").mkdir()
    d = doctor(Agent(image, tmp_path, {**tmp_hosts, "usr-src": str(tmp_path / "no-headers")}))
    headers = d["bpf"]["headers"]
    assert d["bpf"]["available"], d["bpf"]["reason"]
    assert headers["source"] == "packaged" and all(p.startswith(IMAGE_HEADERS + "/") for p in headers["parts"]), headers


def test_headers_come_from_the_host_when_it_has_packaged_ones(
        image: str, tmp_path: Path, tmp_hosts: dict[str, str | None]) -> None:
    if not list(Path("/usr/src").glob("linux-headers-*")):
        pytest.skip("this host has no packaged headers under /usr/src")
    headers = doctor(Agent(image, tmp_path, tmp_hosts))["bpf"]["headers"]
    assert all(p.startswith("/usr/src/") for p in headers["parts"]), headers


def test_run_loads_the_bpf_programs_inside_the_pod(
        image: str, tmp_path: Path, tmp_hosts: dict[str, str | None], workload: img.TestCgroup) -> None:
    (tmp_path / "no-headers").mkdir()
    hosts = {**tmp_hosts, "usr-src": str(tmp_path / "no-headers")}
    last = cycles(Agent(image, tmp_path, hosts, overrides=glob(workload)))[-1]
    avx, perf = last["collectors"]["avx512"], last["collectors"]["perf"]
    assert (avx["up"], avx["detail"]["source"]) == (True, "bpf"), avx
    assert (perf["up"], perf["detail"]["mode"]) == (True, "bpf"), perf
    assert last["errors"] == []


def test_run_sees_the_host_container_and_its_cpu(
        image: str, tmp_path: Path, tmp_hosts: dict[str, str | None], workload: img.TestCgroup) -> None:
    reports = cycles(Agent(image, tmp_path, tmp_hosts, overrides=glob(workload)))
    seen = [c for c in reports[-1]["containers"] if c["cgroup"] == workload.path]
    assert len(seen) == 1, [c["cgroup"] for c in reports[-1]["containers"]]
    assert seen[0]["cpuset"] and "cpu_seconds_total" in seen[0]["metrics"]


def test_run_without_the_host_cgroups_does_not_see_the_container(
        image: str, tmp_path: Path, tmp_hosts: dict[str, str | None], workload: img.TestCgroup) -> None:
    """Control: no host cgroup mount (and /sys without its submounts); the agent reads the cgroup
    filesystem the runtime gives its own container, which shows that container only."""
    overrides = {**glob(workload), "host": {"cgroup_root": "/sys/fs/cgroup"}}
    agent = Agent(image, tmp_path, {**tmp_hosts, "cgroup": None}, recursive=False, overrides=overrides)
    reports = cycles(agent, 2)
    assert all(c["cgroup"] != workload.path for rep in reports for c in rep["containers"])


def test_run_with_no_cgroup_hierarchy_says_so_in_one_line(
        image: str, tmp_path: Path, tmp_hosts: dict[str, str | None]) -> None:
    agent = Agent(image, tmp_path, {**tmp_hosts, "cgroup": None}, recursive=False)
    r = agent.run("run", "--cycles", "1", "--dry-run", "--json", "--config", "/etc/perfbalance/config.yaml")
    problems = [line for line in r.stderr.splitlines() if not line.startswith("{")]
    assert r.returncode != 0 and r.stdout == ""
    assert problems == ["perfbalance: cannot start: cgroupfs unavailable: no cgroup hierarchy found under "
                        "/host/sys/fs/cgroup"], r.stderr[-3000:]


def test_metrics_are_served_to_the_host(
        image: str, tmp_path: Path, tmp_hosts: dict[str, str | None], workload: img.TestCgroup) -> None:
    agent = Agent(image, tmp_path, tmp_hosts, overrides={**glob(workload), "agent": {"interval_seconds": 1}})
    try:
        start = time.monotonic()
        agent.start()
        status = 0
        while status != 200 and time.monotonic() - start < 60:
            time.sleep(0.2)
            try:
                status = agent.get("/readyz")[0]
            except OSError:
                pass
        assert status == 200, f"not ready in 60 s:\n{agent.logs()}"
        print(f"ready {time.monotonic() - start:.1f} s after podman run")
        body = agent.get("/metrics")[1]
        assert 'perfbalance_collector_up{collector="avx512"} 1.0' in body
        mine = [line for line in body.splitlines()
                if line.startswith("perfbalance_container_") and f'container="{workload.leaf}"' in line]
        assert mine, f"no series of {workload.path} in /metrics"
    finally:
        agent.remove()
