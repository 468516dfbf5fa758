"""The two framings on an NRI plugin connection, as pure encoders and incremental decoders.

An external NRI plugin dials the runtime's unix socket and both ends multiplex two logical
connections over it (containerd/nri pkg/net/multiplex): conn 1 carries the Plugin service (the
runtime calls, we answer), conn 2 the Runtime service (we call RegisterPlugin and
UpdateContainers). A mux frame is a 4-byte conn id and a 4-byte payload length, big-endian.
Inside each logical connection runs ttrpc (containerd/ttrpc channel.go): a 10-byte header of
length, stream id, type (1 request, 2 response, 3 data) and flags, then a protobuf message.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MUX_HEADER = struct.Struct(">II")
TTRPC_HEADER = struct.Struct(">IIBB")
PLUGIN_CONN = 1
RUNTIME_CONN = 2
REQUEST = 1
RESPONSE = 2
DATA = 3
# The Go side reads a logical connection through a 4096-byte bufio.Reader whose fill must hold a
# whole mux message (the mux conn's Read returns ENOMEM otherwise): never send a bigger chunk.
MUX_CHUNK = 4096
# The multiplexer refuses payloads over 16 MiB, ttrpc messages over 4 MiB.
MUX_MAX = 1 << 24
TTRPC_MAX = 4 << 20


class WireError(Exception):
    """The peer sent something that is not NRI's framing; the connection cannot go on."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    stream: int
    kind: int
    flags: int
    body: bytes


def mux_frames(conn: int, data: bytes) -> bytes:
    """Bytes to write to the socket for `data` on logical connection `conn`, in safe chunks."""
    out = bytearray()
    for i in range(0, max(len(data), 1), MUX_CHUNK):
        chunk = data[i:i + MUX_CHUNK]
        out += MUX_HEADER.pack(conn, len(chunk)) + chunk
    return bytes(out)


def ttrpc_message(stream: int, kind: int, body: bytes, flags: int = 0) -> bytes:
    if len(body) > TTRPC_MAX:
        raise WireError(f"ttrpc message of {len(body)} bytes exceeds {TTRPC_MAX}")
    return TTRPC_HEADER.pack(len(body), stream, kind, flags) + body


class MuxDecoder:
    """Socket bytes in, (conn id, payload) out; keeps partial frames between feeds."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= MUX_HEADER.size:
            conn, n = MUX_HEADER.unpack_from(self._buf)
            if n > MUX_MAX:
                raise WireError(f"mux frame of {n} bytes on conn {conn} exceeds {MUX_MAX}")
            end = MUX_HEADER.size + n
            if len(self._buf) < end:
                break
            out.append((conn, bytes(self._buf[MUX_HEADER.size:end])))
            del self._buf[:end]
        return out


class TtrpcDecoder:
    """One logical connection's byte stream in, whole ttrpc messages out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= TTRPC_HEADER.size:
            n, stream, kind, flags = TTRPC_HEADER.unpack_from(self._buf)
            if n > TTRPC_MAX:
                raise WireError(f"ttrpc message of {n} bytes on stream {stream} exceeds {TTRPC_MAX}")
            end = TTRPC_HEADER.size + n
            if len(self._buf) < end:
                break
            out.append(Message(stream=stream, kind=kind, flags=flags, body=bytes(self._buf[TTRPC_HEADER.size:end])))
            del self._buf[:end]
        return out
