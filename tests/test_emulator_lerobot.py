"""LeRobot 0.6.1's own FeetechMotorsBus, SOFollower and SOLeader, unmodified, against the emulator."""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from lerobot.motors import Motor, MotorCalibration, MotorNormMode
from lerobot.motors.feetech import FeetechMotorsBus
from lerobot.robots.so_follower import SOFollower, SOFollowerRobotConfig
from lerobot.teleoperators.so_leader import SOLeader, SOLeaderTeleopConfig

from calibration.calibration_file import calibration_path, save_calibration
from calibration.conventions import JOINT_NAMES
from drivers.emulator import BusEmulator, EmulatedArm, StillMotion
from drivers.emulator.arm import reference_calibration


@pytest.fixture(autouse=True)
def never_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """A LeRobot path that would block on input() fails the test instead."""

    def refuse(*_a: object, **_k: object) -> str:
        raise AssertionError("LeRobot asked for input(): the calibration did not match the servos")

    monkeypatch.setattr(builtins, "input", refuse)


def _lerobot_calibration(role: str) -> dict[str, MotorCalibration]:
    cal = reference_calibration(role)  # type: ignore[arg-type]
    return {n: MotorCalibration(**vars(cal[n])) for n in JOINT_NAMES}


def _motors() -> dict[str, Motor]:
    body = MotorNormMode.DEGREES
    return {n: Motor(i + 1, "sts3215", MotorNormMode.RANGE_0_100 if n == "gripper" else body) for i, n in enumerate(JOINT_NAMES)}


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[tuple[EmulatedArm, BusEmulator]]:
    arm = EmulatedArm("follower")
    with BusEmulator(tmp_path / "ttyFollower", arm) as bus:
        yield arm, bus


def test_feetech_bus_handshake_ping_sync_read_write(follower) -> None:
    arm, bus = follower
    lr = FeetechMotorsBus(str(bus.link_path), _motors(), calibration=_lerobot_calibration("follower"))
    lr.connect()  # handshake: ping + model read of every id, firmware versions
    try:
        assert lr.is_calibrated
        found = lr.broadcast_ping()
        assert found == {i: 777 for i in range(1, 7)}
        present = lr.sync_read("Present_Position")
        np.testing.assert_allclose([present[n] for n in JOINT_NAMES], arm.pose_units(), atol=0.15)

        raw = lr.sync_read("Present_Position", normalize=False)
        assert [raw[n] for n in JOINT_NAMES] == arm.present_ticks().tolist()

        lr.enable_torque()
        target = {"shoulder_pan": 20.0, "shoulder_lift": -60.0, "elbow_flex": 60.0, "wrist_flex": 30.0, "wrist_roll": 45.0, "gripper": 50.0}
        lr.sync_write("Goal_Position", target)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            now = lr.sync_read("Present_Position")
            if all(abs(now[n] - target[n]) < 0.5 for n in JOINT_NAMES):
                break
            time.sleep(0.02)
        assert all(abs(now[n] - target[n]) < 0.5 for n in JOINT_NAMES), now
        assert lr.read("Lock", "gripper") == 1  # enable_torque locks like on the real bus
    finally:
        lr.disconnect()
    assert not any(s.torque_enabled for s in arm.servos)  # disconnect disabled torque


def test_feetech_bus_writes_calibration_to_eeprom(tmp_path: Path) -> None:
    arm = EmulatedArm("follower", preset="factory")
    with BusEmulator(tmp_path / "tty", arm) as bus:
        lr = FeetechMotorsBus(str(bus.link_path), _motors())
        lr.connect()
        try:
            assert lr.read_calibration()["elbow_flex"].homing_offset == 0
            wanted = _lerobot_calibration("follower")
            lr.write_calibration(wanted)
            # Lock is 1 at power-on: nothing reached the EEPROM.
            assert lr.read_calibration()["elbow_flex"].homing_offset == 0
            lr.disable_torque()  # writes Lock 0, as LeRobot does before calibrating
            lr.write_calibration(wanted)
            assert lr.is_calibrated
            assert arm.eeprom_calibration() == reference_calibration("follower")
            lr.configure_motors()  # clears Phase bit 4 on the factory units that have it
            assert all(s.reg("Phase") & 0x10 == 0 for s in arm.servos)
            present = lr.sync_read("Present_Position")
            np.testing.assert_allclose([present[n] for n in JOINT_NAMES], arm.pose_units(), atol=0.15)
        finally:
            lr.disconnect()


def test_so_follower_connects_without_prompt_observes_and_acts(tmp_path: Path, follower) -> None:
    arm, bus = follower
    root = tmp_path / "calibration"
    save_calibration(reference_calibration("follower"), "follower", "emu", root=root)
    cfg = SOFollowerRobotConfig(port=str(bus.link_path), id="emu", calibration_dir=calibration_path("follower", "emu", root).parent)
    robot = SOFollower(cfg)
    robot.connect()
    try:
        obs = robot.get_observation()
        np.testing.assert_allclose([obs[f"{n}.pos"] for n in JOINT_NAMES], arm.pose_units(), atol=0.15)
        # configure() ran: LeRobot's gripper protections are in the EEPROM.
        assert arm.servo("gripper").reg("Overload_Torque") == 25
        assert arm.servo("gripper").reg("Max_Torque_Limit") == 500
        robot.bus.enable_torque()
        action = {f"{n}.pos": v for n, v in zip(JOINT_NAMES, [10.0, -80.0, 80.0, 40.0, 5.0, 30.0])}
        sent = robot.send_action(action)
        assert sent == action
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not np.allclose(arm.pose_units(), list(action.values()), atol=0.5):
            time.sleep(0.02)
        np.testing.assert_allclose(arm.pose_units(), list(action.values()), atol=0.5)
    finally:
        robot.disconnect()


def test_so_leader_reads_the_emulated_hand_motion(tmp_path: Path) -> None:
    pose = [12.0, -40.0, 50.0, 20.0, -30.0, 65.0]
    arm = EmulatedArm("leader", motion=StillMotion(pose))
    root = tmp_path / "calibration"
    save_calibration(reference_calibration("leader"), "leader", "emu", root=root)
    with BusEmulator(tmp_path / "ttyLeader", arm) as bus:
        cfg = SOLeaderTeleopConfig(port=str(bus.link_path), id="emu", calibration_dir=calibration_path("leader", "emu", root).parent)
        leader = SOLeader(cfg)
        leader.connect()
        try:
            act = leader.get_action()
            np.testing.assert_allclose([act[f"{n}.pos"] for n in JOINT_NAMES], pose, atol=0.15)
            arm.set_pose_units([-20.0, -10.0, 30.0, 0.0, 90.0, 5.0])  # the operator moves the arm
            act = leader.get_action()
            np.testing.assert_allclose([act[f"{n}.pos"] for n in JOINT_NAMES], [-20.0, -10.0, 30.0, 0.0, 90.0, 5.0], atol=0.15)
        finally:
            leader.disconnect()


def test_leader_and_follower_calibrations_differ_but_map_the_same_pose(tmp_path: Path) -> None:
    lead, foll = reference_calibration("leader"), reference_calibration("follower")
    assert all(lead[n] != foll[n] for n in JOINT_NAMES)
    pose = [5.0, -20.0, 30.0, 10.0, 0.0, 40.0]
    a, b = EmulatedArm("leader", motion=StillMotion(pose)), EmulatedArm("follower", initial_pose_units=pose)
    assert (a.present_ticks() != b.present_ticks()).any()
    np.testing.assert_allclose(a.pose_units(), b.pose_units(), atol=0.1)
