"""A stand-in Kubernetes API server for the status writer: real HTTPS, real API semantics.

What it does like the real API server (and so what the tests prove):
- Node GET, PATCH of `nodes/<n>` and `nodes/<n>/status` with `application/merge-patch+json`
  applied per RFC 7386 (maps merge, null deletes, lists are replaced whole), a
  `metadata.resourceVersion` in the patch is a precondition (409 Conflict when stale), other
  content types are 415; `/status` changes only status, the main resource only metadata;
- events.k8s.io/v1 create, merge-patch and delete, validated as the API server validates them
  (eventTime, reportingController/Instance, action, reason, note <= 1 kB, type, regarding,
  series count >= 2 with lastObservedTime): 422 with a Status body naming the field; a name
  taken is 409 AlreadyExists;
- faults queued per request (429 with Retry-After, 500, a dropped connection) and a hook that
  runs between a client's GET and its PATCH (the kubelet writing its own conditions);
- a list of this node's pods (`GET /api/v1/pods`), so the whole agent can run against it: its
  pod metadata names the containers whose moves become Events.

What it does not prove: authentication and RBAC (every token is accepted; the RBAC files are
checked against the writer's requests by a separate test), strategic merge patch, field
managers, event TTL expiry (simulated by deleting events).
"""

from __future__ import annotations

import copy
import json
import queue
import re
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

NODE = "worker-k1"
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def kubelet_node(name: str = NODE) -> dict[str, Any]:
    t = "2026-12-01T10:00:00Z"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": "node-uid-1", "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": name}, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                       "allocatable": {"cpu": "4", "memory": "7Gi", "pods": "110"},
                       "conditions": [
                           {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                            "message": "ok", "lastHeartbeatTime": t, "lastTransitionTime": t},
                           {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
                            "lastHeartbeatTime": t, "lastTransitionTime": t}]}}


@dataclass
class Request:
    method: str
    path: str
    content_type: str
    body: Any


@dataclass
class Fault:
    method: str
    path_contains: str
    status: int = 500  # 0: drop the connection without an answer
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "injected"


