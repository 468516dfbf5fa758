"""`kubernetes.status`: what the agent tells the control plane, each item off until asked for.

Every item needs RBAC the base deployment does not grant (deploy/components/status-*), so none
is on by default; the section is read once at start (a reload that changes it is logged and
applies at the next start, like `mqtt:`), because the RBAC granted has to match it anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from perfbalance.settings import setting

DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _object_name(value: Any) -> str | None:
    """A ConfigMap or namespace name ("" is allowed where it means: from the environment)."""
    if value and not DNS_SUBDOMAIN.fullmatch(value):
        return "not a Kubernetes object name (lower-case alphanumerics, '-' and '.', at most 253)"
    return None


@dataclass(frozen=True, kw_only=True)
class StatusSection:
    events: bool = setting(False, "An Event (events.k8s.io/v1) on the pod for each applied move, rollback and judged move (component status-events).")
    node_conditions: bool = setting(False, "Node conditions PerfbalanceReady and PerfbalanceConfigValid (component status-node).")
    node_labels: bool = setting(False, "perfbalance.io/* labels and annotations on the Node: AVX-512 licence loss, RDT and block-I/O classes, NRI or cgroupfs (component status-node-labels).")
    extended_resources: bool = setting(False, "perfbalance.io/avx512-island-cpus and perfbalance.io/rdt-free-closids in the Node's capacity and allocatable (component status-node; docs/deploy.md gives their exact meaning).")
    config_events: bool = setting(False, "A Warning Event on the ConfigMap holding the configuration when a new one is rejected, deleted when a good one loads (component status-config-events).")
    configmap_namespace: str = setting("", "Namespace of that ConfigMap; empty: the POD_NAMESPACE environment variable (the DaemonSet sets it from the downward API), else 'perfbalance'.", check=_object_name)
    configmap_name: str = setting("perfbalance-config", "Name of the ConfigMap that holds the configuration.", check=lambda v: _object_name(v) or (None if v else "must not be empty"))
    series_window_seconds: float = setting(360.0, "Repeats of an Event (same pod, action, reason, type) within this time count up its series instead of creating another (client-go: 6 min).", min=1.0, max=86400)
    series_flush_seconds: float = setting(30.0, "Patch a series' count at most this often.", min=1.0, max=3600)
    spam_burst: int = setting(25, "Distinct Events per object allowed at once (the kubelet's spam filter); more are dropped and counted.", min=1, max=1000)
    spam_refill_seconds: float = setting(300.0, "One more Event per object is allowed after each this many seconds.", min=1.0, max=86400)
    resync_seconds: float = setting(60.0, "Rewrite unchanged node status this often (PerfbalanceReady's heartbeat).", min=5.0, max=3600)
