"""Faults inside the writer: killed mid-commit, disk full (injected, and a real full tmpfs).

- the writer SIGKILLed inside a commit, after LeRobot wrote part of it: the next start rolls the
  torn commit back and commits the staged episode again;
- disk full: recording stops with a clear error, the loop keeps running, the dataset stays
  loadable, and the next start commits what was staged.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from recording_support import SyntheticLoop, load_dataset, wait_until
from test_recording_crash import cams, restart_and_append

from daemon.dataset_schema import read_episode_tags
from daemon.recording.recorder import Recorder, RecorderConfig, RecordingError
from daemon.recording.store import staging_dir


def test_writer_killed_inside_a_commit_is_rolled_back_and_redone(tmp_path):
    root = tmp_path / "ds"
    rec = Recorder(RecorderConfig(root=str(root), fault="kill_in_commit:1"), cams())
    rec.open()
    rec.wait_ready(120)
    with SyntheticLoop(rec):
        for i in range(2):
            rec.start_episode(f"episode {i}")
            time.sleep(0.5)
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
        time.sleep(0.5)
        rec.save_episode(True)
        assert rec.wait_saved(60)
        rec.start_episode("does not fit")
        time.sleep(0.5)
        rec.save_episode(True)
        assert wait_until(lambda: rec.phase == "error", 60)
        st = rec.status()
        assert "No space left on device" in st["error"]
        with pytest.raises(RecordingError, match="recording stopped"):
            rec.start_episode("refused")
        n_calls = len(loop.costs_s)
        time.sleep(0.3)
        assert len(loop.costs_s) > n_calls + 10  # the loop kept running
    rec.close()
    assert load_dataset(root).num_episodes == 1  # rolled back to the last good commit
    assert restart_and_append(root, {2}) == 2  # the staged episode was committed on restart


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_disk_full_on_a_tiny_tmpfs(small_tmpfs):
    root = small_tmpfs / "ds"
    rec = Recorder(RecorderConfig(root=str(root)), cams())
    rec.open()
    rec.wait_ready(120)
    filler = small_tmpfs / "filler"
    with SyntheticLoop(rec) as loop:
        rec.start_episode("fits")
        time.sleep(0.5)
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
            time.sleep(0.7)
            try:
                rec.save_episode(True)
            except RecordingError:
                break
            wait_until(lambda: rec.pending_saves() == 0 or rec.phase == "error", 30)
        assert rec.phase == "error", rec.status()
        assert "No space left on device" in rec.status()["error"]
        n = len(loop.costs_s)
        time.sleep(0.3)
        assert len(loop.costs_s) > n + 10  # teleoperation's loop never stopped
    rec.close()
    assert load_dataset(root).num_episodes >= 1
    filler.unlink()
    before = restart_and_append(root, {1, 2, 3, 4, 5, 6, 7})
    assert before >= 1
