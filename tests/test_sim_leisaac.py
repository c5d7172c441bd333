"""The LeIsaac follower's logic, driven through SimFollower with a fake LeIsaac-style environment.

The fake env has LeIsaac's interface: ``reset(seed=)`` -> (obs, info), ``step(action (1, 6) joint
radians)`` -> (obs, reward, terminated, truncated, info), ``obs["policy"]`` holding ``joint_pos``
(1, 6) radians and ``front`` / ``wrist`` (1, H, W, 3) uint8 images.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from calibration.conventions import normalized_to_sim_rad, units_to_sim_rad
from drivers.arm_interface import FollowerArm
from sim_bridge.leisaac_follower import LeisaacBridge, LeisaacBridgeConfig, build_parser, image_to_uint8
from sim_bridge.server import SimServerEndpoint
from sim_bridge.sim_follower import SimFollower
from support import poll_until

H, W = 48, 64
SUCCESS_PAN_RAD = 1.0  # the fake task "succeeds" when the pan joint passes this


class FakeLeisaacEnv:
    def __init__(self) -> None:
        self.q = np.zeros((1, 6), np.float32)
        self.actions: list[np.ndarray] = []
        self.reset_seeds: list[int | None] = []
        self.steps = 0

    def _obs(self):
        img = np.zeros((1, H, W, 3), np.uint8)
        img[..., 0] = np.uint8((self.q[0, 0] * 40) % 255)
        img[:, : H // 2, :, 1] = 200
        return {"policy": {"joint_pos": self.q.copy(), "front": img, "wrist": img[:, ::-1].copy(),
                           "joint_vel": np.zeros((1, 6), np.float32)}}

    def reset(self, seed=None):
        self.reset_seeds.append(seed)
        self.q[:] = 0.1
        return self._obs(), {}

    def step(self, action):
        a = np.asarray(action, dtype=np.float32)
        assert a.shape == (1, 6)
        self.actions.append(a.copy())
        self.q += 0.05 * (a - self.q)  # a first-order joint servo (time constant ~20 steps)
        self.steps += 1
        terminated = np.array([self.q[0, 0] > SUCCESS_PAN_RAD])
        return self._obs(), np.zeros(1), terminated, np.array([False]), {}


@pytest.fixture
def bridge():
    env = FakeLeisaacEnv()
    ep = SimServerEndpoint("tcp://127.0.0.1:0", backend="leisaac:fake",
                           cameras=[{"name": "front", "width": W, "height": H}, {"name": "wrist", "width": W, "height": H}])
    ep.open()
    b = LeisaacBridge(env, ep, config=LeisaacBridgeConfig(step_hz=120.0, publish_hz=30.0, daemon_staleness_s=0.1))
    t = threading.Thread(target=b.run, daemon=True)
    t.start()
    yield b, env
    b.stop()
    t.join(5)
    ep.close()


def test_isaac_is_not_imported_outside_main():
    assert "isaaclab" not in sys.modules and "leisaac" not in sys.modules
    args = build_parser().parse_args([])
    assert args.task == "LeIsaac-SO101-PickOrange-v0"


def test_targets_become_leisaac_radians_and_state_comes_back(bridge):
    b, env = bridge
    f = SimFollower(b.ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        assert isinstance(f, FollowerArm)
        assert env.reset_seeds == [None]
        goal = np.array([20.0, -30.0, 45.0, 10.0, -60.0, 80.0])
        assert poll_until(lambda: (f.write_goals(goal), np.allclose(f.read_joints(), goal, atol=0.05))[1], 20)
        expected_rad = units_to_sim_rad(goal)
        np.testing.assert_allclose(env.actions[-1][0], expected_rad, atol=1e-5)
        # gripper 80 (LeRobot units) is LeIsaac's own normalised map of the gripper, exactly
        np.testing.assert_allclose(expected_rad[5], normalized_to_sim_rad(np.array([0, 0, 0, 0, 0, 80.0]))[5])
        cams = f.cameras()
        assert set(cams) == {"front", "wrist"}
        assert poll_until(lambda: all(c.latest_frame() is not None for c in cams.values()))
        fr = cams["front"].latest_frame().pixels
        assert fr.shape == (H, W, 3) and fr[0, 0, 1] == 200 and fr[-1, 0, 1] == 0
    finally:
        f.close()


def test_success_reset_and_hold(bridge):
    b, env = bridge
    f = SimFollower(b.ep.endpoint, staleness_s=3.0, connect_timeout_s=10)
    try:
        f.connect()
        seq = f.reset_episode(seed=7, timeout_s=5)
        assert env.reset_seeds[-1] == 7
        np.testing.assert_allclose(f.read_joints(), b.joint_units(), atol=1e-4)
        start = f.start_episode()
        f.wait_event("started", start, 5)
        pan_deg_for_success = np.rad2deg(SUCCESS_PAN_RAD) + 10.0  # LeRobot degrees = LeIsaac angle for pan
        goal = np.array([pan_deg_for_success, 0.0, 0.0, 0.0, 0.0, 50.0])
        assert poll_until(lambda: (f.write_goals(goal), any(e.event == "success" for e in list(f._events)))[1])
        ev = f.wait_event("success", start, 1)
        assert ev.seq == start and seq < start
        # success is reported once per episode
        time.sleep(0.2)
        assert sum(e.event == "success" for e in f.events()) == 1

        # the daemon goes quiet mid-move: the bridge holds the measured pose instead of the target
        far = np.array([-50.0, 0.0, 0.0, 0.0, 0.0, 50.0])
        f.write_goals(far)
        time.sleep(0.01)
        f.close()
        assert poll_until(lambda: b._daemon_was_stale, 5)
        time.sleep(0.1)
        held = env.actions[-1][0].copy()
        np.testing.assert_allclose(held, env.q[0], atol=1e-3)
        assert abs(held[0] - units_to_sim_rad(far)[0]) > 0.3, "held where it was, not at the last target"
    finally:
        f.close()


def test_image_conversion():
    f = np.full((1, 4, 5, 4), 0.5, np.float32)  # float RGBA in 0..1
    out = image_to_uint8(f)
    assert out.shape == (4, 5, 3) and out.dtype == np.uint8 and out[0, 0, 0] == 127


def test_workstation_script_needs_only_numpy_zmq_msgpack():
    """On the GPU workstation it runs in LeIsaac's Python: nothing of torch/lerobot/mujoco/daemon."""
    import subprocess

    code = (
        "import sys, sim_bridge.leisaac_follower; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'lerobot', 'daemon', 'drivers', 'mujoco', 'cv2', 'isaaclab', 'leisaac'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
