"""A RealSense through LeRobot 0.6.1's real RealSenseCamera (lerobot/cameras/realsense/), on the
fake ``pyrealsense2`` (tests/fixtures/sdk): frames are read from what LeRobot's class really keeps
(its colour and depth of one frameset under its frame lock; it has no ``latest_frame``), with
``use_depth`` each frame carries its depth map (HxWx1 uint16 millimetres, the colour frame's
capture time), and status and doctor show the depth stream."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyrealsense2 as rs
import pytest
from realsense_support import (
    colour_with_index,
    depth_index_of,
    depth_with_index,
    frame_index_of,
    paired_device,
    plugged,
)
from support import wait_for

from daemon.apps.commands.doctor import PASS, camera_report
from daemon.config.settings import ConfigError, config_from_dict
from daemon.data.recorder import depth_refusal, records_depth
from daemon.data.ring import Ring
from daemon.service.cameras import build_cameras
from drivers.camera_lerobot import LeRobotCamera, lerobot_config
from drivers.cameras import CameraConfig


def realsense(serial: str, use_depth: bool = True, **kw) -> LeRobotCamera:
    cfg = dict(width=160, height=120, fps=30.0) | kw
    return LeRobotCamera(
        CameraConfig("wrist", kind="intelrealsense", serial_number_or_name=serial, use_depth=use_depth, **cfg)
    )


def streaming(cam: LeRobotCamera, frames: int = 8, timeout_s: float = 30) -> None:
    wait_for(lambda: cam.state not in ("opening", "verifying"), timeout_s, f"camera settled ({cam.stats()})")
    assert cam.state == "streaming", cam.stats()
    wait_for(lambda: cam.stats()["frames"] >= frames, timeout_s, f"{frames} frames")


def test_the_fake_sdk_is_what_lerobot_finds_installed():
    from lerobot.cameras.realsense.camera_realsense import RealSenseCamera
    from lerobot.utils.import_utils import _pyrealsense2_available

    assert _pyrealsense2_available and rs.__file__.endswith("tests/fixtures/sdk/pyrealsense2/__init__.py")
    with plugged(paired_device("111")):
        (found,) = RealSenseCamera.find_cameras()
    assert found["id"] == "111" and found["default_stream_profile"]["format"] == "rgb8"
    assert RealSenseCamera.find_cameras() == []  # unplugged


def test_each_frame_carries_the_depth_map_of_its_own_frameset_at_its_capture_time():
    with plugged(paired_device()) as dev:
        cam = realsense(dev.serial)
        assert cam.use_depth and cam.depth_stream == "wrist_depth"
        cam.start()
        try:
            streaming(cam)
            seen = []
            for _ in range(10):
                f = cam.latest_frame()
                assert f is not None and f.depth_mm is not None
                seen.append(f)
                wait_for(lambda f=f: (cam.latest_frame() or f).seq > f.seq, 10, "a newer frame")
            st = cam.stats()
        finally:
            cam.stop()
    for f in seen:
        assert f.pixels.shape == (120, 160, 3) and f.pixels.dtype == np.uint8
        assert f.depth_mm.shape == (120, 160, 1) and f.depth_mm.dtype == np.uint16
        # the colour frame and its depth map are one frameset: both carry its number
        assert depth_index_of(f.depth_mm) == frame_index_of(f.pixels), (f.seq, f.pixels[0, 0], f.depth_mm[-1, -1])
        assert f.capture_monotonic_s <= time.monotonic()
    assert len({frame_index_of(f.pixels) for f in seen}) == len(seen)  # new framesets, not one re-read
    assert st["kind"] == "intelrealsense" and st["device"] == f"realsense:{dev.serial}" and st["state"] == "streaming"
    assert st["depth"]["stream"] == "wrist_depth" and st["depth"]["shape"] == [120, 160, 1]
    assert st["depth"]["unit"] == "mm" and st["depth"]["frames"] >= 10 and st["depth"]["refused"] == 0
    assert records_depth(cam)


def test_without_use_depth_the_realsense_gives_colour_frames_only():
    with plugged(paired_device()) as dev:
        cam = realsense(dev.serial, use_depth=False)
        cam.start()
        try:
            streaming(cam, frames=3)
            f = cam.latest_frame()
            st = cam.stats()
        finally:
            cam.stop()
    assert f is not None and f.depth_mm is None and f.pixels.shape == (120, 160, 3)
    assert st["depth"] is None and not records_depth(cam)


def test_a_realsense_not_plugged_in_says_lerobots_reason_and_a_mode_it_lacks_is_refused():
    cam = realsense("999999999999")
    cam.start()
    try:  # the SDK waits RESOLVE_WAIT_S for the device to be plugged in before it fails
        wait_for(lambda: "open failed" in cam.stats()["error"], rs.RESOLVE_WAIT_S + 20, "the open's failure")
        assert "Failed to open RealSenseCamera(999999999999)" in cam.stats()["error"]
        assert cam.state == "opening" and "still opening" in cam.refusal()
    finally:
        cam.stop()
    with plugged(paired_device("222")):
        odd = realsense("222", width=200, height=100)
        odd.start()
        try:  # plugged in, not in that mode: refused, naming the mode asked and the camera's default
            wait_for(lambda: odd.state == "refused", 20, f"the open's refusal ({odd.stats()})")
            why = odd.refusal()
        finally:
            odd.stop()
    assert "the RealSense 222 is plugged in but does not stream 200x100 @ 30 fps (colour and depth" in why, why
    assert "Couldn't resolve requests" in why and "its default is 640x480 @ 30 fps" in why, why


def test_use_depth_belongs_to_the_realsense():
    with pytest.raises(ConfigError, match="use_depth: only kind = 'intelrealsense'"):
        config_from_dict({"cameras": {"front": {"kind": "opencv", "use_depth": True}}})
    with pytest.raises(ConfigError, match="taken by camera 'wrist'"):
        config_from_dict(
            {
                "cameras": {
                    "wrist": {"kind": "intelrealsense", "serial_number_or_name": "1", "use_depth": True},
                    "wrist_depth": {"kind": "virtual"},
                }
            }
        )
    with pytest.raises(ValueError, match="has no depth stream"):
        lerobot_config(CameraConfig("front", device="0", use_depth=True))
    cfg = config_from_dict(
        {"cameras": {"wrist": {"kind": "intelrealsense", "serial_number_or_name": "1", "use_depth": True}}}
    )
    (cam,) = build_cameras(cfg.cameras)
    assert isinstance(cam, LeRobotCamera) and cam.use_depth
    assert lerobot_config(cam.config).use_depth is True  # LeRobot's option, under its name


def test_a_frame_without_its_depth_map_is_refused_at_the_recorders_edge():
    assert depth_refusal((120, 160), np.zeros((120, 160, 1), np.uint16)) == ""
    assert "no depth map" in depth_refusal((120, 160), None)
    assert "(120, 160, 1) uint16" in depth_refusal((120, 160), np.zeros((120, 160), np.uint16))
    assert "float32" in depth_refusal((120, 160), np.zeros((120, 160, 1), np.float32))


def test_the_ring_holds_each_depth_map_beside_its_image_aligned_whatever_the_sizes():
    cams = [("a", 7, 9), ("b", 5, 3), ("c", 4, 4)]  # odd byte counts: a uint16 view must stay aligned
    ring = Ring.create(cams, n_records=8, n_pixel_slots=3, depths=[0, 2])
    try:
        assert ring.spec.slot_bytes % 8 == 0
        for slot in range(3):
            for c, (_, _h, _w) in enumerate(cams):
                ring.image_view(slot, c)[:] = 10 * slot + c
            ring.depth_view(slot, 0)[:] = 1000 + slot
            ring.depth_view(slot, 2)[:] = 2000 + slot
        for slot in range(3):
            for c, (_, _h, _w) in enumerate(cams):
                assert (ring.image_view(slot, c) == 10 * slot + c).all()
            d0, d2 = ring.depth_view(slot, 0), ring.depth_view(slot, 2)
            assert d0.shape == (7, 9, 1) and d2.shape == (4, 4, 1) and d0.dtype == np.uint16
            assert (d0 == 1000 + slot).all() and (d2 == 2000 + slot).all()
            assert d0.flags.aligned and d2.flags.aligned
        with pytest.raises(ValueError):
            ring.depth_view(0, 1)  # camera b is recorded without depth
    finally:
        ring.close()


def test_doctor_shows_the_depth_stream():
    with plugged(paired_device("333")):
        cfg = config_from_dict(
            {
                "cameras": {
                    "wrist": {
                        "kind": "intelrealsense",
                        "serial_number_or_name": "333",
                        "use_depth": True,
                        "width": 160,
                        "height": 120,
                    }
                }
            }
        )
        rep = camera_report(cfg.cameras, open_cameras=True)
    assert rep is not None
    (check,) = [c for c in rep.checks if c.name == "camera wrist"]
    assert check.status == PASS, check
    assert "realsense:333" in check.detail and "depth wrist_depth: 160x120 uint16 mm" in check.detail, check


def pairs_match(cam: LeRobotCamera, n: int = 5) -> None:
    """The next ``n`` published frames each carry the depth map of their own frameset."""
    for _ in range(n):
        f = cam.latest_frame()
        assert f is not None and f.depth_mm is not None
        assert depth_index_of(f.depth_mm) == frame_index_of(f.pixels), (f.seq, f.pixels[0, 0], f.depth_mm[-1, -1])
        wait_for(lambda f=f: (cam.latest_frame() or f).seq > f.seq, 10, "a newer frame")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_unplugged_for_a_moment_the_realsense_is_gone_then_back_on_the_sdks_own_reconnect():
    """Pulled and put back within LeRobot's 10 s frame wait: the SDK's pipeline reconnects on its
    own (pipeline.cpp), LeRobot's read thread never stops; the camera is gone meanwhile (no frame,
    and says the serial is not connected), then back, colour and depth still one frameset."""
    dev = paired_device("844212070501")
    with plugged(dev):
        cam = realsense(dev.serial)
        cam.start()
        try:
            streaming(cam)
            rs.unplug(dev.serial)
            wait_for(lambda: cam.state == "gone", 10, f"the camera marked gone ({cam.stats()})")
            assert cam.latest_frame() is None  # its frames are missing from now, none is re-used
            st = cam.stats()
            assert st["gone_events"] == 1 and st["device"] == f"realsense:{dev.serial}", st
            assert f"serial {dev.serial} is not connected" in st["error"], st["error"]
            assert "is gone" in cam.refusal(), cam.refusal()
            rs.plug(dev)  # a new enumeration of the same camera
            wait_for(lambda: cam.state == "streaming" and cam.latest_frame() is not None, 30, f"back ({cam.stats()})")
            pairs_match(cam)
            st = cam.stats()
        finally:
            cam.stop()
    assert [e.kind for e in cam.events] == ["gone", "back"], cam.events
    assert st["error"] == "" and st["depth"]["refused"] == 0, st


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_unplugged_for_longer_lerobots_read_thread_stops_and_the_realsense_is_reopened_when_back():
    """Pulled for longer than the SDK's reconnect waits: LeRobot's read thread gives up (the
    pipeline stopped, its reads raise), the camera stays gone and is looked for by its serial;
    plugged back, it is opened again and streams pairs."""
    dev = paired_device("844212070502")
    with plugged(dev):
        cam = realsense(dev.serial)
        cam.start()
        try:
            streaming(cam)
            rs.unplug(dev.serial)
            wait_for(lambda: cam.state == "gone", 10, f"the camera marked gone ({cam.stats()})")
            wait_for(lambda: "read thread stopped" in cam.stats()["error"], 60, f"LeRobot gave up ({cam.stats()})")
            assert cam.state == "gone" and cam.latest_frame() is None
            rs.plug(dev)
            wait_for(lambda: cam.state == "streaming" and cam.latest_frame() is not None, 60, f"back ({cam.stats()})")
            pairs_match(cam)
        finally:
            cam.stop()
    assert [e.kind for e in cam.events] == ["gone", "back"], cam.events


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_depth_maps_of_another_dtype_are_refused_said_and_block_recording_until_they_fit():
    """An SDK handing float32 depth (LeRobot passes it on): no colour frame is published without a
    depth map that fits, the camera's error and its refusal say what came, and once the depth
    fits again the pairs are published and the error is gone."""
    bad = threading.Event()

    def depth(index: int, height: int, width: int) -> np.ndarray:
        d = depth_with_index(index, height, width)
        return d.astype(np.float32) if bad.is_set() else d

    dev = rs.FakeDevice(serial="844212070503", color=colour_with_index, depth=depth)
    with plugged(dev):
        cam = realsense(dev.serial)
        cam.start()
        try:
            streaming(cam)
            bad.set()
            wait_for(lambda: "float32" in cam.stats()["error"], 10, f"the refusal said ({cam.stats()})")
            assert cam.latest_frame() is None
            st = cam.stats()
            assert "(120, 160, 1) float32" in st["error"] and "(120, 160, 1) uint16 mm" in st["error"], st
            assert st["depth"]["refused"] > 0 and "float32" in cam.refusal(), cam.refusal()
            bad.clear()
            wait_for(lambda: cam.latest_frame() is not None, 10, "pairs again")
            pairs_match(cam, 3)
            assert cam.stats()["error"] == "" and cam.refusal() == ""
        finally:
            cam.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_depth_maps_of_another_size_stop_lerobots_read_thread_and_the_camera_says_why():
    """Depth maps of another size than configured: LeRobot's read thread fails on each and stops;
    the camera is gone with LeRobot's own reason (its last read error), not just "stopped"."""
    bad = threading.Event()

    def depth(index: int, height: int, width: int) -> np.ndarray:
        d = depth_with_index(index, height, width)
        return d[: height // 2, : width // 2] if bad.is_set() else d

    dev = rs.FakeDevice(serial="844212070504", color=colour_with_index, depth=depth)
    with plugged(dev):
        cam = realsense(dev.serial)
        cam.start()
        try:
            streaming(cam)
            bad.set()
            wait_for(lambda: cam.state == "gone", 20, f"gone ({cam.stats()})")
            wait_for(lambda: "last read error" in cam.stats()["error"], 20, f"why ({cam.stats()})")
            err = cam.stats()["error"]
            assert "width=80 or height=60 do not match configured width=160 or height=120" in err, err
            assert cam.latest_frame() is None and "is gone" in cam.refusal()
        finally:
            cam.stop()
