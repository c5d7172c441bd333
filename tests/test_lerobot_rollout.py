"""LeRobot's `lerobot-rollout --strategy.type=dagger`, unmodified, on the daemon's arms through the
so101d plugin: a tiny ACT drives the follower, the operator pauses it (LeRobot's smooth handover
drives the leader to the follower through the daemon: the so101d teleoperator is actuated),
corrects with the leader, hands back to the policy and stops, all with the keys LeRobot's dagger
documents (space, tab, Esc), typed into the terminal lerobot-rollout runs in. The dataset LeRobot wrote loads in
LeRobotDataset with its ``intervention`` column True exactly on the correction frames, and every
goal the daemon wrote to the follower's servos kept to the safety layer's step limit.

How the keys get in, headless: LeRobot's dagger takes its events from a keyboard or a foot pedal
(``lerobot/rollout/strategies/dagger.py``: ``_init_dagger_keyboard`` -> ``create_key_listener``,
``_init_dagger_pedal`` -> ``start_pedal_listener``). ``create_key_listener``
(``lerobot/utils/keyboard_input.py``) uses pynput only on a real X11 session, and otherwise,
when stdin is a TTY, its ``TerminalKeyListener``, which reads the keys from the terminal in
cbreak mode (what a user gets over SSH). So lerobot-rollout runs here on a pseudo-terminal, and
the test types into it. The pedal needs evdev and an input device; neither is here.

Real parts: `so101d run` in its own process on the virtual bench, lerobot-rollout in its own, a
LeRobot ACT checkpoint (daemon/policy/tiny.py: LeRobot's own training and save_pretrained).
"""

from __future__ import annotations

import os
import pty
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from lerobot_plugin_support import BIN, CAM_H, CAM_W, lerobot_env, require_plugin, start_daemon, stop_process
from recording_support import train_tiny_act, wait_until
from support import wait_status
from virtual_bench_support import VirtualBench, open_virtual_bench

from calibration.conventions import JOINT_NAMES
from daemon.api.client import ControlClient
from daemon.policy.tiny import make_synthetic_dataset
from drivers.emulator.servo import ADDR_GOAL_POSITION, EmulatedServo

# the step limit under test; at least two periods of the bench's alignment speed (180 deg/s, 100 Hz:
# 1.8 deg a period), since alignment moves by time and a late cycle may take two periods' worth
MAX_STEP_DEG = 5.0
MAX_STEP_GRIPPER_PCT = 10.0
# where the operator holds the leader during the correction: away from anything the tiny policy
# outputs, so a frame's action says whose it is
LEADER_POSE = np.array([25.0, -10.0, 20.0, -35.0, 30.0, 80.0])


@dataclass
class GoalSpy:
    """Every goal the daemon writes to the follower's servos, as the servos take it, with where
    the servo was then (ticks): per servo, rows of (goal, present)."""

    goals: list[list[tuple[int, int]]] = field(default_factory=list)

    def attach(self, servos: list[EmulatedServo]) -> None:
        for index, servo in enumerate(servos):
            self.goals.append([])
            write = servo.write

            def spy(address: int, data: bytes, now: float | None = None, *, _w=write, _s=servo, _i=index) -> None:
                _w(address, data, now)
                if address <= ADDR_GOAL_POSITION < address + len(data):
                    self.goals[_i].append((_s.goal_ticks(), _s.present_ticks()))

            servo.write = spy  # type: ignore[method-assign]


