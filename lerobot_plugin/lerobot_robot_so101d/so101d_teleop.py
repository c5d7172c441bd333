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

With ``arm = "pair"`` it is a bimanual daemon's two leaders, as LeRobot's ``bi_so_leader`` shows
them (lerobot/teleoperators/bi_so_leader/bi_so_leader.py: ``left_``/``right_`` keys, left first;
torque and feedback per arm, split by the prefix).
"""

from __future__ import annotations

import logging
import math
import os
from functools import cached_property
from typing import Any

from lerobot.teleoperators.teleoperator import Teleoperator
from lerobot.utils.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError

from calibration.conventions import JOINT_NAMES
from daemon.api.pose_share import SharedPoses
from lerobot_robot_so101d.config_so101d import SO101DTeleopConfig
from lerobot_robot_so101d.daemon_link import (
    ArmKeys,
    DaemonLink,
    DaemonRefused,
    PoseShare,
    arms_of,
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
        self._arms = arms_of(config.arm)
        self._keys = tuple(k for a in self._arms for k in a.keys)
        self._link = DaemonLink(config.socket, config.timeout_s)
        self._leases: dict[str, str] = {}  # arm -> its leader's lease, while its torque is on (enable_torque)
        self._poses: PoseShare | None = None

    @cached_property
    def action_features(self) -> dict[str, type]:
        return dict.fromkeys(self._keys, float)

    @cached_property
    def feedback_features(self) -> dict[str, type]:
        return dict.fromkeys(self._keys, float)  # leader goals, as so_leader's (bi_so_leader's)

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
        self._poses = PoseShare(self._link, tuple(a.arm for a in self._arms))

    def get_action(self) -> dict[str, float]:
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        rec = self._poses.fresh() if self._poses is not None else None
        action: dict[str, float] = {}
        for arm in self._arms:
            action.update(self._leader_action(arm, rec))
        return action

    def _leader_action(self, arm: ArmKeys, rec: SharedPoses | None) -> dict[str, float]:
        # the daemon keeps its last leader reading when the leader stops answering (unplugged):
        # an old one is no action, or LeRobot would record a frozen leader as the operator's
        shared = self._poses.leader(rec, arm.arm) if self._poses is not None else None
        if shared is not None and shared[1] <= LEADER_MAX_AGE_MS:
            return arm.features(shared[0])  # from shared memory: no request
        reply = self._link.request("arm.observe", arm=arm.arm)
        age_ms = reply.get("leader_age_ms")
        if age_ms is not None and age_ms > LEADER_MAX_AGE_MS:
            raise DeviceNotConnectedError(
                f"the so101d daemon's {arm.arm} leader reading is {age_ms:.0f} ms old "
                f"(max {LEADER_MAX_AGE_MS:.0f} ms): is the leader unplugged? see `so101d status`"
            )
        return as_features(reply.get("leader"), f"{arm.arm} leader", arm.prefix)

    def enable_torque(self) -> None:
        """The leaders' torque on, through the daemon (``leader.acquire``): they hold where they are."""
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        for arm in self._arms:
            if arm.arm not in self._leases:
                reply = self._link.request("leader.acquire", arm=arm.arm, client=client_name(), pid=os.getpid())
                self._leases[arm.arm] = str(reply["lease"])

    def disable_torque(self) -> None:
        """The leaders' torque off (``leader.release``): limp, the operator's hands take them."""
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        leases, self._leases = self._leases, {}
        for lease in leases.values():
            self._link.request("leader.release", lease=lease)

    def send_feedback(self, feedback: dict[str, Any]) -> None:
        """Leader goals (``<joint>.pos``, LeRobot units) to the daemon, which moves the leader
        there at bounded speed; a joint left out keeps its goal, other keys are ignored (as
        so_leader's). Torque must be on (``enable_torque``): a goal then moves the leader,
        as LeRobot's handover does it; without it nothing would, and this raises."""
        if not self._link.connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        # every leader's goals checked before any is sent: a pair's feedback with a NaN (or a leader
        # whose torque is off) on one side moves neither leader
        sends: list[tuple[str, dict[str, float]]] = []
        for arm in self._arms:
            goals = {j: float(feedback[k]) for j, k in zip(JOINT_NAMES, arm.keys, strict=True) if k in feedback}
            if not goals:
                continue
            bad = [f"{arm.prefix}{j}.pos" for j, v in goals.items() if not math.isfinite(v)]
            if bad:
                raise ValueError(
                    f"{self}: the feedback's {', '.join(bad)} is not a finite number: no leader was sent it"
                )
            lease = self._leases.get(arm.arm)
            if lease is None:
                raise DaemonRefused(
                    f"{self}: the {arm.arm} leader's torque is off: enable_torque() before send_feedback()"
                )
            sends.append((lease, goals))
        for lease, goals in sends:
            self._link.request("leader.goal", lease=lease, **goals)

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
