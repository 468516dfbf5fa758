"""Pod metadata from the Kubernetes API: the names cgroups do not carry.

A container found in the cgroup tree is known by its pod UID and container id only. Metrics need
namespace/pod/container labels, RDT classes can be chosen by pod annotation, and VM sandboxes
(Kata, KubeVirt) are recognised by the pod's runtime class or labels: all of that lives in the
API server. This module lists the pods of this node (`fieldSelector=spec.nodeName=<node>`,
`resourceVersion=0` so the API server answers from its watch cache instead of etcd, which is what
the kubelet and kube-proxy do for their periodic lists) with a small standard-library HTTPS
client, caches the result, and fills in the containers with the pure `enrich()`.

The API is a convenience, never a dependency of the cycle: requests are bounded (timeout, body
size), failures back off exponentially and are logged once per distinct error, and the last good
pod list stays in use. A container whose pod the list does not know is left as it is.

The service-account token is re-read whenever its file changes (the kubelet rotates projected
tokens by swapping a symlink), and the CA bundle likewise. No path is hard-wired here: the
defaults are in the `kubernetes:` config section.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from perfbalance.errors import FeatureUnavailable, ParseError, PerfbalanceError
from perfbalance.model import QOS_CLASSES, CollectorStatus, Container
from perfbalance.safefs import read_file

if TYPE_CHECKING:
    from agent.config import Config

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 64 << 10
MAX_CA_BYTES = 4 << 20
MAX_ANNOTATION_KEY = 317  # 253-byte DNS prefix + "/" + 63-byte name
READ_CHUNK = 64 << 10
MAX_ERROR_EXCERPT = 200
MAX_LOGGED_ERRORS = 64
KUBEVIRT_LABEL = ("kubevirt.io", "virt-launcher")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # static pods: the kubelet's UID of the pod
USER_AGENT = "perfbalance-agent"


class KubeApiError(PerfbalanceError):
    """A Kubernetes API request failed: names the URL (or file), the HTTP status and why."""

    def __init__(self, url: str, reason: str, *, status: int | None = None) -> None:
        self.url, self.reason, self.status = url, reason, status
        code = f" HTTP {status}" if status is not None else ""
        super().__init__(f"kubernetes API GET {url}:{code} {reason}")


# ---------------------------------------------------------------------------------------------
# pure parsing
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ApiEndpoint:
    """Where the API server is, from the in-cluster environment."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"


def endpoint_from_env(env: Mapping[str, str]) -> ApiEndpoint | None:
    """KUBERNETES_SERVICE_HOST/PORT (set in every pod) -> the endpoint; None outside a cluster."""
    host = env.get("KUBERNETES_SERVICE_HOST", "").strip()
    if not host:
        return None
    raw = env.get("KUBERNETES_SERVICE_PORT", "").strip() or "443"
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ParseError("KUBERNETES_SERVICE_PORT", raw, "not a TCP port")
    if any(ch in host for ch in "/?#@ \t[]"):
        raise ParseError("KUBERNETES_SERVICE_HOST", host, "not a host name or IP address")
    return ApiEndpoint(host=host, port=int(raw))


@dataclass(frozen=True, kw_only=True)
class PodInfo:
    """What perfbalance keeps of one pod object."""

    uid: str
    name: str
    namespace: str
    qos: str = ""  # lower-case status.qosClass, "" when the API did not say
    runtime_class: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: Mapping[str, str] = field(default_factory=dict)  # container id -> container name
    mirror_of: str = ""  # a static pod's kubelet UID (the cgroup names that one)


@dataclass(frozen=True, kw_only=True)
class PodList:
    """A node's pods indexed by UID (and static pods also by their kubelet UID)."""

    pods: Mapping[str, PodInfo] = field(default_factory=dict)
    resource_version: str = ""
    skipped: tuple[str, ...] = ()  # one line per pod object that could not be used


