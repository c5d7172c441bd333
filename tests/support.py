"""Helpers shared by the test files (not the recording tests, which keep recording_support.py).

Small on purpose: polling with a deadline (a predicate, or the daemon's status over its socket),
a free loopback port, an emulated arm served on a pseudo-terminal, the SDK's port on an emulated
follower, the MuJoCo follower on a thread, LeRobot's connect with bounded handshake retries.
Each replaces copies that lived in several files.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from daemon.api.client import ControlClient, DaemonUnavailable
from drivers.emulator import BusEmulator, EmulatedArm


def wait_for(pred: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``pred`` every 10 ms until it is true; fail the test after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def poll_until(pred: Callable[[], Any], timeout_s: float = 10.0, period_s: float = 0.01) -> bool:
    """Poll ``pred`` until it is true (True) or ``timeout_s`` passed (its last value, as a bool),
    for ``assert poll_until(...), diagnosis`` where the caller words the failure."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(period_s)
    return bool(pred())


def may_take_fifo(priority: int = 1) -> bool:
    """Whether a fresh thread of this process may take SCHED_FIFO at ``priority`` (root,
    CAP_SYS_NICE or RLIMIT_RTPRIO); the thread gives it back at once."""
    allowed: list[bool] = []

    def attempt() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            allowed.append(True)
        except OSError:
            allowed.append(False)

    t = threading.Thread(target=attempt)
    t.start()
    t.join()
    return allowed[0]


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


@contextlib.contextmanager
def sdk_port_on_emulated_follower(
    tmp_path: Path, realism: Any = None
) -> Iterator[tuple[EmulatedArm, BusEmulator, Any, Any]]:
    """An emulated follower on a pty and the Feetech SDK's PortHandler / PacketHandler open on it
    (``realism``: the servos' realism options, e.g. ``realism_from_spec("strict").servo``)."""
    import scservo_sdk as scs

    arm = EmulatedArm("follower") if realism is None else EmulatedArm("follower", realism=realism)
    bus = BusEmulator(tmp_path / "follower", arm).start()
    port = scs.PortHandler(str(tmp_path / "follower"))
    assert port.openPort()
    try:
        yield arm, bus, port, scs.PacketHandler(0)
    finally:
        if port.is_open:
            try:
                port.closePort()
            except OSError:  # a test that unplugged the emulated port
                pass
        bus.stop()


class MujocoSimThread:
    """Our MuJoCo follower bound at ``endpoint``, stepping on a daemon thread.

    ``config_kw`` goes to MujocoFollowerConfig (seed 0 unless given; ``cameras=()`` for none).
    """

    def __init__(self, endpoint: str, **config_kw: Any) -> None:
        from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig

        config_kw.setdefault("seed", 0)
        self.sim = MujocoFollower(MujocoFollowerConfig(bind=endpoint, **config_kw))
        self.sim.open()
        self.thread = threading.Thread(target=self.sim.run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.sim.stop()
        self.thread.join(5)


def refuse_input(monkeypatch: Any) -> None:
    """A LeRobot path that would block on input() (a calibration mismatch) fails the test instead."""

    def refuse(*_a: object, **_k: object) -> str:
        raise AssertionError("LeRobot asked for input(): the calibration did not match the servos")

    monkeypatch.setattr(builtins, "input", refuse)


def _buses(device: Any) -> list[Any]:
    """The serial buses of a LeRobot device: a bi device's two arms', an arm's one, or the bus itself."""
    if hasattr(device, "left_arm"):
        return [device.left_arm.bus, device.right_arm.bus]
    return [getattr(device, "bus", device)]


def connect_lerobot(make: Callable[[], Any], attempts: int = 3) -> Any:
    """Connect a LeRobot device (SOFollower, SOLeader, their Bi pairs or a bare FeetechMotorsBus) built by
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
            for bus in _buses(device):  # a half-done attempt's open ports (a bi device opens left first)
                if bus.is_connected:
                    bus.port_handler.closePort()
            time.sleep(0.3)
    assert last is not None
    raise last


def wait_status(
    sock: Path, pred: Callable[[dict], bool], timeout_s: float = 20.0, proc: subprocess.Popen | None = None
) -> dict:
    """Poll the daemon's `status` over its socket until ``pred(status)``; fail early if ``proc`` exited."""
    end = time.monotonic() + timeout_s
    last: dict | str = "no reply"
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"daemon exited early with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        try:
            with ControlClient(sock, timeout_s=2) as c:
                last = c.request("status")
            if pred(last):
                return last
        except DaemonUnavailable as exc:
            last = str(exc)
        time.sleep(0.1)
    raise AssertionError(f"status never matched; last: {last}")
