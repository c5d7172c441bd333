"""Recording end to end (recorder -> writer process -> LeRobot v3.0), loaded back with LeRobotDataset.

Drives Recorder.on_cycle from a 100 Hz loop with synthetic states and two virtual cameras, then
loads the dataset offline, decodes video frames and checks shapes, names, units, timestamps,
episode tags and the frame/row counts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import av
import numpy as np
import pytest
from recording_support import SyntheticLoop, load_dataset, record_frames, wait_until

from calibration.conventions import FEATURE_NAMES
from daemon.data.recorder import Recorder, RecorderConfig, RecordingError
from daemon.data.schema import EPISODE_TAGS_FILE, read_episode_tags
from daemon.data.store import DatasetMismatchError, staging_dir
from drivers.cameras import CameraConfig, VirtualArmCamera

W, H, FPS = 320, 240, 30


def make_recorder(root: Path, cams=("front", "wrist"), **kw) -> Recorder:
    cameras = [VirtualArmCamera(CameraConfig(n, width=W, height=H, fps=FPS)) for n in cams]
    rec = Recorder(RecorderConfig(root=str(root), fps=FPS, **kw), cameras)
    rec.open()
    rec.wait_ready(120)
    return rec


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Three episodes (success, failure, untagged) and one discarded, then closed."""
    root = tmp_path_factory.mktemp("rec") / "ds"
    rec = make_recorder(root)
    save_s = []
    with SyntheticLoop(rec) as loop:
        for i, success in enumerate((True, False, None)):
            rec.start_episode(f"task {i}")
            record_frames(rec, 36)  # 1.2 s at 30 fps
            t0 = time.perf_counter()
            r = rec.save_episode(success)
            save_s.append(time.perf_counter() - t0)
            assert r["queued"] and r["episode"] == i
        rec.start_episode("thrown away")
        record_frames(rec, 12)
        rec.discard_episode()
        assert rec.wait_saved(90), rec.status()
    status = rec.status()
    rec.close()
    return root, loop, save_s, status


def test_dataset_loads_with_schema_units_and_grid_timestamps(recorded):
    root, loop, _, _status = recorded
    ds = load_dataset(root)
    assert ds.num_episodes == 3
    assert ds.fps == FPS and ds.meta.robot_type == "so101_follower"
    for key in ("observation.state", "action", "teleop.action"):
        assert ds.features[key]["names"] == list(FEATURE_NAMES)
        assert tuple(ds.features[key]["shape"]) == (6,)
    for cam in ("front", "wrist"):
        assert tuple(ds.features[f"observation.images.{cam}"]["shape"]) == (H, W, 3)
        assert ds.meta.features[f"observation.images.{cam}"]["info"]["video.codec"] == "h264"
    eps = ds.meta.episodes
    for e in range(3):
        n = eps[e]["length"]
        assert 36 <= n <= 90  # waited for 36 frames; a busy machine may add some before the save lands
        lo = eps[e]["dataset_from_index"]
        rows = ds.hf_dataset.with_format(None).select(range(lo, lo + n))
        ts = np.array(rows["timestamp"])
        assert np.allclose(ts, np.arange(n) / FPS, atol=1e-6)  # on the fps grid
        assert list(rows["frame_index"]) == list(range(n))
        assert ds[lo]["task"] == f"task {e}"
        state = np.array(rows["observation.state"])
        action = np.array(rows["action"])
        teleop = np.array(rows["teleop.action"])
        assert np.abs(state[:, :5]).max() < 181 and state[:, 5].min() >= 0 and state[:, 5].max() <= 100
        assert np.allclose(action - state, loop.action_offset, atol=1e-4)  # same cycle's vectors
        assert np.allclose(teleop - action, 0.125, atol=1e-4)
        assert np.ptp(state[:, 0]) > 1.0  # the arm moved during the episode


def test_every_video_has_one_frame_per_row_and_decodes(recorded):
    root, _, _, _ = recorded
    ds = load_dataset(root)
    eps = ds.meta.episodes
    for cam in ("front", "wrist"):
        key = f"observation.images.{cam}"
        for e in range(3):
            path = root / ds.meta.get_video_file_path(e, key)
            lo_s, hi_s = eps[e][f"videos/{key}/from_timestamp"], eps[e][f"videos/{key}/to_timestamp"]
            with av.open(str(path)) as c:  # episodes share packed files: count this one's range
                n_video = sum(1 for f in c.decode(video=0) if lo_s - 1e-4 <= float(f.pts * f.time_base) < hi_s - 1e-4)
            assert n_video == eps[e]["length"], (cam, e)
    last = eps[2]["dataset_to_index"] - 1
    item = ds[last]
    img = item["observation.images.front"]
    assert tuple(img.shape) == (3, H, W) and float(img.min()) >= 0.0 and float(img.max()) <= 1.0


