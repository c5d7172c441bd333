"""Mode `policy` driving the MuJoCo follower (SimFollower over ZeroMQ -> MuJoCo): the tiny ACT's
targets flow through the same safety layer into the simulated arm, and the sim arm moves."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from policy_support import tiny_act
from support import MujocoSimThread, free_port, still_arm_on_pty, wait_for

from daemon.config.settings import config_from_dict
from daemon.service.attach_policy import attach_policy
from daemon.service.daemon import Daemon
from drivers.cameras import CameraConfig as CamCfg
from drivers.cameras import VirtualArmCamera
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechLeader
from drivers.sim_follower import SimFollower

H, W = 48, 64
POSE = np.array([0.0, -40.0, 40.0, 20.0, 0.0, 30.0])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_act(tmp_path_factory, {"front": (H, W)})


class Rows:
    def __init__(self, loop) -> None:
        self.rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.modes: list[str] = []
        self.loop = loop

    def on_cycle(self, now, state, action, raw):
        self.rows.append((state.copy(), action.copy(), raw.copy()))
        self.modes.append(self.loop.state.mode)


def test_policy_drives_the_mujoco_follower(ckpt: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="so101d-polsim-") as d:
        root = Path(d)
        _la, lb = still_arm_on_pty(root / "leader", "leader", POSE)
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        sim_thread = MujocoSimThread(endpoint, cameras=())
        sim = sim_thread.sim
        cfg = config_from_dict(
            {
                "socket": {"path": str(root / "c.sock")},
                "follower": {"kind": "sim", "endpoint": endpoint, "stale_timeout_s": 0.3},
                "control": {"rate_hz": 60.0},
                "safety": {"align_speed_deg_s": 90.0, "align_gripper_speed_pct_s": 100.0, "max_step_deg": 1.5},
                "cameras": {"front": {"kind": "virtual", "width": W, "height": H}},
                "policy": {"max_obs_age_s": 5.0, "refill_below": 4},
            }
        )
        cam = VirtualArmCamera(CamCfg(name="front", width=W, height=H, fps=30))
        daemon = Daemon(
            cfg,
            FeetechLeader(str(root / "leader"), reference_calibration("leader")),
            SimFollower(endpoint, staleness_s=0.3),
        )
        rows = Rows(daemon.loop)

        class Feed:
            def on_cycle(self, now, state, action, raw):
                cam.set_state(state)

        daemon.loop.add_hook(rows)
        daemon.loop.add_hook(Feed())
        cam.start()
        ctl = attach_policy(daemon, cameras={"front": cam})
        daemon.start()
        try:
            loop = daemon.loop
            wait_for(lambda: loop.follower_link.connected and loop.measured is not None, 30, "sim follower connected")
            assert loop.follower_kind == "sim"
            r = ctl.load(str(ckpt), wait_s=90)
            assert r["state"] == "ready", r
            ctl.start(record=False)
            wait_for(
                lambda: loop.state.mode == "policy", 30, f"policy mode (now {loop.state.mode}: {loop.state.reason})"
            )
            start = len(rows.rows)
            sim_before = sim.joint_units().copy()
            wait_for(lambda: len(rows.rows) >= start + 100, 30, "100 loop cycles in policy mode")
            wait_for(lambda: daemon.status()["policy"]["results"] >= 2, 30, "two policy results")
            status = daemon.status()
            wait_for(lambda: daemon.status()["cycles"] > status["cycles"] + 10, 10, "loop cycles during the policy")
            end = len(rows.rows)  # the policy's cycles only (a hold commands the measured pose)
            ctl.stop()
            wait_for(lambda: loop.state.mode == "hold", 5, "hold")
            acts = np.array([r[1] for r in rows.rows[start:end]])
            assert len(acts) > 40
            modes = rows.modes[start:end]
            tracking = np.array([a == "policy" and b == "policy" for a, b in itertools.pairwise(modes)])
            steps = np.abs(np.diff(acts, axis=0))[tracking]
            assert len(steps) > 20
            assert np.all(steps[:, :5] <= 1.5 + 1e-6)  # the safety layer's step limit held while tracking
            assert np.all(acts >= loop.params.lower - 1e-6) and np.all(acts <= loop.params.upper + 1e-6)
            # the simulated arm moved under the policy
            assert np.abs(sim.joint_units() - sim_before).max() > 1.0
        finally:
            daemon.stop()
            cam.stop()
            sim_thread.close()
            lb.stop()
