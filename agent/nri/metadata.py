"""Pod metadata from the runtime's NRI view, in the form the API-server path fills in.

While NRI is connected the runtime has already told the plugin every pod's name, namespace,
labels, annotations and runtime handler, and every container's name: the agent needs no API
server for them. This turns the view into `agent.discover.podmeta.PodInfo` by pod UID, so the one
pure `podmeta.enrich()` fills discovered containers the same way from either source. The runtime
handler stands where the API has `spec.runtimeClassName` (a RuntimeClass names its handler; Kata
handlers are `kata`, `kata-qemu`, ... so the same `kubernetes.kata_runtime_classes` pattern applies).
"""

from __future__ import annotations

from types import MappingProxyType

from agent.discover.containers import QOS_DIRS, SYSTEMD_POD
from agent.discover.podmeta import EnrichOptions, PodInfo, enrich_one
from agent.nri.model import Ctr, Pod, View
from perfbalance.model import Container


def pod_infos(view: View) -> dict[str, PodInfo]:
    """{pod uid: PodInfo} of the view's pods, each with its containers' names by id."""
    names: dict[str, dict[str, str]] = {}
    for c in view.containers.values():
        names.setdefault(c.pod_id, {})[c.id] = c.name
    out: dict[str, PodInfo] = {}
    for p in view.pods.values():
        if not p.uid:
            continue
        out[p.uid.lower()] = PodInfo(uid=p.uid.lower(), name=p.name, namespace=p.namespace,
                                     runtime_class=p.runtime_handler, labels=MappingProxyType(dict(p.labels)),
                                     annotations=MappingProxyType(dict(p.annotations)),
                                     containers=MappingProxyType(names.get(p.id, {})))
    return out


def qos_of(cgroup_parent: str) -> str:
    """The QoS class the kubelet's pod cgroup parent names (cgroupfs `kubepods/burstable/pod<uid>`
    or systemd `kubepods-burstable-pod<uid>.slice`); a pod directly under kubepods is guaranteed."""
    parts = [p for p in cgroup_parent.replace(":", "/").split("/") if p]
    for part in reversed(parts):
        if part in QOS_DIRS:
            return QOS_DIRS[part]
        m = SYSTEMD_POD.match(part)
        if m:
            return m.group(1) or "guaranteed"
    return "guaranteed" if any(p in ("kubepods", "kubepods.slice") for p in parts) else "unknown"


def container_of(pod: Pod, ctr: Ctr, options: EnrichOptions) -> Container:
    """A container being created (its cgroup does not exist yet) as discovery and podmeta will
    see it once it runs: names, the pod's allowed annotations, the QoS of its pod's cgroup parent.
    For the class decision at CreateContainer."""
    base = Container(id=ctr.id, name=ctr.name, cgroup="", pod_uid=pod.uid.lower(), qos=qos_of(pod.cgroup_parent))
    infos = pod_infos(View(pods={pod.id: pod}, containers={ctr.id: ctr}))
    return enrich_one(base, infos[base.pod_uid], options) if base.pod_uid in infos else base
