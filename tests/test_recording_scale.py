"""Recording at scale: episodes are packed into LeRobot v3's shared data/video files, and LeRobot
loads, decodes and edits the result (the cost per commit at scale: bench/bench_recording_scale.py).

Episodes are staged exactly as the writer process stages them (writer.CameraEncoder encodes each
camera with PyAV/libx264 and computes LeRobot's image stats; rows.npz, timing.npz, then
episode.json last), then committed by DatasetStore: the real store path, with tiny frames and
short episodes so a hundred and more fit in a test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest

from daemon.data.store import DatasetStore, StoreConfig, write_json_atomic
from daemon.data.writer import CameraEncoder

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


def encode_cameras(d: Path, store: DatasetStore, episode: int, frames: int) -> dict:
    """Each camera's video.mp4 under ``d`` as writer.CameraEncoder makes it; returns the stats."""
    stats = {}
    for c, (name, h, w) in enumerate(store.cfg.cameras):
        enc = CameraEncoder(d / name / "video.mp4", FPS, store.cfg)
        enc.start()
        for i in range(frames):
            enc.feed(frame_rgb(episode, i, c, h, w))
        enc.finish()
        stats[name] = enc.stats
    return stats


def stage_episode(
    store: DatasetStore,
    episode: int,
    frames: int,
    task: str = "pick the cube",
    videos: tuple[Path, dict] | None = None,
) -> Path:
    """What writer.EpisodeBuild.stage leaves in the staging folder for one saved episode.

    ``videos``: (a folder from encode_cameras, its stats) to copy instead of encoding this
    episode's pictures, for episodes whose frames the test never decodes (the encoder is most
    of a staging's cost and not what a commit measures; the commit gets the same files)."""
    uid = f"{time.time_ns():020d}-{episode:08d}"
    d = store.staging / f"ep-{uid}"
    d.mkdir(parents=True)
    if videos is None:
        stats = encode_cameras(d, store, episode, frames)
    else:
        src, stats = videos
        for name, _, _ in store.cfg.cameras:
            (d / name).mkdir()
            shutil.copyfile(src / name / "video.mp4", d / name / "video.mp4")
    t = np.arange(frames, dtype=np.float32)
    state = np.stack([t * 0.1 + episode + j for j in range(6)], axis=1).astype(np.float32)
    np.savez(d / "rows.npz", state=state, action=state + 0.5, teleop=state + 0.25)
    np.savez(
        d / "timing.npz",
        grid_s=t.astype(np.float64) / FPS,
        state_offset_s=np.zeros(frames),
        camera_offset_s=np.zeros((frames, len(store.cfg.cameras))),
        camera_names=np.asarray([n for n, _, _ in store.cfg.cameras], dtype=str),
    )
    tag = {
        "success": True,
        "origin": "teleop",
        "follower_kind": "sim",
        "frames": frames,
        "late_frames": 0,
        "missing_frames": 0,
        "worst_camera_skew_ms": 0.0,
        "notes": [],
        "source": {},
    }
    write_json_atomic(
        d / "episode.json", {"uid": uid, "task": task, "frames": frames, "tag": tag, "video_stats": stats}
    )
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
            got = item[f"observation.images.{name}"].numpy().transpose(1, 2, 0) * 255.0
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
    cap_data, cap_video = 0.012 * 1024**2, 0.008 * 1024**2
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
        assert e["dataset_to_index"] - e["dataset_from_index"] == lengths[i]
        prev = eps[i - 1] if i else None
        for cam in ("front", "wrist"):
            k = f"videos/observation.images.{cam}/"
            same = prev is not None and (prev[k + "chunk_index"], prev[k + "file_index"]) == (
                e[k + "chunk_index"],
                e[k + "file_index"],
            )
            assert e[k + "from_timestamp"] == pytest.approx(prev[k + "to_timestamp"] if same else 0.0)
            assert e[k + "to_timestamp"] - e[k + "from_timestamp"] == pytest.approx(lengths[i] / FPS)
    for i in (0, 5, 11, 23):  # first, middle of a packed file, last
        assert_frames_match(ds, i, lengths[i])


