"""The sim protocol: round trips, limits, version and garbage rejection — over real sockets too."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import zmq

from drivers import sim_protocol as P
from drivers.arm_interface import HandshakeError, PortGoneError
from drivers.sim_follower import SimFollower
from sim_bridge.server import SimServerEndpoint


def _wire(frames):
    return [bytes(f) for f in frames]


def test_target_round_trip():
    frames = _wire(P.encode_target(7, 12.5, np.array([1.0, -2.0, 3.5, 4.0, -5.0, 55.0])))
    msg = P.decode(frames, P.DAEMON_TO_SIM)
    assert msg.type == "target" and msg.header["seq"] == 7 and msg.header["sent_s"] == 12.5
    assert msg.header["pos"] == [1.0, -2.0, 3.5, 4.0, -5.0, 55.0]


def test_frame_round_trip_raw_bytes():
    img = np.random.default_rng(0).integers(0, 255, size=(24, 32, 3), dtype=np.uint8)
    frames = _wire(P.encode_frame("front", 3, 1.0, img))
    assert len(frames) == 2 and len(frames[1]) == img.nbytes
    msg = P.decode(frames, P.SIM_TO_DAEMON)
    np.testing.assert_array_equal(P.frame_pixels(msg), img)


def test_jpeg_frame_round_trip():
    import cv2

    img = np.zeros((48, 64, 3), np.uint8)
    img[:, :32] = (255, 0, 0)  # red left half
    ok, buf = cv2.imencode(".jpg", img[:, :, ::-1])
    assert ok
    msg = P.decode(_wire(P.encode_jpeg_frame("wrist", 1, 0.0, buf.tobytes(), img.shape)), P.SIM_TO_DAEMON)
    out = P.frame_pixels(msg)
    assert out.shape == img.shape and out[10, 5, 0] > 200 and out[10, 5, 2] < 60  # still red, RGB order


@pytest.mark.parametrize(
    "frames, reason",
    [
        ([b"\xc1\xff garbage"], "header"),
        ([msgpack.packb([1, 2, 3])], "header"),
        ([msgpack.packb({"v": 99, "t": "target"})], "version"),
        ([msgpack.packb({"v": True, "t": "heartbeat"})], "version"),
        ([msgpack.packb({"t": "heartbeat"})], "version"),
        ([msgpack.packb({"v": P.PROTOCOL_VERSION, "t": "bogus"})], "type"),
        ([msgpack.packb({"v": P.PROTOCOL_VERSION, "t": "target", "seq": 1, "sent_s": 0.0, "pos": [1, 2]})], "field"),
        (
            [
                msgpack.packb(
                    {
                        "v": P.PROTOCOL_VERSION,
                        "t": "target",
                        "seq": 1,
                        "sent_s": 0.0,
                        "pos": [1, 2, 3, 4, 5, float("nan")],
                    }
                )
            ],
            "field",
        ),
        ([msgpack.packb({"v": P.PROTOCOL_VERSION, "t": "torque", "enabled": 1})], "field"),
        ([msgpack.packb({"v": P.PROTOCOL_VERSION, "t": "heartbeat"}), b"extra"], "frames"),
        ([b"a", b"b", b"c"], "frames"),
        ([b"\x00" * (P.MAX_HEADER_BYTES + 1)], "oversize"),
    ],
)
def test_bad_messages_are_rejected_with_a_reason(frames, reason):
    with pytest.raises(P.ProtocolError) as exc:
        P.decode(frames, P.DAEMON_TO_SIM)
    assert exc.value.reason == reason


def test_version_mismatch_names_both_versions():
    with pytest.raises(P.ProtocolError, match=rf"peer speaks v99, we speak v{P.PROTOCOL_VERSION}"):
        P.decode([msgpack.packb({"v": 99, "t": "state"})], P.SIM_TO_DAEMON)


def test_oversized_payload_and_mismatched_frame_rejected():
    header = msgpack.packb(
        {
            "v": P.PROTOCOL_VERSION,
            "t": "frame",
            "name": "front",
            "seq": 0,
            "capture_s": 0.0,
            "shape": [10, 10, 3],
            "dtype": "uint8",
            "encoding": "raw",
        }
    )
    with pytest.raises(P.ProtocolError) as exc:
        P.decode([header, b"\x00" * (P.MAX_PAYLOAD_BYTES + 1)], P.SIM_TO_DAEMON)
    assert exc.value.reason == "oversize"
    with pytest.raises(P.ProtocolError) as exc:
        P.decode([header, b"\x00" * 299], P.SIM_TO_DAEMON)  # 10x10x3 = 300
    assert exc.value.reason == "field"


def test_encoder_refuses_what_decoder_would_reject():
    with pytest.raises(ValueError):
        P.encode_target(1, 0.0, np.array([0, 0, 0, 0, 0, np.inf]))
    with pytest.raises(ValueError):
        P.encode("hello", name="x" * P.MAX_HEADER_BYTES)


def test_direction_is_enforced():
    frames = _wire(P.encode("state", seq=1, sim_time_s=0.0, pos=[0.0] * 6, torque=True, ack_seq=-1, ack_sent_s=0.0))
    P.decode(frames, P.SIM_TO_DAEMON)
    with pytest.raises(P.ProtocolError) as exc:
        P.decode(frames, P.DAEMON_TO_SIM)
    assert exc.value.reason == "type"


# ------------------------------------------------------------------------------------------------
# over real sockets: an echo sim built on SimServerEndpoint
# ------------------------------------------------------------------------------------------------
class EchoSim:
    """A minimal sim: state = last target, published at 100 Hz; used to test the client side."""

    def __init__(self, bind: str) -> None:
        import threading

        self.ep = SimServerEndpoint(bind, backend="echo", rate_hz=100.0)
        self.ep.open()
        self.pos = np.zeros(6)
        self.ack = (-1, 0.0)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            inbox = self.ep.poll(0.01)
            if inbox.target_units is not None:
                self.pos = inbox.target_units
                self.ack = (inbox.target_seq, inbox.target_sent_s)
            self.ep.send_state(self.pos, sim_time_s=0.0, torque=True, ack_seq=self.ack[0], ack_sent_s=self.ack[1])
        self.ep.close()

    def close(self) -> None:
        self._stop.set()
        self._t.join(2)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_follower_round_trip_and_garbage_on_the_socket(transport, tmp_path):
    bind = "tcp://127.0.0.1:0" if transport == "tcp" else f"ipc://{tmp_path}/sim.sock"
    sim = EchoSim(bind)
    f = SimFollower(sim.ep.endpoint, staleness_s=3.0)
    try:
        f.connect()
        goal = np.array([5.0, -10.0, 20.0, 0.0, 1.0, 40.0])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            f.write_goals(goal)
            if np.allclose(f.read_joints(), goal):
                break
            time.sleep(0.01)
        np.testing.assert_allclose(f.read_joints(), goal)
        assert f.round_trip_s(), "acknowledged targets give round-trip samples"

        # garbage from another client straight into the sim's ROUTER: rejected, counted, no crash
        ctx = zmq.Context.instance()
        rogue = ctx.socket(zmq.DEALER)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(sim.ep.endpoint)
        rogue.send(b"\xc1 not msgpack")
        rogue.send(msgpack.packb({"v": 42, "t": "target"}))
        rogue.send_multipart([b"a", b"b", b"c"])
        time.sleep(0.2)
        rogue.close()
        rej = sim.ep.stats.rejects.by_reason
        assert rej.get("header") == 1 and rej.get("version") == 1 and rej.get("frames") == 1
        # the daemon keeps working
        f.write_goals(goal * 0.5)
        time.sleep(0.1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not np.allclose(f.read_joints(), goal * 0.5):
            f.write_goals(goal * 0.5)
            time.sleep(0.02)
        np.testing.assert_allclose(f.read_joints(), goal * 0.5)
    finally:
        f.close()
        sim.close()


def test_garbage_from_the_sim_side_is_counted_by_the_follower():
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    f = SimFollower(f"tcp://127.0.0.1:{port}", staleness_s=0.2, connect_timeout_s=0.5)
    try:
        with pytest.raises(PortGoneError):
            f.connect()  # nobody answers with state
        assert router.poll(2000)
        peer = router.recv_multipart()[0]
        router.send_multipart([peer, b"\xc1 garbage"])
        router.send_multipart(
            [peer, msgpack.packb({"v": P.PROTOCOL_VERSION, "t": "state", "seq": 1})]
        )  # fields missing
        router.send_multipart([peer, b"x" * (P.MAX_HEADER_BYTES + 10)])
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and f.rejects.total < 3:
            time.sleep(0.02)
        assert f.rejects.by_reason == {"header": 1, "field": 1, "oversize": 1}
        with pytest.raises(PortGoneError):
            f.read_joints()
        # then a wrong-version sim: a clear handshake error naming both versions
        router.send_multipart([peer, msgpack.packb({"v": P.PROTOCOL_VERSION + 1, "t": "state"})])
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and "version" not in f.rejects.by_reason:
            time.sleep(0.02)
        with pytest.raises(HandshakeError, match=rf"v{P.PROTOCOL_VERSION + 1}.*v{P.PROTOCOL_VERSION}"):
            f.read_joints()
    finally:
        f.close()
        router.close()


def test_wrong_version_daemon_gets_an_error_reply():
    ep = SimServerEndpoint("tcp://127.0.0.1:0", backend="test")
    ep.open()
    ctx = zmq.Context.instance()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(ep.endpoint)
    try:
        d.send(msgpack.packb({"v": P.PROTOCOL_VERSION + 5, "t": "hello"}))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not ep.stats.rejects.total:
            ep.poll(0.05)
        assert d.poll(2000)
        msg = P.decode(d.recv_multipart(), P.SIM_TO_DAEMON)
        assert msg.type == "error" and f"v{P.PROTOCOL_VERSION + 5}" in msg.header["error"]
        assert not ep.has_peer, "a wrong-version client is never adopted as the daemon"
    finally:
        d.close()
        ep.close()
