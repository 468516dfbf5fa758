"""Status to the Kubernetes control plane: Events, node conditions, labels, extended resources.

Each item is opt-in (`kubernetes.status.*`) and needs exactly the RBAC its kustomize component
grants (deploy/components/status-*). The writer reads only what a cycle reported (the
CycleReport, plus the configuration status the loop keeps) and never blocks a cycle: the loop
hands it the latest report and a worker thread turns that into API requests.

The API's semantics are taken as they are:
- node conditions are a list, and a JSON merge patch (RFC 7386) replaces lists whole, so the
  writer reads the Node, replaces only its own condition types in the kubelet's list, and
  patches with the resourceVersion it read: a concurrent kubelet update answers 409 Conflict
  and the writer reads again (a bounded number of times);
- Events (events.k8s.io/v1) are created once per distinct (object, action, reason, type) and
  repeats within `series_window_seconds` only count up an EventSeries, patched at most every
  `series_flush_seconds`, as client-go's event recorder does; a token bucket per object (burst
  25, one more per 5 minutes: the kubelet's spam filter) drops the rest, counted;
- 429 honours Retry-After, 5xx and network errors back off exponentially, 422 (the object is
  invalid) and 403 (RBAC) are logged once per distinct message and not retried for that item.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import math
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from perfbalance.errors import PerfbalanceError
from perfbalance.names import LABEL_VALUE, is_name

log = logging.getLogger("perfbalance.kubestatus")

CONTROLLER = "perfbalance.io/agent"
PREFIX = "perfbalance.io/"
READY, CONFIG_VALID = "PerfbalanceReady", "PerfbalanceConfigValid"
MAX_NOTE = 1024  # events.k8s.io/v1 rejects a note over 1 kB
MAX_CONFLICT_RETRIES = 4
SPAM_BURST, SPAM_REFILL_SECONDS = 25, 300.0  # client-go EventSourceObjectSpamFilter defaults
MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "perfbalance-agent"


class Transport(Protocol):
    """One HTTPS request to the API server: (status, body, headers). Raises KubeApiError for
    transport failures (no answer, TLS); HTTP errors are returned, not raised."""

    def request(self, method: str, path: str, *, body: Any = None,
                content_type: str = "application/json") -> tuple[int, bytes, Mapping[str, str]]: ...


@dataclass(frozen=True, kw_only=True)
class StatusOptions:
    events: bool = False
    node_conditions: bool = False
    node_labels: bool = False
    extended_resources: bool = False
    config_events: bool = False
    configmap_namespace: str = "perfbalance"
    configmap_name: str = "perfbalance-config"
    series_window_seconds: float = 360.0
    series_flush_seconds: float = 30.0
    spam_burst: int = SPAM_BURST
    spam_refill_seconds: float = SPAM_REFILL_SECONDS
    resync_seconds: float = 60.0
    backoff_max_seconds: float = 300.0

    @property
    def any(self) -> bool:
        return self.events or self.node_conditions or self.node_labels or self.extended_resources or self.config_events


@dataclass(frozen=True, kw_only=True)
class NodeFacts:
    """What the node offers, as labels, annotations and extended resources (docs/deploy.md)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StatusInput:
    """One cycle as the control plane sees it."""

    time: float
    cycle: int
    ready: bool
    ready_reason: str
    ready_message: str
    config_valid: bool
    config_error: str
    facts: NodeFacts
    events: tuple[EventSpec, ...] = ()


@dataclass(frozen=True, kw_only=True)
class EventSpec:
    namespace: str
    regarding: Mapping[str, str]  # apiVersion, kind, namespace, name, uid (, fieldPath)
    reason: str
    action: str
    note: str
    type: str = "Normal"

    @property
    def key(self) -> tuple[str, ...]:
        r = self.regarding
        return (self.namespace, r.get("kind", ""), r.get("name", ""), r.get("uid", ""), self.action, self.reason, self.type)


# ---------------------------------------------------------------------------------------------
# pure: from a cycle to what the control plane should show
# ---------------------------------------------------------------------------------------------

