"""Sim episodes land in the same LeRobot dataset, same schema, as real ones.

Emulated leader -> daemon loop -> SimFollower -> MuJoCo; the recorder records the loop's states
and the sim's front/wrist cameras (delivered over the bridge), then the dataset is loaded back.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from recording_support import record_frames
from support import MujocoSimThread, free_port, still_arm_on_pty, wait_for

from daemon.config.settings import config_from_dict
from daemon.data.schema import read_episode_tags
from daemon.service.attach_recording import attach_recorder
from daemon.service.daemon import Daemon
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechLeader
from drivers.sim_follower import SimFollower

W, H = 160, 120
POSE = np.array([10.0, -50.0, 55.0, 30.0, 0.0, 40.0])


def test_sim_episode_is_recorded_with_sim_cameras(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sim = MujocoSimThread(endpoint, camera_width=W, camera_height=H)
    d = tempfile.TemporaryDirectory(prefix="so101d-simrec-")
    root = Path(d.name)
    _la, lb = still_arm_on_pty(root / "leader", "leader", POSE)
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "follower": {"kind": "sim", "endpoint": endpoint, "stale_timeout_s": 0.5},
            "control": {"rate_hz": 60.0},
            "safety": {"align_speed_deg_s": 120.0, "align_gripper_speed_pct_s": 150.0},
            "recording": {"fps": 30},
        }
    )
    follower = SimFollower(endpoint, staleness_s=0.5)
    daemon = Daemon(cfg, FeetechLeader(str(root / "leader"), reference_calibration("leader")), follower)
    ds_root = tmp_path / "ds"
    try:
        follower.connect()
        cams = [follower.camera(n, W, H, 30.0) for n in ("front", "wrist")]
        rec = attach_recorder(daemon, cameras=cams, follower_kind=follower.dataset_kind, root=ds_root)
        rec.wait_ready(120)
        daemon.start()
        wait_for(lambda: daemon.loop.state.mode == "teleop", 30, "teleop")
        wait_for(lambda: all(c.latest_frame() is not None for c in cams), 10, "sim frames")
        rec.start_episode("sim pick")
        record_frames(rec, 36)
        r = rec.save_episode(True)
        assert r["queued"]
        assert rec.wait_saved(120), rec.status()
    finally:
        daemon.stop()
        sim.close()
        lb.stop()
        d.cleanup()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/so101d", root=ds_root)
    assert ds.num_episodes == 1 and ds.num_frames >= 36
    item = ds[ds.num_frames // 2]
    for cam in ("front", "wrist"):
        img = item[f"observation.images.{cam}"]
        assert tuple(img.shape) == (3, H, W) and float(img.std()) > 0.01, f"{cam}: blank or wrong shape"
    state = item["observation.state"].numpy()
    # the recorded state is the simulated arm following the leader (gravity droop allowed)
    assert np.all(np.abs(state - POSE) < np.array([5, 10, 10, 10, 5, 5])), state
    tags = read_episode_tags(ds_root)
    assert tags[0].follower_kind == "sim-mujoco" and tags[0].success is True
