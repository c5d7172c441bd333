"""The clients of a bimanual daemon: the operator's `so101d status`, and a LeRobot user with the
so101d plugin, whose ``arm = "pair"`` is LeRobot's ``bi_so_follower`` / ``bi_so_leader`` with the
daemon's safety layer in between.

The virtual bimanual bench (`so101d emulate --bimanual`, a subprocess: four emulated arms) and the
daemon in-process on the configuration docs/configuration.md shows ([arms.left] / [arms.right]).

- The robot's and the teleoperator's features are exactly what LeRobot's own BiSOFollower and
  BiSOLeader declare (names and order), and the robot records as robot_type ``bi_so_follower``.
- ``connect`` takes both arms (or neither: one lent elsewhere refuses the pair and leaves the other
  where it was); the leaders' actions sent as the robot's actions move each follower after its
  own leader; ``disconnect`` gives each arm back to its own leader, holding (as a single arm).
- LeRobot's smooth handover (``teleop_smooth_move_to``) drives both leaders to their followers.
- `so101d status` shows each arm: its mode and source, its two links, its joints.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bimanual_support import LEFT_POSE, RIGHT_POSE, SIDES, still_bimanual_bench, tracking_daemon, write_bimanual_config
from support import wait_for

from calibration.conventions import JOINT_NAMES
from daemon.api.client import ControlClient
from daemon.service.daemon import Daemon
from drivers.emulator.process import EmulatorProcess

pytestmark = pytest.mark.e2e  # the bimanual emulator as a user runs it, LeRobot's classes on the daemon

REPO = Path(__file__).resolve().parents[1]
TOL_DEG = 2.5
MOVED_LEFT_POSE = [-10.0, -30.0, 30.0, 40.0, 10.0, 40.0]
MOVED_RIGHT_POSE = [45.0, -50.0, 70.0, 35.0, -10.0, 30.0]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    with still_bimanual_bench(tmp_path_factory.mktemp("bimanual-plugin")) as ep:
        yield ep


@pytest.fixture(scope="module")
def daemon(bench: EmulatorProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("bimanual-plugin-daemon")
    toml = write_bimanual_config(bench, d, f'\n[socket]\npath = "{d / "control.sock"}"\n')
    with tracking_daemon(toml) as daemon:
        yield daemon


def _pose(bench: EmulatorProcess, arm: str) -> np.ndarray:
    return np.array(bench.control({"cmd": "snapshot", "arm": arm})["pose_units"])


def _operator_resumes(daemon: Daemon) -> None:
    """`so101d teleop start`: arms lent to a client follow its actions from the next one (a release
    leaves them holding, and a client that sent nothing yet is held as stale)."""
    with ControlClient(daemon.socket_path) as op:
        assert "follows its source 'left_client'" in op.request("teleop.start")["message"]


def _side(values: dict[str, float], side: str) -> np.ndarray:
    return np.array([values[f"{side}_{j}.pos"] for j in JOINT_NAMES])


def test_the_pair_has_lerobots_bimanual_features(daemon: Daemon, tmp_path: Path) -> None:
    from lerobot.robots.bi_so_follower import BiSOFollower, BiSOFollowerConfig
    from lerobot.robots.so_follower.config_so_follower import SOFollowerConfig
    from lerobot.teleoperators.bi_so_leader import BiSOLeader, BiSOLeaderConfig
    from lerobot.teleoperators.so_leader.config_so_leader import SOLeaderConfig
    from lerobot_robot_so101d import SO101D, SO101DConfig, SO101DTeleop, SO101DTeleopConfig

    # LeRobot's own classes, not connected (nothing opens a port): what they declare
    theirs = BiSOFollower(
        BiSOFollowerConfig(
            id="bi",
            calibration_dir=tmp_path,
            left_arm_config=SOFollowerConfig(port="/dev/null"),
            right_arm_config=SOFollowerConfig(port="/dev/null"),
        )
    )
    their_leader = BiSOLeader(
        BiSOLeaderConfig(
            id="bi",
            calibration_dir=tmp_path,
            left_arm_config=SOLeaderConfig(port="/dev/null"),
            right_arm_config=SOLeaderConfig(port="/dev/null"),
        )
    )
    ours = SO101D(SO101DConfig(socket=str(daemon.socket_path), arm="pair"))
    our_leader = SO101DTeleop(SO101DTeleopConfig(socket=str(daemon.socket_path), arm="pair"))
    assert list(ours.observation_features.items()) == list(theirs.observation_features.items())
    assert list(ours.action_features.items()) == list(theirs.action_features.items())
    assert list(our_leader.action_features) == list(their_leader.action_features)
    assert list(our_leader.feedback_features) == list(their_leader.feedback_features)
    assert ours.name == theirs.name == "bi_so_follower"


def test_lerobot_teleoperates_both_arms_through_the_daemon_and_hands_them_back(
    daemon: Daemon, bench: EmulatorProcess
) -> None:
    from lerobot_robot_so101d import SO101D, SO101DConfig, SO101DTeleop, SO101DTeleopConfig

    robot = SO101D(SO101DConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop = SO101DTeleop(SO101DTeleopConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop.connect()
    robot.connect()
    try:
        assert daemon.loop.assignments() == {"left": "left_client", "right": "right_client"}
        _operator_resumes(daemon)
        # the leaders, as LeRobot reads them: each side its own leader
        action = teleop.get_action()
        for side in SIDES:
            assert np.allclose(_side(action, side), _pose(bench, f"{side}_leader"), atol=TOL_DEG)
        assert not np.allclose(_side(action, "left"), _side(action, "right"), atol=5.0)

        # the operator's hands move both leaders, differently: only LeRobot's loop below moves
        # the followers now (they are lent), each after its own leader
        bench.control({"cmd": "set_pose", "arm": "left_leader", "pose_units": MOVED_LEFT_POSE})
        bench.control({"cmd": "set_pose", "arm": "right_leader", "pose_units": MOVED_RIGHT_POSE})

        def followed() -> bool:
            robot.send_action(teleop.get_action())
            obs = robot.get_observation()
            return all(np.max(np.abs(_side(obs, s) - _pose(bench, f"{s}_leader"))) < TOL_DEG for s in SIDES)

        wait_for(followed, 20, "both followers at their own leader's moved pose, driven by LeRobot's actions")
        # a malformed pair action (no right arm) moves neither arm and names what it lacks
        left_only = {k: v for k, v in teleop.get_action().items() if k.startswith("left_")}
        with pytest.raises(ValueError, match="right_shoulder_pan.pos"):
            robot.send_action(left_only)
    finally:
        robot.disconnect()
        teleop.disconnect()
        for side, pose in zip(SIDES, (LEFT_POSE, RIGHT_POSE)):
            bench.control({"cmd": "set_pose", "arm": f"{side}_leader", "pose_units": pose})
    assert daemon.loop.assignments() == {"left": "left_leader", "right": "right_leader"}


def test_the_pair_is_both_arms_or_neither(daemon: Daemon) -> None:
    """The right arm lent to someone else: the pair's connect is refused naming the holder, and the
    left arm it took first is given back to its own leader."""
    from lerobot.utils.errors import DeviceNotConnectedError
    from lerobot_robot_so101d import SO101D, SO101DConfig

    with ControlClient(daemon.socket_path) as other:
        lease = other.request("arm.acquire", arm="right", client="another tool")["lease"]
        try:
            robot = SO101D(SO101DConfig(socket=str(daemon.socket_path), arm="pair"))
            with pytest.raises(DeviceNotConnectedError, match="another tool"):
                robot.connect()
            assert not robot.is_connected
            assert daemon.loop.assignments()["left"] == "left_leader"
        finally:
            other.request("arm.release", lease=lease)
    assert daemon.loop.assignments() == {"left": "left_leader", "right": "right_leader"}


def test_lerobots_smooth_handover_drives_both_leaders_to_their_followers(
    daemon: Daemon, bench: EmulatorProcess
) -> None:
    """lerobot-rollout's pause: the followers stay where the robot put them, and LeRobot's
    teleop_smooth_move_to brings each leader to its own follower (two leases, one per leader)."""
    from lerobot.common.control_utils import teleop_smooth_move_to
    from lerobot_robot_so101d import SO101D, SO101DConfig, SO101DTeleop, SO101DTeleopConfig

    robot = SO101D(SO101DConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop = SO101DTeleop(SO101DTeleopConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop.connect()
    robot.connect()
    try:
        _operator_resumes(daemon)  # a release before left both arms holding: the operator's word moves them
        start = teleop.get_action()
        # the followers somewhere else than their leaders: each 10 degrees off on two joints
        goal = dict(start)
        for side in SIDES:
            goal[f"{side}_shoulder_pan.pos"] += 10.0
            goal[f"{side}_elbow_flex.pos"] -= 10.0

        def there() -> bool:
            robot.send_action(goal)
            obs = robot.get_observation()
            return all(np.max(np.abs(_side(obs, s) - _side(goal, s))) < TOL_DEG for s in SIDES)

        wait_for(there, 20, "both followers at the goal")
        followers = robot.get_observation()
        teleop_smooth_move_to(teleop, {k: followers[k] for k in teleop.feedback_features}, duration_s=0.5, fps=30)

        def leaders_there() -> bool:
            return all(np.max(np.abs(_pose(bench, f"{s}_leader") - _side(followers, s))) < TOL_DEG for s in SIDES)

        wait_for(leaders_there, 10, "both leaders at their own follower's pose")
        teleop.disable_torque()
    finally:
        robot.disconnect()
        teleop.disconnect()
        for side, pose in zip(SIDES, (LEFT_POSE, RIGHT_POSE)):  # the next story's leaders
            bench.control({"cmd": "set_pose", "arm": f"{side}_leader", "pose_units": pose})


def test_status_shows_each_arm_its_links_and_its_joints(daemon: Daemon) -> None:
    from daemon.apps.commands.status import one_line

    with ControlClient(daemon.socket_path) as c:
        modes = {side: arm["mode"] for side, arm in c.request("status")["arms"].items()}
    shown = subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", "status", "--socket", str(daemon.socket_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    for side in SIDES:
        # its own mode (a line per arm under the loop's)
        assert any(line.split()[:2] == [side, modes[side]] for line in lines), shown.stdout
        # its two serial links, by their ports
        for role in ("leader", "follower"):
            row = next(line for line in lines if line.startswith(f"{side} {role}"))
            assert f"{side}_{role}" in row and " yes " in row, row
        # its joint table starts with the arm's name
        assert any(line.split()[:2] == [side, "shoulder_pan"] for line in lines), shown.stdout
    with ControlClient(daemon.socket_path) as c:
        line = one_line(c.request("status"))
    for side in SIDES:
        assert f"{side} {modes[side]}" in line and f"{side} max|leader-follower|" in line, line
