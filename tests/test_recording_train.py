"""A recorded dataset trains: LeRobot's own training script runs ACT for a few steps on it, offline.

ACT is built without pretrained backbone weights (no network) and with tiny dimensions to keep
this fast on a CPU; what matters is that lerobot-train accepts our features (state, action,
teleop.action, two h264 camera videos), decodes the videos and steps the optimiser.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time

import pytest
from recording_support import SyntheticLoop

from daemon.recording.recorder import Recorder, RecorderConfig
from drivers.cameras import CameraConfig, VirtualArmCamera

pytest.importorskip("accelerate", reason="lerobot-train needs accelerate (lerobot[training])")


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
                time.sleep(1.0)
                rec.save_episode(True)
            assert rec.wait_saved(90)
    finally:
        rec.close()

    out = tmp_path / "train"
    cmd = [
        sys.executable,
        "-m",
        "lerobot.scripts.lerobot_train",
        "--dataset.repo_id=local/act_smoke",
        f"--dataset.root={root}",
        "--policy.type=act",
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
        "--policy.pretrained_backbone_weights=null",
        "--policy.dim_model=32",
        "--policy.dim_feedforward=64",
        "--policy.n_heads=2",
        "--policy.n_encoder_layers=1",
        "--policy.n_decoder_layers=1",
        "--policy.latent_dim=8",
        "--policy.chunk_size=5",
        "--policy.n_action_steps=5",
        "--steps=3",
        "--batch_size=2",
        "--num_workers=0",
        "--log_freq=1",
        f"--output_dir={out}",
        "--wandb.enable=false",
        "--save_checkpoint=false",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert "dataset.num_episodes=2" in log
    assert "End of training" in log
    losses = [float(m) for m in re.findall(r"loss:\s*([0-9.eE+-]+)", log)]
    assert losses and all(math.isfinite(v) for v in losses), log[-2000:]
