"""A real HTTPS test API server on 127.0.0.1 serving captured-shape pod lists (helpers + fixtures).

The certificate chain (a throwaway CA and a server certificate with IP SAN 127.0.0.1) is made by
the `openssl` CLI once per session, so the client verifies the server exactly as it verifies a
real API server (CA bundle, IP SAN). The server records every request (path, query, headers) so
tests can check what was sent and count requests; its answer is switched per test.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.discover.podmeta import ApiEndpoint, KubeClient

PODS_DIR = Path(__file__).resolve().parents[1] / "data" / "pods"
NODE = "worker-a1"
FIXTURES = ("burstable-containerd", "guaranteed-crio", "kata-qemu", "kubevirt-virt-launcher")


def pod(name: str) -> dict[str, Any]:
    return json.loads((PODS_DIR / f"{name}.json").read_text())


def pod_list(*names: str, rv: str = "884700") -> bytes:
    items = [pod(n) for n in (names or FIXTURES)]
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
                       "items": items}).encode()


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()


@dataclass
class Answer:
    """What the server does next: status + body, optionally slow, chunked or garbage."""

    status: int = 200
    body: bytes = b""
    delay: float = 0.0  # seconds before answering (interruptible on shutdown)
    chunked: bool = False
    trickle: float = 0.0  # seconds between 1-KiB chunks (with chunked)


@dataclass
class Seen:
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


@dataclass
class FakeApi:
    port: int
    ca_file: Path
    answer: Answer = field(default_factory=lambda: Answer(body=pod_list()))
    seen: list[Seen] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def endpoint(self) -> ApiEndpoint:
        return ApiEndpoint(host="127.0.0.1", port=self.port)

    @property
    def env(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urllib.parse.urlsplit(self.path)
            api.seen.append(Seen(path=url.path, query=urllib.parse.parse_qs(url.query),
                                 headers={k.lower(): v for k, v in self.headers.items()}))
            a = api.answer
            if a.delay and api.stop.wait(a.delay):
                return
            self.send_response(a.status)
            self.send_header("Content-Type", "application/json")
            if a.chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self._chunks(a)
                return
            self.send_header("Content-Length", str(len(a.body)))
            self.end_headers()
            self.wfile.write(a.body)

        def _chunks(self, a: Answer) -> None:
            try:
                for i in range(0, len(a.body), 1024):
                    part = a.body[i:i + 1024]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.flush()
                    if a.trickle and api.stop.wait(a.trickle):
                        return
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the client gave up (the behaviour under test)

    return Handler


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pbtest-podmeta-tls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=pbtest-kubernetes-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))
    _openssl("req", *ec, "-subj", "/CN=kube-apiserver", "-keyout", str(d / "server.key"),
             "-out", str(d / "server.csr"))
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"),
             "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
             "-extfile", str(d / "san.ext"), "-out", str(d / "server.crt"))
    return {"ca": d / "ca.crt", "cert": d / "server.crt", "key": d / "server.key"}


@pytest.fixture
def api(certs: dict[str, Path]) -> Iterator[FakeApi]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(certs["cert"]), str(certs["key"]))
    fake = FakeApi(port=0, ca_file=certs["ca"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="pbtest-podmeta-api", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def write_token_dir(base: Path, token: str) -> Path:
    """A kubelet-style projected volume: token -> ..data/token, ..data -> ..<timestamp>/."""
    base.mkdir(parents=True, exist_ok=True)
    stamp = base / f"..{time.monotonic_ns()}"
    stamp.mkdir()
    (stamp / "token").write_text(token)
    tmp_link = base / "..data_tmp"
    os.symlink(stamp.name, tmp_link)
    os.replace(tmp_link, base / "..data")  # the atomic swap the kubelet does on rotation
    if not (base / "token").is_symlink():
        os.symlink("..data/token", base / "token")
    return base / "token"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    return write_token_dir(tmp_path / "serviceaccount", "token-one")


@pytest.fixture
def client(api: FakeApi, token_file: Path) -> KubeClient:
    return KubeClient(endpoint=api.endpoint, token_file=str(token_file), ca_file=str(api.ca_file),
                      timeout_seconds=2.0)


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
