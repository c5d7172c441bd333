"""The daemon in-process on two still emulated arms with the default reconnect backoff (0.2 s
doubling to 2 s): what the reconnect stories (a silent servo, a pulled cable) start from."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from support import still_arm_on_pty

from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

POSE = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])


@dataclass
class ReconnectBench:
    daemon: Daemon
    follower_arm: EmulatedArm  # the emulated servos (take one off the bus)
    follower_bus: BusEmulator  # their pty (unplug, replug)
    follower_port: str
    socket_path: str


@contextlib.contextmanager
def daemon_on_still_arms(root: Path) -> Iterator[ReconnectBench]:
    _la, lb = still_arm_on_pty(root / "leader", "leader", POSE)
    fa, fb = still_arm_on_pty(root / "follower", "follower", POSE)
    cfg = config_from_dict({"socket": {"path": str(root / "c.sock")}})  # the default backoff
    daemon = Daemon(
        cfg,
        FeetechLeader(str(root / "leader"), reference_calibration("leader")),
        FeetechFollower(str(root / "follower"), reference_calibration("follower")),
    )
    daemon.start()
    try:
        yield ReconnectBench(daemon, fa, fb, str(root / "follower"), cfg.socket.path)
    finally:
        daemon.stop()
        lb.stop()
        fb.stop()