def micro_time(t: float) -> str:
    """MicroTime / RFC 3339 with microseconds, as events.k8s.io/v1 wants eventTime."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def note(text: str) -> str:
    return text if len(text.encode()) <= MAX_NOTE else text.encode()[:MAX_NOTE - 3].decode("utf-8", "ignore") + "..."


def move_events(applied: Iterable[Any], realized: Iterable[Any], containers: Mapping[str, Any]) -> list[EventSpec]:
    """One Event per applied move or rollback on its pod (containers without a known pod are
    left out: nothing to attach the Event to), and one per judged move."""
    out = []
    for a in applied:
        c = containers.get(a.container)
        if c is None or not (c.namespace and c.pod and c.pod_uid) or not a.ok:
            continue
        rollback = a.kind == "rollback"
        what = f"{a.kind} {c.name or a.container}: {a.frm or '-'} -> {a.to}"
        nums = f"predicted benefit {a.predicted_benefit:.4f}, cost {a.predicted_cost:.4f} core-s/s"
        out.append(EventSpec(namespace=c.namespace, regarding=_pod_ref(c), action="Rollback" if rollback else "Rebalance",
                             reason="RolledBack" if rollback else ("MovedRDTClass" if a.kind == "rdt_class" else "MovedCPUs"),
                             type="Warning" if rollback else "Normal", note=note(f"{what}; {a.reason}; {nums}")))
    for r in realized:
        c = containers.get(r.container)
        if c is None or not (c.namespace and c.pod and c.pod_uid) or r.rolled_back:
            continue
        out.append(EventSpec(namespace=c.namespace, regarding=_pod_ref(c), action="Judge", reason="MoveJudged",
                             note=note(f"{c.name or r.container}: realized {r.realized:.4f} of predicted {r.predicted:.4f} core-s/s")))
    return out


def status_input(report: Any, *, config: Any, config_valid: bool, config_error: str,
                 extra: Mapping[str, Any], policy: str = "") -> StatusInput:
    """A cycle's report (and the configuration status the loop keeps) as the control plane sees it."""
    snap = report.snapshot
    containers = {s.id: s.container for s in snap.containers}
    nerr = len(report.errors)
    # No cycle number: the status is rewritten when it changes (and at each resync), so a
    # message that changed every cycle would patch every Node every interval.
    message = (f"{len(containers)} containers, policy {policy or config.rebalancer.policy}"
               + (f", {nerr} error(s) in the last cycle, first: {report.errors[0]}" if nerr else ""))
    return StatusInput(time=report.time, cycle=report.cycle, ready=True, ready_reason="CyclesRunning",
                       ready_message=note(message), config_valid=config_valid, config_error=config_error,
                       facts=facts_of(snap, config, extra),
                       events=tuple(move_events(report.applied, report.realized, containers)))


def facts_of(snap: Any, config: Any, extra: Mapping[str, Any]) -> NodeFacts:
    """NodeFacts from a snapshot and the configuration (docs/deploy.md gives each meaning)."""
    from rebalancer.constraints import shareable
    from rebalancer.topoindex import TopoIndex

    loss = config.rebalancer.license_loss(snap.topology.cpu_model)
    avx = snap.collectors.get("avx512")
    rdt = snap.collectors.get("resctrl")
    r = config.resctrl
    classes = set(r.classes) | {c for p in r.partitions.values() for c in getattr(p, "classes", {})}
    blockio = getattr(getattr(config, "blockio", None), "classes", None) or {}
    nri = getattr(config, "nri", None)
    mode = "nri" if nri is not None and getattr(nri, "enabled", False) else "cgroupfs"
    idx = TopoIndex.build(snap.topology)
    island = len(idx.full_cores_within(shareable(snap))) if loss > 0 else 0
    free = extra.get("resctrl_closids_free", snap.node_metrics.get("resctrl_closids_free"))
    return node_facts(license_loss=loss, avx512=bool(avx is not None and avx.up), rdt=bool(rdt is not None and rdt.up),
                      rdt_classes=sorted(classes), blockio_classes=sorted(blockio), mode=mode,
                      closids_free=int(free) if isinstance(free, (int, float)) and rdt is not None and rdt.up else None,
                      island_cpus=island)


def _pod_ref(c: Any) -> dict[str, str]:
    ref = {"apiVersion": "v1", "kind": "Pod", "namespace": c.namespace, "name": c.pod, "uid": c.pod_uid}
    if c.name:
        ref["fieldPath"] = f"spec.containers{{{c.name}}}"
    return ref


