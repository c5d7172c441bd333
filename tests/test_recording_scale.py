"""Recording at scale: commits cost the same at episode 1000 as at episode 1, episodes are packed
into LeRobot v3's shared data/video files, and LeRobot loads, decodes and edits the result.

Episodes are staged exactly as the writer process stages them (writer.CameraEncoder encodes each
camera with PyAV/libx264 and computes LeRobot's image stats; rows.npz, timing.npz, then
episode.json last), then committed by DatasetStore: the real store path, with tiny frames and
short episodes so a thousand of them fit in a test.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest

from daemon.recording.store import DatasetStore, StoreConfig, write_json_atomic
from daemon.recording.writer import CameraEncoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
av.logging.set_level(av.logging.ERROR)  # no libx264 summary per staged episode

CAMERAS = [("front", 24, 32), ("wrist", 24, 32)]
FPS = 30


def frame_rgb(episode: int, frame: int, cam: int, h: int, w: int) -> np.ndarray:
    """A flat colour that tells episode, frame and camera apart after lossy encoding."""
    img = np.empty((h, w, 3), np.uint8)
    img[..., 0] = (episode * 53) % 256
    img[..., 1] = (frame * 40 + cam * 120) % 256
    img[..., 2] = (episode * 17 + 90) % 256
    return img


def stage_episode(store: DatasetStore, episode: int, frames: int, task: str = "pick the cube") -> Path:
    """What writer.EpisodeBuild.stage leaves in the staging folder for one saved episode."""
    uid = f"{time.time_ns():020d}-{episode:08d}"
    d = store.staging / f"ep-{uid}"
    d.mkdir(parents=True)
    stats = {}
    for c, (name, h, w) in enumerate(store.cfg.cameras):
        enc = CameraEncoder(d / name / "video.mp4", FPS, store.cfg)
        enc.start()
        for i in range(frames):
            enc.feed(frame_rgb(episode, i, c, h, w))
        enc.finish()
        stats[name] = enc.stats
    t = np.arange(frames, dtype=np.float32)
    state = np.stack([t * 0.1 + episode + j for j in range(6)], axis=1).astype(np.float32)
    np.savez(d / "rows.npz", state=state, action=state + 0.5, teleop=state + 0.25)
    np.savez(d / "timing.npz", grid_s=t.astype(np.float64) / FPS,
             state_offset_s=np.zeros(frames), camera_offset_s=np.zeros((frames, len(store.cfg.cameras))),
             camera_names=np.asarray([n for n, _, _ in store.cfg.cameras], dtype=str))
    tag = {"success": True, "origin": "teleop", "follower_kind": "sim", "frames": frames, "late_frames": 0,
           "missing_frames": 0, "worst_camera_skew_ms": 0.0, "notes": [], "source": {}}
    write_json_atomic(d / "episode.json", {"uid": uid, "task": task, "frames": frames, "tag": tag,
                                           "video_stats": stats})
    return d


def make_store(root: Path, **caps) -> DatasetStore:
    store = DatasetStore(StoreConfig(root=str(root), fps=FPS, cameras=list(CAMERAS), **caps))
    store.repair()
    return store


def load(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/so101d", root=root, video_backend="pyav")


def files(root: Path, pattern: str) -> list[Path]:
    return sorted(root.glob(pattern))


def assert_frames_match(ds, episode: int, frames: int) -> None:
    """Every decoded frame of the episode is the one written, not a neighbour's."""
    start = int(ds.meta.episodes[episode]["dataset_from_index"])
    for i in range(frames):
        item = ds[start + i]
        assert int(item["episode_index"]) == episode and int(item["frame_index"]) == i
        for c, (name, h, w) in enumerate(CAMERAS):
            got = (item[f"observation.images.{name}"].numpy().transpose(1, 2, 0) * 255.0)
            want = frame_rgb(episode, i, c, h, w).astype(np.float32)
            err = np.abs(got - want).mean()
            assert err < 8.0, (episode, i, name, err)  # neighbours differ by >= 17 in some channel


def test_packed_rollover_follows_lerobot_rules_and_lerobot_reads_it(tmp_path):
    root = tmp_path / "ds"
    store = make_store(root, chunks_size=3, data_files_size_in_mb=0.012, video_files_size_in_mb=0.008)
    lengths = [3 + (i % 4) for i in range(24)]
    for i, n in enumerate(lengths):
        store.commit(stage_episode(store, i, n, task=f"task {i % 2}"))
    store.release_ownership()

    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 24 and info["total_frames"] == sum(lengths)
    assert (info["chunks_size"], info["data_files_size_in_mb"], info["video_files_size_in_mb"]) == (3, 0.012, 0.008)
    cap_data, cap_video = 0.012 * 1024 ** 2, 0.008 * 1024 ** 2
    data = files(root, "data/chunk-*/file-*.parquet")
    videos = files(root, "videos/observation.images.front/chunk-*/file-*.mp4")
    assert len(data) > 3 and len(videos) > 3, "the caps must force rollovers (and a second chunk)"
    for group in (data, videos, files(root, "meta/episodes/chunk-*/file-*.parquet")):
        chunks = {p.parent.name for p in group}
        assert all(len([p for p in group if p.parent.name == c]) <= 3 for c in chunks)
        assert sorted(chunks) == [f"chunk-{i:03d}" for i in range(len(chunks))]
    for p in data[:-1]:
        assert p.stat().st_size < cap_data
    for p in videos[:-1]:
        assert p.stat().st_size < cap_video

    ds = load(root)
    assert ds.num_episodes == 24 and len(ds) == sum(lengths)
    eps = ds.meta.episodes
    for i in range(24):  # pointers as LeRobot's writer sets them: contiguous per file
        e = eps[i]
        if i and e["data/file_index"] == eps[i - 1]["data/file_index"] and \
                e["data/chunk_index"] == eps[i - 1]["data/chunk_index"]:
            key = "videos/observation.images.front/"
        assert e["dataset_to_index"] - e["dataset_from_index"] == lengths[i]
        prev = eps[i - 1] if i else None
        for cam in ("front", "wrist"):
            k = f"videos/observation.images.{cam}/"
            same = prev is not None and (prev[k + "chunk_index"], prev[k + "file_index"]) == \
                (e[k + "chunk_index"], e[k + "file_index"])
            assert e[k + "from_timestamp"] == pytest.approx(prev[k + "to_timestamp"] if same else 0.0)
            assert e[k + "to_timestamp"] - e[k + "from_timestamp"] == pytest.approx(lengths[i] / FPS)
    for i in (0, 5, 11, 23):  # first, middle of a packed file, last
        assert_frames_match(ds, i, lengths[i])
