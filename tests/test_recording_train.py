"""A recorded dataset trains: LeRobot's own training script runs ACT for a few steps on it, offline.

ACT is built without pretrained backbone weights (no network) and with tiny dimensions to keep
this fast on a CPU; what matters is that lerobot-train accepts our features (state, action,
teleop.action, two h264 camera videos), decodes the videos and steps the optimiser.
"""

from __future__ import annotations

import pytest
from recording_support import SyntheticLoop, record_frames, train_tiny_act

from daemon.data.recorder import Recorder, RecorderConfig
from drivers.cameras import CameraConfig, VirtualArmCamera

pytest.importorskip("accelerate", reason="lerobot-train needs accelerate (lerobot[training])")


pytestmark = pytest.mark.e2e  # lerobot-train on a recorded dataset


def test_act_trains_a_few_steps_on_a_recorded_dataset(tmp_path):
    root = tmp_path / "ds"
    cams = [VirtualArmCamera(CameraConfig(n, width=160, height=120)) for n in ("front", "wrist")]
    rec = Recorder(RecorderConfig(root=str(root), repo_id="local/act_smoke"), cams)
    rec.open()
    rec.wait_ready(120)
    try:
        with SyntheticLoop(rec):
            for _i in range(2):
                rec.start_episode("move the arm")
                record_frames(rec, 30)
                rec.save_episode(True)
            assert rec.wait_saved(90)
    finally:
        rec.close()

    train_tiny_act("local/act_smoke", root, tmp_path / "train", 3, 2)
