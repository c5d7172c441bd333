"""One connection to the so101d daemon's control socket, with its failures in LeRobot's words.

A daemon that is not there, or that stops answering, is LeRobot's ``DeviceNotConnectedError``
naming the socket and how to start the daemon; a request the daemon refuses (the arm held by
another client, the operator's hold, a fault) is ``DaemonRefused`` carrying the daemon's reason.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lerobot.utils.errors import DeviceNotConnectedError

from calibration.conventions import JOINT_NAMES
from daemon.api.client import CommandFailed, ControlClient, DaemonUnavailable, socket_path_from_args
from daemon.api.pose_share import PoseShareReader, SharedPoses

log = logging.getLogger(__name__)

START_HINT = "start it with `so101d run` (or `sudo systemctl start so101d`), or pass --robot.socket=PATH"


class DaemonRefused(RuntimeError):
    """The daemon answered, and refused (its reason is the message)."""


def default_socket() -> str:
    """The socket `so101d status` talks to with no options (its configuration, else the service's)."""
    return socket_path_from_args(argparse.Namespace(socket=None, config=None))


def client_name() -> str:
    return f"LeRobot {os.path.basename(sys.argv[0]) or 'python'}"


class DaemonLink:
    def __init__(self, socket: str | None, timeout_s: float) -> None:
        self.path = socket or default_socket()
        self._client = ControlClient(self.path, timeout_s=timeout_s, connect_retry_s=min(2.0, timeout_s))
        self.connected = False

    def connect(self) -> None:
        try:
            self._client.connect()
            self._client.request("ping")
        except DaemonUnavailable as exc:
            self._client.close()
            raise DeviceNotConnectedError(f"no so101d daemon answers at {self.path}: {exc}; {START_HINT}") from None
        self.connected = True

    def request(self, cmd: str, **args: Any) -> dict[str, Any]:
        try:
            return self._client.request(cmd, **args)
        except CommandFailed as exc:
            raise DaemonRefused(f"so101d daemon at {self.path} refused {cmd}: {exc}") from None
        except DaemonUnavailable as exc:
            self.connected = False
            raise DeviceNotConnectedError(
                f"the so101d daemon at {self.path} stopped answering ({exc}); {START_HINT}"
            ) from None

    def close(self) -> None:
        self._client.close()
        self.connected = False


# the share's record is rewritten every cycle: one older than this many periods (and this many
# seconds) is a loop that stopped writing it (the arm's pose not current, the daemon gone), and
# the socket's arm.observe answers instead, with its reason
SHARE_STALE_PERIODS = 5
SHARE_STALE_MIN_S = 0.05


class PoseShare:
    """``arm.observe``'s follower and leader, read from the daemon's pose share (arm.share) when it
    is fresh: a LeRobot step then costs the daemon one request (the action), not two. None where
    the share has nothing current, and the caller asks the socket."""

    def __init__(self, link: DaemonLink, arms: tuple[str, ...]) -> None:
        self._reader: PoseShareReader | None = None
        self._index: dict[str, int] = {}
        try:
            reply = link.request("arm.share")
            names = [str(n) for n in reply["arms"]]
            if all(a in names for a in arms):
                self._reader = PoseShareReader(str(reply["path"]))
                self._index = {a: names.index(a) for a in arms}
        except (DaemonRefused, OSError, ValueError) as exc:
            # another machine's /dev/shm (a container), an older daemon: the socket serves alone
            log.info("the so101d daemon's pose share is not readable here (%s): asking the socket", exc)

    def fresh(self) -> SharedPoses | None:
        """The newest record, if the loop wrote it lately (one read serves every arm of a step)."""
        rec = self._reader.read() if self._reader is not None else None
        if rec is None or time.monotonic() - rec.written_at_s > max(
            SHARE_STALE_MIN_S, SHARE_STALE_PERIODS * rec.period_s
        ):
            return None
        return rec

    def follower(self, rec: SharedPoses | None, arm: str) -> tuple[float, ...] | None:
        return rec.arm(self._index[arm]) if rec is not None and arm in self._index else None

    def leader(self, rec: SharedPoses | None, arm: str) -> tuple[tuple[float, ...], float] | None:
        """The arm's own leader's reading and its age in ms."""
        if rec is None or arm not in self._index:
            return None
        i = self._index[arm]
        pose = rec.leader(i)
        return None if pose is None else (pose, (time.monotonic() - rec.leader_read_at_s(i)) * 1000.0)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


@dataclass(frozen=True)
class ArmKeys:
    """One of the daemon's arms as a LeRobot device shows it: its name in the daemon and the prefix
    of its keys (``left_`` / ``right_`` for a pair, as LeRobot's bi_so_follower and bi_so_leader
    prefix them; nothing for a single arm, as so101_follower)."""

    arm: str
    prefix: str

    @cached_property  # read at every step (a frozen dataclass without slots keeps it)
    def keys(self) -> tuple[str, ...]:
        return tuple(f"{self.prefix}{j}.pos" for j in JOINT_NAMES)

    def features(self, values: tuple[float, ...] | list[float]) -> dict[str, float]:
        return dict(zip(self.keys, values))

    def joints(self, action: dict[str, Any], who: str, all_keys: tuple[str, ...]) -> dict[str, float]:
        """This arm's ``<joint>: value`` from a LeRobot action (its prefixed keys). A value that is
        not a finite number (a policy's NaN) raises here, before any arm of a pair is sent its goal:
        the daemon would refuse it, but only after the other arm had taken its own."""
        try:
            goal = {j: float(action[k]) for j, k in zip(JOINT_NAMES, self.keys)}
        except KeyError as exc:
            raise ValueError(f"{who}: the action lacks {exc.args[0]} (it needs {', '.join(all_keys)})") from None
        bad = [f"{self.prefix}{j}.pos" for j, v in goal.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"{who}: the action's {', '.join(bad)} is not a finite number: no arm was sent it")
        return goal


# `arm = "pair"`: the daemon's bimanual arms, left first (LeRobot's order and prefixes:
# lerobot/robots/bi_so_follower/bi_so_follower.py, lerobot/teleoperators/bi_so_leader/bi_so_leader.py)
PAIR = "pair"
PAIR_ARMS: tuple[ArmKeys, ...] = (ArmKeys("left", "left_"), ArmKeys("right", "right_"))


def arms_of(arm: str) -> tuple[ArmKeys, ...]:
    """The configured ``arm`` option as the daemon arms it names."""
    return PAIR_ARMS if arm == PAIR else (ArmKeys(arm, ""),)


def as_features(joints: dict[str, float] | None, what: str, prefix: str = "") -> dict[str, float]:
    """The daemon's joint dict -> LeRobot's ``<prefix><joint>.pos`` keys; a missing reading raises."""
    if joints is None:
        raise DeviceNotConnectedError(f"the so101d daemon has no {what} reading (see `so101d status`)")
    return {f"{prefix}{j}.pos": float(joints[j]) for j in JOINT_NAMES}


def camera_sizes(link: DaemonLink, names: list[str]) -> dict[str, tuple[int, int]]:
    """The daemon's cameras ``names`` -> (height, width), from its camera.list."""
    was = link.connected
    if not was:
        link.connect()
    try:
        listed = {c["name"]: (int(c["height"]), int(c["width"])) for c in link.request("camera.list")["cameras"]}
    finally:
        if not was:
            link.close()
    missing = [n for n in names if n not in listed]
    if missing:
        raise ValueError(
            f"the so101d daemon at {link.path} has no camera {', '.join(missing)} (its cameras: {', '.join(listed) or 'none'})"
        )
    return {n: listed[n] for n in names}