def test_decoded_picture_shows_the_recorded_state(recorded):
    """The front camera draws the arm from the state: frame k looks like render(state_k), not like
    the picture of a state a second away."""
    root, _, _, _ = recorded
    ds = load_dataset(root)
    cam = VirtualArmCamera(CameraConfig("front", width=W, height=H))
    lo = ds.meta.episodes[0]["dataset_from_index"]
    n = ds.meta.episodes[0]["length"]
    closer = 0
    for k in range(3, n - 3, 4):
        item = ds[lo + k]
        pic = (item["observation.images.front"].numpy().transpose(1, 2, 0) * 255).astype(np.int16)
        same = np.abs(pic - cam.render(item["observation.state"].numpy()).astype(np.int16)).mean()
        far_state = ds[lo + (k + n // 2) % n]["observation.state"].numpy()
        far = np.abs(pic - cam.render(far_state).astype(np.int16)).mean()
        closer += same < far
    assert closer >= 0.8 * len(range(3, n - 3, 4))


def test_episode_tags_and_timing_are_kept(recorded):
    root, _, _, status = recorded
    tags = read_episode_tags(root)
    assert [tags[i].success for i in range(3)] == [True, False, None]
    ds = load_dataset(root)
    for i in range(3):
        t = tags[i]
        assert t.frames == ds.meta.episodes[i]["length"]
        assert t.origin == "teleop" and t.follower_kind == "emulated"
        assert 0 <= t.late_frames <= t.frames and 0 <= t.missing_frames <= t.frames
        assert 0.0 < t.worst_camera_skew_ms < 1000.0
        timing = np.load(root / "meta" / "so101d_timing" / f"episode_{i:06d}.npz", allow_pickle=False)
        assert len(timing["grid_s"]) == t.frames
        assert np.allclose(timing["grid_s"], np.arange(t.frames) / FPS)
        # state sampled at or after its grid point, within a few loop periods
        assert timing["state_offset_s"].min() >= -1e-6 and np.median(timing["state_offset_s"]) < 0.05
        assert timing["camera_offset_s"].shape == (t.frames, 2)
    assert (root / EPISODE_TAGS_FILE).exists()
    assert status["counters"]["records_lost"] == 0
    assert status["episodes_in_dataset"] == 3 and status["saves_pending"] == 0


def test_save_is_quick_and_the_loop_call_is_cheap(recorded):
    _, loop, save_s, _ = recorded
    assert max(save_s) < 0.5
    costs = np.array(loop.costs_s)
    assert np.median(costs) < 1e-3, np.median(costs)  # tens of microseconds; generous on a shared machine


def test_restart_appends_and_verbs_refuse_what_makes_no_sense(recorded, tmp_path):
    root, _, _, _ = recorded
    copy = tmp_path / "ds"
    import shutil

    shutil.copytree(root, copy)
    rec = make_recorder(copy)
    try:
        assert rec.episode_number == 3
        with pytest.raises(RecordingError, match="no episode"):
            rec.save_episode(True)
        with SyntheticLoop(rec):
            rec.start_episode("appended")
            with pytest.raises(RecordingError, match="already recording"):
                rec.start_episode("again")
            record_frames(rec, 18)
            rec.save_episode(True)
            assert rec.wait_saved(60)
    finally:
        rec.close()
    ds = load_dataset(copy)
    assert ds.num_episodes == 4
    assert ds.meta.episodes[3]["dataset_from_index"] == ds.meta.episodes[2]["dataset_to_index"]
    assert read_episode_tags(copy)[3].success is True
    assert not any(staging_dir(copy).glob("ep-*"))


def test_dataset_with_other_features_is_refused_with_the_differences(recorded):
    root, _, _, _ = recorded
    cameras = [VirtualArmCamera(CameraConfig("front", width=640, height=480))]
    rec = Recorder(RecorderConfig(root=str(root), fps=FPS), cameras)
    with pytest.raises(DatasetMismatchError) as err:
        rec.open()
    msg = str(err.value)
    assert "feature 'observation.images.wrist' is in the dataset but not configured" in msg
    assert "observation.images.front: shape" in msg
    rec2 = Recorder(
        RecorderConfig(root=str(root), fps=15),
        [VirtualArmCamera(CameraConfig(n, width=W, height=H)) for n in ("front", "wrist")],
    )
    with pytest.raises(DatasetMismatchError, match="fps 30 in the dataset, 15 configured"):
        rec2.open()
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 3  # untouched


def test_recording_without_loop_frames_is_refused_cleanly(tmp_path):
    rec = make_recorder(tmp_path / "ds", cams=())
    try:
        rec.start_episode("nothing")
        with pytest.raises(RecordingError, match="no frames"):
            rec.save_episode(True)
        assert rec.phase == "idle"
        with pytest.raises(RecordingError, match="empty"):
            rec.start_episode("   ")
        # state-only dataset (no cameras) records fine
        with SyntheticLoop(rec):
            rec.start_episode("state only")
            record_frames(rec, 15)
            rec.save_episode(None)
            assert wait_until(lambda: rec.pending_saves() == 0, 60)
    finally:
        rec.close()
    ds = load_dataset(tmp_path / "ds")
    assert ds.num_episodes == 1 and not ds.meta.video_keys
