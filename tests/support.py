"""Helpers shared by the test files (not the recording tests, which keep recording_support.py).

Small on purpose: polling with a deadline, a free loopback port, an emulated arm served on a
pseudo-terminal, the MuJoCo follower on a thread. Each replaces copies that lived in several files.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

import numpy as np

from drivers.emulator import BusEmulator, EmulatedArm


def wait_for(pred: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``pred`` every 10 ms until it is true; fail the test after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a ZeroMQ endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def still_arm_on_pty(link: Path, role: str, pose_units: np.ndarray) -> tuple[EmulatedArm, BusEmulator]:
    """An emulated arm held still at ``pose_units`` (moved only by the test, "by hand"), served
    in-process on a pty whose slave is symlinked at ``link``."""
    arm = EmulatedArm(role, initial_pose_units=pose_units)  # type: ignore[arg-type]
    arm.set_pose_units(pose_units)
    return arm, BusEmulator(link, arm).start()


class MujocoSimThread:
    """Our MuJoCo follower bound at ``endpoint``, stepping on a daemon thread (no cameras)."""

    def __init__(self, endpoint: str, cameras: tuple = ()) -> None:
        from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig  # noqa: PLC0415 - mujoco is heavy

        self.sim = MujocoFollower(MujocoFollowerConfig(bind=endpoint, cameras=cameras, seed=0))
        self.sim.open()
        self.thread = threading.Thread(target=self.sim.run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.sim.stop()
        self.thread.join(5)


def connect_lerobot(make: Callable[[], Any], attempts: int = 3) -> Any:
    """Connect a LeRobot device (SOFollower, SOLeader or a bare FeetechMotorsBus) built by
    ``make()``, retrying only the handshake.

    LeRobot's SDK waits 50 ms for each status packet and does not retry during connect: on a
    shared 2-core machine a reply is occasionally later than that ("There is no status packet",
    LR#1252, or a motor "missing" from the handshake). That is not what the tests are about, so
    such a failure gets a fresh device (re-opening the port flushes late bytes), up to
    ``attempts`` times. AssertionError (a test's input() guard: a prompt) is never retried.
    """
    last: Exception | None = None
    for _ in range(attempts):
        device = make()
        try:
            device.connect()
            return device
        except (ConnectionError, RuntimeError) as exc:
            last = exc
            bus = getattr(device, "bus", device)
            if bus.is_connected:
                bus.port_handler.closePort()
            time.sleep(0.3)
    assert last is not None
    raise last