@dataclass
class Running:
    bench: VirtualBench
    daemon: subprocess.Popen[bytes]
    spy: GoalSpy

    @property
    def sock(self) -> Path:
        return self.bench.socket_path


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    require_plugin()
    with open_virtual_bench() as bench:
        spy = GoalSpy()
        spy.attach(bench.follower.servos)
        daemon = start_daemon(bench, f"max_step_deg = {MAX_STEP_DEG}\nmax_step_gripper_pct = {MAX_STEP_GRIPPER_PCT}\n")
        try:
            yield Running(bench, daemon, spy)
        finally:
            stop_process(daemon)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`lerobot-train`'s own ACT checkpoint (tiny, two CPU steps) on a dataset with the daemon's
    camera by name and size."""
    work = tmp_path_factory.mktemp("dagger_policy")
    make_synthetic_dataset(work / "dataset", {"front": (CAM_H, CAM_W)}, repo_id="local/synthetic")
    train_tiny_act("local/synthetic", work / "dataset", work / "train", 2, 2, "--dataset.video_backend=pyav", save=True)
    ckpt = work / "train" / "checkpoints" / "last" / "pretrained_model"
    assert (ckpt / "model.safetensors").exists(), sorted(p.name for p in (work / "train").rglob("*"))
    return ckpt


class Rollout:
    """lerobot-rollout on a pseudo-terminal: its log in a file, keys typed into its terminal."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log_path = log
        master, slave = pty.openpty()
        self._master = master
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "lerobot-rollout"), *args],
                stdin=slave,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=lerobot_env(),
            )
        os.close(slave)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout_s: float = 300.0, after: int = 0) -> int:
        """Wait for ``text`` in the log past offset ``after``; its offset."""

        def seen() -> bool:
            if self.proc.poll() is not None and text not in self.log()[after:]:
                raise AssertionError(f"lerobot-rollout exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            return text in self.log()[after:]

        assert wait_until(seen, timeout_s), f"no {text!r} in lerobot-rollout's log:\n{self.log()[-4000:]}"
        return self.log().index(text, after)

    def type(self, keys: bytes) -> None:
        os.write(self._master, keys)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        os.close(self._master)


def _cycle(sock: Path) -> int:
    with ControlClient(sock) as c:
        return int(c.request("arm.observe")["cycle"])


def _wait_command(sock: Path, pred, what: str) -> None:
    """Wait until the follower's command (what the daemon's safety layer sends) satisfies ``pred``."""

    def command() -> np.ndarray:
        with ControlClient(sock) as c:
            cmd = c.request("arm.observe")["command"]
        return np.array([cmd[j] for j in JOINT_NAMES])

    assert wait_until(lambda: pred(command()), 120), f"the follower's command never {what}: {command()}"


def at_leader(cmd: np.ndarray) -> bool:
    return bool(np.all(np.abs(cmd - LEADER_POSE) <= 1.0))


def _wait_cycles(sock: Path, n: int) -> None:
    """Let the daemon's loop run ``n`` more cycles (at 100 Hz: n / 100 s of rollout)."""
    start = _cycle(sock)
    assert wait_until(lambda: _cycle(sock) >= start + n, 60), "the daemon's loop stopped"


def _rollout_args(sock: Path, checkpoint: Path, root: Path, *strategy: str) -> list[str]:
    return [
        "--strategy.type=dagger",
        *strategy,
        f"--policy.path={checkpoint}",
        "--policy.device=cpu",
        "--robot.type=so101d",
        f"--robot.socket={sock}",
        "--robot.daemon_cameras=[front]",
        "--teleop.type=so101d",
        f"--teleop.socket={sock}",
        "--dataset.repo_id=local/rollout_dagger",
        f"--dataset.root={root}",
        "--dataset.single_task=pick the cube",
        "--dataset.push_to_hub=false",
        "--dataset.video=false",
        "--fps=30",
        "--play_sounds=false",
    ]


def _leader_pose(sock: Path) -> np.ndarray:
    with ControlClient(sock) as c:
        leader = c.request("arm.observe")["leader"]
    return np.array([leader[j] for j in JOINT_NAMES])


def _handover_then_hand(running: Running, rollout: Rollout, at: int) -> tuple[int, np.ndarray]:
    """After the pause: LeRobot's handover drives the leader to the follower (torque on, through
    the daemon); after tab, torque off, and the operator's hand moves the leader to LEADER_POSE.
    Returns the log offset and where the handover left the leader."""
    sock, leader = running.sock, running.bench.leader
    at = rollout.wait_log("Smooth handover: moving leader arm to follower position", 30, at)
    assert wait_until(lambda: all(s.torque_enabled for s in leader.servos), 30), "the leader's torque never came on"
    # the leader leaves the operator's pose for the follower's (the policy's last action)
    assert wait_until(lambda: not at_leader(_leader_pose(sock)), 30), "the handover never moved the leader"
    rollout.type(b"\t")  # correct: torque off, the operator takes the leader
    at = rollout.wait_log("Phase transition: paused -> correcting", 30, at)
    assert wait_until(lambda: not any(s.torque_enabled for s in leader.servos), 30), "the leader stayed stiff"
    handover = _leader_pose(sock)
    leader.set_pose_units(LEADER_POSE)  # by hand
    _wait_command(sock, at_leader, "reached the leader")  # the follower follows the correction
    return at, handover


def _operator_starts(sock: Path) -> None:
    """The operator's `so101d teleop start`, the leader held at LEADER_POSE: the follower there."""
    with ControlClient(sock) as c:
        c.request("teleop.start")  # the leader drives, any fault cleared
    wait_status(sock, lambda st: st["mode"] == "teleop", timeout_s=30)
    _wait_command(sock, at_leader, "reached the leader")


def test_dagger_records_policy_frames_and_the_operators_correction(
    running: Running, checkpoint: Path, tmp_path: Path
) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    sock = running.sock
    running.bench.leader.set_pose_units(LEADER_POSE)
    _operator_starts(sock)
    goals_before = [len(g) for g in running.spy.goals]
    root = tmp_path / "ds"
    rollout = Rollout(
        _rollout_args(sock, checkpoint, root, "--strategy.record_autonomous=true"), tmp_path / "rollout.log"
    )
    try:
        rollout.wait_log("Using terminal keyboard input")
        at = rollout.wait_log("DAgger continuous recording started")
        _wait_command(sock, lambda cmd: not at_leader(cmd), "left the leader's pose")  # the policy drives
        _wait_cycles(sock, 200)  # for two seconds
        rollout.type(b" ")  # pause: the arm holds the policy's last action, the leader comes to it
        at = rollout.wait_log("Phase transition: autonomous -> paused", 30, at)
        at, handover = _handover_then_hand(running, rollout, at)
        _wait_cycles(sock, 200)  # two seconds of it
        rollout.type(b"\t")  # the correction ends
        at = rollout.wait_log("Phase transition: correcting -> paused", 30, at)
        rollout.type(b" ")  # back to the policy
        at = rollout.wait_log("Phase transition: paused -> autonomous", 30, at)
        _wait_command(sock, lambda cmd: not at_leader(cmd), "left the leader's pose")
        _wait_cycles(sock, 200)
        rollout.type(b"\x1b")  # Esc: stop the session
        rollout.wait_log("Rollout finished", 120, at)
        assert rollout.proc.wait(60) == 0, rollout.log()[-4000:]
    finally:
        rollout.close()
    # LeRobot's teardown took the follower back to where it started, and gave the arm back: it holds
    with ControlClient(sock) as c:
        obs = c.request("arm.observe")
    assert obs["holder"] is None and obs["mode"] == "hold", obs
    assert at_leader(np.array([obs["command"][j] for j in JOINT_NAMES])), obs["command"]

    ds = LeRobotDataset("local/rollout_dagger", root=root)
    feat = ds.meta.features["intervention"]
    assert feat["dtype"] == "bool" and tuple(feat["shape"]) == (1,), feat
    assert ds.meta.robot_type == "so_follower"
    flags = np.array([bool(np.asarray(ds[i]["intervention"]).reshape(-1)[0]) for i in range(len(ds))])
    actions = np.stack([np.asarray(ds[i]["action"]) for i in range(len(ds))])
    # policy frames, then the correction's, then the policy's again (paused frames are not recorded)
    changes = np.flatnonzero(np.diff(flags.astype(int)))
    assert len(changes) == 2 and not flags[0] and not flags[-1], flags.astype(int).tolist()
    first, last = changes[0] + 1, changes[1]  # the correction: frames first..last
    # two seconds of each (60 frames at 30 fps); loose: a loaded 2-core machine runs the loop slower
    assert first >= 5 and last - first + 1 >= 5 and len(flags) - last - 1 >= 5, (first, last, len(flags))
    # a correction frame's action is the operator's leader (where the handover left it, then where
    # the hand put it); no policy frame's is
    is_leader = np.all(np.abs(actions - LEADER_POSE) <= 1.5, axis=1)
    assert not is_leader[~flags].any(), np.flatnonzero(is_leader & ~flags).tolist()
    handed = np.all(np.abs(actions - handover) <= 1.5, axis=1)
    assert np.all(is_leader[flags] | handed[flags]), np.flatnonzero(flags & ~(is_leader | handed)).tolist()
    assert is_leader[last] and is_leader[flags].sum() >= 5, (first, last)

    # every goal the daemon wrote during the rollout, write by write, kept to the safety layer's
    # step: within the step limit of the goal before it, or of where the servo was (an alignment
    # or a hold starts from the measured pose; a servo moves on a little between the daemon's read
    # and its write, hence the tick of slack and 1 degree for that one)
    cal = running.bench.follower.reference
    moved_ticks: dict[str, float] = {}
    for index, joint in enumerate(JOINT_NAMES):
        rows = np.array(running.spy.goals[index][goals_before[index] :], dtype=float)
        assert len(rows) > 300, (joint, len(rows))
        goal, present = rows[:, 0], rows[:, 1]
        if joint == "gripper":
            limit_ticks = MAX_STEP_GRIPPER_PCT / 100.0 * (cal[joint].range_max - cal[joint].range_min)
        else:
            limit_ticks = MAX_STEP_DEG / 360.0 * 4095
        from_goal = np.abs(np.diff(goal))
        from_arm = np.abs(goal[1:] - present[1:])
        bad = np.flatnonzero((from_goal > limit_ticks + 1) & (from_arm > limit_ticks + 4095 / 360))
        assert len(bad) == 0, (joint, limit_ticks, [(from_goal[i], from_arm[i]) for i in bad[:5]])
        moved_ticks[joint] = float(goal.max() - goal.min())
    # and they moved the arm: the policy's pose and the leader's are ~56 degrees apart at the shoulder
    assert moved_ticks["shoulder_lift"] > 30.0 / 360.0 * 4095, moved_ticks


def test_dagger_by_default_records_only_the_correction_and_ends_after_the_episodes_asked(
    running: Running, checkpoint: Path, tmp_path: Path
) -> None:
    """LeRobot's default dagger (record_autonomous false): the policy's frames are not recorded, a
    correction is one episode, and the session ends by itself after --strategy.num_episodes."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    sock = running.sock
    running.bench.leader.set_pose_units(LEADER_POSE)
    _operator_starts(sock)
    root = tmp_path / "ds"
    rollout = Rollout(_rollout_args(sock, checkpoint, root, "--strategy.num_episodes=1"), tmp_path / "rollout.log")
    try:
        rollout.wait_log("Using terminal keyboard input")
        at = rollout.wait_log("DAgger corrections-only recording started")
        _wait_command(sock, lambda cmd: not at_leader(cmd), "left the leader's pose")  # the policy drives
        rollout.type(b" ")
        at = rollout.wait_log("Phase transition: autonomous -> paused", 30, at)
        at, handover = _handover_then_hand(running, rollout, at)
        _wait_cycles(sock, 200)
        rollout.type(b"\t")  # the correction ends: saved as the one episode asked, and the session ends
        at = rollout.wait_log("Correction 1/1 saved", 60, at)
        rollout.wait_log("Rollout finished", 120, at)
        assert rollout.proc.wait(60) == 0, rollout.log()[-4000:]
    finally:
        rollout.close()
    ds = LeRobotDataset("local/rollout_dagger", root=root)
    assert ds.meta.total_episodes == 1 and len(ds) >= 5, (ds.meta.total_episodes, len(ds))
    flags = np.array([bool(np.asarray(ds[i]["intervention"]).reshape(-1)[0]) for i in range(len(ds))])
    actions = np.stack([np.asarray(ds[i]["action"]) for i in range(len(ds))])
    assert flags.all(), flags.astype(int).tolist()
    at_hand = np.all(np.abs(actions - LEADER_POSE) <= 1.5, axis=1)
    at_handover = np.all(np.abs(actions - handover) <= 1.5, axis=1)
    assert np.all(at_hand | at_handover) and at_hand[-1], actions
