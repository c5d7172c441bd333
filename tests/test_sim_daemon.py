"""The daemon drives the MuJoCo follower: emulated leader -> control loop -> SimFollower -> MuJoCo.

The sim going away must look to the loop exactly like an unplugged follower ("disconnected", loop
alive), and a new sim on the same endpoint must be picked up by the loop's own reconnect thread.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from support import MujocoSimThread, free_port, still_arm_on_pty, wait_for

from daemon.config.settings import config_from_dict
from daemon.service.daemon import Daemon
from drivers.emulator import EmulatedArm, reference_calibration
from drivers.feetech_arm import FeetechLeader
from drivers.sim_follower import SimFollower

POSE_A = np.array([0.0, -60.0, 60.0, 40.0, 0.0, 20.0])
POSE_B = np.array([25.0, -40.0, 45.0, 30.0, 20.0, 60.0])
# a position servo under gravity (MuJoCo's STS3215 model): a few degrees of droop
TOL = np.array([4.0, 8.0, 8.0, 8.0, 4.0, 4.0])


@pytest.fixture
def bench():
    d = tempfile.TemporaryDirectory(prefix="so101d-sim-")
    root = Path(d.name)
    la, lb = still_arm_on_pty(root / "leader", "leader", POSE_A)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sims = [MujocoSimThread(endpoint, cameras=())]
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "follower": {"kind": "sim", "endpoint": endpoint, "stale_timeout_s": 0.5},
            "control": {"rate_hz": 60.0, "reconnect_backoff_min_s": 0.05, "reconnect_backoff_max_s": 0.2},
            "safety": {"align_speed_deg_s": 90.0, "align_gripper_speed_pct_s": 100.0},
        }
    )
    leader = FeetechLeader(str(root / "leader"), reference_calibration("leader"))
    follower = SimFollower(endpoint, staleness_s=cfg.follower.stale_timeout_s)
    daemon = Daemon(cfg, leader, follower)
    daemon.start()
    yield daemon, la, sims, endpoint
    daemon.stop()
    for s in sims:
        s.close()
    lb.stop()
    d.cleanup()


def _sim_error(sim: MujocoSimThread, la: EmulatedArm) -> np.ndarray:
    return np.abs(sim.sim.joint_units() - la.pose_units())


def test_daemon_teleoperates_the_mujoco_follower_and_survives_a_sim_restart(bench):
    daemon, la, sims, endpoint = bench
    mode = lambda: daemon.loop.state.mode  # noqa: E731
    wait_for(lambda: mode() == "teleop", 30, "teleop")
    assert daemon.loop.follower_kind == "sim"
    wait_for(lambda: np.all(_sim_error(sims[0], la) <= TOL), 10, "the sim arm on the leader")
    la.set_pose_units(POSE_B)
    wait_for(lambda: np.all(_sim_error(sims[0], la) <= TOL), 10, "the sim arm on the moved leader")

    # the sim dies: the loop treats it like an unplugged follower and keeps running
    sims[0].close()
    wait_for(lambda: mode() == "disconnected", 5, f"disconnected (mode {mode()})")
    assert daemon.loop.is_running()
    la.set_pose_units(POSE_A)
    # a new sim on the same endpoint: picked up by the loop's reconnect thread, realigned, following
    sims.append(MujocoSimThread(endpoint, cameras=()))
    wait_for(lambda: mode() in ("aligning", "teleop"), 20, f"reconnected (mode {mode()})")
    wait_for(lambda: mode() == "teleop", 20, "teleop again")
    wait_for(lambda: np.all(_sim_error(sims[1], la) <= TOL), 10, "the new sim arm on the leader")
    st = daemon.status()
    assert st["follower"]["losses"] >= 1  # 1 unless CPU starvation made the link flap too


def test_make_follower_builds_a_sim_follower():
    from daemon.service.daemon import make_follower

    cfg = config_from_dict({"follower": {"kind": "sim", "endpoint": "ipc:///tmp/x.sock", "stale_timeout_s": 0.15}})
    f = make_follower(cfg)
    assert isinstance(f, SimFollower) and f.endpoint == "ipc:///tmp/x.sock" and f.staleness_s == 0.15


class GoalLog(SimFollower):
    """The real SimFollower, keeping every goal the control loop writes (time, goal)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.goals: list[tuple[float, np.ndarray]] = []

    def write_goals(self, goals: np.ndarray) -> None:
        import time

        self.goals.append((time.monotonic(), np.array(goals, dtype=float)))
        super().write_goals(goals)


def test_a_sim_scene_reset_mid_teleop_realigns_slowly_from_the_reset_pose():
    """The operator starts a new episode: the sim resets its scene and the arm lands at its rest
    pose, far from the leader. The daemon must not keep commanding the leader's pose (the sim arm
    would race there at actuator speed): it re-aligns from the reset pose at align speed."""
    from sim_bridge import mujoco_scene as scene
    from sim_bridge.mujoco_follower import mj_rad_to_units

    d = tempfile.TemporaryDirectory(prefix="so101d-sim-")
    root = Path(d.name)
    la, lb = still_arm_on_pty(root / "leader", "leader", POSE_B)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sim = MujocoSimThread(endpoint, cameras=())
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "follower": {"kind": "sim", "endpoint": endpoint, "stale_timeout_s": 0.5},
            "control": {"rate_hz": 60.0},
            "safety": {"align_speed_deg_s": 60.0, "align_gripper_speed_pct_s": 60.0},
        }
    )
    follower = GoalLog(endpoint, staleness_s=cfg.follower.stale_timeout_s)
    daemon = Daemon(cfg, FeetechLeader(str(root / "leader"), reference_calibration("leader")), follower)
    daemon.start()
    try:
        mode = lambda: daemon.loop.state.mode  # noqa: E731
        wait_for(lambda: mode() == "teleop", 30, "teleop")
        wait_for(lambda: np.all(_sim_error(sim, la) <= TOL), 10, "the sim arm on the leader")
        rest_units = mj_rad_to_units(
            (np.deg2rad(scene.REST_POSE_DEG) - scene.MJ_JOINT_OFFSET_RAD) * scene.MJ_JOINT_SIGN
        )
        assert np.max(np.abs(rest_units - POSE_B)) > 20.0, "the rest pose must be far from the leader for this story"

        n_before = len(follower.goals)
        follower.reset_episode(timeout_s=10)
        wait_for(lambda: mode() == "aligning", 5, f"aligning after the reset (mode {mode()})")
        wait_for(lambda: mode() == "teleop", 20, "teleop again")
        wait_for(lambda: np.all(_sim_error(sim, la) <= TOL), 10, "the sim arm back on the leader")

        after = [g for _, g in follower.goals[n_before:]]
        # the alignment started where the reset put the arm (a cycle or two of drift allowed) ...
        closest = min(float(np.max(np.abs(g - rest_units))) for g in after)
        assert closest < 8.0, f"no goal near the reset pose: closest {closest:.1f} deg"
        # ... and every goal after it moved at most two cycles of the align speed per cycle
        start = next(i for i, g in enumerate(after) if np.max(np.abs(g - rest_units)) < 8.0)
        steps = np.abs(np.diff(np.array(after[start:]), axis=0))
        two_cycles = 2 * 60.0 / 60.0
        assert steps.max() <= two_cycles + 1e-6, f"a goal stepped {steps.max():.2f} (limit {two_cycles:.2f})"
    finally:
        daemon.stop()
        sim.close()
        lb.stop()
        d.cleanup()
