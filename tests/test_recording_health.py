"""Issue 18: a recording daemon never loses data silently and never answers "saved" when it isn't.

The operator's stories:

- the README's sim camera (``[cameras.front] kind = "sim"``, no size) on the MuJoCo follower:
  the camera takes the simulator's 320x240, episodes save and load with LeRobotDataset (this
  was the reported loss: the camera defaulted to 640x480, the feeder thread died, every answer
  said "saved", and the daemon exited 0 with both episodes gone);
- a sim camera configured with a size the simulator does not render: an error naming both sizes;
- a recorder thread that raises: recording goes to "error" at once, episode start is refused
  with the reason, save never answers "saved", shutdown names the episode lost;
- the writer process SIGKILLed mid-episode under `so101d run`: `so101d episode status` shows the
  error, `so101d episode save` fails naming it, SIGTERM exits non-zero naming the lost episode;
- a simulator that sends a frame of another size than it announced: refused at the edge,
  counted, the episode goes on and saves with its valid frames;
- `so101d episode` / `so101d record` against a daemon with recording disabled: say so and how
  to enable it, exit non-zero.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from recording_support import SyntheticLoop, load_dataset, wait_until
from support import MujocoSimThread, free_port, still_arm_on_pty, wait_for, wait_status
from virtual_bench_support import VirtualBench

from daemon.api.client import ControlClient
from daemon.apps.commands.episode import format_status
from daemon.config.settings import config_from_dict
from daemon.data.recorder import Recorder, RecorderConfig, RecordingError, frame_refusal
from daemon.data.schema import read_episode_tags
from daemon.service.daemon import EXIT_DATA_LOST, RECORDING_DISABLED, Daemon
from drivers.cameras import CameraConfig, VirtualArmCamera
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader
from drivers.sim_follower import SimFollower

SO101D = [sys.executable, "-m", "daemon.apps.cli"]
POSE = np.array([10.0, -50.0, 55.0, 30.0, 0.0, 40.0])


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SO101D, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )


def sim_daemon(root: Path, endpoint: str, cameras: dict, ds_root: Path) -> Daemon:
    """The daemon as the README's sim section configures it: MuJoCo follower, [recording] on."""
    leader_link = root / "leader"
    root.mkdir(parents=True, exist_ok=True)
    cfg = config_from_dict(
        {
            "socket": {"path": str(root / "c.sock")},
            "follower": {"kind": "sim", "endpoint": endpoint, "stale_timeout_s": 0.5},
            "control": {"rate_hz": 60.0},
            "safety": {"align_speed_deg_s": 120.0, "align_gripper_speed_pct_s": 150.0},
            "recording": {"enabled": True, "fps": 30, "dataset_root": str(ds_root), "repo_id": "local/sim"},
            "cameras": cameras,
        }
    )
    return Daemon(
        cfg, FeetechLeader(str(leader_link), reference_calibration("leader")), SimFollower(endpoint, staleness_s=0.5)
    )


