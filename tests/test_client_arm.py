"""An outside client drives the follower over the control socket (what the LeRobot plugin does):
acquire, actions through the safety layer, observations, a second client refused naming the
holder, the operator's hold refusing actions with its reason, a silent client noticed within the
stale bound, a client killed while holding the arm freeing it, release holding the arm; a client
acquiring an arm the operator holds gets it still, and it moves only after the operator's
``teleop start``; a client flooding actions as fast as it can leaves the loop at its rate.

Real parts: the daemon in-process on our Feetech driver over two emulated buses, the real socket
and client; the cycle is not touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from lerobot.utils.errors import DeviceNotConnectedError
from support import still_arm_on_pty, wait_for

from calibration.conventions import JOINT_NAMES
from daemon.api.client import CommandFailed, ControlClient
from daemon.api.messages import ArmActionReply, ArmLeaseReply, ArmObservation, CameraShareReply
from daemon.config.settings import config_from_dict
from daemon.service.client_arm import Lease
from daemon.service.daemon import Daemon
from daemon.service.frame_shares import new_share
from daemon.system.processes import start_ticks
from drivers.emulator import BusEmulator, reference_calibration
from drivers.emulator.arm import EmulatedArm
from drivers.feetech_arm import FeetechFollower, FeetechLeader
from drivers.frame_shm import FrameShareReader

POSE_A = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])
POSE_B = np.array([20.0, -45.0, 50.0, 30.0, 10.0, 45.0])
TOL_DEG = 2.0
_BUSES: dict[str, BusEmulator] = {}  # the module daemon's emulated buses, for the unplug story
_ARMS: dict[str, EmulatedArm] = {}  # ... and its emulated arms (the leader's torque)


def _action(pose: np.ndarray) -> dict[str, float]:
    return {j: float(v) for j, v in zip(JOINT_NAMES, pose)}


def _pose(joints: dict[str, float] | None) -> np.ndarray:
    assert joints is not None
    return np.array([joints[j] for j in JOINT_NAMES])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("client-arm")
    parts = [still_arm_on_pty(tmp / role, role, POSE_A) for role in ("leader", "follower")]
    cfg = config_from_dict(
        {
            "socket": {"path": str(tmp / "c.sock")},
            "safety": {"align_speed_deg_s": 180.0, "align_gripper_speed_pct_s": 180.0},
            "cameras": {"front": {"kind": "virtual", "width": 64, "height": 48, "fps": 30}},
        }
    )
    d = Daemon(
        cfg,
        FeetechLeader(str(tmp / "leader"), reference_calibration("leader")),
        FeetechFollower(str(tmp / "follower"), reference_calibration("follower")),
    )
    d.start()
    _BUSES.update({role: bus for role, (_arm, bus) in zip(("leader", "follower"), parts)})
    _ARMS.update({role: arm for role, (arm, _bus) in zip(("leader", "follower"), parts)})
    try:
        wait_for(lambda: d.loop.state.mode == "teleop", 60, "teleop")
        yield d
    finally:
        d.stop()
        for _arm, bus in parts:
            bus.stop()


def _operator_resumes(daemon: Daemon) -> None:
    """The operator's `so101d teleop start` (a story before may have left the arm held)."""
    with ControlClient(daemon.socket_path) as op:
        op.request("teleop.start")
    wait_for(lambda: daemon.loop.intent == "teleop", 5, "teleop")


