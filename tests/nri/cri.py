"""A kubelet-shaped CRI client: the calls the kubelet makes, through stubs generated at set-up
from Debian's k8s.io/cri-api api.proto (scripts/gen-protos.sh)."""

from __future__ import annotations

import uuid

import grpc
from pbgen.cri import api_pb2 as cri
from pbgen.cri import api_pb2_grpc as cri_grpc

from containerd_env import IMAGE


class Kubelet:
    def __init__(self, address: str, cgroup_parent: str) -> None:
        self._chan = grpc.insecure_channel(address)
        self.rt = cri_grpc.RuntimeServiceStub(self._chan)
        self.cgroup_parent = cgroup_parent
        self.pods: list[str] = []  # removed by the fixture

    def close(self) -> None:
        self._chan.close()

    def teardown(self) -> None:
        """What a test's fixture does at the end: stop and remove every pod it ran, then close."""
        for pod in self.pods:
            try:
                self.stop_remove_pod(pod)
            except Exception:  # already gone, or the runtime was killed by the test
                pass
        self.close()

    def pod_config(self, name: str, *, namespace: str = "default", labels: dict[str, str] | None = None,
                   annotations: dict[str, str] | None = None) -> cri.PodSandboxConfig:
        uid = str(uuid.uuid4())
        return cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid, **(labels or {})},
            annotations=annotations or {},
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=f"{self.cgroup_parent}/pod{uid}",
                security_context=cri.LinuxSandboxSecurityContext(
                    namespace_options=cri.NamespaceOption(network=cri.NODE))))

    def run_pod(self, cfg: cri.PodSandboxConfig) -> str:
        pod_id = self.rt.RunPodSandbox(cri.RunPodSandboxRequest(config=cfg), timeout=120).pod_sandbox_id
        self.pods.append(pod_id)
        return pod_id

    def run(self, pod: str, name: str, **kw: object) -> tuple[str, str, int]:
        """A pod with one started container: (pod id, container id, container pid)."""
        cfg = self.pod_config(pod)
        pod_id = self.run_pod(cfg)
        cid = self.create(pod_id, cfg, name, **kw)  # type: ignore[arg-type]
        self.start(cid)
        return pod_id, cid, self.pid(cid)

    def create(self, pod_id: str, pod_cfg: cri.PodSandboxConfig, name: str, *, cpuset: str = "",
               annotations: dict[str, str] | None = None) -> str:
        res = cri.LinuxContainerResources(cpu_shares=1024, cpuset_cpus=cpuset)
        cfg = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name, attempt=0),
            image=cri.ImageSpec(image=IMAGE),
            command=["/bin/sleep", "1000000"],
            labels={"io.kubernetes.container.name": name},
            annotations=annotations or {},
            linux=cri.LinuxContainerConfig(resources=res))
        req = cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod_cfg)
        return self.rt.CreateContainer(req, timeout=120).container_id

    def start(self, cid: str) -> None:
        self.rt.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=120)

    def pid(self, cid: str) -> int:
        import json
        st = self.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid, verbose=True), timeout=30)
        return int(json.loads(st.info["info"])["pid"])

    def update_cpuset(self, cid: str, cpuset: str) -> None:
        """What the kubelet's CPU manager does on every reconcile: UpdateContainerResources."""
        res = cri.LinuxContainerResources(cpu_shares=1024, cpuset_cpus=cpuset)
        self.rt.UpdateContainerResources(cri.UpdateContainerResourcesRequest(container_id=cid, linux=res), timeout=60)

    def stop_remove_pod(self, pod_id: str) -> None:
        self.rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        self.rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