@pytest.mark.e2e
def test_many_episodes_pack_into_lerobots_default_files_and_lerobot_loads_decodes_and_edits_them(tmp_path):
    """The operator records many short episodes into one dataset (LeRobot's default size targets):
    everything lands in one data file and one video file per camera, the episodes table rolls over
    at 100 rows as LeRobot's does, and LeRobot's loader and lerobot-edit-dataset take it as their own.

    That a commit costs the same at episode 1000 as at episode 1 (and memory does not grow) is a
    speed claim: bench/bench_recording_scale.py measures it side by side with LeRobot's writer."""
    root = tmp_path / "ds"
    store = make_store(root)
    n_episodes, frames = 130, 3  # past the first 100-row episodes file
    tasks = ("pick the cube", "place the cube")
    decoded = {0, 1, 64, 65, 66, 128, 129}  # every episode whose pictures are checked below
    template = tmp_path / "template"
    videos = (template, encode_cameras(template, store, 7, frames))
    for i in range(n_episodes):
        own = i in decoded  # the others get a copy of the template's encoded pictures
        store.commit(stage_episode(store, i, frames, task=tasks[i % 2], videos=None if own else videos))
    store.release_ownership()

    # LeRobot's packing with its default targets: one data file, one video file per camera
    assert [p.relative_to(root).as_posix() for p in files(root, "data/*/*.parquet")] == [
        "data/chunk-000/file-000.parquet"
    ]
    for cam in ("front", "wrist"):
        assert [p.name for p in files(root, f"videos/observation.images.{cam}/*/*.mp4")] == ["file-000.mp4"]
    assert len(files(root, "meta/episodes/*/*.parquet")) == 2  # 100 rows, then the other 30

    ds = load(root)
    assert ds.num_episodes == n_episodes and len(ds) == n_episodes * frames
    for i in (0, 1, 64, 65, 128, 129):  # ends and the middle of the packed files
        assert_frames_match(ds, i, frames)
    assert ds.meta.total_tasks == 2

    # lerobot-edit-dataset (LeRobot's own editor) deletes episodes from it
    out = tmp_path / "edited"
    cmd = [
        sys.executable,
        "-m",
        "lerobot.scripts.lerobot_edit_dataset",
        "--repo_id=local/so101d",
        f"--root={root}",
        "--new_repo_id=local/edited",
        f"--new_root={out}",
        "--operation.type=delete_episodes",
        "--operation.episode_indices=[0, 65, 129]",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    edited = LeRobotDataset("local/edited", root=out, video_backend="pyav")
    assert edited.num_episodes == n_episodes - 3 and len(edited) == (n_episodes - 3) * frames
    # the old episode 66 is now 64: its frames still decode to what was recorded for it
    item = edited[int(edited.meta.episodes[64]["dataset_from_index"]) + 1]
    got = item["observation.images.front"].numpy().transpose(1, 2, 0) * 255.0
    assert np.abs(got - frame_rgb(66, 1, 0, 24, 32)).mean() < 8.0


def lerobot_sessions(root: Path, episodes: int, frames: int) -> None:
    """A dataset as one-commit-per-session recorders left it: each episode its own LeRobot session
    (create / resume, add_frame, save_episode, finalize), so its own data, video and meta files."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from daemon.data.schema import SOURCE_KEY, TAG_KEY, EpisodeTag, dataset_features, tag_to_cell

    enc = RGBEncoderConfig(vcodec="h264", preset="ultrafast", crf=23, g=2)
    for e in range(episodes):
        if e == 0:
            ds = LeRobotDataset.create(
                "local/so101d",
                fps=FPS,
                root=root,
                robot_type="so101_follower",
                features=dataset_features({n: (h, w) for n, h, w in CAMERAS}),
                use_videos=True,
                rgb_encoder=enc,
                video_backend="pyav",
            )
        else:
            ds = LeRobotDataset.resume("local/so101d", root=root, rgb_encoder=enc, video_backend="pyav")
        for i in range(frames):
            frame = {
                "task": "pick the cube",
                "observation.state": np.full(6, e + i, np.float32),
                "action": np.zeros(6, np.float32),
                "teleop.action": np.zeros(6, np.float32),
                TAG_KEY: tag_to_cell(EpisodeTag(e, frames=frames)),
                SOURCE_KEY: "follower=leader",
            }
            for c, (name, h, w) in enumerate(CAMERAS):
                frame[f"observation.images.{name}"] = frame_rgb(e, i, c, h, w)
            ds.add_frame(frame)
        ds.save_episode()
        ds.finalize()


def run_pack(root: Path) -> subprocess.CompletedProcess[str]:
    """`so101d dataset pack ROOT` as the operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "daemon.apps.cli", "dataset", "pack", str(root)],
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        timeout=600,
    )