# -------------------------------------------------------------------------------------------------
# the reported case, end to end
# -------------------------------------------------------------------------------------------------
def test_readme_sim_camera_without_size_records_episodes_that_load(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sim = MujocoSimThread(endpoint)  # the MuJoCo follower's default cameras: front + wrist, 320x240
    d = tempfile.TemporaryDirectory(prefix="so101d-health-")
    root = Path(d.name)
    _, lb = still_arm_on_pty(root / "leader", "leader", POSE)
    ds_root = tmp_path / "datasets"
    daemon = sim_daemon(root, endpoint, {"front": {"kind": "sim"}, "wrist": {"kind": "sim"}}, ds_root)
    saved = []
    try:
        daemon.start()
        rec = daemon.recorder
        wait_for(lambda: rec.phase == "idle", 180, f"recorder ready: {rec.status()}")
        wait_for(lambda: daemon.loop.state.mode == "teleop", 30, "teleop")
        st = rec.status()
        assert [(c["name"], c["width"], c["height"]) for c in st["cameras"]] == [
            ("front", 320, 240),
            ("wrist", 320, 240),
        ]
        for task in ("pick the cube", "place the cube"):
            rec.start_episode(task)
            wait_for(lambda: rec.frames_recorded >= 30, 30, "30 frames")
            saved.append(rec.save_episode(True))
        assert rec.wait_saved(180), rec.status()
        st = rec.status()
        assert st["phase"] == "idle" and st["error"] == "" and st["lost_episodes"] == [], st
        assert st["counters"]["frames_refused"] == 0, st
    finally:
        daemon.stop()
        sim.close()
        lb.stop()
        d.cleanup()
    assert daemon.data_lost == []
    ds = load_dataset(ds_root / "local" / "sim", "local/sim")
    assert ds.num_episodes == 2
    assert ds.num_frames == sum(s["frames"] for s in saved)
    item = ds[ds.num_frames - 1]
    for cam in ("front", "wrist"):
        img = item[f"observation.images.{cam}"]
        assert tuple(img.shape) == (3, 240, 320) and float(img.std()) > 0.01, cam
    tags = read_episode_tags(ds_root / "local" / "sim")
    assert [tags[i].follower_kind for i in sorted(tags)] == ["sim-mujoco"] * 2


def test_sim_camera_configured_with_another_size_is_an_error_naming_both(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sim = MujocoSimThread(endpoint, cameras=("front",))
    d = tempfile.TemporaryDirectory(prefix="so101d-health-")
    root = Path(d.name)
    _, lb = still_arm_on_pty(root / "leader", "leader", POSE)
    daemon = sim_daemon(root, endpoint, {"front": {"kind": "sim", "width": 640, "height": 480}}, tmp_path / "datasets")
    try:
        daemon.start()
        rec = daemon.recorder
        wait_for(lambda: rec.phase == "error", 60, f"recorder error: {rec.status()}")
        error = rec.status()["error"]
        assert "640x480" in error and "320x240" in error and "cameras.front" in error, error
        with pytest.raises(RecordingError, match="640x480"):
            rec.start_episode("pick")
        wait_for(lambda: daemon.loop.state.mode == "teleop", 30, "teleop goes on")
    finally:
        daemon.stop()
        sim.close()
        lb.stop()
        d.cleanup()
    assert daemon.data_lost == []  # nothing was recorded, nothing lost


# -------------------------------------------------------------------------------------------------
# the health invariant
# -------------------------------------------------------------------------------------------------
def virtual_cams() -> list:
    return [VirtualArmCamera(CameraConfig(n, width=160, height=120)) for n in ("front", "wrist")]


def test_a_recorder_thread_that_raises_stops_recording_and_nothing_answers_saved(tmp_path):
    rec = Recorder(RecorderConfig(root=str(tmp_path / "ds"), fault="feeder_raise"), virtual_cams())
    rec.open()
    rec.wait_ready(120)
    with SyntheticLoop(rec) as loop:
        rec.start_episode("wipe the table")
        assert wait_until(lambda: rec.phase == "error", 30), rec.status()
        st = rec.status()
        assert "rec-feeder" in st["error"] and "RuntimeError" in st["error"], st
        assert any("episode 0 ('wipe the table'" in x for x in st["lost_episodes"]), st
        with pytest.raises(RecordingError, match="recording stopped: recording thread rec-feeder failed"):
            rec.save_episode(True)
        with pytest.raises(RecordingError, match="recording stopped: recording thread rec-feeder failed"):
            rec.start_episode("again")
        n = len(loop.costs_s)
        assert wait_until(lambda: len(loop.costs_s) > n + 20, 10), "the loop's hook must keep working"
    t0 = time.monotonic()
    lost = rec.close(timeout_s=30)
    assert time.monotonic() - t0 < 20, "a dead feeder must not hold shutdown for the writer timeout"
    assert len(lost) == 1 and "episode 0 ('wipe the table'" in lost[0], lost


def test_an_episode_saved_before_the_feeder_died_is_named_lost_not_saved(tmp_path):
    """The reported sequence: a save is asked for, and the feeder dies (here: on the SAVE record
    itself) before the writer ever saw it. The save is refused with the reason (it once answered
    "queued"), and the episode comes back from close() and the status as lost, never silently
    dropped."""
    rec = Recorder(RecorderConfig(root=str(tmp_path / "ds"), fault="feeder_raise_at_save"), virtual_cams())
    rec.open()
    rec.wait_ready(120)
    with SyntheticLoop(rec):
        rec.start_episode("stack blocks")
        assert wait_until(lambda: rec.frames_recorded >= 12, 30), rec.status()
        # the save never reaches the writer: the answer says so instead of "queued"
        with pytest.raises(RecordingError, match=r"episode 0 not saved: recording stopped") as refused:
            rec.save_episode(True)
        r = str(refused.value)
        assert rec.phase == "error", rec.status()
        assert rec.status()["saves_pending"] == 1  # not committed, and status says so
        assert not rec.wait_saved(5)
    lost = rec.close(timeout_s=30)
    assert len(lost) == 1 and "episode 0 ('stack blocks'" in lost[0] and "never written" in lost[0], (r, lost)
    assert not (tmp_path / "ds" / "meta" / "info.json").exists() or load_dataset(tmp_path / "ds").num_episodes == 0


# -------------------------------------------------------------------------------------------------
# the writer killed, through the real daemon and CLI
# -------------------------------------------------------------------------------------------------
def _bench_at_pose(virtual_bench: VirtualBench) -> Path:
    virtual_bench.leader.set_pose_units(POSE)
    virtual_bench.follower.set_pose_units(POSE)
    return virtual_bench.root


def test_writer_killed_mid_episode_is_visible_and_shutdown_exits_non_zero_naming_the_loss(virtual_bench):
    root = _bench_at_pose(virtual_bench)
    data = root / "datasets"
    cfg = virtual_bench.write_config(
        f'[recording]\nenabled = true\ndataset_root = "{data}"\nrepo_id = "local/kill"\n'
        "stop_timeout_s = 20\n"
        '[cameras.front]\nkind = "virtual"\nwidth = 160\nheight = 120\n',
    )
    sock = ["--socket", str(root / "c.sock")]
    log_path = root / "so101d.log"
    with open(log_path, "w") as log:  # a file, not a pipe: the writer child would hold a pipe open
        proc = subprocess.Popen(
            [*SO101D, "run", "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )
    try:
        wait_status(root / "c.sock", lambda s: (s.get("recording") or {}).get("phase") == "idle", 180, proc)
        r = cli("episode", "start", "--task", "fold the towel", *sock)
        assert r.returncode == 0, (r.stderr, log_path.read_text()[-3000:])
        with ControlClient(root / "c.sock", timeout_s=10) as c:
            wait_until(lambda: c.request("episode.status")["frames"] >= 15, 60)
            st = c.request("episode.status")
            assert st["phase"] == "recording" and st["frames"] >= 15, st
            os.kill(st["writer_pid"], signal.SIGKILL)  # the real writer process, mid-episode
            assert wait_until(lambda: c.request("episode.status")["phase"] == "error", 10)
            assert c.request("status")["mode"] in ("teleop", "aligning"), "teleop goes on"
        status = cli("episode", "status", *sock)
        assert "writer process died (SIGKILL)" in status.stdout, status.stdout
        assert "episode 0 ('fold the towel'" in status.stdout, status.stdout
        save = cli("episode", "save", *sock)
        assert save.returncode != 0 and "saved" not in save.stdout, (save.stdout, save.stderr)
        assert "recording stopped: writer process died (SIGKILL)" in save.stderr, save.stderr
        start = cli("episode", "start", *sock)
        assert start.returncode != 0 and "writer process died" in start.stderr, start.stderr
        session = cli("record", "--episodes", "1", "--episode-time", "1", "--no-keys", *sock)
        assert session.returncode != 0 and "writer process died" in session.stderr, session.stderr
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(20)
    out = log_path.read_text()
    assert rc == EXIT_DATA_LOST, out[-3000:]
    assert "LOST" in out and "episode 0 ('fold the towel'" in out, out[-3000:]
    assert f"exiting with code {EXIT_DATA_LOST}: data was lost" in out, out[-3000:]


# -------------------------------------------------------------------------------------------------
# a frame of the wrong size, at the edge
# -------------------------------------------------------------------------------------------------
class ScriptedSim:
    """A simulator on our own sim-side endpoint (sim_bridge.server.SimServerEndpoint, what the
    MuJoCo and LeIsaac backends use): announces 160x120 cameras, publishes state and frames at
    30 Hz, and sends the front camera at 320x240 while ``wrong_size`` is set."""

    def __init__(self, endpoint: str) -> None:
        from sim_bridge.server import SimServerEndpoint

        self.ep = SimServerEndpoint(
            endpoint, backend="scripted", cameras=[{"name": n, "width": 160, "height": 120} for n in ("front", "wrist")]
        )
        self.ep.open()
        self.wrong_size = threading.Event()
        self.wrong_sent = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        pos = np.zeros(6)
        seq = 0
        rng = np.random.default_rng(0)
        next_s = time.monotonic()
        while not self._stop.is_set():
            inbox = self.ep.poll(max(0.001, next_s - time.monotonic()))
            if inbox.target_units is not None:
                pos = inbox.target_units
            now = time.monotonic()
            if now < next_s:
                continue
            next_s += 1 / 30
            self.ep.send_state(pos, sim_time_s=seq / 30, torque=True, ack_seq=-1, ack_sent_s=0.0)
            for name in ("front", "wrist"):
                h, w = (240, 320) if name == "front" and self.wrong_size.is_set() else (120, 160)
                if self.ep.send_frame(name, seq, now, rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) and (h, w) == (
                    240,
                    320,
                ):
                    self.wrong_sent += 1
            seq += 1

    def close(self) -> None:
        self._stop.set()
        self._t.join(5)
        self.ep.close()


def test_a_frame_of_the_wrong_size_is_refused_counted_and_recording_goes_on(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    follower = SimFollower(endpoint, staleness_s=0.5)
    sim = rec = None
    try:
        # the daemon wires its cameras before the simulator runs: no size given, none known yet
        cams = [follower.camera("front"), follower.camera("wrist")]
        rec = Recorder(RecorderConfig(root=str(tmp_path / "ds")), cams)
        rec.open()
        assert rec.phase == "starting"
        with pytest.raises(RecordingError, match="waiting for the simulator to announce its image size"):
            rec.start_episode("too early")
        sim = ScriptedSim(endpoint)
        follower.connect()
        rec.wait_ready(120)
        assert [(c.width, c.height) for c in cams] == [(160, 120), (160, 120)]  # from the sim's hello
        with SyntheticLoop(rec):
            rec.start_episode("sort parts")
            assert wait_until(lambda: rec.frames_recorded >= 15, 30)
            sim.wrong_size.set()
            assert wait_until(lambda: rec.status()["counters"]["frames_refused"] >= 5, 30), rec.status()
            sim.wrong_size.clear()
            n = rec.frames_recorded
            assert wait_until(lambda: rec.frames_recorded >= n + 15, 30)
            r = rec.save_episode(True)
            assert rec.wait_saved(120), rec.status()
            st = rec.status()
        assert st["phase"] == "idle" and st["error"] == "" and st["lost_episodes"] == [], st
        refused = st["frames_refused"]
        assert set(refused) == {"front"} and refused["front"]["count"] == st["counters"]["frames_refused"], refused
        assert "(240, 320, 3) uint8" in refused["front"]["last"] and "(120, 160, 3) uint8" in refused["front"]["last"]
        shown = format_status(st)  # what `so101d episode status` prints
        assert f"camera front: {refused['front']['count']} frames refused" in shown, shown
    finally:
        if rec is not None:
            assert rec.close(timeout_s=60) == []
        follower.close()
        if sim is not None:
            sim.close()
    ds = load_dataset(tmp_path / "ds")
    assert ds.num_episodes == 1 and ds.num_frames == r["frames"]
    assert tuple(ds[ds.num_frames - 1]["observation.images.front"].shape) == (3, 120, 160)
    tag = read_episode_tags(tmp_path / "ds")[0]
    assert tag.missing_frames >= refused["front"]["count"] // 2, tag
    assert any("camera front" in n and "refused" in n for n in tag.notes), tag.notes


def test_frame_refusal_names_shape_and_dtype():
    assert frame_refusal((120, 160), np.zeros((120, 160, 3), np.uint8)) == ""
    why = frame_refusal((120, 160), np.zeros((120, 160, 3), np.float32))
    assert "float32" in why and "(120, 160, 3) uint8" in why
    assert "(120, 160, 4)" in frame_refusal((120, 160), np.zeros((120, 160, 4), np.uint8))


# -------------------------------------------------------------------------------------------------
# recording disabled
# -------------------------------------------------------------------------------------------------
def test_episode_and_record_against_a_daemon_without_recording_say_how_to_enable_it(virtual_bench):
    root = _bench_at_pose(virtual_bench)
    cfg = config_from_dict(
        {
            "leader": {"port": str(root / "leader")},
            "follower": {"port": str(root / "follower")},
            "calibration": {"root": str(root / "calibration")},
            "socket": {"path": str(root / "c.sock")},
            "recording": {"enabled": False},
        }
    )
    daemon = Daemon(
        cfg,
        FeetechLeader(str(root / "leader"), reference_calibration("leader")),
        FeetechFollower(str(root / "follower"), reference_calibration("follower")),
    )
    sock = ["--socket", str(root / "c.sock")]
    daemon.start()
    try:
        for args in (
            ["episode", "start", "--task", "pick"],
            ["episode", "status"],
            ["episode", "save"],
            ["record", "--episodes", "1", "--episode-time", "1", "--no-keys"],
        ):
            r = cli(*args, *sock)
            assert r.returncode != 0, (args, r.stdout)
            assert "recording is disabled in this daemon" in r.stderr, (args, r.stderr)
            assert "[recording] enabled = true" in r.stderr and "--record N" in r.stderr, r.stderr
            assert "unknown command" not in r.stderr
        with ControlClient(root / "c.sock", timeout_s=5) as c:
            assert c.call("episode.start")["error"] == RECORDING_DISABLED
            assert "unknown command" in c.call("no.such.verb")["error"]  # other verbs unchanged
    finally:
        daemon.stop()


def test_status_while_a_late_sized_camera_opens_the_writer_is_not_a_dead_writer(tmp_path, monkeypatch):
    """A sim camera announces its size after the daemon started, so the recorder opens its writer
    on a thread of its own. `so101d status` asked while that writer process is being spawned must
    not take the not-yet-started process for a dead writer (it once stopped recording for good
    with "writer process exited (code None)")."""
    import multiprocessing.context

    spawning = threading.Event()
    asked = threading.Event()
    original_start = multiprocessing.context.SpawnProcess.start

    def slow_start(self):  # a spawn that takes as long as a loaded machine's: until status was asked
        spawning.set()
        asked.wait(30)
        original_start(self)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", slow_start)
    cam = VirtualArmCamera(CameraConfig("front", width=160, height=120))
    cam.width = cam.height = 0  # not announced yet
    rec = Recorder(RecorderConfig(root=str(tmp_path / "ds")), [cam])
    rec.open()
    try:
        assert rec.phase == "starting"
        cam.width, cam.height = 160, 120  # the simulator announced its size
        assert spawning.wait(30)
        for _ in range(20):  # what `so101d status` asks while the writer process is being spawned
            st = rec.status()
            assert rec.phase == "starting", st
        asked.set()
        while not rec._ready.is_set() and rec.phase == "starting":
            rec.status()  # what `so101d status` asks while the writer spawns
        rec.wait_ready(120)
        assert rec.phase == "idle", rec.status()
    finally:
        rec.close()
