"""A power cut right after "saved": the answered episode is in the dataset after the restart.

A power cut kills every process of the service at once (the daemon and its writer) and drops what
was not on the disk yet. SIGKILL of the whole process group is the part a test can do; the answer
waiting for the episode to be staged and synced (fsync of its files and folders) is what makes the
same hold when the page cache is lost too.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from recording_support import SyntheticLoop, load_dataset, record_frames, wait_until
from test_recording_crash import pid_alive

from daemon.apps.commands.episode import format_status
from daemon.data.recorder import Recorder, RecorderConfig
from daemon.data.schema import read_episode_tags
from daemon.data.store import staging_dir
from drivers.cameras import CameraConfig, VirtualArmCamera

CHILD = Path(__file__).resolve().parent / "recording_crash_child.py"
REPO = Path(__file__).resolve().parents[1]
CUT_DELAYS_MS = (0, 1, 2, 5, 10, 20)


def small_camera() -> list[VirtualArmCamera]:
    return [VirtualArmCamera(CameraConfig("front", width=64, height=48))]


def save_then_power_cut(root: Path, delay_ms: float) -> dict:
    """One run of the child: restart (repair), one episode saved, the group killed after the answer."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), "power_cut", str(delay_ms)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: the cut takes the child and its writer only
    )
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == -9, f"the child was not cut (rc {proc.returncode}): {out[-2000:]}"
    writer = int(next(line for line in out.splitlines() if line.startswith("WRITER")).split()[1])
    assert wait_until(lambda: not pid_alive(writer), 10), "the writer outlived the power cut"
    saved = next(line for line in out.splitlines() if line.startswith("SAVED "))
    return json.loads(saved[len("SAVED ") :])


def test_every_answered_save_survives_a_power_cut_right_after_the_answer(tmp_path):
    root = tmp_path / "ds"
    answers = [save_then_power_cut(root, d) for d in CUT_DELAYS_MS]
    # the last restart: repair commits what the last cut left staged
    rec = Recorder(RecorderConfig(root=str(root)), small_camera())
    rec.open()
    rec.wait_ready(120)
    try:
        assert rec.wait_saved(90)
        if all(a.get("durable") for a in answers):
            assert rec.status()["dropped_episodes"] == []
    finally:
        rec.close()
    ds = load_dataset(root)
    tags = read_episode_tags(root)
    for a in answers:
        if a.get("durable") is False:
            continue  # the answer said it was not on the disk yet
        e = int(a["episode"])
        assert e < ds.num_episodes, f"episode {e} answered saved ({a}), the dataset has {ds.num_episodes}"
        meta = ds.meta.episodes[e]
        assert list(meta["tasks"]) == [a["task"]], (e, meta["tasks"], a)
        assert int(meta["length"]) == int(a["frames"]), (e, meta["length"], a)
        assert tags[e].success is True
        for i in range(int(meta["dataset_from_index"]), int(meta["dataset_to_index"])):
            assert tuple(ds[i]["observation.images.front"].shape) == (3, 48, 64)
    if all(a.get("durable") for a in answers):  # (a durable: false one may be gone, and named)
        assert ds.num_episodes == len(answers)  # one episode per answer, under the answered number
        assert [int(a["episode"]) for a in answers] == list(range(len(answers)))
    assert not any(staging_dir(root).glob("ep-*"))