def container_id(raw: str) -> str:
    """'containerd://<id>' / 'cri-o://<id>' / 'docker://<id>' -> '<id>' (what cgroups name)."""
    return raw.split("://", 1)[1] if "://" in raw else raw


def _str(d: Mapping[str, Any], key: str, source: str, *, required: bool = False) -> str:
    v = d.get(key)
    if v is None or v == "":
        if required:
            raise ParseError(f"pod {key}", v, "missing", source=source)
        return ""
    if not isinstance(v, str):
        raise ParseError(f"pod {key}", v, "must be a string", source=source)
    return v


def _map(d: Mapping[str, Any], key: str) -> dict[str, str]:
    v = d.get(key)
    if not isinstance(v, Mapping):
        return {}
    return {k: s for k, s in v.items() if isinstance(k, str) and isinstance(s, str)}


def _obj(d: Any, key: str) -> Mapping[str, Any]:
    v = d.get(key) if isinstance(d, Mapping) else None
    return v if isinstance(v, Mapping) else {}


def _container_names(status: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        entries = status.get(key)
        for cs in entries if isinstance(entries, list) else ():
            if not isinstance(cs, Mapping):
                continue
            cid, name = cs.get("containerID"), cs.get("name")
            if isinstance(cid, str) and isinstance(name, str) and container_id(cid):
                out[container_id(cid)] = name
    return out


def parse_pod(obj: Any, *, source: str = "pod") -> PodInfo:
    """One v1 Pod object -> PodInfo. Unknown fields are ignored; bad identity is a ParseError."""
    if not isinstance(obj, Mapping):
        raise ParseError("pod", type(obj).__name__, "must be an object", source=source)
    meta, spec, status = _obj(obj, "metadata"), _obj(obj, "spec"), _obj(obj, "status")
    qos = _str(status, "qosClass", source).lower()
    annotations = _map(meta, "annotations")
    return PodInfo(
        uid=_str(meta, "uid", source, required=True).lower(),
        name=_str(meta, "name", source, required=True),
        namespace=_str(meta, "namespace", source, required=True),
        qos=qos if qos in QOS_CLASSES else "",
        runtime_class=_str(spec, "runtimeClassName", source),
        labels=_map(meta, "labels"), annotations=annotations,
        containers=_container_names(status),
        mirror_of=annotations.get(MIRROR_ANNOTATION, "").lower(),
    )


def parse_pod_list(body: bytes, *, source: str) -> PodList:
    """A v1 PodList response body -> PodList; a pod object that cannot be used is skipped."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ParseError("pod list", f"{len(body)} bytes", f"not JSON ({str(e)[:80]})", source=source) from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("items"), list):
        raise ParseError("pod list", str(body[:80]), "not a PodList (no items array)", source=source)
    pods: dict[str, PodInfo] = {}
    skipped: list[str] = []
    for i, item in enumerate(doc["items"]):
        try:
            pod = parse_pod(item, source=f"{source} items[{i}]")
        except ParseError as e:
            skipped.append(str(e))
            continue
        pods[pod.uid] = pod
        if pod.mirror_of:
            pods.setdefault(pod.mirror_of, pod)
    rv = _obj(doc, "metadata").get("resourceVersion", "")
    return PodList(pods=pods, resource_version=rv if isinstance(rv, str) else "", skipped=tuple(skipped))


def status_message(body: bytes) -> str:
    """The `message` of a v1 Status error body, else a short excerpt of the body."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, Mapping) and isinstance(doc.get("message"), str):
        return doc["message"][:MAX_ERROR_EXCERPT]
    text = body[:MAX_ERROR_EXCERPT].decode("utf-8", "replace").strip()
    return text or "(empty body)"


# ---------------------------------------------------------------------------------------------
# enrich: pure
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class EnrichOptions:
    """Which pod facts are copied onto containers, and how much of them."""

    annotation_prefixes: tuple[str, ...] = ("perfbalance.io/", "rdt.perfbalance.io/")
    max_annotation_value_bytes: int = 256
    max_annotations: int = 32
    kata_runtime_classes: str = "^kata"


def pick_annotations(annotations: Mapping[str, str], options: EnrichOptions) -> dict[str, str]:
    """Only keys under an allowed prefix, values within the byte limit (longer ones dropped:
    a cut value would be a different value), at most `max_annotations`, by key order."""
    out: dict[str, str] = {}
    for key in sorted(annotations):
        if len(out) >= options.max_annotations:
            break
        value = annotations[key]
        if len(key) > MAX_ANNOTATION_KEY or not key.startswith(options.annotation_prefixes):
            continue
        if len(value.encode("utf-8", "replace")) <= options.max_annotation_value_bytes:
            out[key] = value
    return out


def sandbox_of(pod: PodInfo, options: EnrichOptions) -> str:
    """'kata' for a runtime class matching the pattern, 'kubevirt' for virt-launcher pods."""
    if pod.runtime_class and options.kata_runtime_classes and \
            re.search(options.kata_runtime_classes, pod.runtime_class):
        return "kata"
    if pod.labels.get(KUBEVIRT_LABEL[0]) == KUBEVIRT_LABEL[1]:
        return "kubevirt"
    return ""


def enrich_one(c: Container, pod: PodInfo, options: EnrichOptions) -> Container:
    annotations = {**c.annotations, **pick_annotations(pod.annotations, options)}
    return replace(
        c, name=pod.containers.get(c.id, c.name), namespace=pod.namespace, pod=pod.name,
        annotations=annotations, labels=dict(pod.labels) or c.labels,
        qos=pod.qos if c.qos == "unknown" and pod.qos else c.qos,
        sandbox=sandbox_of(pod, options) or c.sandbox,
    )


def enrich(containers: Sequence[Container], pods: Mapping[str, PodInfo], *,
           options: EnrichOptions = EnrichOptions()) -> list[Container]:
    """Containers with their pod's name, namespace, allowed annotations, QoS (when the cgroup
    path did not give it), sandbox kind and container name; unknown pods stay as they are."""
    out = []
    for c in containers:
        pod = pods.get(c.pod_uid.lower()) if c.pod_uid else None
        out.append(c if pod is None else enrich_one(c, pod, options))
    return out


# ---------------------------------------------------------------------------------------------
# the HTTPS client
# ---------------------------------------------------------------------------------------------

class _WatchedFile:
    """A small file re-read only when it changes (path, inode, mtime or size differ)."""

    def __init__(self, path: str, *, what: str, max_bytes: int) -> None:
        self.path, self.what, self.max_bytes = path, what, max_bytes
        self._stamp: tuple[Any, ...] | None = None
        self._data = b""
        self.reads = 0

    def _stat(self) -> tuple[Any, ...]:
        st = os.stat(self.path)  # follows the ..data symlink a projected volume swaps
        return (os.path.realpath(self.path), st.st_ino, st.st_mtime_ns, st.st_size)

    def read(self, *, force: bool = False) -> bytes:
        try:
            stamp = self._stat()
            if force or stamp != self._stamp:
                data = read_file(self.path, self.max_bytes)
                self.reads += 1
                if not data.strip():
                    raise KubeApiError(self.path, f"{self.what} is empty")
                self._stamp, self._data = stamp, data
        except OverflowError:
            raise KubeApiError(self.path, f"{self.what} larger than {self.max_bytes} bytes") from None
        except OSError as e:
            raise KubeApiError(self.path, f"cannot read {self.what} ({e.strerror or e})") from None
        return self._data


class KubeClient:
    """GET requests to the API server with the pod's service-account credentials."""

    def __init__(self, *, endpoint: ApiEndpoint, token_file: str, ca_file: str,
                 timeout_seconds: float = 5.0, max_response_bytes: int = 32 << 20) -> None:
        self.endpoint, self.timeout, self.max_bytes = endpoint, timeout_seconds, max_response_bytes
        self._token = _WatchedFile(token_file, what="service-account token", max_bytes=MAX_TOKEN_BYTES)
        self._ca = _WatchedFile(ca_file, what="CA bundle", max_bytes=MAX_CA_BYTES)
        self._ca_data = b""
        self._context: ssl.SSLContext | None = None
        self.requests = 0

    def check(self) -> None:
        """Raise KubeApiError when the token or the CA bundle cannot be used."""
        self._token.read()
        self._ssl_context()

    def _ssl_context(self) -> ssl.SSLContext:
        data = self._ca.read()
        if self._context is None or data != self._ca_data:
            try:
                ctx = ssl.create_default_context(cadata=data.decode("ascii", "replace"))
            except (ssl.SSLError, ValueError) as e:
                raise KubeApiError(self._ca.path, f"CA bundle not usable ({e})") from None
            self._context, self._ca_data = ctx, data
        return self._context

    def get(self, path: str, query: Mapping[str, str]) -> bytes:
        """The body of a 200 response; KubeApiError (naming the URL and status) otherwise."""
        target = f"{path}?{urllib.parse.urlencode(query)}" if query else path
        url = self.endpoint.base_url + target
        token = self._token.read().decode("utf-8", "replace").strip()
        ctx = self._ssl_context()
        self.requests += 1
        status, body = self._exchange(url, target, token, ctx)
        if status == 401:  # the token may have rotated between our stat and the server's check
            try:
                self._token.read(force=True)
            except KubeApiError:
                pass  # the 401 below is the error worth reporting
        if status != 200:
            raise KubeApiError(url, status_message(body), status=status)
        return body

    def _exchange(self, url: str, target: str, token: str, ctx: ssl.SSLContext) -> tuple[int, bytes]:
        deadline = time.monotonic() + self.timeout
        conn = http.client.HTTPSConnection(self.endpoint.host, self.endpoint.port,
                                           timeout=self.timeout, context=ctx)
        try:
            conn.request("GET", target, headers={
                "Authorization": f"Bearer {token}", "Accept": "application/json",
                "User-Agent": USER_AGENT})
            resp = conn.getresponse()
            return resp.status, self._read_body(resp, url, deadline, ok=resp.status == 200)
        except TimeoutError:
            raise KubeApiError(url, f"no answer within {self.timeout:g} s") from None
        except ssl.SSLError as e:
            raise KubeApiError(url, f"TLS failed ({e.reason or e})") from None
        except (OSError, http.client.HTTPException) as e:
            raise KubeApiError(url, f"request failed ({type(e).__name__}: {e})") from None
        finally:
            conn.close()

    def _read_body(self, resp: http.client.HTTPResponse, url: str, deadline: float, *, ok: bool) -> bytes:
        limit = self.max_bytes if ok else MAX_ERROR_EXCERPT * 4  # error bodies: an excerpt is enough
        length = resp.getheader("Content-Length")
        if ok and length and length.isdigit() and int(length) > limit:
            raise KubeApiError(url, f"response of {length} bytes exceeds the limit of {limit} bytes",
                               status=resp.status)
        chunks, total = [], 0
        while total <= limit:
            if time.monotonic() > deadline:
                raise KubeApiError(url, f"response not complete within {self.timeout:g} s", status=resp.status)
            chunk = resp.read1(min(READ_CHUNK, limit + 1 - total))  # one recv: the deadline is checked between
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
        if not ok:
            return b"".join(chunks)[:limit]
        raise KubeApiError(url, f"response exceeds the limit of {limit} bytes", status=resp.status)

    def list_node_pods(self, node: str) -> PodList:
        """This node's pods, served from the API server's watch cache."""
        query = {"fieldSelector": f"spec.nodeName={node}", "resourceVersion": "0"}
        body = self.get("/api/v1/pods", query)
        try:
            return parse_pod_list(body, source=f"{self.endpoint.base_url}/api/v1/pods")
        except ParseError as e:
            raise KubeApiError(f"{self.endpoint.base_url}/api/v1/pods?{urllib.parse.urlencode(query)}",
                               f"unusable answer: {e.reason}: {str(e.value)[:80]!r}", status=200) from None


# ---------------------------------------------------------------------------------------------
# the cache the agent asks every cycle
# ---------------------------------------------------------------------------------------------

class PodSource(Protocol):
    def list_node_pods(self, node: str) -> PodList: ...


class PodMetadata:
    """The node's pods, refreshed at most every `refresh_seconds`, sooner (at most every
    `unknown_refresh_seconds`) when a container names a pod UID not seen before, and with
    exponential backoff after errors. The last good list is always what is served."""

    def __init__(self, *, source: PodSource, node: str, refresh_seconds: float = 30.0,
                 unknown_refresh_seconds: float = 5.0, backoff_initial_seconds: float = 2.0,
                 backoff_max_seconds: float = 300.0, options: EnrichOptions = EnrichOptions(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.node, self.options, self.clock = source, node, options, clock
        self.refresh_seconds, self.unknown_refresh_seconds = refresh_seconds, unknown_refresh_seconds
        self.backoff_initial, self.backoff_max = backoff_initial_seconds, backoff_max_seconds
        self._pods: Mapping[str, PodInfo] = {}
        self._missing: frozenset[str] = frozenset()
        self._next_due = 0.0  # the next periodic refresh
        self._not_before = 0.0  # backoff: no request at all before this
        self._last_attempt: float | None = None
        self._last_success: float | None = None
        self._failures = 0
        self._logged: set[str] = set()
        self.last_error = ""

    # -- what the cycle calls -------------------------------------------------------------
    def enrich(self, containers: Sequence[Container]) -> list[Container]:
        """Refresh when due, then `enrich()` with the last good list. Never raises for the API."""
        pods = self.pods(c.pod_uid.lower() for c in containers if c.pod_uid)
        return enrich(containers, pods, options=self.options)

    def pods(self, want: Iterable[str] = ()) -> Mapping[str, PodInfo]:
        wanted = frozenset(want)
        if self._due(wanted, self.clock()):
            self.refresh(wanted)
        return self._pods

    def refresh(self, want: Iterable[str] = ()) -> bool:
        """List the pods now (ignoring the schedule); False, with `last_error`, when it failed."""
        now = self.clock()
        self._last_attempt = now
        try:
            got = self.source.list_node_pods(self.node)
        except KubeApiError as e:
            self._failed(str(e), now)
            return False
        self._succeeded(got, frozenset(want), now)
        return True

    def status(self) -> CollectorStatus:
        age = None if self._last_success is None else max(0.0, self.clock() - self._last_success)
        detail = {"pods": len({p.uid for p in self._pods.values()}), "failures": self._failures,
                  "age_seconds": age}
        return CollectorStatus(up=not self.last_error and self._last_success is not None,
                               reason=self.last_error, detail=detail)

    # -- scheduling -----------------------------------------------------------------------
    def _due(self, want: frozenset[str], now: float) -> bool:
        if now < self._not_before:
            return False
        if now >= self._next_due:
            return True
        new = want - self._pods.keys() - self._missing
        return bool(new) and (self._last_attempt is None
                              or now - self._last_attempt >= self.unknown_refresh_seconds)

    def _succeeded(self, got: PodList, want: frozenset[str], now: float) -> None:
        if self.last_error:
            log.info("kubernetes API answers again: %d pods on node %s", len(got.pods), self.node)
            self._logged.clear()  # a recurring error is worth one more line after a recovery
        for line in got.skipped:
            self._log_once(f"pod skipped: {line}")
        self._pods, self._missing = got.pods, want - got.pods.keys()
        self._failures, self.last_error, self._last_success = 0, "", now
        self._next_due, self._not_before = now + self.refresh_seconds, now

    def _failed(self, error: str, now: float) -> None:
        self._failures += 1
        self.last_error = error
        delay = min(self.backoff_max, self.backoff_initial * 2 ** min(self._failures - 1, 30))
        self._not_before = self._next_due = now + delay
        self._log_once(f"{error} (keeping the last good list of {len(self._pods)} pods; retrying"
                       f" with backoff up to {self.backoff_max:g} s)", key=error)

    def _log_once(self, message: str, *, key: str | None = None) -> None:
        key = key or message
        if key in self._logged:
            return
        if len(self._logged) < MAX_LOGGED_ERRORS:
            self._logged.add(key)
        log.warning("%s", message)


# ---------------------------------------------------------------------------------------------
# from the configuration
# ---------------------------------------------------------------------------------------------

def options_from_config(config: Config) -> EnrichOptions:
    """Enrich options; the class annotations (resctrl, block I/O, real time) are always let through."""
    k = config.kubernetes
    class_keys = (config.resctrl.annotation, config.blockio.annotation, config.rt.annotation)
    prefixes = tuple(dict.fromkeys((*k.annotation_prefixes, *class_keys)))
    return EnrichOptions(annotation_prefixes=prefixes,
                         max_annotation_value_bytes=k.annotation_max_value_bytes,
                         kata_runtime_classes=k.kata_runtime_classes)


def open_pod_metadata(config: Config, *, node: str, env: Mapping[str, str]) -> PodMetadata | None:
    """The pod-metadata cache per `kubernetes.api`: None when off, or (auto) when not in a
    cluster or the credentials cannot be read. With `on`, FeatureUnavailable says why it is
    unusable, including a first list that fails."""
    k = config.kubernetes
    if k.api == "off":
        return None
    try:
        client = _client(config, env)
        client.check()
    except (KubeApiError, ParseError, _NotInCluster) as e:
        if k.api == "on":
            raise FeatureUnavailable("kubernetes API", f"kubernetes.api is on but {e}") from None
        log.info("kubernetes API not used (kubernetes.api: auto): %s", e)
        return None
    meta = PodMetadata(source=client, node=node, refresh_seconds=k.refresh_seconds,
                       unknown_refresh_seconds=k.unknown_refresh_seconds,
                       backoff_max_seconds=k.backoff_max_seconds, options=options_from_config(config))
    if k.api == "on" and not meta.refresh():
        raise FeatureUnavailable("kubernetes API", f"kubernetes.api is on but {meta.last_error}")
    return meta


class _NotInCluster(PerfbalanceError):
    pass


def client_from_config(config: Config, env: Mapping[str, str]) -> KubeClient:
    """A client with the pod's credentials (`kubernetes:` token, CA, timeout; the endpoint from
    `env`), checked: for writers beside the pod list (node status and Events). PerfbalanceError
    (KubeApiError, ParseError, not in a cluster) says why it cannot be used."""
    client = _client(config, env)
    client.check()
    return client


def _client(config: Config, env: Mapping[str, str]) -> KubeClient:
    k = config.kubernetes
    endpoint = endpoint_from_env(env)
    if endpoint is None:
        raise _NotInCluster("KUBERNETES_SERVICE_HOST is not set (not running in a pod?)")
    return KubeClient(endpoint=endpoint, token_file=k.token_file, ca_file=k.ca_file,
                      timeout_seconds=k.timeout_seconds, max_response_bytes=k.max_response_bytes)


def reconfigure(meta: PodMetadata, config: Config) -> None:
    """Follow a reloaded config (schedule and enrich options; the endpoint stays)."""
    k = config.kubernetes
    meta.refresh_seconds, meta.unknown_refresh_seconds = k.refresh_seconds, k.unknown_refresh_seconds
    meta.backoff_max, meta.options = k.backoff_max_seconds, options_from_config(config)
    if isinstance(meta.source, KubeClient):
        meta.source.timeout, meta.source.max_bytes = k.timeout_seconds, k.max_response_bytes
