"""Faults inside the writer: killed mid-commit, disk full (injected, and a real full tmpfs).

- the writer SIGKILLed inside a commit, after LeRobot wrote part of it: the next start rolls the
  torn commit back and commits the staged episode again;
- disk full: recording stops with a clear error, the loop keeps running, the dataset stays
  loadable; an episode that may not fit is refused before it starts, with the figures; once space
  is back the staged episode is committed and the next `episode start` records, no restart.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import subprocess
from pathlib import Path

import pytest
from recording_support import SyntheticLoop, load_dataset, record_frames, wait_until
from test_recording_crash import cams, restart_and_append

from daemon.data.recorder import Recorder, RecorderConfig, RecordingError
from daemon.data.schema import read_episode_tags
from daemon.data.store import staging_dir
from drivers.cameras import CameraConfig, VirtualArmCamera


def test_writer_killed_inside_a_commit_is_rolled_back_and_redone(tmp_path):
    root = tmp_path / "ds"
    rec = Recorder(RecorderConfig(root=str(root), fault="kill_in_commit:1"), cams())
    rec.open()
    rec.wait_ready(120)
    with SyntheticLoop(rec):
        for i in range(2):
            rec.start_episode(f"episode {i}")
            record_frames(rec, 15)
            rec.save_episode(True)
        assert wait_until(lambda: rec.phase == "error", 90), rec.status()
        assert "writer process" in rec.status()["error"]
    rec.close()
    assert (staging_dir(root) / "commit.json").exists()  # torn: LeRobot had written part of episode 1
    assert restart_and_append(root, {2}) == 2  # rolled back, then episode 1 re-committed from staging
    tags = read_episode_tags(root)
    assert sorted(tags) == [0, 1, 2]


def test_disk_full_stops_recording_loop_continues_dataset_loads(tmp_path):
    root = tmp_path / "ds"
    rec = Recorder(RecorderConfig(root=str(root), fault="enospc_in_commit:1"), cams())
    rec.open()
    rec.wait_ready(120)
    with SyntheticLoop(rec) as loop:
        rec.start_episode("fits")
        record_frames(rec, 15)
        rec.save_episode(True)
        assert rec.wait_saved(60)
        rec.start_episode("does not fit")
        record_frames(rec, 15)
        rec.save_episode(True)
        assert wait_until(lambda: rec.phase == "error", 60)
        st = rec.status()
        assert "No space left on device" in st["error"]
        rec.cfg.min_free_mb = 1e12  # the disk still full, as far as the recorder can tell
        with pytest.raises(RecordingError, match="recording stopped, the disk is full.*MB free"):
            rec.start_episode("refused")
        n_calls = len(loop.costs_s)
        assert wait_until(lambda: len(loop.costs_s) > n_calls + 10, 10)  # the loop kept running
    rec.close()
    assert load_dataset(root).num_episodes == 1  # rolled back to the last good commit
    assert restart_and_append(root, {2}) == 2  # the staged episode was committed on restart


SMALL_TMPFS_MB = 4


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SMALL_TMPFS_MB}m", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_disk_full_on_a_tiny_tmpfs(small_tmpfs):
    root = small_tmpfs / "ds"
    rec = Recorder(RecorderConfig(root=str(root), min_free_mb=0), cams())  # the full disk mid-episode
    rec.open()
    rec.wait_ready(120)
    filler = small_tmpfs / "filler"
    with SyntheticLoop(rec) as loop:
        rec.start_episode("fits")
        record_frames(rec, 15)
        rec.save_episode(True)
        assert rec.wait_saved(60)
        st = os.statvfs(small_tmpfs)
        free = st.f_bavail * st.f_frsize
        with open(filler, "wb") as fh:  # leave ~40 KB: the next episode cannot fit
            fh.write(b"\0" * max(0, free - 40_000))
        for _ in range(6):
            if rec.phase == "error":
                break
            try:
                rec.start_episode("does not fit")
            except RecordingError:
                break
            # ~20 frames, unless the writer already failed on the full disk
            assert wait_until(lambda: rec.phase == "error" or rec.status()["frames"] >= 20, 30), rec.status()
            try:
                rec.save_episode(True)
            except RecordingError:
                break
            wait_until(lambda: rec.pending_saves() == 0 or rec.phase == "error", 30)
        assert rec.phase == "error", rec.status()
        assert "No space left on device" in rec.status()["error"]
        # the figures, as the start refusal gives them
        assert re.search(r"\d+\.\d MB free for .*free some space and start again", rec.status()["error"]), rec.status()
        n = len(loop.costs_s)
        assert wait_until(lambda: len(loop.costs_s) > n + 10, 10)  # teleoperation's loop never stopped
        filler.unlink()
        lost = rec.status()["lost_episodes"]
        again = rec.start_episode("after space came back")["episode"]
        # a LOST episode's number is not answered again for another one
        assert not any(text.startswith(f"episode {again} ") for text in lost), (again, lost)
        rec.discard_episode()
    rec.close()
    assert load_dataset(root).num_episodes >= 1
    before = restart_and_append(root, {1, 2, 3, 4, 5, 6, 7}, min_free_mb=0)
    assert before >= 1


def fill(path: Path, leave_bytes: int) -> None:
    """Writes ``path`` until only ``leave_bytes`` are free on its filesystem (or none at all)."""
    st = os.statvfs(path.parent)
    todo = max(0, st.f_bavail * st.f_frsize - leave_bytes)
    with open(path, "wb") as fh:
        try:
            while todo > 0:
                todo -= fh.write(b"\0" * min(todo, 1 << 20))
            fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def test_a_full_disk_recovers_without_a_restart(small_tmpfs):
    """Refused before the episode with the figures; a commit that hits the full disk keeps its
    staged episode; space freed: that episode is committed and the next one records; nothing
    earlier is damaged."""
    root = small_tmpfs / "ds"
    cam = [VirtualArmCamera(CameraConfig("front", width=64, height=48))]
    rec = Recorder(RecorderConfig(root=str(root), min_free_mb=1), cam)
    rec.open()
    rec.wait_ready(120)
    filler = small_tmpfs / "filler"
    try:
        with SyntheticLoop(rec):
            rec.start_episode("fits")
            record_frames(rec, 10)
            assert rec.save_episode(True)["durable"] is True
            assert rec.wait_saved(60)

            fill(filler, 500_000)  # under the 1 MB an episode needs
            with pytest.raises(RecordingError, match=r"0\.\d MB free .*at least 1 MB needed"):
                rec.start_episode("refused before it starts")
            assert rec.phase == "idle"
            filler.unlink()

            # the commit meets a full disk: hold it back until the disk is full
            with open(staging_dir(root) / "commit.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                rec.start_episode("staged, then the disk fills")
                record_frames(rec, 10)
                assert rec.save_episode(True)["durable"] is True  # staged and synced
                fill(filler, 0)
            assert wait_until(lambda: rec.phase == "error", 60), rec.status()
            assert "No space left on device" in rec.status()["error"]
            with pytest.raises(RecordingError, match="disk is full.*MB free.*no restart needed"):
                rec.start_episode("still full")
            assert rec.status()["saves_pending"] == 1  # kept staged, not lost
            assert rec.status()["lost_episodes"] == []

            filler.unlink()
            r = rec.start_episode("after space came back")
            assert r["episode"] == 2
            assert wait_until(lambda: rec.status()["episodes_in_dataset"] == 2, 60), rec.status()
            record_frames(rec, 10)
            assert rec.save_episode(True)["durable"] is True
            assert rec.wait_saved(60)
    finally:
        rec.close()
    ds = load_dataset(root)
    assert ds.num_episodes == 3
    assert [list(ds.meta.episodes[e]["tasks"]) for e in range(3)] == [
        ["fits"],
        ["staged, then the disk fills"],
        ["after space came back"],
    ]
    for i in range(len(ds)):
        assert tuple(ds[i]["observation.images.front"].shape) == (3, 48, 64)
