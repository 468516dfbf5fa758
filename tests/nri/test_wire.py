"""NRI's framings: mux frames around ttrpc messages, decoded from arbitrary socket reads."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from agent.nri import wire


def test_big_payload_is_split_into_chunks_the_go_reader_accepts() -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    framed = wire.mux_frames(wire.RUNTIME_CONN, data)
    frames = wire.MuxDecoder().feed(framed)
    assert [len(p) for _, p in frames] == [4096, 4096, 2048]
    assert all(c == wire.RUNTIME_CONN for c, _ in frames)
    assert b"".join(p for _, p in frames) == data


def test_small_payload_is_one_frame() -> None:
    assert wire.MuxDecoder().feed(wire.mux_frames(1, b"abc")) == [(1, b"abc")]


@given(st.lists(st.binary(max_size=9000), min_size=1, max_size=4), st.integers(1, 50))
def test_messages_survive_any_read_boundaries(bodies: list[bytes], step: int) -> None:
    stream = b"".join(wire.mux_frames(wire.PLUGIN_CONN, wire.ttrpc_message(2 * i + 1, wire.REQUEST, b))
                      for i, b in enumerate(bodies))
    mux, tt = wire.MuxDecoder(), wire.TtrpcDecoder()
    got = []
    for i in range(0, len(stream), step):
        for _, payload in mux.feed(stream[i:i + step]):
            got += tt.feed(payload)
    assert [(m.stream, m.kind, m.body) for m in got] == [(2 * i + 1, wire.REQUEST, b) for i, b in enumerate(bodies)]


def test_oversized_ttrpc_length_is_a_wire_error() -> None:
    bad = wire.TTRPC_HEADER.pack(wire.TTRPC_MAX + 1, 1, wire.REQUEST, 0)
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.TtrpcDecoder().feed(bad)
    assert wire.TtrpcDecoder().feed(wire.TTRPC_HEADER.pack(3, 1, wire.REQUEST, 0)) == []  # control: waits for body