def test_an_episode_repair_cannot_finish_is_named_in_status_and_kept(tmp_path):
    """A saved (staged) episode whose video was cut short cannot be committed: the restart sets it
    aside (kept, not deleted) and status names it with its number, task and why; the next one
    records."""
    root = tmp_path / "ds"
    staging = staging_dir(root)
    staging.mkdir(parents=True)
    with open(staging / "commit.lock", "a") as lock:  # holds the commit back: the episode stays staged
        fcntl.flock(lock, fcntl.LOCK_EX)
        answer = save_then_power_cut(root, 0)
    assert answer["durable"] is True
    (stage,) = staging.glob("ep-*")
    video = stage / "front" / "video.mp4"
    with open(video, "r+b") as fh:
        fh.truncate(video.stat().st_size // 2)

    rec = Recorder(RecorderConfig(root=str(root)), small_camera())
    rec.open()
    rec.wait_ready(120)
    try:
        assert wait_until(lambda: rec.status()["dropped_episodes"], 60), rec.status()
        (dropped,) = rec.status()["dropped_episodes"]
        assert dropped.startswith(f"episode 0 ({answer['task']!r}): could not be committed"), dropped
        assert "unfinished-ep-" in dropped  # where its files are kept
        assert "DROPPED: episode 0" in format_status(rec.status())
        assert rec.wait_saved(30) and rec.status()["saves_pending"] == 0
        with SyntheticLoop(rec):
            rec.start_episode("after the drop")
            record_frames(rec, 10)
            assert rec.save_episode(True)["durable"] is True
            assert rec.wait_saved(60)
    finally:
        rec.close()
    assert load_dataset(root).num_episodes == 1
    assert list(staging.glob("unfinished-ep-*/front/video.mp4"))  # kept for a person to look at


def test_the_episode_in_progress_at_a_crash_is_named_after_the_restart(tmp_path):
    root = tmp_path / "ds"
    rec = Recorder(RecorderConfig(root=str(root)), small_camera())
    rec.open()
    rec.wait_ready(120)
    with SyntheticLoop(rec):
        rec.start_episode("cut mid-episode")
        record_frames(rec, 5)
        assert wait_until(lambda: any(staging_dir(root).glob("ep-*/start.json")), 30)
        rec._proc.kill()  # the writer dies with the episode in progress
        assert wait_until(lambda: rec.phase == "error", 30)
    rec.close()
    rec = Recorder(RecorderConfig(root=str(root)), small_camera())
    rec.open()
    rec.wait_ready(120)
    try:
        assert rec.status()["dropped_episodes"] == [
            "episode 0 ('cut mid-episode'): recording was interrupted before the episode was saved (found at"
            " restart); episode number 0 is not given to another episode"
        ]
        assert rec.status()["episode"] == 1  # the next episode's number
    finally:
        rec.close()


def test_the_cli_says_saving_until_an_answer_is_durable():
    from daemon.apps.commands.episode import describe

    reply = {"episode": 3, "frames": 75, "success": True, "queued": True, "handed_to_writer": True}
    assert describe("save", dict(reply, durable=False)).startswith("episode 3 saving… (75 frames, success; not on")
    assert describe("save", dict(reply, durable=True)).startswith("episode 3 saved (75 frames, success, on disk)")
    st = {"phase": "idle", "episode": 4, "saving": [3], "dropped_episodes": ["episode 2 ('x'): why"]}
    text = format_status(st)
    assert "saving… episode 3" in text and "DROPPED: episode 2 ('x'): why" in text


def _hand_staged(staging: Path, name: str, number: int, task: str) -> Path:
    """A staged episode's folder as the writer leaves it (its files' content does not matter to
    repair's sorting; only which names exist)."""
    d = staging / name
    (d / "front").mkdir(parents=True)
    (d / "front" / "video.mp4").write_bytes(b"\0" * 64)
    (d / "rows.npz").write_bytes(b"\0" * 64)
    (d / "start.json").write_text(json.dumps({"uid": name[3:], "task": task, "episode": number}))
    (d / "saving.json").write_text(json.dumps({"episode": number}))
    return d


def test_repair_sets_aside_a_damaged_or_missing_episode_json_and_never_deletes_a_staged_one(tmp_path):
    """episode.json cut to one byte must not stop every restart; one that went missing after the
    episode was staged (answered durable) must be kept, not deleted as 'never on the disk'."""
    from daemon.data.store import STAGED_FILE, DatasetStore, StoreConfig

    root = tmp_path / "ds"
    staging = staging_dir(root)
    broken = _hand_staged(staging, "ep-1-a", 1, "broken json")
    (broken / "episode.json").write_text("{")
    (broken / STAGED_FILE).touch()
    gone = _hand_staged(staging, "ep-2-b", 2, "json removed")
    (gone / STAGED_FILE).touch()
    _hand_staged(staging, "ep-3-c", 3, "killed while saving")  # no episode.json, never staged

    store = DatasetStore(StoreConfig(root=str(root)))
    store.repair(wait_s=0)
    try:
        texts = [d.describe() for d in store.dropped]
        assert len(texts) == 3, texts
        assert texts[0].startswith("episode 1 ('broken json'): could not be committed"), texts
        assert "ep-1-a/episode.json is unreadable" in texts[0], texts
        assert texts[1].startswith("episode 2 ('json removed'): could not be committed"), texts
        assert "episode.json is missing" in texts[1] and "before it was on the disk" not in texts[1], texts
        assert (
            texts[2] == "episode 3 ('killed while saving'): killed while it was being saved, before it was on the disk"
        )
        assert (staging / "unfinished-ep-1-a" / "front" / "video.mp4").exists()
        assert (staging / "unfinished-ep-2-b" / "front" / "video.mp4").exists()
        assert not (staging / "ep-3-c").exists()
        assert store.staged_episodes() == []
    finally:
        store.release_ownership()
    # the next restart names the two kept ones again, once each
    store = DatasetStore(StoreConfig(root=str(root)))
    store.repair(wait_s=0)
    try:
        assert [d.episode for d in store.dropped] == [1, 2], [d.describe() for d in store.dropped]
    finally:
        store.release_ownership()


def test_an_episode_number_is_never_given_to_another_episode(tmp_path):
    """LeRobot's episode_index closes up when a saved episode is set aside; the number answered to
    the operator does not: the next episodes get new numbers (kept on the disk across a restart),
    each one's tag carries its number, and the drop note says nothing untrue about numbers."""
    root = tmp_path / "ds"
    staging = staging_dir(root)
    rec = Recorder(RecorderConfig(root=str(root)), small_camera())
    rec.open()
    rec.wait_ready(120)
    answers = []
    try:
        with SyntheticLoop(rec):
            rec.start_episode("ep a")
            record_frames(rec, 8)
            answers.append(rec.save_episode(True))
            assert rec.wait_saved(60)
            with open(staging / "commit.lock", "a") as lock:  # b and c stay staged
                fcntl.flock(lock, fcntl.LOCK_EX)
                for task in ("ep b", "ep c"):
                    assert rec.start_episode(task)["episode"] == len(answers)
                    record_frames(rec, 8)
                    answers.append(rec.save_episode(True))
                    assert answers[-1]["durable"] is True
                first, _ = sorted(staging.glob("ep-*"))
                video = first / "front" / "video.mp4"
                with open(video, "r+b") as fh:  # b's video damaged: b is set aside at its commit
                    fh.truncate(video.stat().st_size // 2)
            assert wait_until(lambda: rec.status()["dropped_episodes"], 60), rec.status()
            assert rec.wait_saved(60)
            (dropped,) = rec.status()["dropped_episodes"]
            assert dropped.startswith("episode 1 ('ep b'): could not be committed"), dropped
            assert "will be the next one saved" not in dropped, dropped
            assert rec.status()["last_committed"] == "episode 2 (dataset episode 1)"
            assert "last committed: episode 2 (dataset episode 1)" in format_status(rec.status())
            assert rec.start_episode("ep d")["episode"] == 3  # not 2: that one is 'ep c'
            record_frames(rec, 8)
            answers.append(rec.save_episode(True))
            assert answers[-1]["episode"] == 3
            assert rec.wait_saved(60)
    finally:
        rec.close()
    rec = Recorder(RecorderConfig(root=str(root)), small_camera())
    rec.open()
    rec.wait_ready(120)
    try:
        assert rec.status()["episode"] == 4  # after a restart too: 4 numbers were handed out
        with SyntheticLoop(rec):
            assert rec.start_episode("ep e")["episode"] == 4
            record_frames(rec, 8)
            rec.save_episode(True)
            assert rec.wait_saved(60)
    finally:
        rec.close()
    ds = load_dataset(root)
    tags = read_episode_tags(root)
    by_number = {t.episode_number: (i, list(ds.meta.episodes[i]["tasks"])) for i, t in tags.items()}
    assert by_number == {0: (0, ["ep a"]), 2: (1, ["ep c"]), 3: (2, ["ep d"]), 4: (3, ["ep e"])}, by_number
