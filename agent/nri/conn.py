"""One NRI plugin connection: a blocking unix socket, a reader thread, calls and answers.

A thread, not the agent's asyncio loop: the runtime gives a plugin 2 s per request (containerd's
plugin_request_timeout) and closes it on a miss, so answers must not wait behind a sampling
window or a planning pass. Requests from the runtime (conn 1) are answered on the reader thread
by `serve(method, payload) -> payload`; our calls (conn 2) use odd ttrpc stream ids, as a ttrpc
client does, and wait for the matching response.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future

from agent.nri import api, wire

log = logging.getLogger(__name__)
Serve = Callable[[str, str, bytes], bytes]


class CallError(Exception):
    """The runtime answered a call with a non-OK ttrpc status."""

    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"NRI {method}: status {code}: {message}")
        self.code = code


class Closed(Exception):
    """The connection to the runtime is gone."""


class Connection:
    def __init__(self, *, sock: socket.socket, serve: Serve, on_close: Callable[[str], None]) -> None:
        self._sock = sock
        self._serve = serve
        self._on_close = on_close
        self._wlock = threading.Lock()
        self._plock = threading.Lock()
        self._pending: dict[int, tuple[str, Future[bytes]]] = {}
        self._streams = itertools.count(1, 2)
        self._closed = threading.Event()
        self._reason = ""
        self._thread = threading.Thread(target=self._read_loop, name="nri-reader", daemon=True)

    @classmethod
    def dial(cls, path: str, *, serve: Serve, on_close: Callable[[str], None], timeout: float = 5.0) -> Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        sock.settimeout(None)
        return cls(sock=sock, serve=serve, on_close=on_close)

    def start(self) -> None:
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def reason(self) -> str:
        return self._reason

    def call(self, service: str, method: str, payload: bytes, *, timeout: float) -> bytes:
        """Send one request on the Runtime connection and wait for its response payload."""
        fut: Future[bytes] = Future()
        with self._plock:
            if self._closed.is_set():
                raise Closed(self._reason)
            stream = next(self._streams)
            self._pending[stream] = (method, fut)
        req = api.Request(service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9))
        try:
            self._send(wire.RUNTIME_CONN, wire.ttrpc_message(stream, wire.REQUEST, req.SerializeToString()))
            return fut.result(timeout)
        finally:
            with self._plock:
                self._pending.pop(stream, None)

    def close(self, reason: str = "closed by the agent") -> None:
        with self._plock:
            if self._closed.is_set():
                return
            self._reason = reason
            self._closed.set()
            pending, self._pending = self._pending, {}
        for _, fut in pending.values():
            fut.set_exception(Closed(reason))
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._on_close(reason)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _send(self, conn: int, data: bytes) -> None:
        with self._wlock:
            try:
                self._sock.sendall(wire.mux_frames(conn, data))
            except OSError as e:
                raise Closed(f"write failed: {e.strerror or e}") from None

    def _read_loop(self) -> None:
        mux = wire.MuxDecoder()
        streams = {wire.PLUGIN_CONN: wire.TtrpcDecoder(), wire.RUNTIME_CONN: wire.TtrpcDecoder()}
        reason = "runtime closed the connection"
        try:
            while data := self._sock.recv(65536):
                for conn, payload in mux.feed(data):
                    if conn in streams:  # other conn ids are not NRI's: dropped, as the Go mux does
                        for msg in streams[conn].feed(payload):
                            self._dispatch(conn, msg)
        except (OSError, wire.WireError, Closed) as e:
            reason = str(e) or type(e).__name__
        self.close(reason)

    def _dispatch(self, conn: int, msg: wire.Message) -> None:
        if conn == wire.RUNTIME_CONN and msg.kind == wire.RESPONSE:
            with self._plock:
                method, fut = self._pending.get(msg.stream, ("", None))
            if fut is None:
                return
            resp = api.Response.FromString(msg.body)
            if resp.status.code:
                fut.set_exception(CallError(method, resp.status.code, resp.status.message))
            else:
                fut.set_result(resp.payload)
        elif conn == wire.PLUGIN_CONN and msg.kind == wire.REQUEST:
            self._answer(msg.stream, api.Request.FromString(msg.body))

    def _answer(self, stream: int, req: api.Request) -> None:
        try:
            resp = api.Response(payload=self._serve(req.service, req.method, req.payload))
        except NotImplementedError:
            resp = api.Response(status=api.Status(code=api.UNIMPLEMENTED, message=f"{req.method} not handled"))
        except Exception as e:  # a handler bug answers an error instead of killing the connection
            log.exception("NRI %s handler failed", req.method)
            resp = api.Response(status=api.Status(code=api.UNKNOWN, message=f"{type(e).__name__}: {e}"))
        self._send(wire.PLUGIN_CONN, wire.ttrpc_message(stream, wire.RESPONSE, resp.SerializeToString()))