def test_a_client_drives_the_arm_through_safety_and_gives_it_back(daemon: Daemon) -> None:
    path = daemon.socket_path
    with ControlClient(path) as c, ControlClient(path) as other:
        lease = c.request_as(ArmLeaseReply, "arm.acquire", client="test client", pid=os.getpid()).lease
        assert lease
        # the second client is refused, naming the holder
        with pytest.raises(CommandFailed, match=rf"held by test client \(pid {os.getpid()}\)"):
            other.request("arm.acquire", client="intruder")
        assert daemon.loop.assignments()["follower"] == "client"
        # far away: the first command is the safety layer's alignment step, not the target
        first = c.request_as(ArmActionReply, "arm.action", lease=lease, **_action(POSE_B))
        step = np.abs(_pose(first.commanded) - POSE_A)
        assert step.max() < 10.0, f"the first command jumped: {first.commanded}"

        def arrived() -> bool:
            c.request("arm.action", lease=lease, **_action(POSE_B))
            obs = c.request_as(ArmObservation, "arm.observe")
            return obs.follower is not None and bool(np.all(np.abs(_pose(obs.follower) - POSE_B) < TOL_DEG))

        wait_for(arrived, 20, "the follower at the client's target")
        obs = c.request_as(ArmObservation, "arm.observe")
        assert obs.source == "client" and obs.holder is not None and "test client" in obs.holder
        assert obs.leader is not None and np.allclose(_pose(obs.leader), POSE_A, atol=TOL_DEG)
        # an action missing a joint, or an unknown lease, is refused and moves nothing
        with pytest.raises(CommandFailed, match="missing gripper"):
            c.request("arm.action", lease=lease, **{k: v for k, v in _action(POSE_B).items() if k != "gripper"})
        with pytest.raises(CommandFailed, match="not current"):
            c.request("arm.action", lease="0" * 32, **_action(POSE_A))
        # the operator holds: the action is refused with the daemon's reason
        other.request("hold")
        with pytest.raises(CommandFailed, match=r"operator's hold \(hold: hold requested\)"):
            c.request("arm.action", lease=lease, **_action(POSE_A))
        released = c.request_as(ArmLeaseReply, "arm.release", lease=lease)
        assert "holding" in released.message
        assert daemon.loop.assignments()["follower"] == "leader"
        wait_for(lambda: daemon.loop.state.mode == "hold", 5, "hold after release")
        held = _pose(c.request_as(ArmObservation, "arm.observe").follower)
        assert np.allclose(held, POSE_B, atol=TOL_DEG), "the arm did not stay where the client left it"
        # the lease is spent
        with pytest.raises(CommandFailed, match="not current"):
            c.request("arm.action", lease=lease, **_action(POSE_A))


def _settled_follower(daemon: Daemon, op: ControlClient) -> np.ndarray:
    """The follower's pose once two observations ten cycles apart agree (it has stopped moving)."""
    last = [_pose(op.request_as(ArmObservation, "arm.observe").follower)]

    def still() -> bool:
        daemon.loop.wait_cycles(10)
        now = _pose(op.request_as(ArmObservation, "arm.observe").follower)
        moved = float(np.max(np.abs(now - last[0])))
        last[0] = now
        return moved < 0.1

    wait_for(still, 10, "the held follower at rest")
    return last[0]


