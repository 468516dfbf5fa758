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

from agent.discover.podmeta import PodInfo
from agent.nri.model import View


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
