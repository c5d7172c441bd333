"""Teleoperator ``so101d``: the leader arm the so101d daemon reads, as LeRobot's ``so101_leader``
shows it (``<joint>.pos``, degrees, the gripper 0..100)."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from lerobot.teleoperators.teleoperator import Teleoperator
from lerobot.utils.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError

from lerobot_robot_so101d.config_so101d import SO101DTeleopConfig
from lerobot_robot_so101d.daemon_link import FEATURE_KEYS, DaemonLink, as_features

LEADER_MAX_AGE_MS = 500.0  # as the robot's camera frames: older than this is not the leader now


class SO101DTeleop(Teleoperator):
    config_class = SO101DTeleopConfig
    name = "so101d"

    def __init__(self, config: SO101DTeleopConfig) -> None:
        super().__init__(config)
        self.config = config
        self._link = DaemonLink(config.socket, config.timeout_s)

    @cached_property
    def action_features(self) -> dict[str, type]:
        return dict.fromkeys(FEATURE_KEYS, float)

    @cached_property
    def feedback_features(self) -> dict[str, type]:
        return {}  # the daemon's leader is moved by hand; nothing is sent back to it

    @property
    def is_connected(self) -> bool:
        return self._link.connected

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:
        """Nothing to do here: the daemon owns the leader's calibration."""

    def configure(self) -> None:
        """Nothing to do here."""

    def connect(self, calibrate: bool = True) -> None:
        if self._link.connected:
            raise DeviceAlreadyConnectedError(f"{self} is already connected")
        self._link.connect()

    def get_action(self) -> dict[str, float]:
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        reply = self._link.request("arm.observe", arm=self.config.arm)
        # the daemon keeps its last leader reading when the leader stops answering (unplugged):
        # an old one is no action, or LeRobot would record a frozen leader as the operator's
        age_ms = reply.get("leader_age_ms")
        if age_ms is not None and age_ms > LEADER_MAX_AGE_MS:
            raise DeviceNotConnectedError(
                f"the so101d daemon's leader reading is {age_ms:.0f} ms old (max {LEADER_MAX_AGE_MS:.0f} ms): "
                "is the leader unplugged? see `so101d status`"
            )
        return as_features(reply.get("leader"), "leader")

    def send_feedback(self, feedback: dict[str, Any]) -> None:
        raise NotImplementedError(
            "so101d teleoperator: feedback to the leader is not supported (the daemon's leader is torque-off)"
        )

    def disconnect(self) -> None:
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected")
        self._link.close()