def test_a_client_acquiring_a_held_arm_gets_it_still_until_the_operator_resumes(daemon: Daemon) -> None:
    """The operator's hold is the operator's: LeRobot's connect() gets the arm, but it stays where
    it is and send_action raises naming the hold and the resume; after the operator's `so101d
    teleop start` the arm follows LeRobot's actions, and at disconnect the leader has it back."""
    from lerobot_robot_so101d import SO101D, SO101DConfig
    from lerobot_robot_so101d.daemon_link import DaemonRefused

    path = daemon.socket_path
    with ControlClient(path) as op:
        op.request("teleop.stop")
        wait_for(lambda: daemon.loop.state.mode == "hold", 5, "the operator's hold")
        # the previous story may leave the follower still travelling to its last goal: let it arrive
        before = _settled_follower(daemon, op)
        robot = SO101D(SO101DConfig(socket=str(path)))
        robot.connect()
        try:
            assert daemon.loop.assignments()["follower"] == "client"
            assert daemon.loop.intent == "hold", "acquiring took the operator's hold away"
            far = before + np.array([15.0, 10.0, -10.0, 10.0, 10.0, 15.0])
            goal = {f"{j}.pos": float(v) for j, v in zip(JOINT_NAMES, far)}
            with pytest.raises(DaemonRefused, match=r"operator's hold \(hold: hold requested\).*so101d teleop start"):
                robot.send_action(goal)
            daemon.loop.wait_cycles(20)
            here = np.array([robot.get_observation()[f"{j}.pos"] for j in JOINT_NAMES])
            assert np.allclose(here, before, atol=0.5), f"the held arm moved on acquire: {here} from {before}"
            assert daemon.loop.state.mode == "hold"
            # the operator resumes: the arm, still lent, follows LeRobot's actions
            assert "follower follows its source 'client'" in op.request("teleop.start")["message"]

            def arrived() -> bool:
                robot.send_action(goal)
                now = np.array([robot.get_observation()[f"{j}.pos"] for j in JOINT_NAMES])
                return bool(np.all(np.abs(now - far) < TOL_DEG))

            wait_for(arrived, 20, "the follower at LeRobot's target after teleop start")
            assert daemon.loop.assignments()["follower"] == "client"
        finally:
            robot.disconnect()
    assert daemon.loop.assignments()["follower"] == "leader"


FLOOD_ACTIONS = 200
_FLOODER = """
import json, socket, sys, threading
path, line, n = sys.argv[1], (sys.argv[2] + "\\n").encode(), int(sys.argv[3])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
print("ready", flush=True)
sys.stdin.readline()
# pipelined: every action written at once, the replies read as they come
writer = threading.Thread(target=lambda: [s.sendall(line) for _ in range(n)])
writer.start()
replies = s.makefile("rb")
ok, errors = 0, []
for _ in range(n):
    reply = json.loads(replies.readline())
    ok += bool(reply["ok"])
    if not reply["ok"] and len(errors) < 3:
        errors.append(reply["error"])
writer.join()
print(json.dumps({"ok": ok, "errors": errors}), flush=True)
"""