def label_value(v: str) -> str:
    """A value Kubernetes accepts as a label (<= 63, alphanumeric at both ends), else ""."""
    return v if is_name(v, LABEL_VALUE) else ""


def node_facts(*, license_loss: float, avx512: bool, rdt: bool, rdt_classes: Sequence[str],
               blockio_classes: Sequence[str], mode: str, closids_free: int | None,
               island_cpus: int) -> NodeFacts:
    """Labels (selectable), annotations (lists) and extended resources from what the node has."""
    labels = {f"{PREFIX}avx512": str(avx512).lower(), f"{PREFIX}avx512-license-loss": f"{license_loss:.2f}",
              f"{PREFIX}rdt": str(rdt).lower(), f"{PREFIX}blockio": str(bool(blockio_classes)).lower(),
              f"{PREFIX}mode": label_value(mode) or "unknown"}
    annotations = {f"{PREFIX}rdt-classes": ",".join(sorted(rdt_classes)),
                   f"{PREFIX}blockio-classes": ",".join(sorted(blockio_classes))}
    resources = {f"{PREFIX}avx512-island-cpus": island_cpus if avx512 else 0}
    if closids_free is not None:
        resources[f"{PREFIX}rdt-free-closids"] = max(0, closids_free)
    return NodeFacts(labels=labels, annotations=annotations, resources=resources)


