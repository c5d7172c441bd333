"""LeIsaac remote-leader compatibility: decode our packets exactly the way LeIsaac's subscriber does.

LeIsaac 0.4's SO101LeaderRemote: a SUB socket with CONFLATE=1 and an empty subscription, connected
to the endpoint; each message is passed to ``struct.unpack("<6f", msg)`` and zipped with the motor
names shoulder_pan .. gripper. That is reproduced here (not imported: LeIsaac is not installed).
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
import zmq

from calibration.calibration_file import ArmCalibration, MotorCalibration
from calibration.conventions import JOINT_IDS, JOINT_NAMES
from daemon.service.leisaac_remote_leader import LeisaacRemoteLeaderPublisher, encode_packet

MOTOR_NAMES = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]


def _leisaac_subscriber(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.CONFLATE, 1)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint)
    return sub


def _leisaac_decode(msg: bytes) -> dict[str, float]:
    return dict(zip(MOTOR_NAMES, struct.unpack("<6f", msg)))


def _cal(drive_mode_lift: int = 0) -> ArmCalibration:
    motors = {n: MotorCalibration(JOINT_IDS[n], 0, 0, 1000, 3000) for n in JOINT_NAMES}
    motors["shoulder_lift"] = MotorCalibration(2, drive_mode_lift, 0, 1000, 3000)
    motors["gripper"] = MotorCalibration(6, 0, 0, 2000, 3000)
    return ArmCalibration(motors)


def test_packet_is_24_bytes_of_little_endian_float32():
    pkt = encode_packet(np.array([1.5, -2, 3, -4, 5, 60]))
    assert len(pkt) == 24
    assert pkt[:4] == struct.pack("<f", 1.5)
    with pytest.raises(ValueError):
        encode_packet(np.array([0, 0, 0, 0, 0, np.nan]))
    with pytest.raises(ValueError):
        encode_packet(np.zeros(5))


def test_leisaac_subscriber_decodes_normalised_leader_pose():
    ctx = zmq.Context.instance()
    pub = LeisaacRemoteLeaderPublisher("tcp://127.0.0.1:0", context=ctx)
    pub.open()
    sub = _leisaac_subscriber(ctx, pub.endpoint)
    cal = _cal(drive_mode_lift=1)
    # pan at the range middle (0), lift at range_max with drive_mode 1 (-100), elbow at range_min
    # (-100), wrist_flex 3/4 (+50), roll beyond range_max (clamped to +100), gripper 3/4 open (75)
    ticks = np.array([2000, 3000, 1000, 2500, 3500, 2750])
    expected = {
        "shoulder_pan": 0.0,
        "shoulder_lift": -100.0,
        "elbow_flex": -100.0,
        "wrist_flex": 50.0,
        "wrist_roll": 100.0,
        "gripper": 75.0,
    }
    try:
        got = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and got is None:  # PUB/SUB: the first sends may precede the join
            assert pub.publish_ticks(ticks, cal)
            if sub.poll(50):
                msg = sub.recv()
                assert len(msg) == 24
                got = _leisaac_decode(msg)
        assert got is not None, "the LeIsaac-style subscriber received nothing"
        assert got == pytest.approx(expected, abs=1e-4)

        # CONFLATE: a slow subscriber only ever sees the newest pose
        for k in range(50):
            pub.publish_normalized(np.array([k, 0, 0, 0, 0, 10.0]))
        time.sleep(0.2)
        last = None
        while sub.poll(100):
            last = _leisaac_decode(sub.recv())
        assert last is not None and last["shoulder_pan"] == 49.0
        assert pub.sent >= 51
    finally:
        sub.close()
        pub.close()


def test_publishing_without_subscribers_never_blocks():
    pub = LeisaacRemoteLeaderPublisher("tcp://127.0.0.1:0")
    pub.open()
    try:
        t0 = time.perf_counter()
        for _ in range(2000):
            pub.publish_normalized(np.zeros(6))
        assert time.perf_counter() - t0 < 2.0
    finally:
        pub.close()
