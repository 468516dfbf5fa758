"""The agent's HTTP endpoint: /metrics, /healthz, /readyz, /api/state and the live node view.

Why the standard library: the agent is a node daemon that should not pull in a web framework for
five read-only routes. A ThreadingHTTPServer runs in one daemon thread beside the asyncio loop;
every request reads `AgentState.view()` (a consistent copy under its lock) and nothing else, so
a slow scraper can never stall a cycle, and a scrape does no host I/O. `/metrics` serves the
report's series rendered once per cycle (agent/export/exposition.py), gzipped when asked. The node view's files are
read once at start and served from memory; it uses no CDN, so it works on an air-gapped node.

Wiring (agent/loop.py):  server = serve_http(state, config.metrics.listen, ...); ...; server.stop()
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.config import Config
from agent.export.exposition import Exposition
from agent.export.prometheus import state_json
from agent.export.report import AgentState
from perfbalance.errors import ConfigError

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = {  # URL path -> (file in STATIC_DIR, content type); nothing else is served
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
PAGE_CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'"


def parse_listen(text: str, *, source: str = "metrics.listen") -> tuple[str, int]:
    """"host:port", "[v6]:port" or ":port" (all addresses) -> (host, port)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(source, "", text, "must be host:port with a port 0..65535")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return (host or "0.0.0.0", int(port))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class NodeServer:
    """The HTTP server of one agent. `start()` binds (port 0: any free port) and serves in a thread."""

    def __init__(self, state: AgentState, *, listen: str = "127.0.0.1:9847",
                 stale_after: float = 30.0,
                 node_view: bool = True, bandwidth_peak: float = 0.0,
                 clock: Callable[[], float] = time.time, static_dir: Path = STATIC_DIR) -> None:
        self.state = state
        self.host, self.port = parse_listen(listen)
        self.exposition = Exposition(state, bandwidth_peak=bandwidth_peak)
        self.stale_after, self.bandwidth_peak, self.clock = stale_after, bandwidth_peak, clock
        self.static = _load_static(static_dir) if node_view else {}
        self.started = clock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> NodeServer:
        cls = _Server6 if ":" in self.host else _Server
        try:
            self._server = cls((self.host, self.port), _handler(self))
        except OSError as e:
            raise ConfigError("metrics.listen", "", f"{self.host}:{self.port}", f"cannot listen ({e.strerror})") from None
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="perfbalance-http",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        log.info("serving metrics and node view", extra={"url": self.url})
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
        self._server = self._thread = None

    # -- what each route answers (pure functions of the state and the clock) ------------------
    def health(self) -> tuple[int, str]:
        """Alive when the loop ticked within `stale_after` (or we are still within it of start)."""
        now = self.clock()
        latest = self.state.view()["latest"]
        last = latest.time if latest is not None else self.started
        age = now - last
        if age <= self.stale_after:
            return 200, "ok\n"
        what = "last cycle" if latest is not None else "start without a cycle"
        return 503, f"stalled: {what} {age:.0f} s ago (limit {self.stale_after:.0f} s)\n"

    def readiness(self) -> tuple[int, str]:
        view = self.state.view()
        if not view["ready"]:
            return 503, "not ready: no cycle completed yet\n"
        if not view["config_valid"]:
            return 503, f"not ready: configuration invalid: {view['config_error']}\n"
        return 200, "ready\n"

    def api_state(self) -> bytes:
        doc = state_json(self.state.view(), bandwidth_peak=self.bandwidth_peak)
        return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


def serve_http(state: AgentState, listen: str, **kw: Any) -> NodeServer:
    """Create and start the server; see NodeServer for the keyword arguments."""
    return NodeServer(state, listen=listen, **kw).start()


def stale_after(config: Config) -> float:
    """metrics.stale_after_seconds, or 3 cycles (at least 30 s) when it is 0."""
    return config.metrics.stale_after_seconds or max(30.0, 3 * config.agent.interval_seconds)


def serve_from_config(state: AgentState, config: Config) -> NodeServer | None:
    """What the agent loop calls once at start: None when metrics.enabled is false.

    Raises ConfigError when the address cannot be bound. A changed `metrics:` section takes
    effect at the next start (the listening socket is not moved on reload).
    """
    m = config.metrics
    if not m.enabled:
        return None
    return serve_http(state, m.listen, stale_after=stale_after(config), node_view=m.node_view,
                      bandwidth_peak=m.memory_bandwidth_peak_bytes_per_second)


def _load_static(static_dir: Path) -> dict[str, tuple[bytes, str]]:
    out = {}
    for route, (name, ctype) in STATIC_FILES.items():
        try:
            out[route] = ((static_dir / name).read_bytes(), ctype)
        except OSError as e:
            log.warning("node view file missing; / will answer 404", extra={"file": str(static_dir / name), "error": e.strerror})
    return out


def _handler(node: NodeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "perfbalance"
        sys_version = ""

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = urlsplit(self.path).path
            try:
                self._route(path)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away
            except Exception:  # noqa: BLE001 - a bug in one route must not kill the thread silently
                log.exception("HTTP handler failed", extra={"path": path})
                self._send(500, b"internal error\n", "text/plain; charset=utf-8")

        def _route(self, path: str) -> None:
            if path == "/metrics":
                body, ctype, gz = node.exposition.render(self.headers.get("Accept", ""),
                                                         self.headers.get("Accept-Encoding", ""))
                self._send(200, body, ctype, gzipped=gz)
            elif path == "/healthz":
                self._text(*node.health())
            elif path == "/readyz":
                self._text(*node.readiness())
            elif path == "/api/state":
                self._send(200, node.api_state(), "application/json")
            elif path in node.static:
                body, ctype = node.static[path]
                self._send(200, body, ctype, csp=True)
            else:
                self._text(404, "not found\n")

        def _text(self, code: int, text: str) -> None:
            self._send(code, text.encode(), "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, ctype: str, *, csp: bool = False, gzipped: bool = False) -> None:
            self.send_response(code, HTTPStatus(code).phrase)
            self.send_header("Content-Type", ctype)
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Vary", "Accept-Encoding")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            if csp:
                self.send_header("Content-Security-Policy", PAGE_CSP)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("http " + format, *args)

    return Handler
