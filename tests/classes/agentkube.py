"""A Kubernetes-shaped node for the agent: real pod cgroups, real processes, and the HTTPS
stand-in API server of tests/podmeta serving their pod objects (names, labels, annotations).

The pods live under `<prefix>/kubepods/besteffort/pod<uid>/<container id>` (cgroupfs driver, the
kubelet's `--cgroup-root` one level down), so the agent's ordinary Kubernetes discovery finds
them and nothing at the cgroup root is touched. Each pod has one container.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "podmeta"))
from podmeta_api import Answer, FakeApi  # noqa: E402

from perfbalance.cgroupfs import Cgroupfs  # noqa: E402

CONTROLLERS = ("cpuset", "cpu", "cpuacct", "memory", "blkio", "io")
NODE = "pbtest-node"
NAMESPACE = "pbtest"


@dataclass
class Pod:
    name: str
    rel: str
    uid: str
    cid: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def to_api(self) -> dict[str, Any]:
        return {"metadata": {"name": self.name, "namespace": NAMESPACE, "uid": self.uid,
                             "labels": self.labels, "annotations": self.annotations},
                "spec": {"nodeName": NODE},
                "status": {"qosClass": "BestEffort",
                           "containerStatuses": [{"name": "main", "containerID": f"containerd://{self.cid}"}]}}


class KubeNode:
    """Pods made for one test, their processes, and what the API server says about them."""

    def __init__(self, cgfs: Cgroupfs, prefix: str, api: FakeApi) -> None:
        self.cgfs, self.prefix, self.api = cgfs, prefix, api
        self.pods: dict[str, Pod] = {}
        if any(cgfs.exists(k, "cpuset") for k in ("kubepods", "kubepods.slice")):
            pytest.skip("kubepods exists at the cgroup root (a kubelet or another test): discovery would not look one level down")

    def pod(self, name: str, argv: list[str], *, labels: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None) -> Pod:
        uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
        rel = f"{self.prefix}/kubepods/besteffort/pod{uid}/{cid}"
        self.cgfs.create(rel, controllers=CONTROLLERS)
        p = Pod(name=name, rel=rel, uid=uid, cid=cid, labels=labels or {}, annotations=annotations or {})
        p.proc = subprocess.Popen(["sh", "-c", 'read _go; exec "$@"', "sh", *argv], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.pods[name] = p
        self.cgfs.attach(rel, p.proc.pid, controllers=CONTROLLERS)
        assert p.proc.stdin is not None
        p.proc.stdin.write("\n")
        p.proc.stdin.close()
        self.publish()
        return p

    def annotate(self, name: str, annotations: dict[str, str]) -> None:
        self.pods[name].annotations = annotations
        self.publish()

    def publish(self) -> None:
        body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                           "items": [p.to_api() for p in self.pods.values()]}).encode()
        self.api.answer = Answer(body=body)

    def close(self) -> None:
        for p in self.pods.values():  # the process and whatever it started (dd under its shell)
            for _ in range(20):
                pids = self.cgfs.pids(p.rel, recursive=True) if self.cgfs.exists(p.rel, "cpuset") else []
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if p.proc is not None and p.proc.poll() is None:
                    p.proc.wait()
                time.sleep(0.05)
            if p.proc is not None:
                p.proc.wait()
        try:
            self.cgfs.remove(self.prefix)
        except Exception:  # noqa: BLE001 (best effort: a test failure must not hide behind cleanup)
            pass


def config_text(tmp_path: Path, api: FakeApi, token_file: Path, extra: str) -> str:
    return f"""
agent: {{run_dir: {tmp_path / 'run'}, log_format: text, interval_seconds: 1.0}}
discovery: {{kubernetes: true}}
metrics: {{enabled: false}}
kubernetes: {{api: on, token_file: {token_file}, ca_file: {api.ca_file}, refresh_seconds: 1.0}}
collectors: {{avx512: {{enabled: false}}, perf: {{mode: "off"}}}}
{extra}
"""


def json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    """The `run --json` lines the agent wrote."""
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
