"""Build small, real LeRobot checkpoints offline: for tests, benchmarks and `so101d policy selftest`.

A synthetic LeRobotDataset in the daemon's schema (daemon/data/schema.py) is written with
LeRobot's own API, a policy (ACT or Diffusion) is trained on it for a few steps with LeRobot's own
processors, and saved exactly as LeRobot 0.6.1 saves checkpoints (``save_pretrained`` of the
policy and of both processor pipelines). Nothing is downloaded: backbones start from random
weights (``pretrained_backbone_weights=None``).

The synthetic episodes move smoothly through a range typical of the SO-101 in LeRobot units
(body joints within +-40 degrees, gripper 10..90), and the action leads the state by a few frames,
so a policy's outputs are recognisably in joint units (not normalised values).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibration.conventions import GRIPPER_INDEX, NUM_JOINTS
from daemon.data.schema import (
    ACTION_KEY,
    DEFAULT_FPS,
    IMAGE_KEY_PREFIX,
    ROBOT_TYPE,
    SOURCE_KEY,
    STATE_KEY,
    TAG_KEY,
    TELEOP_ACTION_KEY,
    EpisodeTag,
    dataset_features,
    tag_to_cell,
)
from daemon.system.realtime import run_without_realtime


def synthetic_pose(t_s: float, phase: float = 0.0) -> np.ndarray:
    """A smooth arm pose (6,) in LeRobot units at time t."""
    k = np.arange(NUM_JOINTS)
    pose = 40.0 * np.sin(2 * np.pi * (0.25 * t_s + phase) + k)
    pose[GRIPPER_INDEX] = 50.0 + 40.0 * np.sin(2 * np.pi * 0.4 * t_s + phase)
    return pose.astype(np.float32)


def synthetic_frame(pose: np.ndarray, height: int, width: int) -> np.ndarray:
    """An RGB frame whose content follows the pose (brightness bands), cheap to make."""
    img = np.zeros((height, width, 3), dtype=np.uint8)
    img[..., 0] = np.uint8(int(127 + 3 * pose[0]) % 256)
    img[..., 1] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    img[..., 2] = np.uint8(int(2.5 * pose[GRIPPER_INDEX]) % 256)
    return img


def make_synthetic_dataset(
    root: Path,
    cameras: dict[str, tuple[int, int]],
    episodes: int = 2,
    frames_per_episode: int = 30,
    fps: int = DEFAULT_FPS,
    repo_id: str = "so101d/synthetic",
    lead_frames: int = 3,
):
    """Write a LeRobot v3.0 dataset in the daemon's schema; returns the (read-mode) LeRobotDataset."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    # LeRobot's default encoder (SVT-AV1) would run FIFO 99 as root, and leave the calling thread
    # there: everything this process starts afterwards (a daemon, a bench loop) would inherit it.
    run_without_realtime(
        lambda: _write_synthetic(root, cameras, episodes, frames_per_episode, fps, repo_id, lead_frames)
    )
    return LeRobotDataset(repo_id, root=root, video_backend="pyav")


def _write_synthetic(
    root: Path,
    cameras: dict[str, tuple[int, int]],
    episodes: int,
    frames_per_episode: int,
    fps: int,
    repo_id: str,
    lead_frames: int,
) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset.create(
        repo_id, fps=fps, features=dataset_features(cameras), root=root, robot_type=ROBOT_TYPE, use_videos=True
    )
    for ep in range(episodes):
        tag = tag_to_cell(
            EpisodeTag(
                ep, success=True, follower_kind="emulated", frames=frames_per_episode, source={"generated": True}
            )
        )
        for i in range(frames_per_episode):
            t = i / fps
            state = synthetic_pose(t, phase=0.1 * ep)
            action = synthetic_pose(t + lead_frames / fps, phase=0.1 * ep)
            frame = {
                STATE_KEY: state,
                ACTION_KEY: action,
                TELEOP_ACTION_KEY: action,
                TAG_KEY: tag,
                SOURCE_KEY: "follower=leader",
                "task": "synthetic",
            }
            for name, (h, w) in cameras.items():
                frame[IMAGE_KEY_PREFIX + name] = synthetic_frame(state, h, w)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()


@dataclass
class TinyTrainResult:
    checkpoint: Path
    losses: list[float]


