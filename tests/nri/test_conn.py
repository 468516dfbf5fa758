"""One NRI connection over a socketpair: answers, unknown methods, a peer that breaks framing."""

from __future__ import annotations

import socket
import threading

import pytest

from agent.nri import api, wire
from agent.nri.conn import Connection

pytest.importorskip("pbgen.nri.api_pb2", reason="NRI modules not generated: run scripts/setup.sh")


def pair(serve):  # type: ignore[no-untyped-def]
    ours, theirs = socket.socketpair()
    closed: list[str] = []
    done = threading.Event()
    conn = Connection(sock=ours, serve=serve, on_close=lambda r: (closed.append(r), done.set()))
    conn.start()
    return conn, theirs, closed, done


def read_response(sock: socket.socket) -> tuple[int, api.Response]:
    mux, tt = wire.MuxDecoder(), wire.TtrpcDecoder()
    while True:
        for conn, payload in mux.feed(sock.recv(65536)):
            assert conn == wire.PLUGIN_CONN
            for m in tt.feed(payload):
                assert m.kind == wire.RESPONSE
                return m.stream, api.Response.FromString(m.body)


def request(sock: socket.socket, stream: int, method: str, body: bytes = b"") -> None:
    req = api.Request(service=api.PLUGIN_SERVICE, method=method, payload=body)
    sock.sendall(wire.mux_frames(wire.PLUGIN_CONN, wire.ttrpc_message(stream, wire.REQUEST, req.SerializeToString())))


def test_request_is_answered_on_its_stream() -> None:
    conn, peer, _, _ = pair(lambda service, method, body: body[::-1])
    request(peer, 7, "Echo", b"abc")
    stream, resp = read_response(peer)
    assert (stream, resp.status.code, resp.payload) == (7, 0, b"cba")
    conn.close()


def test_unhandled_method_answers_unimplemented() -> None:
    def serve(service: str, method: str, body: bytes) -> bytes:
        raise NotImplementedError(method)
    conn, peer, _, _ = pair(serve)
    request(peer, 1, "Nope")
    _, resp = read_response(peer)
    assert resp.status.code == api.UNIMPLEMENTED
    conn.close()


def test_broken_framing_closes_with_a_reason() -> None:
    conn, peer, closed, done = pair(lambda *a: b"")
    peer.sendall(wire.MUX_HEADER.pack(wire.PLUGIN_CONN, wire.MUX_MAX + 1))
    assert done.wait(5)
    assert "exceeds" in closed[0] and conn.closed


def test_peer_hangup_closes_and_fails_pending_calls() -> None:
    conn, peer, closed, done = pair(lambda *a: b"")
    result: list[BaseException] = []
    t = threading.Thread(target=lambda: result.append(pytest.raises(Exception, conn.call, api.RUNTIME_SERVICE,
                                                                   "RegisterPlugin", b"", timeout=5).value))
    t.start()
    peer.recv(65536)  # the request arrived
    peer.close()
    t.join(5)
    assert done.wait(5) and closed == ["runtime closed the connection"]
    assert type(result[0]).__name__ == "Closed"
