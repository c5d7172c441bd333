"""Cameras: the virtual arm camera draws the state it is given; a dead camera is reported, not hung on."""

from __future__ import annotations

import time

import numpy as np
import pytest
from support import wait_for

from drivers.camera_lerobot import LeRobotCamera, make_camera
from drivers.cameras import Camera, CameraConfig, Frame, VirtualArmCamera


def test_virtual_camera_implements_the_protocol_and_delivers_at_its_rate():
    cam = VirtualArmCamera(CameraConfig("front", width=320, height=240, fps=30))
    assert isinstance(cam, Camera)
    cam.set_state(np.array([0, 10, -20, 5, 0, 50.0]))
    cam.start()
    try:
        wait_for(lambda: cam.stats()["frames"] >= 30, 20, "30 frames")
        cam.stop()  # frozen from here: the last frame and the counters agree
        f = cam.latest_frame()
        st = cam.stats()
    finally:
        cam.stop()
    assert isinstance(f, Frame)
    assert f.pixels.shape == (240, 320, 3) and f.pixels.dtype == np.uint8
    assert abs(f.capture_monotonic_s - time.monotonic()) < 2.0
    # 30 fps configured, measured over its first ~second on a loaded 2-core machine: generous
    # bounds, but it must be streaming at about its rate, neither stuck nor free-running
    assert 15 <= st["fps_measured"] <= 45, st
    assert f.seq == st["frames"] - 1
    assert not st["stalled"] and st["error"] == ""


def test_virtual_picture_follows_the_arm_and_the_gripper():
    cam = VirtualArmCamera(CameraConfig("front", width=320, height=240))
    base = np.array([0, 10, -20, 5, 0, 0.0])
    closed = cam.render(base)
    opened = cam.render(base + np.array([0, 0, 0, 0, 0, 100.0]))
    moved = cam.render(base + np.array([0, 40, 0, 0, 0, 0.0]))
    assert np.count_nonzero(np.any(closed != opened, axis=2)) > 50  # the jaws moved apart
    assert np.count_nonzero(np.any(closed != moved, axis=2)) > 500  # the whole arm moved
    assert np.array_equal(closed, cam.render(base))  # deterministic
    wrist = VirtualArmCamera(CameraConfig("wrist", width=320, height=240))
    assert wrist.view == "wrist"
    w_closed, w_open = wrist.render(base), wrist.render(base + np.array([0, 0, 0, 0, 0, 100.0]))
    assert np.count_nonzero(np.any(w_closed != w_open, axis=2)) > 200


def test_missing_device_is_reported_as_error_and_stalled_without_blocking():
    cam = make_camera(CameraConfig("front", device="/dev/video-does-not-exist", fps=30))
    assert isinstance(cam, LeRobotCamera)
    t0 = time.monotonic()
    cam.start()
    assert time.monotonic() - t0 < 0.5  # start never waits for the device
    wait_for(lambda: cam.is_stalled() and bool(cam.stats()["error"]), 10, "the missing camera flagged stalled")
    st = cam.stats()
    assert cam.latest_frame() is None
    assert "open failed" in st["error"]
    assert st["stalled"] and st["stall_events"] == 1
    cam.stop()


class _FrozenCamera(VirtualArmCamera):
    """A virtual camera whose picture source freezes after a few frames (like a USB camera that
    stops streaming): the base class must flag it stalled and keep the last frame available."""

    def __init__(self) -> None:
        super().__init__(CameraConfig("front", width=64, height=48, fps=30))
        self.frozen = False

    def _grab(self):
        if self.frozen:
            self._stop.wait(0.05)
            return None
        return super()._grab()


def test_camera_that_stops_delivering_is_flagged_stalled():
    cam = _FrozenCamera()
    cam.start()
    try:
        wait_for(lambda: cam.stats()["frames"] >= 5, 10, "5 frames")
        assert not cam.stats()["stalled"]
        cam.frozen = True
        wait_for(lambda: cam.stats()["stalled"], 10, "the frozen camera flagged stalled")
        st = cam.stats()
        assert st["stalled"] and st["read_failures"] > 0
        last = cam.latest_frame()  # the last picture before the freeze stays available
        assert last is not None and last.seq == st["frames"] - 1 and last.pixels.shape == (48, 64, 3)
    finally:
        cam.stop()


def test_bad_camera_configuration_is_refused():
    with pytest.raises(ValueError, match="resolution"):
        VirtualArmCamera(CameraConfig("front", width=0, height=480))
    with pytest.raises(ValueError, match="fps"):
        VirtualArmCamera(CameraConfig("front", fps=0))
