"""Small datasets for the dataset-tool tests, written the way the daemon writes them.

Each episode is staged in the writer's on-disk format (rows.npz, timing.npz, episode.json, one
MP4 per camera encoded by the writer's own CameraEncoder) and committed by the real DatasetStore,
so what the tests edit is byte for byte what a recording leaves (minus the control loop).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VENV_BIN = Path(sys.executable).parent
FPS = 30


def smooth_motion(n: int, phase: float = 0.0) -> np.ndarray:
    """Every joint moving, gripper opening and closing (LeRobot units: degrees, gripper 0..100)."""
    t = np.arange(n) / FPS + phase
    return np.stack(
        [
            30.0 * np.sin(0.9 * t),
            20.0 + 15.0 * np.sin(0.7 * t),
            -30.0 + 20.0 * np.cos(0.6 * t),
            10.0 * np.sin(1.1 * t),
            60.0 * np.sin(0.5 * t),
            50.0 + 45.0 * np.sin(2.5 * t),
        ],
        axis=1,
    ).astype(np.float32)


@dataclass
class Ep:
    """One episode to write: its tag and, for planted defects, how its rows are changed."""

    task: str = "pick the cube"
    success: bool | None = True
    follower_kind: str = "feetech"
    origin: str = "teleop"
    frames: int = 45
    notes: list[str] = field(default_factory=list)
    bench: str = ""
    source: dict[str, Any] = field(default_factory=dict)
    # (state, action) -> (state, action): plant a defect in the rows
    rows: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
    camera_gap: tuple[int, int] | None = None  # frames [a, b) with no new image (a dropped camera)


def store_for(root: Path, cameras: list[tuple[str, int, int]] | None = None):
    from daemon.data.store import DatasetStore, StoreConfig

    store = DatasetStore(StoreConfig(root=str(root), repo_id=f"local/{root.name}", fps=FPS, cameras=cameras or []))
    store.repair(wait_s=5.0)
    return store


def stage_episode(store, ep: Ep, phase: float = 0.0) -> Path:
    """One episode in the writer's staged format (see daemon/data/writer.py EpisodeBuffer.stage)."""
    from daemon.data.store import write_json_atomic
    from daemon.data.writer import CameraEncoder

    uid = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
    stage = store.staging / f"ep-{uid}"
    stage.mkdir(parents=True)
    n = ep.frames
    state = smooth_motion(n, phase)
    action = state + 0.5
    if ep.rows is not None:
        state, action = ep.rows(state.copy(), action.copy())
    cams = [name for name, _, _ in store.cfg.cameras]
    cam_offset = np.zeros((n, len(cams)))
    stats = {}
    for c, (name, h, w) in enumerate(store.cfg.cameras):
        enc = CameraEncoder(stage / name / "video.mp4", FPS, store.cfg)
        enc.start()
        img = np.zeros((h, w, 3), np.uint8)
        for k in range(n):
            if ep.camera_gap and ep.camera_gap[0] <= k < ep.camera_gap[1]:
                cam_offset[k, c] = np.nan  # no image: the previous one repeats
            else:
                img = np.full((h, w, 3), (k * 5) % 255, np.uint8)
            enc.feed(img)
        enc.finish()
        stats[name] = enc.stats
    np.savez(stage / "rows.npz", state=state, action=action, teleop=action)
    np.savez(
        stage / "timing.npz",
        grid_s=np.arange(n) / FPS,
        state_offset_s=np.zeros(n),
        camera_offset_s=cam_offset,
        camera_names=np.asarray(cams, dtype=str),
    )
    missing = int(np.isnan(cam_offset).any(axis=1).sum()) if cams else 0
    tag = {
        "success": ep.success,
        "origin": ep.origin,
        "follower_kind": ep.follower_kind,
        "frames": n,
        "late_frames": 0,
        "missing_frames": missing,
        "worst_camera_skew_ms": 0.0,
        "notes": list(ep.notes),
        "source": dict(ep.source),
        "bench": ep.bench,
    }
    write_json_atomic(
        stage / "episode.json", {"uid": uid, "task": ep.task, "frames": n, "tag": tag, "video_stats": stats}
    )
    return stage


def make_dataset(root: Path, episodes: list[Ep], cameras: list[tuple[str, int, int]] | None = None) -> Path:
    """A dataset of ``episodes``, committed by the real store (one transaction)."""
    store = store_for(root, cameras)
    try:
        stages = [stage_episode(store, ep, phase=i * 0.37) for i, ep in enumerate(episodes)]
        store.commit_many(stages)
    finally:
        store.release_ownership()
    return root


def so101d(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """The `so101d` console script, as an operator runs it."""
    return subprocess.run(
        [str(VENV_BIN / "so101d"), *args], capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy()
    )


def lerobot_edit_dataset(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """LeRobot 0.6.1's own `lerobot-edit-dataset` console script."""
    p = subprocess.run(
        [str(VENV_BIN / "lerobot-edit-dataset"), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def info_json(root: Path) -> dict[str, Any]:
    return json.loads((root / "meta" / "info.json").read_text())


def so101d_here(capsys, *args: str) -> tuple[int, str, str]:
    """The same `so101d` entry point, run in this process (LeRobot imported once per test run):
    (exit code, stdout, stderr)."""
    from daemon.apps.cli import main

    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err
