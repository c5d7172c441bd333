"""The daemon on the virtual bench records an episode from a RealSense with depth (LeRobot's real
RealSenseCamera on the fake ``pyrealsense2``, tests/fixtures/sdk): the episode loads in
LeRobotDataset with ``observation.images.wrist_depth`` decoded back to millimetres within the
error of LeRobot's 12-bit quantiser, info.json says what LeRobot needs to decode it, and its
stats are in millimetres. A RealSense unplugged mid-episode and put back: the loop and the
episode go on, the camera is gone meanwhile (status says which), its frames are recorded missing
(counted in the tag, which says when), colour and depth stay one frameset in every row, and the
episode loads."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess

import numpy as np
import pyrealsense2 as rs
import pytest
from realsense_support import plugged
from recording_support import SyntheticLoop, load_dataset, record_frames, wait_until
from rich.console import Console

from daemon.api.client import ControlClient
from daemon.apps.commands.status import one_line, render
from daemon.config.settings import config_from_dict
from daemon.data.recorder import Recorder, RecorderConfig
from daemon.data.schema import read_episode_tags
from daemon.service.daemon import Daemon
from drivers.camera_lerobot import LeRobotCamera
from drivers.cameras import CameraConfig
from drivers.emulator import reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader

pytestmark = pytest.mark.e2e

W, H = 160, 120


def quantiser_bound_mm(depth_mm: np.ndarray, info: dict) -> np.ndarray:
    """The most a depth can move through LeRobot's quantiser, from its own settings in info.json:
    half a 12-bit code (lerobot/datasets/depth_utils.quantize_depth: log codes of depth + shift
    between depth_min and depth_max, DEPTH_QMAX steps), plus dequantize_depth's rounding to whole
    millimetres."""
    from lerobot.configs.video import DEPTH_QMAX

    lo, hi, shift = info["video.depth_min"], info["video.depth_max"], info["video.shift"]
    assert info["video.use_log"] is True
    half_code = (math.log(hi + shift) - math.log(lo + shift)) / DEPTH_QMAX / 2
    return (depth_mm / 1000.0 + shift) * math.expm1(half_code) * 1000.0 + 0.5 + 1e-3


def test_a_realsense_with_depth_records_an_episode_that_lerobot_decodes_to_millimetres(virtual_bench):
    bench = virtual_bench
    data = bench.root / "datasets"
    cfg = config_from_dict(
        {
            "leader": {"port": str(bench.leader_port)},
            "follower": {"port": str(bench.follower_port)},
            "calibration": {"root": str(bench.calibration_root)},
            "socket": {"path": str(bench.socket_path)},
            "control": {"rate_hz": 50.0},
            "recording": {"enabled": True, "dataset_root": str(data), "repo_id": "local/depth", "stop_timeout_s": 60},
            "cameras": {
                "wrist": {
                    "kind": "intelrealsense",
                    "serial_number_or_name": "844212070777",
                    "use_depth": True,
                    "width": W,
                    "height": H,
                    "fps": 30,
                }
            },
        }
    )
    refusals: list[str] = []
    with plugged(rs.FakeDevice(serial="844212070777")):
        daemon = Daemon(
            cfg,
            FeetechLeader(str(bench.leader_port), reference_calibration("leader")),
            FeetechFollower(str(bench.follower_port), reference_calibration("follower")),
        )
        daemon.start()
        try:
            with ControlClient(bench.socket_path, timeout_s=10) as c:

                def started() -> bool:
                    r = c.call("episode.start", task="pick the cube")
                    if r.get("error"):
                        refusals.append(str(r["error"]))
                        return False
                    return True

                assert wait_until(started, 90, 0.2), refusals[-3:]
                assert wait_until(lambda: c.request("episode.status")["frames"] >= 45, 60)
                st = c.request("status")
                saved = c.request("episode.save")
                assert "episode" in str(saved), saved
        finally:
            daemon.stop()
    wrist = st["cameras"]["wrist"]
    assert wrist["state"] == "streaming" and wrist["depth"]["stream"] == "wrist_depth", wrist
    shown = io.StringIO()  # `so101d status`: the camera's line names its depth stream
    Console(file=shown, width=240, color_system=None, force_terminal=False).print(render(st))
    assert "+ depth wrist_depth (mm," in shown.getvalue(), shown.getvalue()

    root = data / "local" / "depth"
    info = json.loads((root / "meta" / "info.json").read_text())
    feature = info["features"]["observation.images.wrist_depth"]
    assert feature["dtype"] == "video" and feature["shape"] == [H, W, 1], feature
    depth_info = feature["info"]
    assert depth_info["is_depth_map"] is True and depth_info["depth_unit"] == "mm", depth_info
    assert depth_info["video.codec"] == "hevc" and depth_info["video.pix_fmt"] == "gray12le", depth_info
    # the x265 settings added to LeRobot's (daemon/data/store.depth_encoder_config), recorded
    assert depth_info["video.preset"] == "ultrafast", depth_info
    assert "lossless=1" in depth_info["video.extra_options"]["x265-params"], depth_info
    assert "bframes=0" in depth_info["video.extra_options"]["x265-params"], depth_info
    assert info["features"]["observation.images.wrist"]["shape"] == [H, W, 3]

    ds = load_dataset(root, "local/depth")
    assert ds.num_episodes == 1 and "observation.images.wrist_depth" in ds.meta.depth_keys
    truth = rs.ramp_depth_mm(0, H, W).astype(np.float64)
    known = truth > 0
    worst = 0.0
    for i in (0, len(ds) // 2, len(ds) - 1):
        item = ds[i]
        assert tuple(item["observation.images.wrist"].shape) == (3, H, W)
        depth = item["observation.images.wrist_depth"]
        assert tuple(depth.shape) == (1, H, W), depth.shape
        got = depth.numpy()[0].astype(np.float64)  # LeRobot's depth_output_unit: millimetres
        err = np.abs(got - truth)[known]
        bound = quantiser_bound_mm(truth, depth_info)[known]
        assert (err <= bound).all(), f"frame {i}: error up to {err.max():.2f} mm, bound {bound[err.argmax()]:.2f}"
        worst = max(worst, float(err.max()))
        # no depth (0): LeRobot's dequantiser clamps to its depth_min
        assert np.allclose(got[~known], depth_info["video.depth_min"] * 1000.0)
    assert worst > 0.0  # lossy where the 12-bit codes are coarser than a millimetre: it was quantised
    # stats in millimetres (a colour camera's are scaled to 0..1; a depth map's are not)
    stats = json.loads((root / "meta" / "stats.json").read_text())
    ds_stats = stats["observation.images.wrist_depth"]
    assert np.asarray(ds_stats["max"]).item() == pytest.approx(truth.max(), abs=2)
    assert np.asarray(ds_stats["min"]).item() == pytest.approx(0.0, abs=1)
    assert 1000 < np.asarray(ds_stats["mean"]).item() < 2500
    assert np.asarray(stats["observation.images.wrist"]["max"]).max() <= 1.0


def depth_config(bench, data, serial: str) -> object:
    return config_from_dict(
        {
            "leader": {"port": str(bench.leader_port)},
            "follower": {"port": str(bench.follower_port)},
            "calibration": {"root": str(bench.calibration_root)},
            "socket": {"path": str(bench.socket_path)},
            "control": {"rate_hz": 50.0},
            "recording": {"enabled": True, "dataset_root": str(data), "repo_id": "local/depth", "stop_timeout_s": 60},
            "cameras": {
                "wrist": {
                    "kind": "intelrealsense",
                    "serial_number_or_name": serial,
                    "use_depth": True,
                    "width": W,
                    "height": H,
                    "fps": 30,
                }
            },
        }
    )


def wrist_stats(c: ControlClient) -> dict:
    (wrist,) = [s for s in c.request("episode.status")["cameras"] if s["name"] == "wrist"]
    return wrist


NEAR_MM, FAR_MM = 500, 2000


def coded_colour(index: int, height: int, width: int) -> np.ndarray:
    """The frame number (mod 256) in eight vertical bands, white for a 1: exact through h264."""
    img = np.zeros((height, width, 3), np.uint8)
    for b in range(8):
        if (index >> b) & 1:
            img[:, b * width // 8 : (b + 1) * width // 8] = 255
    return img


def coded_depth(index: int, height: int, width: int) -> np.ndarray:
    """The same number in the same bands, far for a 1: exact through LeRobot's quantiser."""
    depth = np.full((height, width), NEAR_MM, np.uint16)
    for b in range(8):
        if (index >> b) & 1:
            depth[:, b * width // 8 : (b + 1) * width // 8] = FAR_MM
    return depth


def bits_of(plane: np.ndarray, threshold: float) -> int:
    """The number an HxW plane carries in its bands (each read at its middle)."""
    w = plane.shape[1]
    return sum(1 << b for b in range(8) if plane[:, (2 * b + 1) * w // 16].mean() > threshold)


# LeRobot's read thread logs each failed read (and may end by raising) while the camera is away
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_realsense_unplugged_mid_episode_is_recorded_missing_in_pairs_and_the_episode_loads(virtual_bench):
    bench = virtual_bench
    data = bench.root / "datasets"
    # colour and depth carry the frame's number
    dev = rs.FakeDevice(serial="844212070888", color=coded_colour, depth=coded_depth)
    cfg = depth_config(bench, data, dev.serial)
    refusals: list[str] = []
    with plugged(dev):
        daemon = Daemon(
            cfg,
            FeetechLeader(str(bench.leader_port), reference_calibration("leader")),
            FeetechFollower(str(bench.follower_port), reference_calibration("follower")),
        )
        daemon.start()
        try:
            with ControlClient(bench.socket_path, timeout_s=10) as c:

                def started() -> bool:
                    r = c.call("episode.start", task="pick the cube")
                    if r.get("error"):
                        refusals.append(str(r["error"]))
                        return False
                    return True

                assert wait_until(started, 90, 0.2), refusals[-3:]
                assert wait_until(lambda: c.request("episode.status")["frames"] >= 30, 60)
                rs.unplug(dev.serial)
                assert wait_until(lambda: wrist_stats(c)["state"] == "gone", 30), wrist_stats(c)
                at_gone = c.request("episode.status")["frames"]
                st = c.request("status")
                wrist = st["cameras"]["wrist"]
                assert wrist["device"] == f"realsense:{dev.serial}" and "not connected" in wrist["error"], wrist
                assert "camera wrist GONE" in one_line(st), one_line(st)
                # the loop and the episode go on without the camera
                assert wait_until(lambda: c.request("episode.status")["frames"] >= at_gone + 15, 30)
                assert c.request("status")["mode"] in ("teleop", "aligning")
                rs.plug(dev)
                assert wait_until(lambda: wrist_stats(c)["state"] == "streaming", 60), wrist_stats(c)
                back = c.request("episode.status")["frames"]
                assert wait_until(lambda: c.request("episode.status")["frames"] >= back + 20, 60)
                saved = c.request("episode.save")
                assert "episode" in str(saved), saved
        finally:
            daemon.stop()
    root = data / "local" / "depth"
    ds = load_dataset(root, "local/depth")
    assert ds.num_episodes == 1 and "observation.images.wrist_depth" in ds.meta.depth_keys
    (tag,) = read_episode_tags(root).values()
    assert tag.missing_frames >= 15, tag  # the frames while it was gone, counted
    assert tag.missing_frames < tag.frames - 40, tag
    gaps = [n for n in tag.notes if n.startswith("camera wrist: gone at")]
    assert len(gaps) == 1 and "back at" in gaps[0] and "recorded missing" in gaps[0], tag.notes
    # every row's colour and depth are one frameset (the gap repeats the last pair, both halves):
    # the frame number each half carries in its bit bands
    pairs = []
    for i in range(len(ds)):
        item = ds[i]
        colour = item["observation.images.wrist"].numpy().mean(axis=0)  # CxHxW in 0..1
        depth = item["observation.images.wrist_depth"].numpy()[0]  # HxW millimetres
        pairs.append((bits_of(colour, 0.5), bits_of(depth, (NEAR_MM + FAR_MM) / 2)))
    apart = [(i, c, d) for i, (c, d) in enumerate(pairs) if c != d]
    assert not apart, f"rows whose colour and depth are of different framesets (row, colour, depth): {apart[:10]}"
    # framesets from before and after the gap (a loaded machine records some twice: late frames)
    assert len({c for c, _ in pairs}) > 15, pairs


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


def test_a_disk_filling_while_depth_is_encoded_stops_recording_clearly_and_keeps_the_saved_episode(small_tmpfs):
    """The disk fills mid-episode while the depth stream (the largest: lossless) is encoded: the
    recorder stops with the disk's error, the loop goes on, and the episode saved before loads
    whole, every colour frame and depth map of it."""
    root = small_tmpfs / "ds"
    filler = small_tmpfs / "filler"
    dev = rs.FakeDevice(serial="844212070505", color=coded_colour, depth=coded_depth)
    with plugged(dev):
        cam = LeRobotCamera(
            CameraConfig(
                "wrist", kind="intelrealsense", serial_number_or_name=dev.serial, use_depth=True, width=W, height=H
            )
        )
        rec = Recorder(RecorderConfig(root=str(root), min_free_mb=0), [cam])  # the full disk mid-episode
        rec.open()
        try:
            rec.wait_ready(120)
            assert wait_until(lambda: cam.state == "streaming", 60), cam.stats()
            with SyntheticLoop(rec) as loop:
                rec.start_episode("fits")
                record_frames(rec, 30)
                rec.save_episode(True)
                assert rec.wait_saved(60)
                st = os.statvfs(small_tmpfs)
                with open(filler, "wb") as fh:  # ~60 KB left: a few frames of depth
                    fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - 60_000))
                rec.start_episode("the disk fills under it")
                assert wait_until(lambda: rec.phase == "error", 60), rec.status()
                err = rec.status()["error"]
                # the stream whose write failed (here the depth's, the largest) and the disk's figures
                assert "No space left on device" in err and "encoder for wrist" in err, err
                assert "free some space and start again" in err, err
                n = len(loop.costs_s)
                assert wait_until(lambda: len(loop.costs_s) > n + 10, 10)  # the loop never stopped
        finally:
            rec.close()
            cam.stop()
    filler.unlink()
    ds = load_dataset(root)
    assert ds.num_episodes == 1
    (tag,) = read_episode_tags(root).values()
    assert len(ds) == tag.frames >= 30, (len(ds), tag)
    for i in range(len(ds)):  # every frame of the saved episode: its colour and its depth, one frameset
        item = ds[i]
        colour = item["observation.images.wrist"].numpy().mean(axis=0)
        depth = item["observation.images.wrist_depth"].numpy()[0]
        assert bits_of(colour, 0.5) == bits_of(depth, (NEAR_MM + FAR_MM) / 2), i
