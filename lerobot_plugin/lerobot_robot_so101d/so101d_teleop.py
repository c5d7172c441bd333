"""Teleoperator ``so101d``: the leader arm the so101d daemon reads, as LeRobot's ``so101_leader``
shows it (``<joint>.pos``, degrees, the gripper 0..100).

Feedback: this teleoperator is not actuated. LeRobot's ``so_leader`` is (its ``send_feedback``
writes ``Goal_Position`` to the leader's own bus, lerobot/teleoperators/so_leader/so_leader.py in
LeRobot 0.6.1), but here the daemon owns the leader's bus and offers no verb that drives it, so
``feedback_features`` is empty and there is no ``enable_torque``/``disable_torque``. LeRobot asks
exactly that (``lerobot.common.control_utils.teleop_supports_feedback``) before its smooth
handover, and then takes its handover for a leader that cannot be driven: lerobot-rollout's
episodic reset and dagger correction slide the *follower* to the leader's pose
(``follower_smooth_move_to``, through ``robot.send_action``: the daemon's safety layer), instead
of driving the leader to the follower. ``send_feedback`` keeps to that declaration: what
``so_leader`` would write (``<joint>.pos`` goals) is refused with the reason, instead of being
dropped as if the leader had moved; anything else is ignored, as ``so_leader`` ignores it.
"""

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
        return {}  # not actuated (module docstring): LeRobot's handover then moves the follower

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
        """Nothing to send: ``feedback_features`` is empty (module docstring). Leader goals
        (``<joint>.pos``) raise ``ValueError`` naming them; other keys are ignored, as LeRobot's
        so_leader ignores them."""
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        goals = sorted(k for k in feedback if k.endswith(".pos"))
        if goals:
            raise ValueError(
                f"{self}: the so101d daemon's leader cannot be driven ({', '.join(goals)} not sent): it is "
                "moved by hand; feedback_features is empty, so LeRobot's handover slides the follower to "
                "the leader instead"
            )

    def disconnect(self) -> None:
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected")
        self._link.close()
