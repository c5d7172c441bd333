"""Crash safety: SIGKILL at any moment loses at most the episode in progress.

- the daemon process and its writer both killed mid-episode, and right after a save;
- only the daemon killed: the writer commits what was saved, then exits;
- the writer killed mid-rollover: right after a commit opened a new packed data/video file;
(The writer killed inside a commit, and disk full: test_recording_faults.py.)
Every case ends with LeRobotDataset loading the folder and the next start appending to it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from recording_support import SyntheticLoop, load_dataset, record_frames, wait_until

from daemon.data.recorder import Recorder, RecorderConfig
from daemon.data.schema import read_episode_tags
from daemon.data.store import staging_dir
from drivers.cameras import CameraConfig, VirtualArmCamera

CHILD = Path(__file__).resolve().parent / "recording_crash_child.py"
REPO = Path(__file__).resolve().parents[1]


def cams():
    return [VirtualArmCamera(CameraConfig(n, width=160, height=120)) for n in ("front", "wrist")]


def run_child_until_kill_point(root: Path, mode: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    writer_pid = -1
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("WRITER"):
            writer_pid = int(line.split()[1])
        if line.strip() == "KILL-ME":
            return proc, writer_pid
    proc.kill()
    raise AssertionError(f"child never reached its kill point (rc {proc.poll()})")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of a dead parent is reaped by init; treat "Z" as dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def restart_and_append(root: Path, expect_before: set[int], min_free_mb: float | None = None) -> int:
    """Next start repairs, resumes the same dataset, and appends one episode."""
    cfg = RecorderConfig(root=str(root))
    if min_free_mb is not None:  # a tiny filesystem
        cfg.min_free_mb = min_free_mb
    rec = Recorder(cfg, cams())
    rec.open()
    rec.wait_ready(120)
    try:
        assert rec.wait_saved(90)
        before = load_dataset(root).num_episodes
        assert before in expect_before, before
        with SyntheticLoop(rec):
            rec.start_episode("after the crash")
            record_frames(rec, 15)
            rec.save_episode(True)
            assert rec.wait_saved(90)
    finally:
        rec.close()
    ds = load_dataset(root)
    assert ds.num_episodes == before + 1
    assert ds[len(ds) - 1]["observation.images.front"].shape == (3, 120, 160)
    assert not any(staging_dir(root).glob("ep-*"))
    return before


def test_a_daemon_killed_while_its_writer_starts_leaves_no_writer_behind(tmp_path):
    """The writer is still importing LeRobot (minutes at nice 19 on a busy machine) when the daemon
    is killed -9: it notices at once and exits, instead of finishing its start for nobody."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path / "ds"), "before_ready"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("WRITER"), first
        writer_pid = int(first.split()[1])
        # stderr is shared with the writer: it ends when the writer has exited
        log = proc.stderr.read()
        wait_until(lambda: not pid_alive(writer_pid), 30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the child's group is left
        except ProcessLookupError:
            pass
        proc.wait()
    assert "the daemon died before the dataset writer was ready" in log, log
    assert "parent process died" not in log  # it did not finish its start first


def test_a_recorder_closed_while_its_writer_starts_leaves_no_writer_behind(tmp_path):
    """The daemon stopped (or a test done) before its writer finished starting: close returns at
    once and no writer is left importing for nobody (it ignores SIGTERM)."""
    rec = Recorder(RecorderConfig(root=str(tmp_path / "ds")), [])
    rec.open()
    writer = rec._proc
    assert writer is not None and writer.is_alive() and not rec._ready.is_set()
    started = time.monotonic()
    assert rec.close(timeout_s=30) == []
    assert not writer.is_alive()
    assert time.monotonic() - started < 10  # not the 30 s stop timeout


def test_kill_9_everything_mid_episode(tmp_path):
    root = tmp_path / "ds"
    proc, writer = run_child_until_kill_point(root, "mid_episode")
    os.killpg(proc.pid, signal.SIGKILL)  # the daemon and its writer, like a power cut of the service
    proc.wait(10)
    assert wait_until(lambda: not pid_alive(writer), 10)
    assert restart_and_append(root, {2}) == 2


def test_kill_9_everything_right_after_a_save(tmp_path):
    root = tmp_path / "ds"
    proc, writer = run_child_until_kill_point(root, "mid_save")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert wait_until(lambda: not pid_alive(writer), 10)
    # the save returned before the episode was encoded/staged: it survives if it got staged
    restart_and_append(root, {2, 3})


def test_kill_9_daemon_only_lets_the_writer_finish_saved_episodes(tmp_path):
    root = tmp_path / "ds"
    proc, writer = run_child_until_kill_point(root, "mid_save")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert wait_until(lambda: not pid_alive(writer), 90), "writer did not exit after its parent died"
    ds = load_dataset(root)
    assert ds.num_episodes == 3  # the saved one was committed by the orphaned writer
    assert read_episode_tags(root)[2].success is True
    restart_and_append(root, {3})


def test_an_answered_save_survives_the_daemon_dying_the_same_instant(tmp_path):
    """save_episode answers only once the save is in the writer's hands: a daemon SIGKILLed right
    after the answer (before its own feeder thread ran again) still gets the episode committed."""
    root = tmp_path / "ds"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), "save_then_die"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL, out
    writer = int(next(line for line in out.splitlines() if line.startswith("WRITER")).split()[1])
    assert wait_until(lambda: not pid_alive(writer), 90), "writer did not exit after its parent died"
    assert load_dataset(root).num_episodes == 3
    assert read_episode_tags(root)[2].success is True


def test_kill_9_writer_mid_rollover_keeps_every_committed_episode(tmp_path):
    """A dataset made with tiny size targets (info.json, as LeRobot's update_chunk_settings
    leaves them) rolls over to new files at every episode; the writer dies right after creating
    one. The next start removes the torn commit's files, re-commits the staged episodes, and every
    earlier episode still decodes."""
    from test_recording_scale import stage_episode

    from daemon.data.store import DatasetStore, StoreConfig

    root = tmp_path / "ds"
    store = DatasetStore(
        StoreConfig(
            root=str(root),
            cameras=[("front", 120, 160), ("wrist", 120, 160)],
            data_files_size_in_mb=0.001,
            video_files_size_in_mb=0.001,
        )
    )
    store.repair()
    store.commit(stage_episode(store, 0, 6))
    store.release_ownership()
    files_before = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())

    proc, writer = run_child_until_kill_point(root, "mid_rollover")
    assert wait_until(lambda: not pid_alive(writer), 90), "the writer never reached the rollover"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert (staging_dir(root) / "commit.json").exists()  # torn mid-rollover
    new_files = [p for p in root.rglob("*") if p.is_file() and p.relative_to(root) not in files_before]
    assert any(p.suffix in (".mp4", ".parquet") for p in new_files), new_files

    before = restart_and_append(root, {2})  # the saved episode is re-committed from staging
    ds = load_dataset(root)
    assert (
        len({int(ds.meta.episodes[i]["videos/observation.images.front/file_index"]) for i in range(ds.num_episodes)})
        == ds.num_episodes
    )  # one video file each: rolled over
    assert ds.num_episodes == before + 1
    for e in range(ds.num_episodes):
        item = ds[int(ds.meta.episodes[e]["dataset_from_index"])]
        assert tuple(item["observation.images.wrist"].shape) == (3, 120, 160)
