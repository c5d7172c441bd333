"""Protocol-0 codec and streaming parser (drivers/protocol.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from drivers import protocol as P


def test_checksum_matches_the_sdk_example() -> None:
    # READ id 1, address 56, 2 bytes: FF FF 01 04 02 38 02 BE (SDK-computed)
    assert P.read(1, 56, 2) == bytes([0xFF, 0xFF, 0x01, 0x04, 0x02, 0x38, 0x02, 0xBE])


def test_sync_read_and_sync_write_layout() -> None:
    pkt = P.sync_read(56, 2, [1, 2, 3, 4, 5, 6])
    assert len(pkt) == 14  # the facts file's 14-byte request
    assert pkt[2] == 0xFE and pkt[4] == P.INST_SYNC_READ
    w = P.sync_write(42, 2, {i: P.le_bytes(2000 + i, 2) for i in range(1, 7)})
    assert len(w) == 26
    parsed = P.PacketParser().feed(w)
    assert parsed[0].params[:2] == bytes([42, 2]) and parsed[0].params[2] == 1


def test_status_round_trip_and_wire_time() -> None:
    raw = P.encode_status(3, 0x20, P.le_bytes(2047, 2))
    (pkt,) = P.PacketParser().feed(raw)
    assert (pkt.servo_id, pkt.code, P.le_int(pkt.params)) == (3, 0x20, 2047)
    assert pkt.encode() == raw
    assert abs(P.wire_time_s(62, 1_000_000) - 0.00062) < 1e-12


def test_bad_checksum_is_dropped_and_the_next_packet_found() -> None:
    good = P.ping(1)
    bad = bytearray(P.read(2, 56, 2))
    bad[-1] ^= 0xFF
    parser = P.PacketParser()
    out = parser.feed(bytes(bad) + good)
    assert [p.servo_id for p in out] == [1]
    assert parser.stats.bad_checksums == 1


def test_garbage_before_header_is_skipped_and_split_feeds_work() -> None:
    parser = P.PacketParser()
    data = b"\x00\x13\xff\x42" + P.read(5, 3, 2) + b"\xff"
    out = []
    for b in data:
        out += parser.feed(bytes([b]))
    assert [(p.servo_id, p.code) for p in out] == [(5, P.INST_READ)]
    assert parser.stats.skipped_bytes == 4
    assert parser.pending == 1  # trailing 0xFF kept: may start the next header


def test_triple_ff_and_impossible_length_resync() -> None:
    parser = P.PacketParser()
    out = parser.feed(b"\xff" + P.ping(7) + b"\xff\xff\x01\x00" + P.ping(8))
    assert [p.servo_id for p in out] == [7, 8]


def test_stale_partial_packet_is_abandoned_after_a_gap() -> None:
    parser = P.PacketParser(stale_s=0.005)
    # A garbage header claiming 200 bytes would swallow the next request without the timeout.
    assert parser.feed(b"\xff\xff\x01\xc8\x02", now_s=1.0) == []
    out = parser.feed(P.ping(1), now_s=1.1)
    assert [p.servo_id for p in out] == [1]


@settings(max_examples=200, deadline=None)
@given(
    noise=st.binary(max_size=40),
    ids=st.lists(st.integers(0, 0xFD), min_size=1, max_size=5),
    payload=st.binary(max_size=20),
)
def test_packets_survive_leading_noise(noise: bytes, ids: list[int], payload: bytes) -> None:
    stream = b"".join(P.encode_instruction(i, P.INST_WRITE, payload) for i in ids)
    parser = P.PacketParser()
    out = parser.feed(noise, now_s=0.0)
    out += parser.feed(stream, now_s=1.0)  # after a gap: any partial garbage is abandoned
    # Every real packet is found (noise may add spurious valid-looking packets before them).
    tail = [(p.servo_id, p.params) for p in out[-len(ids) :]]
    assert tail == [(i, payload) for i in ids]


# --- the servo side never falls over, whatever arrives ----------------------------------------
_INSTRUCTIONS = st.sampled_from(
    [
        P.INST_PING,
        P.INST_READ,
        P.INST_WRITE,
        P.INST_REG_WRITE,
        P.INST_ACTION,
        P.INST_SYNC_READ,
        P.INST_SYNC_WRITE,
        0x00,
        0x06,
        0x7F,
        0xFF,
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    packets=st.lists(
        st.tuples(st.sampled_from([1, 2, 6, 7, 0xFE, 0xFD, 0]), _INSTRUCTIONS, st.binary(max_size=40)),
        min_size=1,
        max_size=12,
    )
)
def test_any_well_framed_packet_sequence_is_handled_without_error(tmp_path_factory, packets) -> None:
    from drivers.emulator import BusEmulator, EmulatedArm

    arm = EmulatedArm("follower")
    bus = BusEmulator(tmp_path_factory.mktemp("fuzz") / "f", arm, wire_time=False)
    # Drive the packet handler directly (no pty): every reply must be a valid status packet.
    for servo_id, instr, params in packets:
        with arm.lock:
            replies, _baud, delays = bus._handle(P.Packet(servo_id, instr, params), None)
        assert len(replies) == len(delays)
        for r in replies:
            (pkt,) = P.PacketParser().feed(r)
            assert pkt.code & 0x80 == 0  # the SDK refuses error bytes above 0x7F
    snap = arm.snapshot()
    assert set(snap["servos"]) == {"shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"}
