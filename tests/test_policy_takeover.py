"""Take-over state machine against the emulated leader (our driver on the STS3215 emulator):
torque on, moved to the follower's pose at a bounded speed, released; failures release the leader."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from daemon.policy.takeover import LeaderActuator, Takeover, TakeoverConfig
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.feetech_arm import FeetechLeader

POSE_A = np.array([0.0, -40.0, 40.0, 20.0, 0.0, 20.0])
POSE_B = np.array([25.0, -25.0, 30.0, 35.0, 15.0, 45.0])


@pytest.fixture()
def leader(tmp_path: Path):
    arm = EmulatedArm("leader", initial_pose_units=POSE_A)
    arm.set_pose_units(POSE_A)  # a hand holds it at POSE_A (a still motion source)
    emu = BusEmulator(tmp_path / "leader", arm).start()
    drv = FeetechLeader(str(tmp_path / "leader"), reference_calibration("leader"))
    drv.connect()
    yield arm, emu, drv
    drv.close()
    emu.stop()


def run(t: Takeover, pose, period_s: float = 0.02, limit_s: float = 20.0) -> None:
    end = time.monotonic() + limit_s
    while not t.finished and time.monotonic() < end:
        t.step(time.monotonic(), pose)
        time.sleep(period_s)


def torques(arm: EmulatedArm) -> list[bool]:
    return [bool(s.torque_enabled) for s in arm.servos]


def test_leader_is_moved_to_the_follower_pose_then_released(leader) -> None:
    arm, _emu, drv = leader
    assert not any(torques(arm))
    cfg = TakeoverConfig(speed_deg_s=60.0, gripper_speed_pct_s=80.0, tolerance_deg=3.0)
    t = Takeover(LeaderActuator(drv), cfg)
    assert t.step(time.monotonic(), POSE_B) == "moving"
    assert all(torques(arm))  # torque on, and nothing jumped: goals were set to present first
    assert np.allclose(arm.pose_units(), POSE_A, atol=1.5)
    run(t, POSE_B)
    assert t.phase == "done", t.error
    assert not any(torques(arm))  # released for the operator's hand
    assert np.max(np.abs(arm.pose_units() - POSE_B)) <= 3.5
    time.sleep(1.0)  # the hand holds it where the motors left it: no snap back to POSE_A
    assert np.max(np.abs(arm.pose_units() - POSE_B)) <= 3.5
    # bounded speed: 15+ degrees at 60 deg/s took several ticks, each step within speed * elapsed time
    times = np.array([c[0] for c in t.commands])
    cmds = np.array([c[1] for c in t.commands])
    assert len(cmds) >= 3
    # shoulder_pan moved 25 degrees, to within the 3 degree tolerance (the start pose itself
    # within 1.5): at 60 deg/s that takes at least 20.5/60 s, however few steps a loaded machine ran
    assert times[-1] - times[0] >= (25.0 - 3.0 - 1.5) / 60.0 - 0.01
    steps = np.abs(np.diff(cmds, axis=0))
    dts = np.diff(times)[:, None]
    assert np.all(steps[:, :5] <= 60.0 * dts + 1e-9)
    assert np.all(steps[:, 5] <= 80.0 * dts[:, 0] + 1e-9)
    assert steps.max() > 0


def test_unplugged_leader_fails_and_never_raises(leader) -> None:
    _arm, emu, drv = leader
    t = Takeover(LeaderActuator(drv), TakeoverConfig(timeout_s=5.0))
    t.step(time.monotonic(), POSE_B)
    emu.unplug()
    run(t, POSE_B, limit_s=10)
    assert t.phase == "failed" and t.error
    emu.replug()


def test_timeout_releases_the_leader(leader) -> None:
    arm, _emu, drv = leader
    t = Takeover(LeaderActuator(drv), TakeoverConfig(timeout_s=0.3, speed_deg_s=5.0))
    run(t, POSE_B, limit_s=5)
    assert t.phase == "failed" and "did not reach" in (t.error or "")
    assert not any(torques(arm))


def test_bad_follower_pose_fails_cleanly(leader) -> None:
    _arm, _emu, drv = leader
    t = Takeover(LeaderActuator(drv))
    assert t.step(time.monotonic(), np.full(6, np.nan)) == "failed"
    assert "follower pose" in (t.error or "")
    with pytest.raises(ValueError):
        TakeoverConfig(speed_deg_s=0.0)
