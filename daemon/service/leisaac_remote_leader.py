"""Publish the leader arm in LeIsaac's own remote-leader format (compatibility path).

LeIsaac 0.4's ``SO101LeaderRemote`` (``teleop_se3_agent.py --teleop_device=so101leader
--remote_endpoint=tcp://HOST:5556``) subscribes with a SUB socket (CONFLATE, empty subscription)
and unpacks every message as exactly six little-endian float32 — shoulder_pan, shoulder_lift,
elbow_flex, wrist_flex, wrist_roll, gripper — in LeRobot's *normalised* units: body joints
-100..100 of the calibrated range, gripper 0..100. No topic, no timestamp, no sequence number.

The daemon converts its leader ticks with the leader's calibration (``ticks_to_units(...,
body_mode="range_m100_100")``, LeRobot's own normalisation, including drive_mode) and sends
without blocking once per loop cycle. With CONFLATE on the PUB side too, a subscriber that is
slow (or absent) never builds a queue: it always gets the newest pose.
"""

from __future__ import annotations

import logging
import struct

import numpy as np
import zmq

from calibration.calibration_file import ArmCalibration
from calibration.conventions import NUM_JOINTS, ticks_to_units, units_to_ticks
from drivers.arm_interface import LeaderArm
from drivers.leader_mapping import LeisaacMappedLeader

log = logging.getLogger("so101d.sim.remote_leader")

DEFAULT_BIND = "tcp://127.0.0.1:5556"
PACKET = struct.Struct("<6f")  # 24 bytes


def encode_packet(normalized: np.ndarray) -> bytes:
    v = np.asarray(normalized, dtype=np.float64)
    if v.shape != (NUM_JOINTS,) or not np.all(np.isfinite(v)):
        raise ValueError(f"expected {NUM_JOINTS} finite values, got {v!r}")
    return PACKET.pack(*v.tolist())


class LeisaacRemoteLeaderPublisher:
    """ZeroMQ PUB (bound, CONFLATE) of 24-byte leader packets. ``publish_*`` never blocks."""

    def __init__(self, bind: str = DEFAULT_BIND, context: zmq.Context | None = None) -> None:
        self.bind_endpoint = bind
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self.sent = 0
        self.dropped = 0

    def open(self) -> None:
        s = self._ctx.socket(zmq.PUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.CONFLATE, 1)
        s.bind(self.bind_endpoint)
        self._sock = s
        log.info("publishing the leader for LeIsaac at %s", self.endpoint)

    @property
    def endpoint(self) -> str:
        assert self._sock is not None, "open() first"
        return self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def publish_normalized(self, normalized: np.ndarray) -> bool:
        """Send six values already in LeRobot's normalised units (body -100..100, gripper 0..100)."""
        if self._sock is None:
            raise RuntimeError("LeisaacRemoteLeaderPublisher: open() first")
        try:
            self._sock.send(encode_packet(normalized), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def publish_ticks(self, leader_ticks: np.ndarray, leader_cal: ArmCalibration) -> bool:
        """Leader Present_Position ticks + the leader's ArmCalibration -> one packet."""
        return self.publish_normalized(ticks_to_units(leader_ticks, leader_cal, body_mode="range_m100_100"))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None


class RemoteLeaderHook:
    """A ``LeaderHook`` (daemon/control/seams.py): publishes every fresh leader reading in
    LeIsaac's remote-leader format, without blocking.

    LeIsaac wants the leader itself: behind a sim mapping (``[follower] sim_mapping``) the loop's
    leader reading is the mapped sim target, so the hook sends the mapped leader's own reading
    (``LeisaacMappedLeader.last_raw_units``) instead.
    """

    def __init__(
        self, publisher: LeisaacRemoteLeaderPublisher, leader_cal: ArmCalibration, leader: LeaderArm | None = None
    ) -> None:
        self.publisher = publisher
        self.cal = leader_cal
        self.mapped = leader if isinstance(leader, LeisaacMappedLeader) else None

    def on_leader(self, now_monotonic_s: float, leader_units: np.ndarray) -> None:
        raw = self.mapped.last_raw_units if self.mapped is not None else None
        units = raw if raw is not None else leader_units
        self.publisher.publish_ticks(units_to_ticks(units, self.cal), self.cal)
