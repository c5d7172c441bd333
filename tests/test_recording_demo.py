"""Demo episodes on the virtual bench: the daemon (in-process) on emulated arms, the leader
playing the pick-and-place demo, [recording] on with a virtual camera; record_demo_episodes
records them and prints where the dataset is and how to load it; the follower's motion is in it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from daemon.config import config_from_dict
from daemon.recording.demo_session import record_demo_episodes
from daemon.service import Daemon
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.emulator.motion import DemoMotion
from drivers.feetech_arm import FeetechFollower, FeetechLeader
from recording_support import load_dataset


def test_demo_records_episodes_of_the_emulated_arm_and_says_how_to_load_them():
    with tempfile.TemporaryDirectory(prefix="so101d-demo-rec-") as d:
        root = Path(d)
        la = EmulatedArm("leader", motion=DemoMotion())
        fa = EmulatedArm("follower")
        lb = BusEmulator(root / "leader", la).start()
        fb = BusEmulator(root / "follower", fa).start()
        cfg = config_from_dict({
            "socket": {"path": str(root / "c.sock")},
            "recording": {"enabled": True, "dataset_root": str(root / "datasets"), "repo_id": "demo/bench"},
            "cameras": {"front": {"kind": "virtual", "width": 160, "height": 120}},
        })
        daemon = Daemon(cfg, FeetechLeader(str(root / "leader"), reference_calibration("leader")),
                        FeetechFollower(str(root / "follower"), reference_calibration("follower")))
        lines: list[str] = []
        try:
            daemon.start()
            n = record_demo_episodes(daemon, episodes=2, episode_s=2.0, reset_s=0.2, say=lines.append)
        finally:
            daemon.stop()
            lb.stop()
            fb.stop()
        assert n == 2
        text = "\n".join(lines)
        ds_root = root / "datasets" / "demo" / "bench"
        assert f"dataset: {ds_root}" in text and "LeRobotDataset('demo/bench'" in text
        ds = load_dataset(ds_root, "demo/bench")
        assert ds.num_episodes == 2
        state = np.array(ds.hf_dataset.with_format(None)["observation.state"])
        assert np.ptp(state, axis=0).max() > 2.0  # the follower moved with the demo leader
        assert tuple(ds[0]["observation.images.front"].shape) == (3, 120, 160)