@dataclass
class KubeStore:
    nodes: dict[str, dict[str, Any]] = field(default_factory=lambda: {NODE: kubelet_node()})
    events: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    # set: every request but the pod list waits (up to 30 s) until `stalled` is cleared, as an
    # API server that accepts connections and does not answer
    stalled: threading.Event = field(default_factory=threading.Event)
    arrived: int = 0  # requests received other than the pod list, answered or not yet
    faults: list[Fault] = field(default_factory=list)
    seen: list[Request] = field(default_factory=list)
    after_node_get: Callable[[KubeStore], None] | None = None
    # what a watch sends, in order: an event dict, "BREAK" (cut mid-event), "END" (the server's
    # timeoutSeconds: a clean end), "GONE" (410: the resourceVersion is too old)
    watch: queue.Queue[Any] = field(default_factory=queue.Queue)
    watch_queries: list[dict[str, list[str]]] = field(default_factory=list)
    rv: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def kubelet_heartbeat(self, name: str = NODE) -> None:
        """What the kubelet does every few seconds: rewrite its own conditions (new rv)."""
        node = self.nodes[name]
        for c in node["status"]["conditions"]:
            if c["type"] == "Ready":
                c["lastHeartbeatTime"] = "2026-12-01T10:05:00Z"
        self.bump(node)

    def events_for(self, kind: str, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events.values() if e["regarding"].get("kind") == kind and e["regarding"].get("name") == name]

    # -- request handling ------------------------------------------------------------------
    def handle(self, method: str, path: str, content_type: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        with self.lock:
            self.seen.append(Request(method=method, path=path, content_type=content_type, body=body))
            for f in list(self.faults):
                if f.method == method and f.path_contains in path:
                    self.faults.remove(f)
                    return f.status, status(f.status, "Injected", f.message), f.headers
            if method == "GET" and path == "/api/v1/pods":
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)},
                             "items": copy.deepcopy(self.pods)}, {}
            m = re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", path)
            if m:
                return self._node(method, m.group(1), bool(m.group(2)), content_type, body)
            m = re.fullmatch(r"/apis/events\.k8s\.io/v1/namespaces/([^/]+)/events(?:/([^/]+))?", path)
            if m:
                return self._event(method, m.group(1), m.group(2), content_type, body)
            return 404, status(404, "NotFound", f"no route {path}"), {}

    def _node(self, method: str, name: str, sub: bool, ctype: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        node = self.nodes.get(name)
        if node is None:
            return 404, status(404, "NotFound", f'nodes "{name}" not found'), {}
        if method == "GET":
            out = copy.deepcopy(node)
            if self.after_node_get is not None:
                self.after_node_get(self)
            return 200, out, {}
        if method != "PATCH":
            return 405, status(405, "MethodNotAllowed", method), {}
        if ctype != "application/merge-patch+json":
            return 415, status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}"), {}
        want_rv = (body.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != node["metadata"]["resourceVersion"]:
            return 409, status(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                                                 "modified; please apply your changes to the latest version and try again"), {}
        patched = merge_patch(node, body)
        new = copy.deepcopy(node)
        if sub:
            new["status"] = patched.get("status", {})
        else:
            new["metadata"] = {**patched["metadata"], "name": name, "resourceVersion": node["metadata"]["resourceVersion"]}
        problem = _node_problem(new)
        if problem:
            return 422, status(422, "Invalid", f'Node "{name}" is invalid: {problem}'), {}
        self.bump(new)
        self.nodes[name] = new
        return 200, new, {}

    def _event(self, method: str, ns: str, name: str | None, ctype: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        if method == "POST" and name is None:
            problem = _event_problem(body, ns)
            if problem:
                return 422, status(422, "Invalid", f"Event.events.k8s.io is invalid: {problem}"), {}
            key = (ns, body["metadata"]["name"])
            if key in self.events:
                return 409, status(409, "AlreadyExists", f'events.events.k8s.io "{key[1]}" already exists'), {}
            ev = copy.deepcopy(body)
            self.bump(ev)
            self.events[key] = ev
            return 201, ev, {}
        key = (ns, name or "")
        if key not in self.events:
            return 404, status(404, "NotFound", f'events.events.k8s.io "{name}" not found'), {}
        if method == "DELETE":
            del self.events[key]
            return 200, status(200, "", ""), {}
        if method == "PATCH":
            if ctype != "application/merge-patch+json":
                return 415, status(415, "UnsupportedMediaType", ctype), {}
            new = merge_patch(self.events[key], body)
            problem = _event_problem(new, ns)
            if problem:
                return 422, status(422, "Invalid", f"Event.events.k8s.io is invalid: {problem}"), {}
            self.bump(new)
            self.events[key] = new
            return 200, new, {}
        return 405, status(405, "MethodNotAllowed", method), {}


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure" if code >= 300 else "Success",
            "message": message, "reason": reason, "code": code}


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[mkMGTPE]|e[0-9]+)?$")


def _node_problem(node: dict[str, Any]) -> str:
    for i, c in enumerate(node.get("status", {}).get("conditions") or []):
        if not c.get("type"):
            return f"status.conditions[{i}].type: Required value"
        if c.get("status") not in ("True", "False", "Unknown"):
            return f"status.conditions[{i}].status: Unsupported value: {c.get('status')!r}"
    for part in ("capacity", "allocatable"):
        for k, v in (node.get("status", {}).get(part) or {}).items():
            if not isinstance(v, str) or not QUANTITY.match(v):
                return f"status.{part}[{k}]: Invalid value: {v!r}: quantities must match the regular expression"
    for k, v in (node.get("metadata", {}).get("labels") or {}).items():
        if not isinstance(v, str) or len(v) > 63 or not re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", v):
            return f"metadata.labels: Invalid value: {v!r}"
    return ""


