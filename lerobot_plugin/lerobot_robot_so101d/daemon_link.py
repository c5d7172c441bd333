"""One connection to the so101d daemon's control socket, with its failures in LeRobot's words.

A daemon that is not there, or that stops answering, is LeRobot's ``DeviceNotConnectedError``
naming the socket and how to start the daemon; a request the daemon refuses (the arm held by
another client, the operator's hold, a fault) is ``DaemonRefused`` carrying the daemon's reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from lerobot.utils.errors import DeviceNotConnectedError

from calibration.conventions import JOINT_NAMES
from daemon.api.client import CommandFailed, ControlClient, DaemonUnavailable, socket_path_from_args

START_HINT = "start it with `so101d run` (or `sudo systemctl start so101d`), or pass --robot.socket=PATH"
FEATURE_KEYS: tuple[str, ...] = tuple(f"{j}.pos" for j in JOINT_NAMES)  # so101_follower's keys, in order


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


def as_features(joints: dict[str, float] | None, what: str) -> dict[str, float]:
    """The daemon's joint dict -> LeRobot's ``<joint>.pos`` keys; a missing reading raises."""
    if joints is None:
        raise DeviceNotConnectedError(f"the so101d daemon has no {what} reading (see `so101d status`)")
    return {f"{j}.pos": float(joints[j]) for j in JOINT_NAMES}


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