def _policy_config(policy_type: str, input_features, output_features, size: str, device: str, chunk_size: int = 10):
    if policy_type == "act":
        from lerobot.policies.act.configuration_act import ACTConfig

        if size == "tiny":
            return ACTConfig(
                input_features=input_features,
                output_features=output_features,
                chunk_size=chunk_size,
                n_action_steps=chunk_size,
                dim_model=32,
                dim_feedforward=64,
                n_heads=2,
                n_encoder_layers=1,
                n_decoder_layers=1,
                n_vae_encoder_layers=1,
                latent_dim=8,
                pretrained_backbone_weights=None,
                device=device,
            )
        return ACTConfig(  # LeRobot's defaults (resnet18, dim 512, chunk 100), offline backbone
            input_features=input_features,
            output_features=output_features,
            pretrained_backbone_weights=None,
            device=device,
        )
    if policy_type == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        # Crop must fit the tiny frames; few denoising steps keep the tests fast.
        first_cam = next((f.shape for k, f in input_features.items() if k.startswith(IMAGE_KEY_PREFIX)), (3, 96, 96))
        crop = (min(84, first_cam[1]), min(84, first_cam[2]))
        return DiffusionConfig(
            input_features=input_features,
            output_features=output_features,
            n_obs_steps=2,
            horizon=16,
            n_action_steps=8,
            down_dims=(32, 64),
            diffusion_step_embed_dim=32,
            num_train_timesteps=10,
            num_inference_steps=4 if size == "tiny" else None,
            crop_shape=crop,
            pretrained_backbone_weights=None,
            use_group_norm=True,
            spatial_softmax_num_keypoints=8,
            device=device,
        )
    raise ValueError(f"unsupported policy type {policy_type!r}")


def train_tiny_policy(
    dataset,
    out_dir: Path,
    policy_type: str = "act",
    steps: int = 5,
    batch_size: int = 8,
    size: str = "tiny",
    device: str = "cpu",
    seed: int = 0,
    chunk_size: int = 10,
) -> TinyTrainResult:
    """Train ``steps`` optimiser steps and save a LeRobot checkpoint folder at ``out_dir``.

    ``chunk_size`` (tiny ACT only; n_action_steps follows it): 100 is what plain ``lerobot-train``
    gives an ACT (LeRobot's ACTConfig defaults chunk_size = n_action_steps = 100)."""
    import torch
    from lerobot.configs.types import FeatureType
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors
    from lerobot.utils.feature_utils import dataset_to_policy_features

    torch.manual_seed(seed)
    features = dataset_to_policy_features(dataset.meta.features)
    outputs = {k: f for k, f in features.items() if k == ACTION_KEY}
    inputs = {k: f for k, f in features.items() if f.type is not FeatureType.ACTION and k != TELEOP_ACTION_KEY}
    cfg = _policy_config(policy_type, inputs, outputs, size, device, chunk_size)
    policy = get_policy_class(policy_type)(cfg)
    pre, post = make_pre_post_processors(cfg, dataset_stats=dataset.meta.stats)
    fps = dataset.meta.fps
    delta = {}
    if cfg.observation_delta_indices is not None:
        for key in inputs:
            delta[key] = [i / fps for i in cfg.observation_delta_indices]
    delta[ACTION_KEY] = [i / fps for i in cfg.action_delta_indices]
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    train_ds = LeRobotDataset(dataset.repo_id, root=dataset.root, video_backend="pyav", delta_timestamps=delta)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=batch_size, shuffle=True, num_workers=0)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    policy.train()
    losses: list[float] = []
    while len(losses) < steps:
        for batch in loader:
            batch = pre(batch)
            loss, _ = policy.forward(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if len(losses) >= steps:
                break
    policy.eval()
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    policy.save_pretrained(out_dir)
    pre.save_pretrained(out_dir)
    post.save_pretrained(out_dir)
    return TinyTrainResult(checkpoint=out_dir, losses=losses)


def tiny_act_checkpoint(
    work_dir: Path,
    cameras: dict[str, tuple[int, int]],
    steps: int = 5,
    frames_per_episode: int = 30,
    chunk_size: int = 10,
) -> Path:
    """Dataset + a few training steps of a tiny ACT -> checkpoint folder (work_dir/checkpoint)."""
    work_dir = Path(work_dir)
    ds = make_synthetic_dataset(work_dir / "dataset", cameras, frames_per_episode=frames_per_episode)
    return train_tiny_policy(
        ds, work_dir / "checkpoint", policy_type="act", steps=steps, chunk_size=chunk_size
    ).checkpoint
