"""A real containerd 1.7 with NRI and its CRI plugin, started from temp dirs, driven like a kubelet.

containerd comes from Debian 13's package, extracted (not installed) by scripts/setup.sh test
into CACHE; runc and busybox-static are Debian 12's. The pod sandbox and test containers run a
tiny OCI image built here from /usr/bin/busybox and imported with `ctr images import`. Pods use
the host network (no CNI) and a cgroup parent of our own under the cgroupfs driver.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("PERFBALANCE_TRIXIE_CACHE", "/var/cache/perfbalance/trixie")) / "root"
BIN = CACHE / "usr/bin"
IMAGE = "docker.io/pbnri/busybox:1"
BUSYBOX = Path("/usr/bin/busybox")
RUNC = Path(os.environ.get("PBNRI_RUNC", "/usr/sbin/runc"))


def missing() -> str:
    """Why this machine cannot run the containerd tests, or ""."""
    for p in (BIN / "containerd", BIN / "containerd-shim-runc-v2", BIN / "ctr", BUSYBOX, RUNC):
        if not p.exists():
            return f"{p} missing: run scripts/setup.sh test"
    try:
        import pbgen.cri.api_pb2_grpc  # noqa: F401
    except ImportError:
        return "CRI client stubs (pbgen.cri) missing: run scripts/setup.sh test"
    return ""


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def busybox_oci_tar(path: Path) -> None:
    """An OCI image layout tar with one uncompressed layer: /bin/busybox and its applet links."""
    layer_io = io.BytesIO()
    with tarfile.open(fileobj=layer_io, mode="w") as t:
        for d in ("bin", "tmp", "proc", "sys", "dev", "etc"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            t.addfile(ti)
        t.add(str(BUSYBOX), arcname="bin/busybox")
        for applet in ("sh", "sleep", "cat", "grep", "taskset"):
            ti = tarfile.TarInfo(f"bin/{applet}")
            ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(ti)
    layer = layer_io.getvalue()
    blobs: dict[str, bytes] = {}
    ldesc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer)}
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sleep", "1000000"]},
              "rootfs": {"type": "layers", "diff_ids": [ldesc["digest"]]}}
    cdesc = {"mediaType": "application/vnd.oci.image.config.v1+json", **_blob(blobs, json.dumps(config).encode())}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cdesc, "layers": [ldesc]}
    mdesc = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             **_blob(blobs, json.dumps(manifest).encode()),
             "annotations": {"io.containerd.image.name": IMAGE, "org.opencontainers.image.ref.name": "1"}}
    index = {"schemaVersion": 2, "manifests": [mdesc]}
    with tarfile.open(path, "w") as t:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":")[1], data)


CONFIG = """\
version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/c.sock"
[ttrpc]
  address = "{d}/c.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  disable_connections = false
  plugin_config_path = "{d}/nri-conf.d"
  plugin_path = "{d}/nri-plugins"
  plugin_registration_timeout = "10s"
  plugin_request_timeout = "10s"
  socket_path = "{d}/nri.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{image}"
  enable_selinux = false
  # this machine withholds CAP_SYS_RESOURCE: a sandbox cannot lower oom_score_adj to -998
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni-bin"
    conf_dir = "{d}/cni-conf"
"""


@dataclass
class Containerd:
    """One containerd process; restart() keeps its root and state (what a runtime restart does)."""
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_toml: str = ""  # more tables, appended to the config (e.g. the tasks service's blockio_config_file)

    @property
    def nri_socket(self) -> str:
        return str(self.dir / "nri.sock")

    @property
    def cri_address(self) -> str:
        return "unix://" + str(self.dir / "c.sock")

    def start(self) -> None:
        cfg = self.dir / "config.toml"
        cfg.write_text(CONFIG.format(d=self.dir, image=IMAGE, runc=RUNC) + self.extra_toml)
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        log = open(self.dir / "containerd.log", "ab")
        self.proc = subprocess.Popen([str(BIN / "containerd"), "--config", str(cfg)], env=env,
                                     stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited: {self.log_tail()}")
            if (self.dir / "c.sock").exists() and (self.dir / "nri.sock").exists():
                if self.ctr("version", check=False).returncode == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"containerd did not come up: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash: shims and containers keep running."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "ctr"), "-a", str(self.dir / "c.sock"), "-n", "k8s.io", *args],
                              capture_output=True, text=True, check=check, timeout=120)

    def import_image(self) -> None:
        tar = self.dir / "busybox-oci.tar"
        busybox_oci_tar(tar)
        self.ctr("images", "import", "--snapshotter", "native", str(tar))

    def log_tail(self, n: int = 3000) -> str:
        try:
            return (self.dir / "containerd.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""


def new_containerd(tag: str) -> Containerd:
    # short: unix socket paths are limited to 108 bytes
    return Containerd(dir=Path(tempfile.mkdtemp(prefix=f"pbnri-{tag}-", dir="/tmp")))


def cleanup(c: Containerd) -> None:
    c.stop()
    # shims outlive containerd by design: end the ones started for this root (their argv names it)
    out = subprocess.run(["pgrep", "-f", f"containerd-shim-runc-v2 -namespace k8s.io .*-address {c.dir}/c.sock"],
                         capture_output=True, text=True)
    for pid in out.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["umount", "-R", "--lazy", str(c.dir)], capture_output=True)
    shutil.rmtree(c.dir, ignore_errors=True)


@contextmanager
def running(c: Containerd) -> Iterator[Containerd]:
    """`c` started with the test image imported, and cleaned up afterwards whatever happens."""
    try:
        c.start()
        c.import_image()
        yield c
    finally:
        cleanup(c)
