"""Teleoperator ``so101d``: the leader arm the so101d daemon reads, as LeRobot's ``so101_leader``
shows it (``<joint>.pos``, degrees, the gripper 0..100).

Actuated, as ``so_leader`` is (lerobot/teleoperators/so_leader/so_leader.py in LeRobot 0.6.1:
``feedback_features`` are its action features, ``enable_torque``/``disable_torque`` exist), so
LeRobot's smooth handover (``lerobot.common.control_utils.teleop_smooth_move_to``: enable_torque,
then ``send_feedback`` with goals interpolated from the leader's pose to the follower's) drives
the leader to the follower, as lerobot-rollout's dagger pause and episodic reset ask. The daemon
owns the leader's port, so the goals go through it (``leader.acquire`` / ``leader.goal`` /
``leader.release``): it moves the leader at the take-over's bounded speed within the leader's
calibrated range, and lets it go limp at ``disable_torque``, at ``disconnect``, when this process
ends, or when an arm starts following the leader (the daemon refuses to drive a leader an arm
follows: the follower must be lent to a client, e.g. robot ``so101d``, or held).
"""

from __future__ import annotations

import logging
import os
from functools import cached_property
from typing import Any

from lerobot.teleoperators.teleoperator import Teleoperator
from lerobot.utils.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError

from lerobot_robot_so101d.config_so101d import SO101DTeleopConfig
from lerobot_robot_so101d.daemon_link import (
    FEATURE_KEYS,
    DaemonLink,
    DaemonRefused,
    PoseShare,
    as_features,
    client_name,
)

log = logging.getLogger(__name__)
LEADER_MAX_AGE_MS = 500.0  # as the robot's camera frames: older than this is not the leader now


class SO101DTeleop(Teleoperator):
    config_class = SO101DTeleopConfig
    name = "so101d"

    def __init__(self, config: SO101DTeleopConfig) -> None:
        super().__init__(config)
        self.config = config
        self._link = DaemonLink(config.socket, config.timeout_s)
        self._lease: str | None = None  # the leader's, while its torque is on (enable_torque)
        self._poses: PoseShare | None = None

    @cached_property
    def action_features(self) -> dict[str, type]:
        return dict.fromkeys(FEATURE_KEYS, float)

    @cached_property
    def feedback_features(self) -> dict[str, type]:
        return dict.fromkeys(FEATURE_KEYS, float)  # leader goals, as so_leader's

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
        self._poses = PoseShare(self._link, self.config.arm)

    def get_action(self) -> dict[str, float]:
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        # the daemon keeps its last leader reading when the leader stops answering (unplugged):
        # an old one is no action, or LeRobot would record a frozen leader as the operator's
        shared = self._poses.leader() if self._poses is not None else None
        if shared is not None and shared[1] <= LEADER_MAX_AGE_MS:
            return shared[0]  # from shared memory: no request
        reply = self._link.request("arm.observe", arm=self.config.arm)
        age_ms = reply.get("leader_age_ms")
        if age_ms is not None and age_ms > LEADER_MAX_AGE_MS:
            raise DeviceNotConnectedError(
                f"the so101d daemon's leader reading is {age_ms:.0f} ms old (max {LEADER_MAX_AGE_MS:.0f} ms): "
                "is the leader unplugged? see `so101d status`"
            )
        return as_features(reply.get("leader"), "leader")

    def enable_torque(self) -> None:
        """The leader's torque on, through the daemon (``leader.acquire``): it holds where it is."""
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        if self._lease is None:
            self._lease = str(self._link.request("leader.acquire", client=client_name(), pid=os.getpid())["lease"])

    def disable_torque(self) -> None:
        """The leader's torque off (``leader.release``): limp, the operator's hand takes it."""
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        lease, self._lease = self._lease, None
        if lease is not None:
            self._link.request("leader.release", lease=lease)

    def send_feedback(self, feedback: dict[str, Any]) -> None:
        """Leader goals (``<joint>.pos``, LeRobot units) to the daemon, which moves the leader
        there at bounded speed; a joint left out keeps its goal, other keys are ignored (as
        so_leader's). Torque must be on (``enable_torque``): a goal then moves the leader,
        as LeRobot's handover does it; without it nothing would, and this raises."""
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        goals = {k.removesuffix(".pos"): float(v) for k, v in feedback.items() if k in self.feedback_features}
        if not goals:
            return
        if self._lease is None:
            raise DaemonRefused(f"{self}: the leader's torque is off: enable_torque() before send_feedback()")
        self._link.request("leader.goal", lease=self._lease, **goals)

    def disconnect(self) -> None:
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected")
        try:
            self.disable_torque()
        except (DaemonRefused, DeviceNotConnectedError) as exc:
            # disconnect runs in LeRobot's `finally`: the error that brought us here matters more
            # (and a leader whose holder is gone goes limp by itself)
            log.warning("%s: could not release the leader: %s", self, exc)
        finally:
            if self._poses is not None:
                self._poses.close()
                self._poses = None
            self._link.close()
