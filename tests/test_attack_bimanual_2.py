"""Attacks on a bimanual daemon's clients, from the outside, as users would make them.

The virtual bimanual bench (`so101d emulate --bimanual`, a subprocess: four emulated arms, the
leaders still) and the daemon in-process on the configuration docs/configuration.md shows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bimanual_support import LEFT_POSE, RIGHT_POSE, SIDES, still_bimanual_bench, tracking_daemon, write_bimanual_config
from support import wait_for

from calibration.conventions import JOINT_NAMES
from daemon.api.client import CommandFailed, ControlClient
from daemon.service.daemon import Daemon
from drivers.emulator.process import EmulatorProcess

pytestmark = pytest.mark.e2e  # the bimanual emulator as a user runs it, the daemon on its four ports


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    with still_bimanual_bench(tmp_path_factory.mktemp("attack-bi")) as ep:
        yield ep


@pytest.fixture(scope="module")
def daemon(bench: EmulatorProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("attack-bi-daemon")
    toml = write_bimanual_config(
        bench,
        d,
        f"""
[recording]
enabled = true
dataset_root = "{d / "datasets"}"
repo_id = "local/attack-bi"
fps = 30
task = "hand over"

[socket]
path = "{d / "control.sock"}"
""",
    )
    with tracking_daemon(toml) as daemon:
        yield daemon


def _follower(bench: EmulatorProcess, side: str) -> np.ndarray:
    return np.array(bench.control({"cmd": "snapshot", "arm": f"{side}_follower"})["pose_units"])


def _back_to_teleop(daemon: Daemon) -> None:
    with ControlClient(daemon.socket_path) as op:
        op.request("teleop.start")
    wait_for(lambda: all(a.state.mode == "teleop" for a in daemon.loop.arms), 20, "both arms tracking again")


def test_a_pair_action_with_nan_on_the_right_moves_neither_arm(daemon: Daemon, bench: EmulatorProcess) -> None:
    """A policy's NaN on one side of a pair action: the plugin says so and neither arm moves (the
    left's goal was sent before the right's was refused, so the left moved alone)."""
    from lerobot_robot_so101d import SO101D, SO101DConfig

    robot = SO101D(SO101DConfig(socket=str(daemon.socket_path), arm="pair"))
    robot.connect()
    try:
        with ControlClient(daemon.socket_path) as op:
            op.request("teleop.start")
        obs = robot.get_observation()
        robot.send_action({k: obs[k] for k in robot.action_features})  # both hold where they are
        before = {s: _follower(bench, s) for s in SIDES}
        action = {k: obs[k] for k in robot.action_features}
        action["left_shoulder_pan.pos"] += 15.0
        action["right_elbow_flex.pos"] = math.nan
        with pytest.raises(Exception) as refused:
            robot.send_action(action)
        # what a moving left arm would have done by now (the safe speed is many degrees a second)
        for _ in range(25):
            robot.get_observation()
            daemon.loop.call(lambda: None, timeout_s=2.0)
        for s in SIDES:
            moved = float(np.max(np.abs(_follower(bench, s) - before[s])))
            assert moved < 1.0, f"the {s} arm moved {moved:.1f} degrees on a pair action with NaN on the right"
        # said by the plugin, before anything was sent, naming the joint
        assert refused.type is ValueError and "right_elbow_flex.pos" in str(refused.value), refused.value
    finally:
        robot.disconnect()
        _back_to_teleop(daemon)


def test_one_arm_released_leaves_the_other_clients_arm_following_it(daemon: Daemon, bench: EmulatorProcess) -> None:
    """Two tools, one arm each (`--robot.arm=left`, `--robot.arm=right`): the left one's
    disconnect must not stop the right one's arm (a release held the whole loop)."""
    with ControlClient(daemon.socket_path) as a, ControlClient(daemon.socket_path) as b:
        left = a.request("arm.acquire", arm="left", client="tool A")["lease"]
        right = b.request("arm.acquire", arm="right", client="tool B")["lease"]
        a.request("teleop.start")
        here = _follower(bench, "right")
        goal = dict(zip(JOINT_NAMES, here.tolist()))
        b.request("arm.action", lease=right, **goal)
        a.request("arm.release", lease=left)
        goal["shoulder_pan"] += 10.0
        try:
            reply = b.request("arm.action", lease=right, **goal)
        except CommandFailed as exc:
            pytest.fail(f"tool A's release of the left arm stopped tool B's right arm: {exc}")
        assert reply["commanded"] is not None

        def there() -> bool:
            b.request("arm.action", lease=right, **goal)
            return abs(_follower(bench, "right")[0] - goal["shoulder_pan"]) < 2.5

        wait_for(there, 10, "the right arm at tool B's goal")
        b.request("arm.release", lease=right)
    _back_to_teleop(daemon)