def test_a_client_flooding_actions_leaves_the_loop_at_its_rate(daemon: Daemon) -> None:
    """A client pipelining actions as fast as it can (its own process) is served at most at twice
    the loop's rate, and the loop keeps its configured rate meanwhile: before, the socket thread
    serving the flood kept the GIL from the loop and a 100 Hz loop ran ~40 cycles/s."""
    _operator_resumes(daemon)
    with ControlClient(daemon.socket_path) as c:
        lease = c.request_as(ArmLeaseReply, "arm.acquire", client="flood", pid=os.getpid()).lease
        here = _pose(c.request_as(ArmObservation, "arm.observe").follower)
        line = json.dumps({"cmd": "arm.action", "lease": lease, **_action(here)})
        child = subprocess.Popen(
            [sys.executable, "-c", _FLOODER, str(daemon.socket_path), line, str(FLOOD_ACTIONS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert child.stdin is not None and child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            cycles0, t0 = daemon.loop.cycles, time.monotonic()
            child.stdin.write("go\n")
            child.stdin.flush()
            result = json.loads(child.stdout.readline())
            cycles, wall_s = daemon.loop.cycles - cycles0, time.monotonic() - t0
            child.wait(10)
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(10)
        c.request("arm.release", lease=lease)
    assert result["ok"] == FLOOD_ACTIONS, result
    rate_cycles = daemon.cfg.control.rate_hz * wall_s
    words = (
        f"{cycles} cycles during {FLOOD_ACTIONS} actions in {wall_s:.2f} s ({rate_cycles:.0f} at the configured rate)"
    )
    # the flood was served at most at twice the loop's rate (the loop follows one target a cycle) ...
    assert 2 * rate_cycles >= FLOOD_ACTIONS - 1, words
    # ... and the loop kept its rate meanwhile (generous: a loaded 2-core machine slows it too)
    assert cycles >= 0.5 * rate_cycles, words


def test_a_silent_client_is_noticed_and_a_killed_one_frees_the_arm(daemon: Daemon, tmp_path: Path) -> None:
    path = daemon.socket_path
    _operator_resumes(daemon)
    # a client in its own process: acquires, sends one action, then stops sending and is killed
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "from daemon.api.client import ControlClient\n"
            "c = ControlClient(sys.argv[1]).connect()\n"
            "r = c.request('arm.acquire', client='doomed', pid=os.getpid())\n"
            "o = c.request('arm.observe')['follower']\n"
            "c.request('arm.action', lease=r['lease'], **o)\n"
            "print('sent', flush=True)\n"
            "time.sleep(600)\n",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "sent"
        # it stopped sending: within the stale bound the arm holds, saying why
        wait_for(lambda: daemon.loop.state.reason == "client stale", 5, "hold on a silent client")
        with ControlClient(path) as c:
            with pytest.raises(CommandFailed, match="held by doomed"):
                c.request("arm.acquire", client="next")
            os.killpg(child.pid, signal.SIGKILL)  # the power-cut way: no release
            child.wait(10)
            lease = c.request_as(ArmLeaseReply, "arm.acquire", client="next", pid=os.getpid()).lease
            assert lease
            c.request("arm.release", lease=lease)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)


@pytest.mark.parametrize("pid_words", ["pid=1", "pid=None"], ids=["lying-pid", "no-pid"])
def test_a_killed_client_frees_the_arm_whatever_pid_it_claimed(daemon: Daemon, pid_words: str) -> None:
    """The holder is the process on the socket (the kernel says which), not the pid a request
    names: a client claiming pid 1 (alive for ever), or none, and then killed, frees the arm."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from daemon.api.client import ControlClient\n"
            "c = ControlClient(sys.argv[1]).connect()\n"
            f"c.request('arm.acquire', client='liar', {pid_words})\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n",
            str(daemon.socket_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with ControlClient(daemon.socket_path) as c:
            with pytest.raises(CommandFailed, match=rf"held by liar \(pid {child.pid}\)"):
                c.request("arm.acquire", client="next", pid=os.getpid())
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
            lease = c.request_as(ArmLeaseReply, "arm.acquire", client="next", pid=os.getpid()).lease
            assert lease
            c.request("arm.release", lease=lease)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)


def test_a_reused_pid_is_not_the_holder() -> None:
    """A holder's pid taken by a new process (pid reuse) is not the holder alive."""
    me = os.getpid()
    started = start_ticks(me)
    assert started is not None
    assert Lease("follower", "t", "c", me, 0.0, started).alive()
    assert not Lease("follower", "t", "c", me, 0.0, started + 1).alive()


def test_a_camera_shared_in_memory_gives_the_client_its_newest_frames(daemon: Daemon) -> None:
    with ControlClient(daemon.socket_path) as c:
        with pytest.raises(CommandFailed, match="no camera named 'side'"):
            c.request("camera.share", camera="side")
        share = c.request_as(CameraShareReply, "camera.share", camera="front")
        assert (share.width, share.height) == (64, 48)
        reader = FrameShareReader(share.path)
        try:
            wait_for(lambda: reader.latest() is not None, 10, "a first shared frame")
            first = reader.latest()
            assert first is not None and first.pixels.shape == (48, 64, 3) and first.pixels.dtype == np.uint8
            # the observation names the newest frame in the share; frames keep coming
            wait_for(lambda: c.request("arm.observe")["frames"].get("front", -1) > first.seq, 10, "newer frames")
            newer = reader.latest()
            assert newer is not None and newer.seq > first.seq
            cam = next(x for x in daemon.context.cameras.built() if x.name == "front")
            live = cam.latest_frame()
            assert live is not None and live.seq >= newer.seq
        finally:
            reader.close()
    # a second share of the same camera is the same memory (one copy per frame, whoever reads)
    with ControlClient(daemon.socket_path) as c:
        assert c.request("camera.share", camera="front")["path"] == share.path


def test_the_plugin_refuses_a_frozen_camera_frame(daemon: Daemon) -> None:
    """A daemon camera that stops delivering (unplugged, hung) gives the plugin's get_observation
    LeRobot's TimeoutError, as so101_follower's cameras do, not the last frame for ever."""
    from lerobot_robot_so101d import SO101D, SO101DConfig

    robot = SO101D(SO101DConfig(socket=str(daemon.socket_path), daemon_cameras=["front"]))
    robot.connect()
    cam = next(x for x in daemon.context.cameras.built() if x.name == "front")
    try:
        assert robot.get_observation()["front"].shape == (48, 64, 3)
        cam.stop()  # no frame comes any more; the share keeps the last one
        _wait_refused(robot.get_observation, TimeoutError, ("front", "ms old"), "the plugin refusing the frozen frame")
    finally:
        cam.start()
        robot.disconnect()


def _wait_refused(call: Callable[[], object], error: type[Exception], words: tuple[str, ...], what: str) -> None:
    """Until ``call`` raises ``error`` (its message naming each of ``words``) instead of answering."""

    def refused() -> bool:
        try:
            call()
        except error as exc:
            assert all(w in str(exc) for w in words), exc
            return True
        return False

    wait_for(refused, 10, what)


def test_a_killed_daemons_frame_shares_are_swept() -> None:
    """A daemon killed whole (SIGKILL: nothing unlinks its files) leaves its camera shares in
    /dev/shm; the next daemon's share removes them once their maker is gone."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from daemon.service.frame_shares import new_share\n"
            "print(new_share('front', 8, 4).path, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        left = Path(child.stdout.readline().strip())
        assert left.exists()
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
        assert left.exists(), "nothing removes a killed process's share by itself"
        mine = new_share("front", 8, 4)
        try:
            assert not left.exists(), f"{left} outlived its daemon"
            assert mine.path.exists()
        finally:
            mine.close()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)


def _leader_torque() -> list[bool]:
    return [servo.torque_enabled for servo in _ARMS["leader"].servos]


def _leader_pose(c: ControlClient) -> np.ndarray:
    return _pose(c.request_as(ArmObservation, "arm.observe").leader)


def test_lerobots_smooth_handover_drives_the_leader_to_the_follower(daemon: Daemon) -> None:
    """The so101d teleoperator is actuated, as LeRobot's so_leader: LeRobot's own check says so,
    and LeRobot's own handover (teleop_smooth_move_to, as lerobot-rollout's dagger pause and
    episodic reset call it) drives the emulated leader to the follower's pose through the daemon;
    disable_torque leaves it limp there. Goals before enable_torque are refused."""
    from lerobot.common.control_utils import teleop_smooth_move_to, teleop_supports_feedback
    from lerobot_robot_so101d import SO101D, SO101DConfig, SO101DTeleop, SO101DTeleopConfig
    from lerobot_robot_so101d.daemon_link import DaemonRefused

    path = str(daemon.socket_path)
    teleop = SO101DTeleop(SO101DTeleopConfig(socket=path))
    robot = SO101D(SO101DConfig(socket=path))
    with pytest.raises(DeviceNotConnectedError):
        teleop.send_feedback({})
    teleop.connect()
    robot.connect()  # lent while the last story's release holds it: still, until the operator's resume
    try:
        _operator_resumes(daemon)
        assert teleop_supports_feedback(teleop)
        teleop.send_feedback({"rumble": 1.0})  # not a leader goal: ignored, as LeRobot's so_leader does
        leader = teleop.get_action()
        with pytest.raises(DaemonRefused, match=r"torque is off: enable_torque\(\)"):
            teleop.send_feedback(leader)
        assert not any(_leader_torque())

        def at(pose: np.ndarray) -> Callable[[], bool]:
            action = {f"{j}.pos": float(v) for j, v in zip(JOINT_NAMES, pose)}

            def arrived() -> bool:
                robot.send_action(action)
                now = robot.get_observation()
                return bool(np.all(np.abs(np.array([now[f"{j}.pos"] for j in JOINT_NAMES]) - pose) < TOL_DEG))

            return arrived

        # LeRobot's policy left the follower away from the leader
        wait_for(at(POSE_B), 20, "the follower away from the leader")
        assert np.allclose(_pose({k.removesuffix(".pos"): v for k, v in leader.items()}), POSE_A, atol=TOL_DEG)
        obs = robot.get_observation()
        follower = {k: v for k, v in obs.items() if k.endswith(".pos")}
        teleop_smooth_move_to(teleop, follower, duration_s=1.0)  # LeRobot's: enable_torque, then goals
        assert all(_leader_torque()), "the leader's torque is not on during LeRobot's handover"
        target = np.array([follower[f"{j}.pos"] for j in JOINT_NAMES])

        def leader_at_follower() -> bool:
            now = teleop.get_action()
            return bool(np.all(np.abs(np.array([now[f"{j}.pos"] for j in JOINT_NAMES]) - target) < TOL_DEG))

        wait_for(leader_at_follower, 20, "the leader at the follower's pose after LeRobot's handover")
        teleop.disable_torque()  # the operator takes it: limp where it is
        wait_for(lambda: not any(_leader_torque()), 5, "the leader limp after disable_torque")
        assert leader_at_follower()
    finally:
        robot.disconnect()
        teleop.disconnect()
    assert not any(_leader_torque())


def test_the_daemon_bounds_the_leaders_speed_and_refuses_a_leader_an_arm_follows(daemon: Daemon) -> None:
    """A client's goal far away (a jump) moves the leader at the take-over's speed, not at once;
    while the follower follows the leader (teleop, no client holding the arm) the leader is not
    driven at all, the policy's take-over waits for the client to let it go, and a client that
    dies holding the leader leaves it limp."""
    _operator_resumes(daemon)
    _ARMS["leader"].set_pose_units(POSE_A)
    with ControlClient(daemon.socket_path) as c:
        with pytest.raises(CommandFailed, match=r"follower follows the leader now \(teleop\)"):
            c.request("leader.acquire", client="test")
        assert not any(_leader_torque())
        arm_lease = c.request_as(ArmLeaseReply, "arm.acquire", client="test", pid=os.getpid()).lease
        try:
            lease = c.request("leader.acquire", client="test", pid=os.getpid())["lease"]
            with ControlClient(daemon.socket_path) as other:
                with pytest.raises(CommandFailed, match=r"leader is held by test \(pid"):
                    other.request("leader.acquire", client="intruder")
            assert all(_leader_torque())
            # one driver of the leader's motors at a time: the policy's take-over is refused
            c.request("hold")
            with pytest.raises(CommandFailed, match=r"leader is driven by test \(pid"):
                c.request("policy.takeover")
            _operator_resumes(daemon)  # the follower stays lent: the leader is still not followed
            assert all(_leader_torque())
            far = POSE_A + np.array([60.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            t0 = time.monotonic()
            reply = c.request("leader.goal", lease=lease, **_action(far))
            assert np.allclose(_pose(reply["goal"]), far)
            # a joint left out keeps its goal
            c.request("leader.goal", lease=lease, shoulder_pan=float(far[0]))
            wait_for(lambda: bool(np.all(np.abs(_leader_pose(c) - far) < TOL_DEG)), 20, "the leader at the goal")
            took_s = time.monotonic() - t0
            # 60 degrees at 45 deg/s: 1.33 s at the least (the servo lags its goal, never leads it)
            assert took_s >= 0.9 * 60.0 / 45.0, f"the leader jumped: 60 degrees in {took_s:.2f} s"
            c.request("leader.release", lease=lease)
            assert not any(_leader_torque())
            with pytest.raises(CommandFailed, match="not current"):
                c.request("leader.goal", lease=lease, **_action(POSE_A))
        finally:
            c.request("arm.release", lease=arm_lease)
    _operator_resumes(daemon)
    with ControlClient(daemon.socket_path) as c:
        arm_lease = c.request_as(ArmLeaseReply, "arm.acquire", client="test", pid=os.getpid()).lease
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time\n"
                "from daemon.api.client import ControlClient\n"
                "c = ControlClient(sys.argv[1]).connect()\n"
                "c.request('leader.acquire', client='doomed')\n"
                "print('held', flush=True)\n"
                "time.sleep(600)\n",
                str(daemon.socket_path),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            start_new_session=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "held"
            assert all(_leader_torque())
            os.killpg(child.pid, signal.SIGKILL)  # the power-cut way: no release
            child.wait(10)
            wait_for(lambda: not any(_leader_torque()), 5, "the leader limp once its client is gone")
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(10)
            c.request("arm.release", lease=arm_lease)
    _ARMS["leader"].set_pose_units(POSE_A)


def test_the_plugin_observes_through_the_pose_share(daemon: Daemon) -> None:
    """get_observation reads the pose the loop measured at its newest cycle from shared memory
    (no request), the same numbers arm.observe answers; a share gone stale is not read."""
    from lerobot_robot_so101d import SO101D, SO101DConfig
    from lerobot_robot_so101d.daemon_link import SHARE_STALE_MIN_S

    from daemon.api.messages import ArmShareReply
    from daemon.api.pose_share import PoseShareReader

    with ControlClient(daemon.socket_path) as c:
        share = c.request_as(ArmShareReply, "arm.share")
        assert share.arms == ["follower"] and share.period_s == pytest.approx(0.01)
        reader = PoseShareReader(share.path)
        try:
            # the share is written from the loop's next cycle on (under load, after the reply)
            wait_for(lambda: reader.read() is not None, 5, "the share's first record")
            first = reader.read()
            assert first is not None
            wait_for(lambda: (r := reader.read()) is not None and r.cycle > first.cycle + 5, 5, "newer cycles")
            rec = reader.read()
            assert rec is not None
            obs = c.request_as(ArmObservation, "arm.observe")
            arm = rec.arm(0)
            assert arm is not None and np.allclose(arm, _pose(obs.follower), atol=0.5)
            leader = rec.leader(0)
            assert leader is not None and np.allclose(leader, _pose(obs.leader), atol=0.5)
            assert time.monotonic() - rec.written_at_s < SHARE_STALE_MIN_S
        finally:
            reader.close()
        # the same file for every client
        assert c.request("arm.share")["path"] == share.path
    robot = SO101D(SO101DConfig(socket=str(daemon.socket_path)))
    robot.connect()
    try:
        requests = daemon.context.server.requests
        for _ in range(20):
            robot.get_observation()
        assert daemon.context.server.requests == requests, "get_observation asked the socket"
    finally:
        robot.disconnect()


def test_the_plugin_teleop_refuses_an_unplugged_leaders_last_reading(daemon: Daemon) -> None:
    """The daemon keeps its last leader reading when the leader stops answering; the plugin's
    get_action must not hand it to LeRobot as the operator's action. (Last: it unplugs the leader.)"""
    from lerobot_robot_so101d import SO101DTeleop, SO101DTeleopConfig

    teleop = SO101DTeleop(SO101DTeleopConfig(socket=str(daemon.socket_path)))
    teleop.connect()
    try:
        assert set(teleop.get_action()) == {f"{j}.pos" for j in JOINT_NAMES}
        _BUSES["leader"].stop()  # unplugged: no reply any more
        _wait_refused(
            teleop.get_action,
            DeviceNotConnectedError,
            ("leader", "ms old"),
            "the plugin refusing the frozen leader reading",
        )
    finally:
        teleop.disconnect()