def test_a_one_file_per_episode_dataset_keeps_appending_and_packs(tmp_path):
    root = tmp_path / "ds"
    lerobot_sessions(root, 3, 4)
    assert len(files(root, "videos/observation.images.front/*/*.mp4")) == 3  # fragmented, as before

    store = make_store(root)
    store.commit(stage_episode(store, 3, 4))  # appends: LeRobot's plain MP4s are closed, not extended
    store.release_ownership()
    ds = load(root)
    assert ds.num_episodes == 4
    for e in range(4):
        assert_frames_match(ds, e, 4)
    before = [ds[i]["observation.images.wrist"] for i in range(len(ds))]

    r = run_pack(root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "packed 4 episodes" in r.stdout
    assert [p.name for p in files(root, "videos/observation.images.front/*/*.mp4")] == ["file-000.mp4"]
    assert len(files(root, "data/*/*.parquet")) == 1
    assert not any(tmp_path.glob(".ds.so101d-pack*")) and not any(tmp_path.glob(".ds.so101d-unpacked"))
    ds = load(root)
    assert ds.num_episodes == 4 and ds.meta.total_frames == 16
    after = [ds[i]["observation.images.wrist"] for i in range(len(ds))]
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(before, after))  # stream copy: same pictures

    store = make_store(root)  # and recording goes on into the packed files
    store.commit(stage_episode(store, 4, 4))
    store.release_ownership()
    ds = load(root)
    assert ds.num_episodes == 5 and len(files(root, "videos/observation.images.front/*/*.mp4")) == 1
    assert_frames_match(ds, 4, 4)


def test_a_dataset_without_cameras_packs(tmp_path):
    """Joints only (a camera-less bench): pack used to crash on the episode's missing staging folder."""
    root = tmp_path / "joints"
    store = DatasetStore(StoreConfig(root=str(root), fps=FPS, cameras=[]))
    store.repair()
    for e in range(3):
        store.commit(stage_episode(store, e, 5))
    store.release_ownership()
    before = load(root)
    states = [before[i]["observation.state"].numpy() for i in range(len(before))]
    r = run_pack(root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "packed 3 episodes" in r.stdout
    after = load(root)
    assert after.num_episodes == 3 and after.meta.total_frames == 15
    assert all(np.array_equal(a, after[i]["observation.state"].numpy()) for i, a in enumerate(states))


def test_pack_refuses_a_folder_that_is_no_dataset(tmp_path):
    (tmp_path / "empty").mkdir()
    r = run_pack(tmp_path / "empty")
    assert r.returncode == 1 and "not a LeRobot dataset" in r.stderr


def test_a_failed_append_leaves_every_shared_file_as_it_was(tmp_path):
    """Disk full (injected) after a commit wrote into the shared data, video and metadata files:
    the rollback puts every file back byte for byte, and the episode commits on the next try."""
    import hashlib

    root = tmp_path / "ds"
    store = make_store(root, data_files_size_in_mb=0.012, video_files_size_in_mb=0.008)
    for i in range(5):
        store.commit(stage_episode(store, i, 4))

    def snapshot() -> dict[str, str]:
        return {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }

    before = snapshot()
    store.cfg.fault = "enospc_in_commit:5"
    stage = stage_episode(store, 5, 4)
    with pytest.raises(OSError, match="No space left"):
        store.commit(stage)
    assert "rolled back a torn commit" in store.rollback_if_torn()
    assert snapshot() == before
    assert load(root).num_episodes == 5

    store.cfg.fault = ""
    store.commit(stage)
    store.release_ownership()
    ds = load(root)
    assert ds.num_episodes == 6
    for e in (3, 4, 5):
        assert_frames_match(ds, e, 4)


def test_pack_finishes_a_swap_cut_short_by_a_crash(tmp_path):
    """Power cut between pack's two renames: the dataset folder is gone, the packed copy and the
    old one are beside it. The next `so101d dataset pack` puts the packed copy in place first."""
    from daemon.data.repack import pack_dirs

    root = tmp_path / "ds"
    store = make_store(root)
    for i in range(3):
        store.commit(stage_episode(store, i, 4))
    store.release_ownership()
    new, old = pack_dirs(root)
    shutil.copytree(root, new)  # the complete packed copy
    root.rename(old)  # ... and the crash came before new -> root
    r = run_pack(root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "finished an interrupted repack" in r.stderr
    assert not new.exists() and not old.exists()
    ds = load(root)
    assert ds.num_episodes == 3
    assert_frames_match(ds, 2, 4)
