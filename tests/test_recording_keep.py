"""Keep the last N seconds (`so101d episode keep --last S`, LeRobot 0.6.1's ``lerobot-rollout
--strategy.type=highlight``): between episodes the recorder keeps the last ``ring_s`` seconds of
frames in its pre-roll buffer; ``keep`` turns the newest S seconds of them into the start of a new
episode, which records on live until it is saved.

Real parts: the recorder and its writer process (LeRobot's dataset, PyAV), a virtual camera, and
for the story the daemon in-process on the shared virtual bench (our Feetech driver on the STS3215
emulator), its control socket and the `so101d episode` CLI. What is checked: the episode is the kept
rows then the live ones, frame indices 0..n-1 and timestamps k / fps with no gap or repeat where the
two meet; every row's joints are what the loop had at that row's cycle (the synthetic loop's state
is a function of its clock: the kept rows are the cycles before the verb, the live ones after it);
kept rows are handed to the writer without overrunning a pixel ring far smaller than them (no frame
without its image); a discard mid-flush writes nothing of it; every refusal says why and changes
nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from recording_support import SyntheticLoop, load_dataset, record_frames, synthetic_state, wait_until
from support import wait_for

from daemon.api.client import ControlClient
from daemon.data.recorder import Recorder, RecorderConfig, RecordingError
from daemon.data.schema import read_episode_tags
from daemon.data.store import TIMING_DIR
from drivers.cameras import CameraConfig, VirtualArmCamera

FPS = 30
W, H = 64, 48
REPO = "local/keep"


def make_recorder(root: Path, **kw) -> Recorder:
    cam = VirtualArmCamera(CameraConfig("front", width=W, height=H, fps=FPS))
    rec = Recorder(RecorderConfig(root=str(root), repo_id=REPO, fps=FPS, **kw), [cam])
    rec.open()
    rec.wait_ready(120)
    return rec


def fed(rec: Recorder) -> int:
    return int(rec.status()["preroll"]["fed"])


def episode_rows(ds, i: int):
    lo = int(ds.meta.episodes[i]["dataset_from_index"])
    hi = int(ds.meta.episodes[i]["dataset_to_index"])
    return ds.hf_dataset.with_format(None).select(range(lo, hi))


def test_kept_rows_begin_the_episode_and_the_live_ones_follow_on_one_grid(tmp_path):
    root = tmp_path / "ds"
    # a pixel ring of 6 frames: the 60 kept rows must wait for room, not go without their images
    rec = make_recorder(root, ring_s=3.0, pixel_ring_s=0.2)
    try:
        with pytest.raises(RecordingError, match="nothing buffered yet"):
            rec.keep_episode(1.0)  # the loop has not run
        with SyntheticLoop(rec) as loop:
            assert wait_until(lambda: fed(rec) >= 3 * FPS, 60, 0.02), rec.status()["preroll"]
            assert rec.status()["preroll"]["frames"] == 3 * FPS  # full: at most ring_s * fps
            for bad, words in ((3.5, "longer than the buffer"), (0.0, "above 0"), (-2.0, "above 0")):
                with pytest.raises(RecordingError, match=words) as exc:
                    rec.keep_episode(bad)
                assert exc.value.field == "last_s"
            assert rec.status()["phase"] == "idle"
            t_keep = time.monotonic()
            kept = rec.keep_episode(2.0, task="kept")
            t_answered = time.monotonic()
            assert kept["kept_frames"] == 2 * FPS and kept["kept_s"] == 2.0 and kept["task"] == "kept"
            with pytest.raises(RecordingError, match="already recording"):
                rec.keep_episode(1.0)
            st = rec.status()
            assert st["phase"] == "recording" and st["frames"] >= 2 * FPS
            assert st["kept"]["frames"] == 2 * FPS and st["preroll"]["paused"] is True
            record_frames(rec, 2 * FPS + 45)
            saved = rec.save_episode(True)
            assert rec.wait_saved(90), rec.status()
            # between episodes again: the buffer fills anew
            assert wait_until(lambda: rec.status()["preroll"]["frames"] >= 5, 30, 0.02)
        status = rec.status()
    finally:
        rec.close()
    n = saved["frames"]
    ds = load_dataset(root, REPO)
    assert ds.num_episodes == 1 and int(ds.meta.episodes[0]["length"]) == n == len(ds)
    rows = episode_rows(ds, 0)
    assert [int(x) for x in rows["frame_index"]] == list(range(n))
    np.testing.assert_allclose([float(x) for x in rows["timestamp"]], np.arange(n) / FPS, atol=1e-4)
    timing = np.load(root / TIMING_DIR / "episode_000000.npz")
    state_s = timing["state_s"]
    # in order; a row repeats its cycle only where the loop stalled past a grid point (late frames)
    assert len(state_s) == n and (np.diff(state_s) >= 0).all()
    assert int((np.diff(state_s) == 0).sum()) <= read_episode_tags(root)[0].late_frames
    # the kept rows are the cycles before the verb, the live ones after it: none lost, none twice
    k = kept["kept_frames"]
    assert state_s[k - 1] <= t_keep + 1e-6 < t_answered <= state_s[k] + 0.05
    assert state_s[k] > state_s[k - 1]
    # one grid: row i at the first cycle at or after t0 + i / fps (a cycle is 10 ms here)
    tag = read_episode_tags(root)[0]
    assert tag.kept["frames"] == k and tag.kept["last_s"] == 2.0
    grid = tag.kept["grid_t0_s"] + np.arange(n) / FPS
    offsets = state_s - grid
    assert offsets.min() >= -1e-5 and np.median(offsets) < 0.011, offsets
    # every row's joints are the loop's at that cycle: the kept ones from before the keep too
    state = np.array(rows["observation.state"], dtype=np.float64)
    expect = np.array([synthetic_state(t) for t in state_s])
    np.testing.assert_allclose(state, expect, atol=1e-3)
    action = np.array(rows["action"], dtype=np.float64)
    np.testing.assert_allclose(action, expect + loop.action_offset, atol=1e-3)
    # the 60 kept rows went through a 6-slot pixel ring with every image
    assert status["counters"]["frames_without_pixels"] == 0, status["counters"]
    assert not any("fell behind" in note for note in tag.notes), tag.notes
    assert tag.frames == n and tag.success is True
    assert tuple(ds[0]["observation.images.front"].shape) == (3, H, W)


def test_a_save_or_discard_while_the_kept_rows_are_still_going_to_the_writer(tmp_path):
    root = tmp_path / "ds"
    rec = make_recorder(root, ring_s=2.0, pixel_ring_s=0.1)  # a 3-frame pixel ring
    try:
        with SyntheticLoop(rec):
            assert wait_until(lambda: rec.status()["preroll"]["frames"] >= 2 * FPS, 60, 0.02)
            first = rec.keep_episode(2.0)
            saved = rec.save_episode()  # at once: most kept rows are still queued in the feeder
            assert saved["frames"] >= first["kept_frames"]
            assert rec.wait_saved(90), rec.status()
            # the buffer refills; a keep thrown away mid-flush writes nothing of it
            assert wait_until(lambda: rec.status()["preroll"]["frames"] >= 2 * FPS, 60, 0.02)
            rec.keep_episode(2.0)
            gone = rec.discard_episode()
            assert gone["discarded_frames"] >= 2 * FPS
            assert wait_until(lambda: rec.status()["kept"] is None and rec.status()["preroll"]["frames"] > 0, 30)
            # an ordinary episode after them: the buffer empties at its start, nothing of it kept
            rec.start_episode("plain")
            assert rec.status()["preroll"]["frames"] == 0 and rec.status()["kept"] is None
            record_frames(rec, 10)
            plain = rec.save_episode()
            assert rec.wait_saved(90), rec.status()
        status = rec.status()
    finally:
        rec.close()
    ds = load_dataset(root, REPO)
    assert ds.num_episodes == 2
    assert [int(ds.meta.episodes[i]["length"]) for i in range(2)] == [saved["frames"], plain["frames"]]
    tags = read_episode_tags(root)
    assert tags[0].kept["frames"] == first["kept_frames"] and tags[1].kept == {}
    assert status["counters"]["frames_without_pixels"] == 0, status["counters"]
    assert [int(x) for x in episode_rows(ds, 0)["frame_index"]] == list(range(saved["frames"]))


def test_keep_with_the_buffer_off_is_refused(tmp_path):
    rec = make_recorder(tmp_path / "ds")
    try:
        with SyntheticLoop(rec):
            assert rec.status()["preroll"] is None
            with pytest.raises(RecordingError, match=r"ring_s is 0 \(off\)"):
                rec.keep_episode(1.0)
            assert rec.status()["phase"] == "idle"
    finally:
        rec.close()


# ---------------------------------------------------------------------------------------- story
SO101D = [sys.executable, "-m", "daemon.apps.cli"]
POSE_A = np.array([0.0, -40.0, 45.0, 30.0, 0.0, 50.0])  # the bench's rest pose
POSE_B = np.array([30.0, -20.0, 30.0, 10.0, 20.0, 20.0])
RING_S = 2.0


def cli(sock: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SO101D, "episode", *args, "--socket", str(sock)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )


def follower_at(c: ControlClient, pose: np.ndarray, tol: float = 1.5) -> bool:
    joints = c.request("status")["joints"]["follower"]
    return joints is not None and bool(np.all(np.abs(np.array(list(joints.values())) - pose) < tol))


@pytest.mark.e2e
def test_story_keep_the_last_seconds_on_the_virtual_bench(virtual_bench):
    data = virtual_bench.root / "datasets"
    d = virtual_bench.daemon(
        {
            "recording": {
                "enabled": True,
                "dataset_root": str(data),
                "repo_id": REPO,
                "fps": FPS,
                "stop_timeout_s": 60,
                "ring_s": RING_S,
            },
            "cameras": {"front": {"kind": "virtual", "width": W, "height": H, "fps": FPS}},
        },
        rate_hz=100.0,
    )
    sock = virtual_bench.socket_path
    root = data / "local" / "keep"
    d.start()
    try:
        with ControlClient(d.socket_path, timeout_s=10) as c:
            wait_for(lambda: c.request("status")["mode"] == "teleop", 120, "teleop")
            wait_for(lambda: c.request("episode.status")["phase"] == "idle", 120, "the recorder ready")
            # the operator holds the leader at A; the buffer fills with A for longer than it holds
            virtual_bench.leader.set_pose_units(POSE_A)
            wait_for(lambda: follower_at(c, POSE_A), 60, "the follower at A")
            at_a = c.request("episode.status")["preroll"]["fed"]
            wait_for(
                lambda: c.request("episode.status")["preroll"]["fed"] >= at_a + RING_S * FPS + 5,
                60,
                "a full buffer of frames at A",
            )
            pre = c.request("episode.status")["preroll"]
            assert pre["frames"] == pre["max_frames"] == RING_S * FPS and pre["ring_s"] == RING_S

            # refusals, each with its reason, nothing started
            for args, words in (
                (["keep", "--last", "5"], "longer than the buffer: [recording] ring_s = 2 s"),
                (["keep", "--last", "0"], "above 0"),
                (["keep"], "takes --last S"),
                (["start", "--last", "1"], "takes --last S"),
            ):
                r = cli(sock, *args)
                assert r.returncode == 1 and words in r.stderr, (args, r.stdout, r.stderr)
            reply = c.call("episode.keep", last_s=-1)
            assert reply["ok"] is False and reply["field"] == "last_s" and "above 0" in reply["error"], reply
            reply = c.call("episode.keep")
            assert reply["ok"] is False and reply["field"] == "last_s", reply
            reply = c.call("episode.keep", last_s="1")
            assert reply["ok"] is False and reply["field"] == "last_s", reply
            assert c.request("episode.status")["phase"] == "idle"

            t_keep = time.monotonic()
            r = cli(sock, "keep", "--last", "1.5", "--task", "the good part")
            t_answered = time.monotonic()
            assert r.returncode == 0, r.stderr
            assert "its first 1.50 s (45 frames) from before the keep" in r.stdout, r.stdout
            st = c.request("episode.status")
            assert st["phase"] == "recording" and st["kept"]["frames"] == 45 and st["task"] == "the good part"
            r = cli(sock, "keep", "--last", "1")
            assert r.returncode == 1 and "already recording" in r.stderr, r.stderr
            r = cli(sock, "status")
            assert r.returncode == 0 and "kept: its first 45 frames" in r.stdout, r.stdout
            # live: the operator moves to B, and the episode goes on until saved
            virtual_bench.leader.set_pose_units(POSE_B)
            wait_for(lambda: follower_at(c, POSE_B), 60, "the follower at B")
            n0 = c.request("episode.status")["frames"]
            wait_for(lambda: c.request("episode.status")["frames"] >= n0 + 15, 60, "live frames at B")
            r = cli(sock, "save", "--success")
            assert r.returncode == 0, r.stderr
            wait_for(lambda: c.request("episode.status")["saves_pending"] == 0, 60, "the episode committed")
            st = c.request("episode.status")
            assert st["episodes_in_dataset"] == 1 and not st["lost_episodes"], st
            assert st["preroll"]["paused"] is False  # between episodes: the buffer fills again
    finally:
        d.stop()

    ds = load_dataset(root, REPO)
    tags = read_episode_tags(root)
    assert ds.num_episodes == 1
    n = int(ds.meta.episodes[0]["length"])
    assert tags[0].kept["frames"] == 45 and tags[0].frames == n > 45 + 15  # kept rows + live rows
    rows = episode_rows(ds, 0)
    assert [int(x) for x in rows["frame_index"]] == list(range(n))
    np.testing.assert_allclose([float(x) for x in rows["timestamp"]], np.arange(n) / FPS, atol=1e-4)
    timing = np.load(root / TIMING_DIR / "episode_000000.npz")
    state_s = timing["state_s"]
    assert (np.diff(state_s) >= 0).all()  # in order across the join (a stall repeats a cycle)
    assert state_s[44] < t_answered and state_s[45] > t_keep  # kept: before the verb's answer
    grid = tags[0].kept["grid_t0_s"] + np.arange(n) / FPS
    assert (state_s - grid).min() >= -1e-5 and np.median(state_s - grid) < 0.011
    state = np.array(rows["observation.state"], dtype=np.float64)
    # the kept rows hold the follower at A (what status showed then), the last live ones at B
    assert np.all(np.abs(state[:45] - POSE_A) < 2.0), state[:45]
    assert np.all(np.abs(state[-10:] - POSE_B) < 2.0), state[-10:]
    assert tags[0].success is True and tags[0].origin == "teleop"
