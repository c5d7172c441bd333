"""Recording on a simulated follower through the daemon's own wiring (no hand-made cameras):
[follower] kind = "sim" + [cameras.*] kind = "sim" + [recording] enabled, against the MuJoCo follower.

- episode.start resets the sim's scene and starts its episode; save/discard stop it;
- the sim's success signal becomes the episode's success when the operator gives none, and an
  explicit verdict wins (the sim's is kept in the notes);
- the tag names the sim backend ("sim-mujoco");
- the sim dying mid-episode: the loop holds (disconnected), the episode's tag says
  "sim went stale at frame N" and when it came back; the dataset loads with the sim's cameras.
"""

from __future__ import annotations

import socket
import tempfile
import threading
from pathlib import Path

import mujoco
import numpy as np
import pytest
from recording_support import load_dataset, record_frames
from support import wait_for

from daemon.api.client import ControlClient
from daemon.config.settings import config_from_dict
from daemon.data.schema import read_episode_tags
from daemon.service.daemon import Daemon
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.feetech_arm import FeetechLeader
from sim_bridge.mujoco_follower import MujocoFollower, MujocoFollowerConfig

W, H = 160, 120
pytestmark = pytest.mark.e2e  # the daemon recording a MuJoCo follower

POSE = np.array([10.0, -50.0, 55.0, 30.0, 0.0, 40.0])


class Sim:
    def __init__(self, bind: str) -> None:
        self.sim = MujocoFollower(MujocoFollowerConfig(bind=bind, camera_width=W, camera_height=H, seed=0))
        self.sim.open()
        self.t = threading.Thread(target=self.sim.run, daemon=True)
        self.t.start()

    def lift_cube(self) -> None:
        """The cube 12 cm up (as if grasped and lifted): the sim reports success on its next tick.

        On the sim's own thread: an mj_forward from here while it steps corrupted memory (a
        segfault in CI, in a later mj_step)."""

        def lift(sim: MujocoFollower) -> None:
            q = sim._cube_qadr
            sim.data.qpos[q + 2] = 0.12
            sim.data.qvel[:] = 0.0
            mujoco.mj_forward(sim.model, sim.data)

        self.sim.call_in_sim_thread(lift)

    def close(self) -> None:
        self.sim.stop()
        self.t.join(5)


def test_sim_episodes_follow_the_recorder_with_verdicts_and_staleness_notes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    d = tempfile.TemporaryDirectory(prefix="so101d-simep-")
    root = Path(d.name)
    sims = [Sim(endpoint)]
    la = EmulatedArm("leader", initial_pose_units=POSE)
    la.set_pose_units(POSE)
    lb = BusEmulator(root / "leader", la).start()
    ds_root = root / "datasets" / "sim" / "eps"
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "follower": {"kind": "sim", "endpoint": endpoint, "stale_timeout_s": 0.3},
            "control": {"rate_hz": 60.0, "reconnect_backoff_min_s": 0.05, "reconnect_backoff_max_s": 0.2},
            "safety": {"align_speed_deg_s": 120.0, "align_gripper_speed_pct_s": 150.0},
            "recording": {"enabled": True, "dataset_root": str(root / "datasets"), "repo_id": "sim/eps", "fps": 30},
            "cameras": {n: {"kind": "sim", "width": W, "height": H, "fps": 30} for n in ("front", "wrist")},
        }
    )
    daemon = Daemon(cfg, FeetechLeader(str(root / "leader"), reference_calibration("leader")))  # follower from cfg
    mode = lambda: daemon.loop.state.mode  # noqa: E731

    def more_frames(n: int) -> None:  # n more frames in the episode in progress (~n / 30 s)
        record_frames(rec, int(rec.status()["frames"]) + n)

    try:
        daemon.start()
        rec = daemon.recorder
        rec.wait_ready(180)
        wait_for(lambda: mode() == "teleop", 30, "teleop")
        wait_for(lambda: all(c.latest_frame() is not None for c in rec.cameras), 10, "sim frames")
        with ControlClient(daemon.socket_path, timeout_s=15) as c:
            # episode 0: the sim says success, the operator says nothing -> success
            sim = sims[0].sim
            seq_before = sim.episode_seq
            assert c.request("episode.start", task="lift")["episode"] == 0
            assert sim.episode_active and sim.episode_seq > seq_before  # reset + start confirmed by the sim
            more_frames(24)
            sims[0].lift_cube()
            more_frames(24)
            assert c.request("episode.save")["queued"]
            wait_for(lambda: not sim.episode_active, 5, "the sim's episode stopped")
            # the next start resets the scene: the cube is back on the table
            assert c.request("episode.start", task="lift")["episode"] == 1
            assert sim.cube_height_m() < 0.01
            more_frames(24)
            sims[0].lift_cube()
            more_frames(24)
            c.request("episode.save", success=False)  # the operator's verdict wins
            # episode 2: nothing happens in the sim, then it dies mid-episode and comes back
            c.request("episode.start", task="stale")
            more_frames(24)
            sims[0].close()
            wait_for(lambda: mode() == "disconnected", 10, f"the loop holding (mode {mode()})")
            wait_for(
                lambda: any("sim went stale at frame" in n for n in c.request("episode.status")["notes"]),
                5,
                "the stale note on the episode in progress",
            )
            sims.append(Sim(endpoint))
            wait_for(lambda: mode() == "teleop", 30, f"teleop again (mode {mode()})")
            more_frames(15)
            c.request("episode.save")
            # a discarded episode stops the sim's episode too
            c.request("episode.start", task="thrown away")
            assert sims[1].sim.episode_active
            c.request("episode.discard")
            wait_for(lambda: not sims[1].sim.episode_active, 5, "the sim's episode stopped on discard")
        assert rec.wait_saved(180), rec.status()
    finally:
        daemon.stop()
        for s in sims:
            s.close()
        lb.stop()
    try:
        tags = read_episode_tags(ds_root)
        assert sorted(tags) == [0, 1, 2]
        assert {t.follower_kind for t in tags.values()} == {"sim-mujoco"}
        assert tags[0].success is True and any(n.startswith("sim success: cube lifted") for n in tags[0].notes)
        assert tags[1].success is False and any(n.startswith("sim success") for n in tags[1].notes)
        assert tags[2].success is None
        stale = [n for n in tags[2].notes if n.startswith("sim went stale at frame ")]
        back = [n for n in tags[2].notes if n.startswith("sim back at frame ")]
        assert stale and back, tags[2].notes
        n_stale = int(stale[0].split()[5])
        assert 24 <= n_stale < tags[2].frames  # 24 frames recorded before the sim died
        ds = load_dataset(ds_root, "sim/eps")
        assert ds.num_episodes == 3
        item = ds[ds.meta.episodes[0]["dataset_from_index"] + 10]
        for cam in ("front", "wrist"):
            img = item[f"observation.images.{cam}"]
            assert tuple(img.shape) == (3, H, W) and float(img.std()) > 0.01, cam
    finally:
        d.cleanup()
