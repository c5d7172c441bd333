"""The virtual bimanual bench: `so101d emulate --bimanual`, and LeRobot 0.6.1's own BiSOLeader and
BiSOFollower, unmodified, teleoperating the two emulated pairs.

One emulator for the file (a subprocess, like test_emulator_lerobot.py: LeRobot's handshake pings
each servo once with no retry). LeRobot finds the calibration the emulator wrote by its own rule:
``HF_LEROBOT_CALIBRATION / robots / so_follower / <id>_left.json`` (its Robot and Teleoperator
base classes; the constant is read from the environment when lerobot is imported, so the test
points the constant those classes read at the bench's folder).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator

import numpy as np
import pytest
from lerobot.robots import robot as lerobot_robot
from lerobot.robots.bi_so_follower import BiSOFollower, BiSOFollowerConfig
from lerobot.robots.so_follower import SOFollowerConfig
from lerobot.teleoperators import teleoperator as lerobot_teleoperator
from lerobot.teleoperators.bi_so_leader import BiSOLeader, BiSOLeaderConfig
from lerobot.teleoperators.so_leader import SOLeaderConfig
from recording_support import wait_until
from support import connect_lerobot, refuse_input

from calibration.calibration_file import ArmCalibration, calibration_path
from calibration.conventions import JOINT_NAMES
from drivers.emulator import EmulatedArm, StillMotion
from drivers.emulator import cli as emulate_cli
from drivers.emulator.arm import reference_calibration
from drivers.emulator.motion import HandoverMotion
from drivers.emulator.process import EmulatorProcess

pytestmark = pytest.mark.e2e  # `so101d emulate --bimanual` as a user runs it, LeRobot's classes on it

SIDES = ("left", "right")
ARMS = ("left_leader", "left_follower", "right_leader", "right_follower")
# LeRobot's bimanual order: every left key, then every right key (bi_so_follower.py _motors_ft)
BI_KEYS = [f"{side}_{joint}.pos" for side in SIDES for joint in JOINT_NAMES]


@pytest.fixture(autouse=True)
def never_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_input(monkeypatch)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    d = tmp_path_factory.mktemp("bibench")
    with EmulatorProcess(d, bimanual=True, calibration_out=d / "calibration") as ep:
        yield ep


@pytest.fixture
def lerobot_calibration_root(bench: EmulatorProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """LeRobot's calibration root is the bench's --calibration-out folder (what
    HF_LEROBOT_CALIBRATION=<folder> does for a LeRobot started afterwards)."""
    root = bench.directory / "calibration"
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(root))
    monkeypatch.setattr(lerobot_robot, "HF_LEROBOT_CALIBRATION", root)
    monkeypatch.setattr(lerobot_teleoperator, "HF_LEROBOT_CALIBRATION", root)


def _pose(bench: EmulatorProcess, arm: str) -> np.ndarray:
    return np.array(bench.control({"cmd": "snapshot", "arm": arm})["pose_units"])


def _bi_leader(bench: EmulatorProcess) -> BiSOLeader:
    cfg = BiSOLeaderConfig(
        id="emulated_leader",
        left_arm_config=SOLeaderConfig(port=str(bench.links["left_leader"])),
        right_arm_config=SOLeaderConfig(port=str(bench.links["right_leader"])),
    )
    return BiSOLeader(cfg)


def _bi_follower(bench: EmulatorProcess) -> BiSOFollower:
    cfg = BiSOFollowerConfig(
        id="emulated_follower",
        left_arm_config=SOFollowerConfig(port=str(bench.links["left_follower"])),
        right_arm_config=SOFollowerConfig(port=str(bench.links["right_follower"])),
    )
    return BiSOFollower(cfg)


def test_emulate_bimanual_announces_four_ports_and_writes_lerobot_bi_calibration(bench: EmulatorProcess) -> None:
    arms = bench.control({"cmd": "arms"})["arms"]
    assert list(arms) == list(ARMS)
    announced = bench.log_path.read_text().splitlines()
    for name in ARMS:
        link = bench.links[name]
        assert link.is_symlink() and os.readlink(link).startswith("/dev/pts/")
        assert f"{name}: {link} -> {arms[name]['pty']}" in announced  # printed like the single-arm bench
    assert len({arms[n]["pty"] for n in ARMS}) == 4  # four buses, not one shared
    root = bench.directory / "calibration"
    for side in SIDES:
        for role, bi_id in (("leader", "emulated_leader"), ("follower", "emulated_follower")):
            path = calibration_path(role, f"{bi_id}_{side}", root)  # type: ignore[arg-type]
            saved = ArmCalibration.from_json_dict(json.loads(path.read_text()))
            assert saved == reference_calibration(role, side=side)  # type: ignore[arg-type]
            eeprom = bench.control({"cmd": "eeprom_calibration", "arm": f"{side}_{role}"})["calibration"]
            assert eeprom == saved.to_json_dict()  # what that arm's servos hold
    # Two physical arms per role: a swapped pair of files would not match (LeRobot would ask).
    for role in ("leader", "follower"):
        assert reference_calibration(role, side="left") != reference_calibration(role, side="right")  # type: ignore[arg-type]
    # A command for one arm must say which of the four.
    with pytest.raises(Exception, match="say which arm"):
        bench.control({"cmd": "snapshot"})


@pytest.mark.usefixtures("lerobot_calibration_root")
def test_lerobot_bi_leader_reads_two_hands_moving_differently(bench: EmulatorProcess) -> None:
    leader = connect_lerobot(lambda: _bi_leader(bench))
    try:
        assert list(leader.action_features) == BI_KEYS
        samples: list[np.ndarray] = []

        def both_sides_moved() -> bool:
            action = leader.get_action()
            assert list(action) == BI_KEYS
            samples.append(np.array([action[k] for k in BI_KEYS]))
            span = np.ptp(np.array(samples), axis=0)
            return bool(span[:6].max() > 10.0 and span[6:].max() > 10.0)

        assert wait_until(both_sides_moved, timeout_s=20.0, step_s=0.02), f"leaders' spans: {np.ptp(samples, axis=0)}"
        both = np.array(samples)
        left, right = both[:, :6], both[:, 6:]
        # Not one motion twice, nor one mirrored: the sides follow different paths.
        assert np.abs(left - right).max() > 5.0
        mirror = left * np.array([-1, 1, 1, 1, -1, 1])  # pan and roll flipped: the mirror image
        assert np.abs(mirror - right).max() > 5.0

        # Each port is its own arm: two hand-set poses read back on their own side.
        poses = {"left": [12.0, -40.0, 50.0, 20.0, -30.0, 65.0], "right": [-20.0, -10.0, 30.0, 0.0, 90.0, 5.0]}
        for side, pose in poses.items():
            bench.control({"cmd": "set_pose", "arm": f"{side}_leader", "pose_units": pose})
        action = leader.get_action()
        np.testing.assert_allclose([action[k] for k in BI_KEYS], poses["left"] + poses["right"], atol=0.15)
    finally:
        leader.disconnect()
        for side in SIDES:
            bench.control({"cmd": "set_motion", "arm": f"{side}_leader", "motion": f"handover-{side}"})
    assert not leader.is_connected


@pytest.mark.usefixtures("lerobot_calibration_root")
def test_lerobot_bi_follower_observes_acts_and_disconnects_cleanly(bench: EmulatorProcess) -> None:
    robot = connect_lerobot(lambda: _bi_follower(bench))
    try:
        assert list(robot.action_features) == BI_KEYS
        obs = robot.get_observation()
        assert list(obs) == BI_KEYS  # no cameras configured: the twelve joints only
        measured = np.concatenate([_pose(bench, f"{side}_follower") for side in SIDES])
        np.testing.assert_allclose([obs[k] for k in BI_KEYS], measured, atol=0.15)

        targets = {"left": [10.0, -80.0, 80.0, 40.0, 5.0, 30.0], "right": [-25.0, -50.0, 60.0, 20.0, -45.0, 60.0]}
        action = {k: v for k, v in zip(BI_KEYS, targets["left"] + targets["right"])}
        assert robot.send_action(action) == action
        wanted = np.array(targets["left"] + targets["right"])

        def arrived() -> bool:
            now = robot.get_observation()
            return bool(np.allclose([now[k] for k in BI_KEYS], wanted, atol=0.5))

        assert wait_until(arrived, timeout_s=6.0), robot.get_observation()
        for side in SIDES:  # the emulator's own view of each follower agrees
            np.testing.assert_allclose(_pose(bench, f"{side}_follower"), targets[side], atol=0.5)
    finally:
        robot.disconnect()
    assert not robot.is_connected
    for side in SIDES:  # LeRobot's disconnect let go of both arms
        servos = bench.control({"cmd": "snapshot", "arm": f"{side}_follower"})["servos"]
        assert not any(s["torque_enabled"] for s in servos.values()), side
    assert bench.proc is not None and bench.proc.poll() is None  # the bench serves on


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--bimanual", "--leader", "/tmp/x"], "--leader: a single pair's port"),
        (["--left-leader", "/tmp/x"], "--left-leader: a side's port needs --bimanual"),
        (["--bimanual"], "--bimanual: give --left-leader"),
    ],
)
def test_emulate_refuses_flags_that_do_not_fit_together(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    emulate_cli.add_arguments(parser)
    assert emulate_cli.run(parser.parse_args(argv)) == 2
    assert why in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize("side", SIDES)
def test_each_handover_side_stays_inside_both_calibrated_ranges_smoothly(side: str) -> None:
    motion = HandoverMotion(side)
    assert motion.duration_s == HandoverMotion("left").duration_s  # one shared cycle: the sides stay in step
    for role in ("leader", "follower"):
        cal = reference_calibration(role)  # type: ignore[arg-type]
        arm = EmulatedArm(role, motion=StillMotion(motion.pose_at(0.0)))  # type: ignore[arg-type]
        for t in np.linspace(0, motion.duration_s, 161):
            arm.set_pose_units(motion.pose_at(float(t)))
            ticks = arm.present_ticks()
            for i, n in enumerate(JOINT_NAMES):
                assert cal[n].range_min <= ticks[i] <= cal[n].range_max, (role, n, t)
    poses = np.array([motion.pose_at(t) for t in np.arange(0, 2 * motion.duration_s, 0.01)])
    assert np.abs(np.diff(poses, axis=0)).max() < 2.0  # no jump, also across the loop
    assert poses[:, 5].min() < 15 and poses[:, 5].max() > 60  # each gripper closes and opens