def test_pair_feedback_with_nan_on_the_right_moves_neither_leader(daemon: Daemon, bench: EmulatorProcess) -> None:
    """LeRobot's handover feedback to a pair of leaders with a NaN on the right: neither leader is
    sent a goal (the left's went out before the right was refused)."""
    from lerobot_robot_so101d import SO101D, SO101DConfig, SO101DTeleop, SO101DTeleopConfig

    robot = SO101D(SO101DConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop = SO101DTeleop(SO101DTeleopConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop.connect()
    robot.connect()  # the followers lent first: driving a leader must not move its follower
    try:
        teleop.enable_torque()
        start = teleop.get_action()
        feedback = dict(start)
        feedback["left_shoulder_pan.pos"] += 15.0
        feedback["right_gripper.pos"] = math.nan
        with pytest.raises(ValueError, match="right_gripper.pos"):
            teleop.send_feedback(feedback)
        for _ in range(25):
            daemon.loop.call(lambda: None, timeout_s=2.0)
        left = np.array(bench.control({"cmd": "snapshot", "arm": "left_leader"})["pose_units"])
        assert abs(left[0] - LEFT_POSE[0]) < 1.0, f"the left leader moved to {left[0]:.1f} on a feedback with NaN"
        teleop.disable_torque()
    finally:
        robot.disconnect()
        teleop.disconnect()
        for side, pose in zip(SIDES, (LEFT_POSE, RIGHT_POSE)):
            bench.control({"cmd": "set_pose", "arm": f"{side}_leader", "pose_units": pose})
    _back_to_teleop(daemon)


def test_a_pair_client_killed_holding_both_arms_leaves_both_held_then_free(
    daemon: Daemon, bench: EmulatorProcess, tmp_path: Path
) -> None:
    """kill -9 of a LeRobot process driving the pair: both arms hold within the stale bound (no
    target any more), and the next pair connect takes both (the dead holder's leases freed)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from lerobot_robot_so101d import SO101D, SO101DConfig

    ready = tmp_path / "ready"
    child = f"""
import pathlib, time
from lerobot_robot_so101d import SO101D, SO101DConfig
robot = SO101D(SO101DConfig(socket={str(daemon.socket_path)!r}, arm="pair"))
robot.connect()
obs = robot.get_observation()
action = {{k: obs[k] for k in robot.action_features}}
pathlib.Path({str(ready)!r}).write_text("x")
while True:
    robot.send_action(action)
    time.sleep(1 / 30)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", child], env=env)
    try:
        wait_for(ready.exists, 60, "the pair client driving both arms")
        with ControlClient(daemon.socket_path) as op:
            op.request("teleop.start")
        wait_for(lambda: all(a.state.mode == "teleop" for a in daemon.loop.arms), 10, "both arms following the client")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed_at = time.monotonic()
        stale_s = daemon.cfg.safety.leader_stale_s
        wait_for(lambda: all(a.state.mode == "hold" for a in daemon.loop.arms), 10, "both arms holding")
        took_s = time.monotonic() - killed_at
        assert took_s < stale_s + 0.5, f"the arms held {took_s:.2f} s after the kill (stale bound {stale_s} s)"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    robot = SO101D(SO101DConfig(socket=str(daemon.socket_path), arm="pair"))
    robot.connect()  # the dead process's leases are freed to the next client
    try:
        assert daemon.loop.assignments() == {"left": "left_client", "right": "right_client"}
    finally:
        robot.disconnect()
    _back_to_teleop(daemon)


def test_the_left_follower_unplugged_mid_episode_is_named_in_the_tag_not_filled_later(
    daemon: Daemon, bench: EmulatorProcess
) -> None:
    """The left (primary) follower unplugged for a while mid-episode: as for the right arm, its
    newest values repeat and the tag says from which frame. The loop made no record at all while
    the primary arm was lost, so the recorder later filled the gap's frames, as late frames, with
    the values read after the follower came back, and the tag named nothing."""
    from daemon.data.schema import read_episode_tags

    rec = daemon.recorder
    assert rec is not None
    wait_for(lambda: rec.phase == "idle", 120, "the recorder ready")
    _back_to_teleop(daemon)
    with ControlClient(daemon.socket_path) as c:
        c.request("episode.start")
        wait_for(lambda: rec.frames_recorded >= 15, 30, "15 frames")
        bench.control({"cmd": "unplug", "arm": "left_follower"})
        left = next(a for a in daemon.loop.arms if a.name == "left")
        wait_for(lambda: not left.link.connected, 10, "the left follower gone")
        gone_at = daemon.loop.cycles
        wait_for(lambda: daemon.loop.cycles >= gone_at + 40, 10, "0.8 s of cycles without the left follower")
        bench.control({"cmd": "replug", "arm": "left_follower"})
        wait_for(lambda: left.link.connected, 30, "the left follower back")
        at = rec.frames_recorded
        wait_for(lambda: rec.frames_recorded >= at + 15, 30, "15 frames more")
        c.request("episode.save", success=True)
    assert rec.wait_saved(90), rec.status()
    wait_for(lambda: rec.status()["episodes_in_dataset"] >= 1, 60, "the episode committed")
    tag = list(read_episode_tags(Path(rec.status()["dataset"])).values())[-1]
    assert any(n.startswith("left arm: pose not current from frame") for n in tag.notes), tag.notes
    _back_to_teleop(daemon)


def test_after_the_pair_robot_disconnects_the_leaders_can_still_be_driven(daemon: Daemon) -> None:
    """LeRobot's loops end with robot.disconnect() before teleop.disconnect(): the arms released
    hold (each alone), they follow no leader, so a leader drive may start and go on meanwhile."""
    from lerobot_robot_so101d import SO101D, SO101DConfig, SO101DTeleop, SO101DTeleopConfig

    robot = SO101D(SO101DConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop = SO101DTeleop(SO101DTeleopConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop.connect()
    robot.connect()
    robot.disconnect()
    try:
        assert all(a.released_hold for a in daemon.loop.arms)
        wait_for(lambda: all(a.state.mode == "hold" for a in daemon.loop.arms), 5, "both arms holding, released")
        teleop.enable_torque()  # both leaders: no arm follows them
        teleop.send_feedback(teleop.get_action())
        teleop.disable_torque()
    finally:
        teleop.disconnect()
    _back_to_teleop(daemon)


def test_an_action_for_the_left_arm_held_while_the_right_follower_is_gone_is_refused(
    daemon: Daemon, bench: EmulatorProcess
) -> None:
    """`--robot.arm=left` on a bimanual rig, the right follower unplugged: the loop holds the left
    arm too (fault_holds = "all"), so its actions are refused with why, not answered with a
    command the loop never sends (and the arm stays where it is)."""
    with ControlClient(daemon.socket_path) as c:
        lease = c.request("arm.acquire", arm="left", client="tool A")["lease"]
        c.request("teleop.start")
        here = _follower(bench, "left")
        goal = dict(zip(JOINT_NAMES, here.tolist()))
        c.request("arm.action", lease=lease, **goal)
        bench.control({"cmd": "unplug", "arm": "right_follower"})
        right = next(a for a in daemon.loop.arms if a.name == "right")
        try:
            wait_for(lambda: not right.link.connected, 10, "the right follower gone")
            goal["shoulder_pan"] += 10.0
            with pytest.raises(CommandFailed, match="right not connected"):
                c.request("arm.action", lease=lease, **goal)
            assert abs(_follower(bench, "left")[0] - here[0]) < 1.0
        finally:
            bench.control({"cmd": "replug", "arm": "right_follower"})
        wait_for(lambda: right.link.connected, 30, "the right follower back")
        c.request("arm.release", lease=lease)
    _back_to_teleop(daemon)


@pytest.mark.unit
def test_calibrate_with_a_config_but_no_arm_is_refused_not_ignored(tmp_path: Path) -> None:
    """`so101d calibrate follower --config rig.toml` (the side forgotten): the configuration was
    ignored and the port guessed (/dev/so101-follower, or the only adapter: maybe the other side's
    arm), its file saved under the single-arm id. Refused, naming --arm, before any port opens."""
    import subprocess
    import sys

    rig = tmp_path / "so101d.toml"
    rig.write_text(
        '[arms.left]\nleader_port = "/tmp/nope-ll"\nfollower_port = "/tmp/nope-lf"\n'
        '[arms.right]\nleader_port = "/tmp/nope-rl"\nfollower_port = "/tmp/nope-rf"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", "calibrate", "follower", "--config", str(rig), "--verify"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--arm left or --arm right" in done.stderr, done.stderr


def test_the_pair_teleop_refuses_an_unplugged_left_leaders_last_reading(daemon: Daemon, bench: EmulatorProcess) -> None:
    """The left leader unplugged: the pair's get_action raises naming the left leader, rather than
    handing LeRobot its frozen last reading beside the right's live one."""
    from lerobot.utils.errors import DeviceNotConnectedError
    from lerobot_robot_so101d import SO101DTeleop, SO101DTeleopConfig

    teleop = SO101DTeleop(SO101DTeleopConfig(socket=str(daemon.socket_path), arm="pair"))
    teleop.connect()
    try:
        teleop.get_action()
        bench.control({"cmd": "unplug", "arm": "left_leader"})
        try:
            left = daemon.loop.leaders["left_leader"]
            wait_for(lambda: not left.link.connected, 10, "the left leader gone")
            with pytest.raises(DeviceNotConnectedError, match="left leader"):
                wait_for(lambda: teleop.get_action() is None, 5, "a refusal")
        finally:
            bench.control({"cmd": "replug", "arm": "left_leader"})
        wait_for(lambda: left.link.connected, 30, "the left leader back")
    finally:
        teleop.disconnect()
    _back_to_teleop(daemon)
