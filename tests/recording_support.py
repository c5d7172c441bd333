"""Shared helpers for the recording tests: a 100 Hz loop driving Recorder.on_cycle.

Until a test goes through the daemon, this stands in for the control loop: synthetic follower
states (smooth joint motion, the gripper opening and closing) at 100 Hz, exactly the call the
daemon's loop makes every cycle.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def synthetic_state(t_s: float) -> np.ndarray:
    """Smooth joint motion in LeRobot units (degrees; gripper 0..100)."""
    return np.array(
        [
            40.0 * np.sin(0.8 * t_s),
            20.0 + 15.0 * np.sin(0.5 * t_s),
            -30.0 + 20.0 * np.cos(0.6 * t_s),
            10.0 * np.sin(1.1 * t_s),
            90.0 * np.sin(0.3 * t_s),
            50.0 + 45.0 * np.sin(1.5 * t_s),
        ]
    )


class SyntheticLoop:
    """Calls ``recorder.on_cycle`` at ``rate_hz`` on its own thread; records the call costs."""

    def __init__(self, recorder, rate_hz: float = 100.0) -> None:
        self.recorder = recorder
        self.period_s = 1.0 / rate_hz
        self.costs_s: list[float] = []
        self.periods_s: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self.action_offset = np.array([0.5, -0.5, 0.25, 0.0, 0.0, 1.0])

    def __enter__(self) -> SyntheticLoop:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(5)

    def _run(self) -> None:
        nxt = time.monotonic()
        last = None
        while not self._stop.is_set():
            now = time.monotonic()
            if last is not None:
                self.periods_s.append(now - last)
            last = now
            state = synthetic_state(now)
            action = state + self.action_offset
            teleop = action + 0.125
            t0 = time.perf_counter()
            self.recorder.on_cycle(now, state, action, teleop)
            self.costs_s.append(time.perf_counter() - t0)
            nxt += self.period_s
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                nxt = time.monotonic()


def load_dataset(root: Path, repo_id: str = "local/so101d"):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(repo_id, root=root)


def record_frames(recorder, frames: int, timeout_s: float = 60.0) -> int:
    """Wait until the episode being recorded holds ``frames`` frames (instead of sleeping for
    frames / fps, which a loaded machine overshoots or undershoots); returns the count seen."""
    seen = 0

    def enough() -> bool:
        nonlocal seen
        seen = int(recorder.status()["frames"])
        return seen >= frames

    assert wait_until(enough, timeout_s, 0.02), f"only {seen} of {frames} frames after {timeout_s} s"
    return seen


def wait_until(pred, timeout_s: float, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


def train_tiny_act(
    repo_id: str, root: Path, out: Path, steps: int, episodes: int, *extra: str, save: bool = False
) -> str:
    """`lerobot-train` (LeRobot's own script, its defaults but a tiny ACT) on a recorded dataset for
    a few CPU steps; asserts it trained on ``episodes`` episodes with finite losses, returns its log.
    ``save``: LeRobot saves its checkpoint too, at ``out/checkpoints/last/pretrained_model``."""
    import math
    import re
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "lerobot.scripts.lerobot_train",
        f"--dataset.repo_id={repo_id}",
        f"--dataset.root={root}",
        *extra,
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
        f"--steps={steps}",
        "--batch_size=2",
        "--num_workers=0",
        "--log_freq=1",
        f"--output_dir={out}",
        "--wandb.enable=false",
        f"--save_checkpoint={str(save).lower()}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert f"dataset.num_episodes={episodes}" in log and "End of training" in log
    losses = [float(m) for m in re.findall(r"loss:\s*([0-9.eE+-]+)", log)]
    assert losses and all(math.isfinite(v) for v in losses), log[-2000:]
    return log