def _event_problem(ev: Any, ns: str) -> str:
    if not isinstance(ev, dict):
        return "body: must be an object"
    meta = ev.get("metadata") or {}
    checks = [
        (not meta.get("name"), "metadata.name: Required value"),
        (meta.get("namespace", ns) != ns, "metadata.namespace: does not match the namespace of the request"),
        (not MICRO.match(str(ev.get("eventTime", ""))), "eventTime: Required value (MicroTime)"),
        (not ev.get("reportingController") or len(ev["reportingController"]) > 128, "reportingController: Required value"),
        (not ev.get("reportingInstance") or len(ev["reportingInstance"]) > 128, "reportingInstance: Required value"),
        (not ev.get("action") or len(ev["action"]) > 128, "action: Required value"),
        (not ev.get("reason") or len(ev["reason"]) > 128, "reason: Required value"),
        (len(str(ev.get("note", "")).encode()) > 1024, "note: Too long: may not be longer than 1024"),
        (ev.get("type") not in ("Normal", "Warning"), f"type: Unsupported value: {ev.get('type')!r}"),
        (not (ev.get("regarding") or {}).get("kind"), "regarding.kind: Required value"),
    ]
    series = ev.get("series")
    if series is not None:
        checks += [(not isinstance(series.get("count"), int) or series["count"] < 2, "series.count: must be >= 2"),
                   (not MICRO.match(str(series.get("lastObservedTime", ""))), "series.lastObservedTime: Required value")]
    return next((msg for bad, msg in checks if bad), "")


def _handler(store: KubeStore) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw
            url = urllib.parse.urlsplit(self.path)
            path = url.path
            query = urllib.parse.parse_qs(url.query)
            if self.command == "GET" and path == "/api/v1/nodes" and query.get("watch") == ["1"]:
                store.watch_queries.append(query)
                store.seen.append(Request(method="GET", path=path, content_type="", body=None))
                self._watch()
                return
            if path != "/api/v1/pods":
                store.arrived += 1
            waited = 0.0
            while store.stalled.is_set() and path != "/api/v1/pods" and waited < 30:
                time.sleep(0.05)
                waited += 0.05
            code, doc, headers = store.handle(self.command, path, self.headers.get("Content-Type", ""), body)
            if code == 0:  # a connection that breaks mid-request
                self.close_connection = True
                self.connection.shutdown(2)
                return
            data = json.dumps(doc).encode()
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _watch(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                item = store.watch.get(timeout=30)
                if item == "END":
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if item == "BREAK":
                    part = b'{"type":"MODIFIED","obj'
                    self.wfile.write(b"%x\r\n%s" % (len(part) + 10, part))  # a chunk cut short
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                gone = item == "GONE"
                if gone:  # the API server ends a watch after its ERROR event
                    item = {"type": "ERROR", "object": status(410, "Expired", "too old resource version")}
                line = json.dumps(item).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                if gone:
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.wfile.flush()

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve  # noqa: N815 (http.server's names)

    return Handler


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def kube_certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pbtest-kube-tls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=pbtest-kube-ca", "-keyout", str(d / "ca.key"),
             "-out", str(d / "ca.crt"))
    _openssl("req", *ec, "-subj", "/CN=kube-apiserver", "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"))
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-days", "1", "-extfile", str(d / "san.ext"), "-out", str(d / "server.crt"))
    return {"ca": d / "ca.crt", "cert": d / "server.crt", "key": d / "server.key"}


@dataclass
class KubeServer:
    store: KubeStore
    port: int
    ca_file: Path


@pytest.fixture
def kube(kube_certs: dict[str, Path]) -> Iterator[KubeServer]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(kube_certs["cert"]), str(kube_certs["key"]))
    store = KubeStore()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="pbtest-kube-api", daemon=True)
    thread.start()
    try:
        yield KubeServer(store=store, port=server.server_address[1], ca_file=kube_certs["ca"])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