def conditions(status: StatusInput, previous: Sequence[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """The node's conditions with ours set: the kubelet's and anyone else's are kept as they
    are; lastTransitionTime changes only when our status flips."""
    ours = {READY: ("True" if status.ready else "False", status.ready_reason, status.ready_message),
            CONFIG_VALID: ("True", "ConfigLoaded", "the configuration is valid and in force") if status.config_valid
            else ("False", "ConfigRejected", note(f"rejected, the last good configuration stays in force: {status.config_error}"))}
    out = [dict(c) for c in previous if c.get("type") not in ours]
    before = {c.get("type"): c for c in previous}
    for kind, (st, reason, message) in ours.items():
        old = before.get(kind, {})
        out.append({"type": kind, "status": st, "reason": reason, "message": message,
                    "lastHeartbeatTime": rfc3339(now),
                    "lastTransitionTime": old.get("lastTransitionTime", rfc3339(now)) if old.get("status") == st else rfc3339(now)})
    return out


def _ours_changed(new: Sequence[Mapping[str, Any]], old: Sequence[Mapping[str, Any]]) -> bool:
    def pick(cs: Sequence[Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
        return {c.get("type"): (c.get("status"), c.get("reason"), c.get("message")) for c in cs
                if c.get("type") in (READY, CONFIG_VALID)}
    return pick(new) != pick(old)


# ---------------------------------------------------------------------------------------------
# event aggregation (kubelet-like): spam filter and series
# ---------------------------------------------------------------------------------------------

@dataclass
class _Series:
    name: str
    namespace: str
    count: int
    first: float
    last: float
    flushed_count: int
    flushed_at: float


class EventAggregator:
    """Decides per event: create, count into a series, or drop (spam filter)."""

    def __init__(self, *, window: float, burst: int = SPAM_BURST, refill_seconds: float = SPAM_REFILL_SECONDS) -> None:
        self.window, self.burst, self.refill = window, burst, refill_seconds
        self.series: dict[tuple[str, ...], _Series] = {}
        self._tokens: dict[tuple[str, ...], tuple[float, float]] = {}  # object -> (tokens, at)
        self.dropped = 0

    def admit(self, ev: EventSpec, now: float) -> str:
        """'create', 'series' or 'drop'."""
        s = self.series.get(ev.key)
        if s is not None and now - s.last <= self.window:
            s.count += 1
            s.last = now
            return "series"
        obj = ev.key[:4]
        tokens, at = self._tokens.get(obj, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) / self.refill)
        if tokens < 1.0:
            self._tokens[obj] = (tokens, now)
            self.dropped += 1
            return "drop"
        self._tokens[obj] = (tokens - 1.0, now)
        return "create"

    def created(self, ev: EventSpec, name: str, now: float) -> None:
        self.series[ev.key] = _Series(name=name, namespace=ev.namespace, count=1, first=now, last=now, flushed_count=1,
                                       flushed_at=now)

    def due(self, now: float, flush_every: float) -> list[_Series]:
        """Series with uncounted repeats whose last patch is `flush_every` old; series that are
        over (no repeat within the window) and fully counted are forgotten."""
        self.series = {k: s for k, s in self.series.items()
                       if now - s.last <= self.window or s.count != s.flushed_count}
        return [s for s in self.series.values() if s.count != s.flushed_count and now - s.flushed_at >= flush_every]


# ---------------------------------------------------------------------------------------------
# the writer
# ---------------------------------------------------------------------------------------------

class ApiProblem(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


class StatusWriter:
    """Turns StatusInputs into API requests; `sync()` is one pass (called from one thread)."""

    def __init__(self, *, transport: Transport, node: str, options: StatusOptions,
                 clock: Callable[[], float] = time.time) -> None:
        self.api, self.node, self.options, self.clock = transport, node, options, clock
        self.events = EventAggregator(window=options.series_window_seconds, burst=options.spam_burst,
                                      refill_seconds=options.spam_refill_seconds)
        self._pending: list[EventSpec] = []
        self._latest: StatusInput | None = None
        self._synced: tuple[Any, ...] | None = None
        self._next_resync = 0.0
        self._not_before = 0.0
        self._failures = 0
        self._logged: set[str] = set()
        self._config_event: str = ""  # name of our Warning Event on the ConfigMap, "" if none
        self._config_error_posted: str = ""
        self._own_labels: set[str] = set()
        self._own_resources: set[str] = set()
        self.lock = threading.Lock()
        self.stats: dict[str, int] = {"requests": 0, "conflicts": 0, "throttled": 0, "errors": 0,
                                      "events_created": 0, "series_updates": 0}
        self.last_error = ""

    # -- input (any thread) -----------------------------------------------------------------
    def offer(self, status: StatusInput) -> None:
        with self.lock:
            self._latest = status
            if self.options.events:
                self._pending.extend(status.events)
                del self._pending[:-1000]  # bounded: a storm keeps its newest

    def stopping(self) -> None:
        """The agent is stopping: the next sync says PerfbalanceReady=False (AgentStopped)."""
        with self.lock:
            if self._latest is not None:
                self._latest = dataclasses.replace(self._latest, ready=False, ready_reason="AgentStopped",
                                                   ready_message="the perfbalance agent on this node stopped", events=())
        self._synced, self._not_before = None, 0.0

    # -- one pass (the writer's thread) -----------------------------------------------------
    def sync(self) -> None:
        now = self.clock()
        if now < self._not_before:
            return
        with self.lock:
            status, pending, self._pending = self._latest, self._pending, []
        try:
            if status is not None:
                self._config_event_sync(status, now)
                self._node_sync(status, now)
        except ApiProblem as e:
            with self.lock:
                self._pending = pending + self._pending
            self._backoff(e, now)
            return
        try:
            self._events_sync(pending, now)
        except ApiProblem as e:
            self._backoff(e, now)
            return
        self._failures, self.last_error = 0, ""

    def _backoff(self, e: ApiProblem, now: float) -> None:
        self._failures += 1
        self.stats["errors"] += 1
        self.last_error = e.message
        delay = e.retry_after if e.retry_after is not None else min(self.options.backoff_max_seconds, 2.0 ** min(self._failures, 16))
        self._not_before = now + delay
        self._log_once(f"kubernetes status: {e.message} (retrying in {delay:g} s)", key=e.message)

    def _log_once(self, message: str, *, key: str) -> None:
        if key not in self._logged and len(self._logged) < 64:
            self._logged.add(key)
            log.warning("%s", message)

    def _call(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
              ok: Sequence[int] = (200, 201)) -> tuple[int, Any]:
        """A request; 404/409/422/403 are returned for the caller to decide, 429/5xx raised."""
        self.stats["requests"] += 1
        status, raw, headers = self.api.request(method, path, body=body, content_type=content_type)
        if status == 429:
            self.stats["throttled"] += 1
            raise ApiProblem(429, f"{method} {path}: HTTP 429 too many requests", retry_after=_retry_after(headers))
        if status >= 500:
            raise ApiProblem(status, f"{method} {path}: HTTP {status} {_message(raw)}")
        doc = None
        if raw:
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = None
        if status in (403, 422) or (status not in ok and status not in (404, 409)):
            self._log_once(f"kubernetes status: {method} {path}: HTTP {status} {_message(raw)} (not retried)",
                           key=f"{method} {path.split('/')[-1] if status == 422 else path} {status}")
        return status, doc

    # -- nodes -----------------------------------------------------------------------------
    def _node_sync(self, st: StatusInput, now: float) -> None:
        o = self.options
        key = (st.ready, st.ready_reason, st.ready_message, st.config_valid, st.config_error, _frozen(st.facts))
        if key == self._synced and now < self._next_resync:
            return
        if o.node_conditions or o.extended_resources:
            self._node_status(st, now)
        if o.node_labels:
            self._node_meta(st)
        self._synced, self._next_resync = key, now + o.resync_seconds

    def _node_status(self, st: StatusInput, now: float) -> None:
        path = f"/api/v1/nodes/{self.node}"
        for _ in range(MAX_CONFLICT_RETRIES):
            code, node = self._call("GET", path, ok=(200,))
            if code != 200 or not isinstance(node, Mapping):
                return
            patch: dict[str, Any] = {"metadata": {"resourceVersion": node.get("metadata", {}).get("resourceVersion", "")},
                                     "status": {}}
            old = node.get("status", {}).get("conditions") or []
            if self.options.node_conditions:
                patch["status"]["conditions"] = conditions(st, old, now)
            if self.options.extended_resources:
                res = {k: str(v) for k, v in st.facts.resources.items()}
                gone = {k: None for k in self._own_resources - res.keys()}
                patch["status"]["capacity"] = {**res, **gone}
                patch["status"]["allocatable"] = {**res, **gone}
            code, _ = self._call("PATCH", f"{path}/status", patch, content_type=MERGE_PATCH)
            if code == 409:
                self.stats["conflicts"] += 1
                continue
            if code == 200 and self.options.extended_resources:
                self._own_resources = set(st.facts.resources)
            return
        raise ApiProblem(409, f"PATCH {path}/status: still conflicting after {MAX_CONFLICT_RETRIES} reads")

    def _node_meta(self, st: StatusInput) -> None:
        want = {**st.facts.labels}
        gone = {k: None for k in self._own_labels - want.keys()}
        patch = {"metadata": {"labels": {**want, **gone}, "annotations": dict(st.facts.annotations)}}
        code, _ = self._call("PATCH", f"/api/v1/nodes/{self.node}", patch, content_type=MERGE_PATCH)
        if code == 200:
            self._own_labels = set(want)

    def node_seen(self, node: Mapping[str, Any]) -> bool:
        """A Node object seen by the watch: when what we wrote is gone or different (the kubelet
        re-registered and dropped extended resources, someone removed a label), the next sync
        writes it again instead of waiting for the resync. True when a rewrite was scheduled."""
        with self.lock:
            st = self._latest
        if st is None or self._synced is None:
            return False
        meta, status = node.get("metadata") or {}, node.get("status") or {}
        o, missing = self.options, []
        if o.node_conditions:
            have = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
            want = {READY: "True" if st.ready else "False", CONFIG_VALID: "True" if st.config_valid else "False"}
            missing += [k for k, v in want.items() if have.get(k) != v]
        if o.extended_resources:
            cap = status.get("capacity") or {}
            missing += [k for k, v in st.facts.resources.items() if cap.get(k) != str(v)]
        if o.node_labels:
            labels = meta.get("labels") or {}
            missing += [k for k, v in st.facts.labels.items() if labels.get(k) != v]
        if missing:
            self._next_resync = 0.0
            log.info("node %s lost %s: writing it again", self.node, ", ".join(sorted(missing)))
        return bool(missing)

    # -- events ----------------------------------------------------------------------------
    def _events_sync(self, pending: list[EventSpec], now: float) -> None:
        for i, ev in enumerate(pending):
            try:
                if self.events.admit(ev, now) == "create":
                    self._create_event(ev, now)
            except ApiProblem:
                with self.lock:  # the rest waits for the back-off, newest kept within the bound
                    self._pending = (pending[i:] + self._pending)[-1000:]
                raise
        for series in self.events.due(now, self.options.series_flush_seconds):
            self._flush_series(series, now)

    def _create_event(self, ev: EventSpec, now: float) -> str:
        name = f"{ev.regarding.get('name', 'object')}.{uuid.uuid4().hex[:16]}"
        body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": name, "namespace": ev.namespace},
                "eventTime": micro_time(now), "reportingController": CONTROLLER,
                "reportingInstance": f"perfbalance-{self.node}"[:128], "action": ev.action, "reason": ev.reason,
                "regarding": dict(ev.regarding), "note": note(ev.note), "type": ev.type}
        code, _ = self._call("POST", f"/apis/events.k8s.io/v1/namespaces/{ev.namespace}/events", body)
        if code in (200, 201):
            self.stats["events_created"] += 1
            self.events.created(ev, name, now)
            return name
        return ""

    def _flush_series(self, s: _Series, now: float) -> None:
        patch = {"series": {"count": s.count, "lastObservedTime": micro_time(s.last)}}
        code, _ = self._call("PATCH", f"/apis/events.k8s.io/v1/namespaces/{s.namespace}/events/{s.name}", patch,
                             content_type=MERGE_PATCH)
        s.flushed_count, s.flushed_at = s.count, now  # 404 (expired) or 422: the next repeat creates a new Event
        if code == 200:
            self.stats["series_updates"] += 1
        else:
            self.events.series = {k: v for k, v in self.events.series.items() if v is not s}

    # -- the ConfigMap ---------------------------------------------------------------------
    def _config_event_sync(self, st: StatusInput, now: float) -> None:
        if not self.options.config_events:
            return
        error = "" if st.config_valid else st.config_error
        if error == self._config_error_posted:
            return
        o = self.options
        base = f"/apis/events.k8s.io/v1/namespaces/{o.configmap_namespace}/events"
        if self._config_event:
            code, _ = self._call("DELETE", f"{base}/{self._config_event}", ok=(200, 202))
            if code in (200, 202, 404):
                self._config_event = ""
        if error:
            ref = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": o.configmap_namespace, "name": o.configmap_name}
            ev = EventSpec(namespace=o.configmap_namespace, regarding=ref, action="LoadConfig", reason="InvalidConfig",
                           type="Warning", note=f"node {self.node}: {error}")
            self._config_event = self._create_event(ev, now)
        self._config_error_posted = error


def _frozen(f: NodeFacts) -> tuple[Any, ...]:
    return (tuple(sorted(f.labels.items())), tuple(sorted(f.annotations.items())), tuple(sorted(f.resources.items())))


def _retry_after(headers: Mapping[str, str]) -> float | None:
    v = {k.lower(): x for k, x in headers.items()}.get("retry-after", "")
    try:
        s = float(v)
    except ValueError:
        return None
    return s if math.isfinite(s) and 0 <= s <= 3600 else None


def _message(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw[:200].decode("utf-8", "replace")
    return str(doc.get("message", ""))[:200] if isinstance(doc, Mapping) else ""


class NodeWatch:
    """A watch on this Node (`fieldSelector=metadata.name=<node>`) feeding `StatusWriter.node_seen`.

    A watch ends: the server closes it after `timeoutSeconds` (normal), the connection breaks
    (a proxy, an API server restart), or the resourceVersion is too old (an ERROR event with 410
    Gone). The first two resume from the last resourceVersion seen; 410 starts again from a
    fresh GET. `run_once()` is one watch; the caller loops with a back-off on failures.
    """

    def __init__(self, *, transport: Any, node: str, writer: StatusWriter, timeout_seconds: int = 300) -> None:
        self.api, self.node, self.writer, self.timeout = transport, node, writer, timeout_seconds
        self.resource_version = ""
        self.stats = {"watches": 0, "events": 0, "broken": 0, "gone": 0}

    def run_once(self) -> str:
        """One watch; returns how it ended: 'closed', 'broken' or 'gone' (ApiProblem on HTTP errors)."""
        if not self.resource_version:
            code, raw, _ = self.api.request("GET", f"/api/v1/nodes/{self.node}")
            if code != 200:
                raise ApiProblem(code, f"GET /api/v1/nodes/{self.node}: HTTP {code} {_message(raw)}")
            node = json.loads(raw)
            self.resource_version = str((node.get("metadata") or {}).get("resourceVersion", ""))
            self.writer.node_seen(node)
        self.stats["watches"] += 1
        path = (f"/api/v1/nodes?watch=1&allowWatchBookmarks=true&timeoutSeconds={self.timeout}"
                f"&fieldSelector=metadata.name%3D{self.node}&resourceVersion={self.resource_version}")
        try:
            for line in self.api.stream(path, read_timeout=self.timeout + 30):
                if self._event(line) == "gone":
                    return "gone"
        except ApiProblem as e:
            if e.status != 0:
                raise
            self.stats["broken"] += 1
            return "broken"
        return "closed"

    def _event(self, line: bytes) -> str:
        try:
            ev = json.loads(line)
        except ValueError:
            raise ApiProblem(0, f"watch of node {self.node}: not JSON: {line[:80]!r}") from None
        kind, obj = ev.get("type"), ev.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                self.stats["gone"] += 1
                self.resource_version = ""  # too old: list again
                return "gone"
            raise ApiProblem(int(obj.get("code") or 500), f"watch of node {self.node}: {obj.get('message', '')}")
        self.stats["events"] += 1
        self.resource_version = str((obj.get("metadata") or {}).get("resourceVersion", self.resource_version))
        if kind in ("ADDED", "MODIFIED"):
            self.writer.node_seen(obj)
        return kind or ""


class ClientTransport:
    """Transport over the agent's KubeClient: its service-account token (re-read on rotation),
    CA bundle, timeout and bounded reads, for every verb."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._streams: set[http.client.HTTPSConnection] = set()
        self._closed = False
        self._lock = threading.Lock()

    def close(self) -> None:
        """End every open watch now (its read returns) and refuse new ones: the agent is stopping."""
        with self._lock:
            self._closed, streams = True, list(self._streams)
        for conn in streams:
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def request(self, method: str, path: str, *, body: Any = None,
                content_type: str = "application/json") -> tuple[int, bytes, Mapping[str, str]]:
        c = self.client
        url = c.endpoint.base_url + path
        token = c._token.read().decode("utf-8", "replace").strip()
        ctx = c._ssl_context()
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json", "User-Agent": USER_AGENT}
        if data is not None:
            headers["Content-Type"] = content_type
        c.requests += 1
        deadline = time.monotonic() + c.timeout
        conn = http.client.HTTPSConnection(c.endpoint.host, c.endpoint.port, timeout=c.timeout, context=ctx)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = c._read_body(resp, url, deadline, ok=200 <= resp.status < 300)
            return resp.status, raw, dict(resp.getheaders())
        except TimeoutError:
            raise ApiProblem(0, f"{method} {url}: no answer within {c.timeout:g} s") from None
        except ssl.SSLError as e:
            raise ApiProblem(0, f"{method} {url}: TLS failed ({e.reason or e})") from None
        except (OSError, http.client.HTTPException) as e:
            raise ApiProblem(0, f"{method} {url}: request failed ({type(e).__name__}: {e})") from None
        except PerfbalanceError as e:  # KubeApiError: token or CA unreadable, body too large
            raise ApiProblem(0, str(e)) from None
        finally:
            conn.close()

    def stream(self, path: str, *, read_timeout: float, max_line: int = 4 << 20) -> Iterator[bytes]:
        """The lines of a watch response; ApiProblem(status 0) when the connection breaks."""
        c = self.client
        url = c.endpoint.base_url + path
        token = c._token.read().decode("utf-8", "replace").strip()
        conn = http.client.HTTPSConnection(c.endpoint.host, c.endpoint.port, timeout=c.timeout, context=c._ssl_context())
        with self._lock:
            if self._closed:
                raise ApiProblem(0, f"GET {url}: not watched, the agent is stopping")
            self._streams.add(conn)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                                               "User-Agent": USER_AGENT})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ApiProblem(resp.status, f"GET {url}: HTTP {resp.status} {_message(resp.read(800))}")
            if conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            while True:
                line = resp.readline(max_line + 1)
                if not line:
                    return
                if not line.endswith(b"\n"):
                    raise ApiProblem(0, f"GET {url}: the watch broke mid-event ({len(line)} bytes)")
                if line.strip():
                    yield line
        except (TimeoutError, OSError, http.client.HTTPException) as e:
            raise ApiProblem(0, f"GET {url}: watch failed ({type(e).__name__}: {e})") from None
        except PerfbalanceError as e:
            raise ApiProblem(0, str(e)) from None
        finally:
            with self._lock:
                self._streams.discard(conn)
            conn.close()
