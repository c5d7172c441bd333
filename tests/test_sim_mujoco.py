"""SimFollower against the real MuJoCo follower (in a thread, and as a killed/restarted process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support import poll_until

from calibration.calibration_file import ArmCalibration, MotorCalibration
from calibration.conventions import GRIPPER_INDEX, JOINT_IDS, JOINT_NAMES, sim_unit_limits, ticks_to_units
from drivers.arm_interface import FollowerArm, PortGoneError
from drivers.sim_follower import SimFollower
from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig, mj_rad_to_units, units_to_mj_rad

REPO = Path(__file__).resolve().parents[1]


class ThreadSim:
    def __init__(self, **kw) -> None:
        self.sim = MujocoFollower(MujocoFollowerConfig(bind="tcp://127.0.0.1:0", seed=1, **kw))
        self.endpoint = self.sim.open()
        self.thread = threading.Thread(target=self.sim.run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.sim.stop()
        self.thread.join(5)


@pytest.fixture(scope="module")
def sim():
    s = ThreadSim()
    yield s
    s.close()


@pytest.fixture
def follower(sim):
    # staleness is not under test here: generous, so a loaded CI machine cannot make it flap
    f = SimFollower(sim.endpoint, staleness_s=3.0, connect_timeout_s=10)
    f.connect()
    yield f
    f.close()


def _track(f: SimFollower, goal: np.ndarray, tol: np.ndarray | float, timeout_s: float = 8.0) -> np.ndarray:
    def reached() -> bool:
        f.write_goals(goal)
        try:
            return bool(np.all(np.abs(f.read_joints() - goal) < tol))
        except PortGoneError:  # a sim starved of CPU for a moment: the loop would hold and retry
            return False

    assert poll_until(reached, timeout_s, 1 / 30), f"did not reach {goal}: at {f.last_known_joints().round(1)}"
    return f.last_known_joints()


def test_joint_map_round_trip_and_limits():
    u = np.array([10.0, -20.0, 30.0, -40.0, 50.0, 25.0])
    np.testing.assert_allclose(mj_rad_to_units(units_to_mj_rad(u)), u, atol=1e-9)
    lo, hi = sim_unit_limits()
    assert lo[GRIPPER_INDEX] == pytest.approx(0.0) and hi[GRIPPER_INDEX] == pytest.approx(100.0)


def test_is_a_follower_arm_and_targets_flow(follower):
    assert isinstance(follower, FollowerArm) and follower.kind == "sim"
    assert follower.sim_info["backend"] == "mujoco"
    goal = np.array([15.0, -40.0, 50.0, 30.0, 10.0, 60.0])
    # a position servo under gravity: within a few degrees (gripper: percent)
    _track(follower, goal, tol=np.array([3, 5, 5, 5, 3, 3.0]))
    lo, hi = follower.joint_limits()
    assert np.all(lo < hi)
    health = follower.read_health()
    assert not health.missing and not health.faults and all(s.torque_enabled for s in health.servos.values())
    assert follower.round_trip_s()


def test_cameras_arrive(follower):
    cams = follower.cameras()
    assert set(cams) == {"front", "wrist"}
    for cam in cams.values():
        cam.start()
    assert poll_until(lambda: all(c.latest_frame() is not None for c in cams.values()), 10)
    first = {n: c.latest_frame() for n, c in cams.items()}
    assert poll_until(lambda: all(c.latest_frame().seq > first[n].seq + 3 for n, c in cams.items()), 10)
    for name, cam in cams.items():
        fr = cam.latest_frame()
        assert fr.pixels.shape == (240, 320, 3) and fr.pixels.dtype == np.uint8
        assert fr.pixels.std() > 5, f"{name}: a blank image"
        assert (cam.width, cam.height) == (320, 240)
        assert cam.stats()["frames"] >= 4 and not cam.stats()["stalled"]
    # the front camera sees the red cube somewhere
    px = cams["front"].latest_frame().pixels.astype(int)
    assert np.any((px[..., 0] > 120) & (px[..., 1] < 60) & (px[..., 2] < 60))


def test_gripper_closes_from_the_leader_side(sim, follower):
    """Leader gripper at its calibrated minimum -> LeRobot units 0 (closed) -> the sim jaw closes."""
    leader_cal = ArmCalibration({n: MotorCalibration(JOINT_IDS[n], 0, 0, 1000, 3000) for n in JOINT_NAMES})
    ticks_open = np.full(6, 2000)
    ticks_open[GRIPPER_INDEX] = 3000  # range_max -> 100 (open)
    ticks_closed = ticks_open.copy()
    ticks_closed[GRIPPER_INDEX] = 1000  # range_min -> 0 (closed)
    u_open, u_closed = ticks_to_units(ticks_open, leader_cal), ticks_to_units(ticks_closed, leader_cal)
    assert u_open[GRIPPER_INDEX] == pytest.approx(100) and u_closed[GRIPPER_INDEX] == pytest.approx(0)
    # hold the arm up, away from the cube, so the jaws move freely
    u_open[:5] = u_closed[:5] = [0.0, -30.0, 30.0, 0.0, 0.0]

    tol = np.array([5, 8, 8, 8, 5, 3.0])
    _track(follower, u_open, tol)
    gap_open = sim.sim.jaw_gap_m()
    state = _track(follower, u_closed, tol)
    gap_closed = sim.sim.jaw_gap_m()
    assert state[GRIPPER_INDEX] < 3.0
    assert gap_closed < gap_open - 0.05, f"jaw gap {gap_open:.3f} m -> {gap_closed:.3f} m: the jaw did not close"
    assert gap_closed < 0.01


def test_torque_off_is_limp_and_on_holds(follower):
    _track(follower, np.array([0.0, -20.0, 20.0, 0.0, 0.0, 50.0]), tol=np.array([3, 5, 5, 5, 3, 3.0]))
    follower.set_torque(False)
    assert poll_until(lambda: not follower.read_health().servos["shoulder_lift"].torque_enabled, 5)
    before = follower.read_joints()
    # a limp arm falls under gravity
    assert poll_until(lambda: np.abs(follower.read_joints()[1:3] - before[1:3]).max() > 10, 5)
    follower.set_torque(True)
    assert poll_until(lambda: follower.read_health().servos["shoulder_lift"].torque_enabled, 5)
    time.sleep(0.3)
    a = follower.read_joints()
    time.sleep(0.5)
    assert np.abs(follower.read_joints()[:5] - a[:5]).max() < 3.0, "torque on: the arm holds where it is"


def test_episode_reset_and_events(follower):
    _track(follower, np.array([20.0, -30.0, 30.0, 0.0, 0.0, 50.0]), tol=np.array([3, 5, 5, 5, 3, 3.0]))
    seq = follower.reset_episode(seed=5, timeout_s=5)
    rest = follower.read_joints()
    assert abs(rest[0]) < 1 and rest[1] == pytest.approx(-100, abs=1.5), "reset puts the arm at the rest pose"
    started = follower.start_episode()
    assert follower.wait_event("started", started, 5).seq == started
    stopped = follower.stop_episode()
    follower.wait_event("stopped", stopped, 5)
    kinds = [e.event for e in follower.events()]
    assert kinds[:3] == ["reset_done", "started", "stopped"] and seq < started < stopped


def test_success_and_termination_checks():
    sim = MujocoFollower(MujocoFollowerConfig(cameras=(), seed=0))

    class Recorder:
        def __init__(self):
            self.events = []

        def send_event(self, event, detail="", seq=None):
            self.events.append(event)

    rec = Recorder()
    sim._check_task(rec)
    assert rec.events == [] and not sim.cube_lifted()
    q = sim._cube_qadr
    sim.data.qpos[q + 2] = 0.12
    import mujoco

    mujoco.mj_forward(sim.model, sim.data)
    sim._check_task(rec)
    sim._check_task(rec)  # reported once per episode
    assert rec.events == ["success"]
    sim.data.qpos[q : q + 3] = [0.2, 0.0, -0.2]
    mujoco.mj_forward(sim.model, sim.data)
    sim._check_task(rec)
    assert rec.events == ["success", "terminated"]
    sim.reset_scene(seed=1)
    assert not sim.cube_lifted() and not sim.cube_lost()


def test_sim_holds_when_the_daemon_goes_quiet():
    s = ThreadSim(cameras=(), daemon_staleness_s=0.1)
    f = SimFollower(s.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        start = f.read_joints()
        far = np.array([100.0, 60.0, -80.0, 80.0, 150.0, 90.0])
        f.write_goals(far)
        assert poll_until(lambda: np.abs(f.read_joints() - start).max() > 2, 5)  # it started moving
        f.close()  # the daemon vanishes mid-motion
        assert poll_until(lambda: s.sim._daemon_was_stale, 5)
        target_rad = units_to_mj_rad(far)
        assert not np.allclose(
            s.sim.data.ctrl[:6], np.clip(target_rad, s.sim.arm().ctrl_lo, s.sim.arm().ctrl_hi), atol=0.05
        ), "with the daemon gone the sim holds instead of finishing the last move"
    finally:
        f.close()
        s.close()


# ------------------------------------------------------------------------------------------------
# the sim process killed mid-stream, then a new one on the same endpoint
# ------------------------------------------------------------------------------------------------
def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(bind: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daemon.apps.cli",
            "sim-follower",
            "--backend",
            "mujoco",
            "--bind",
            bind,
            "--cameras",
            "",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_sim_killed_mid_stream_is_detected_and_a_new_sim_is_picked_up(transport, tmp_path):
    bind = f"ipc://{tmp_path}/sim.sock" if transport == "ipc" else f"tcp://127.0.0.1:{_free_tcp_port()}"
    staleness = 0.1
    proc = _spawn(bind)
    f = SimFollower(bind, staleness_s=staleness, connect_timeout_s=60)
    proc2 = None
    try:
        f.connect()
        goal = np.array([5.0, -50.0, 60.0, 10.0, 0.0, 40.0])
        assert poll_until(lambda: (f.write_goals(goal), f._fresh())[1], 10)  # mid-stream
        for _ in range(10):
            f.write_goals(goal)
            time.sleep(1 / 30)
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(10)
        detected_at = None
        while time.monotonic() - killed_at < 5:
            try:
                f.read_joints()
            except PortGoneError:
                detected_at = time.monotonic()
                break
            time.sleep(0.002)
        assert detected_at is not None, "a dead sim must surface as PortGoneError"
        # within the staleness time (plus scheduling slack on a loaded 2-core machine)
        assert detected_at - killed_at <= staleness + 0.6, f"detected {detected_at - killed_at:.3f} s after the kill"
        assert f.read_health().missing == tuple(JOINT_NAMES)
        with pytest.raises(PortGoneError):
            f.read_joints()

        proc2 = _spawn(bind)
        deadline = time.monotonic() + 60
        while True:
            try:
                f.reconnect()
                break
            except PortGoneError:
                assert time.monotonic() < deadline, "the new sim was never picked up"
        state = f.last_known_joints()
        assert state[1] == pytest.approx(-100, abs=3), f"fresh sim: rest pose expected, got {state.round(1)}"
        assert f.counters.reconnects >= 1
        _track(f, goal, tol=np.array([3, 6, 6, 6, 3, 3.0]), timeout_s=15)
    finally:
        f.close()
        for p in (proc, proc2):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def test_the_scene_is_moved_on_the_sim_thread_while_it_serves():
    """MjData is not thread-safe: a cube placed from the test goes through the serving thread."""
    import mujoco  # after sim_bridge chose the GL backend

    s = ThreadSim(cameras=())
    try:
        assert poll_until(lambda: s.sim.ticks > 2, 5)

        def lift(sim: MujocoFollower) -> tuple[str, float]:
            sim.data.qpos[sim._cube_qadr + 2] = 0.12
            mujoco.mj_forward(sim.model, sim.data)
            return threading.current_thread().name, sim.cube_height_m()

        thread_name, height_m = s.sim.call_in_sim_thread(lift)
        assert thread_name == s.thread.name != threading.current_thread().name
        assert height_m > 0.1
        ticks = s.sim.ticks
        with pytest.raises(ZeroDivisionError):
            s.sim.call_in_sim_thread(lambda sim: 1 / 0)  # handed back to the caller ...
        assert poll_until(lambda: s.sim.ticks > ticks + 2, 5)  # ... and the sim serves on
    finally:
        s.close()
    assert s.sim.call_in_sim_thread(lambda sim: threading.current_thread().name) == threading.current_thread().name
