"""Robot ``so101d``: an arm of the so101d daemon, as LeRobot's ``so101_follower`` shows it, or
(``arm = "pair"``) a bimanual daemon's two arms, as LeRobot's ``bi_so_follower`` shows them.

The features are so101_follower's (``<joint>.pos``: body joints in degrees, the gripper 0..100),
so a dataset recorded through the daemon has the same columns, and its robot_type is
``so_follower``, the type LeRobot records for that arm (the arm behind the daemon is one). A pair's
are bi_so_follower's (lerobot/robots/bi_so_follower/bi_so_follower.py in LeRobot 0.6.1: the left
arm's keys prefixed ``left_``, then the right's ``right_``; robot_type ``bi_so_follower``), and
``connect`` takes both arms or neither.
``connect`` takes the arm from the daemon (``arm.acquire``: it now follows this client's
actions, through the daemon's safety layer); ``send_action`` returns what that layer commands,
and raises ``DaemonRefused`` with the daemon's reason while the operator holds the arm (or it is
in fault, or torque is off) instead of moving; ``disconnect`` gives the arm back and it holds
where it is. No calibration here: the daemon owns the servos and their calibration.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from functools import cached_property
from typing import Any

from lerobot.robots.robot import Robot
from lerobot.utils.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError

from drivers.frame_shm import FrameShareReader
from lerobot_robot_so101d.config_so101d import SO101DConfig
from lerobot_robot_so101d.daemon_link import (
    PAIR,
    DaemonLink,
    DaemonRefused,
    PoseShare,
    arms_of,
    as_features,
    camera_sizes,
    client_name,
)

log = logging.getLogger(__name__)
# so101_follower's cameras refuse a frame older than this (LeRobot's Camera.read_latest default):
# a camera that stopped delivering must not feed a frozen image into a dataset
FRAME_MAX_AGE_MS = 500.0


class SO101D(Robot):
    config_class = SO101DConfig
    name = "so_follower"  # LeRobot's robot_type for the SO-100/101 follower (dataset metadata)

    def __init__(self, config: SO101DConfig) -> None:
        if config.arm == PAIR:
            self.name = "bi_so_follower"  # LeRobot's robot_type for a bimanual SO pair
        super().__init__(config)
        self.config = config
        self._arms = arms_of(config.arm)
        self._keys = tuple(k for a in self._arms for k in a.keys)
        self._link = DaemonLink(config.socket, config.timeout_s)
        self._leases: dict[str, str] = {}  # arm -> its lease, while connected
        # LeRobot reads len(robot.cameras) and the features before connect: the sizes come from
        # the daemon's camera.list now (the daemon must be running to record its cameras)
        self.cameras: dict[str, tuple[int, int]] = (
            camera_sizes(self._link, config.daemon_cameras) if config.daemon_cameras else {}
        )
        self._frames: dict[str, FrameShareReader] = {}
        self._poses: PoseShare | None = None

    @cached_property
    def observation_features(self) -> dict[str, type | tuple[int, ...]]:
        cams = {name: (h, w, 3) for name, (h, w) in self.cameras.items()}
        return {**dict.fromkeys(self._keys, float), **cams}

    @cached_property
    def action_features(self) -> dict[str, type]:
        return dict.fromkeys(self._keys, float)

    @property
    def is_connected(self) -> bool:
        return bool(self._leases)

    @property
    def is_calibrated(self) -> bool:
        return True  # the daemon calibrates its arms (so101d calibrate)

    def calibrate(self) -> None:
        """Nothing to do here: the daemon owns the servos' calibration."""

    def configure(self) -> None:
        """Nothing to do here: the daemon configures the servos it drives."""

    def connect(self, calibrate: bool = True) -> None:
        if self._leases:
            raise DeviceAlreadyConnectedError(f"{self} is already connected")
        self._link.connect()
        messages = []
        for arm in self._arms:
            try:
                reply = self._link.request("arm.acquire", arm=arm.arm, client=client_name(), pid=os.getpid())
            except DaemonRefused as exc:
                self._give_back()  # a pair is both arms or neither
                self._link.close()
                raise DeviceNotConnectedError(str(exc)) from None
            self._leases[arm.arm] = str(reply["lease"])
            messages.append(str(reply.get("message") or ""))
        # a LeRobot tool may end without disconnect(): robot_client returns when its policy
        # server is not there (robot_client.py async_client: start() False, no client.stop()),
        # and the arm would stay lent to a process that is gone until the next client asks
        atexit.register(self._release_at_exit)
        try:
            self._poses = PoseShare(self._link, tuple(a.arm for a in self._arms))
            for name in self.cameras:
                share = self._link.request("camera.share", camera=name)
                self._frames[name] = FrameShareReader(share["path"])
            self._wait_first_frames()
        except Exception:
            self.disconnect()
            raise
        # e.g. that the operator holds the arm: lent, but still until their `so101d teleop start`
        log.info("%s: the daemon at %s: %s", self, self._link.path, "; ".join(messages))

    def _wait_first_frames(self, timeout_s: float = 5.0) -> None:
        end = time.monotonic() + timeout_s
        waiting = list(self._frames)
        while waiting:
            waiting = [n for n in waiting if self._frames[n].latest() is None]
            if waiting and time.monotonic() > end:
                raise DeviceNotConnectedError(
                    f"the so101d daemon's camera(s) {', '.join(waiting)} gave no frame in {timeout_s:g} s"
                )
            if waiting:
                time.sleep(0.01)

    def _check(self) -> dict[str, str]:
        if not self._leases:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first")
        return self._leases

    def get_observation(self) -> dict[str, Any]:
        self._check()
        # the poses the loop measured at its newest cycle, from shared memory (no request), else
        # the socket's arm.observe (the share not current: the daemon says why)
        rec = self._poses.fresh() if self._poses is not None else None
        obs: dict[str, Any] = {}
        for arm in self._arms:
            shared = self._poses.follower(rec, arm.arm) if self._poses is not None else None
            if shared is not None:
                obs.update(arm.features(shared))
            else:
                reply = self._link.request("arm.observe", arm=arm.arm)
                obs.update(as_features(reply.get("follower"), f"{arm.arm} pose", arm.prefix))
        for name, reader in self._frames.items():
            frame = reader.latest()
            if frame is None:
                raise DeviceNotConnectedError(f"the so101d daemon's camera {name} has no frame")
            # both sides read CLOCK_MONOTONIC: the daemon's capture time is comparable here
            age_ms = (time.monotonic() - frame.capture_monotonic_s) * 1000.0
            if age_ms > FRAME_MAX_AGE_MS:
                raise TimeoutError(
                    f"the so101d daemon's camera {name}: newest frame is {age_ms:.0f} ms old "
                    f"(max {FRAME_MAX_AGE_MS:.0f} ms; see `so101d status` for the camera)"
                )
            obs[name] = frame.pixels
        return obs

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        leases = self._check()
        # every arm's goal checked before any is sent: a malformed pair action moves neither arm
        goals = [(arm, arm.joints(action, str(self), self._keys)) for arm in self._arms]
        sent: dict[str, Any] = {}
        for arm, goal in goals:
            reply = self._link.request("arm.action", lease=leases[arm.arm], **goal)
            commanded = reply.get("commanded")
            if commanded is None:
                raise DaemonRefused(
                    f"the so101d daemon commands nothing to {arm.arm} now: {reply.get('mode')} ({reply.get('reason')})"
                )
            sent.update(as_features(commanded, "commanded", arm.prefix))
        return sent

    def _release_at_exit(self) -> None:
        if self._leases:
            log.info("%s: exiting still connected: giving the arm back", self)
            self.disconnect()

    def _give_back(self) -> None:
        leases, self._leases = self._leases, {}
        for arm, lease in leases.items():
            try:
                if self._link.connected:
                    self._link.request("arm.release", lease=lease)
            except (DaemonRefused, DeviceNotConnectedError) as exc:
                # disconnect runs in LeRobot's `finally`: the error that brought us here matters more
                log.warning("%s: could not give %s back: %s", self, arm, exc)

    def disconnect(self) -> None:
        self._check()
        atexit.unregister(self._release_at_exit)
        try:
            self._give_back()
        finally:
            for reader in self._frames.values():
                reader.close()
            self._frames.clear()
            if self._poses is not None:
                self._poses.close()
                self._poses = None
            self._link.close()
