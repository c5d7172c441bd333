"""Real cameras through LeRobot's OpenCV camera, against sources OpenCV really opens: a named pipe
fed with a YUV4MPEG2 stream at a set rate (tests/cameras_support.py) and a video file. What the
camera negotiated and delivers is checked at open; unplug and replug are survived."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import cast

import cv2
import numpy as np
import pytest
from cameras_support import PipeCamera
from support import wait_for

from daemon.config.settings import config_from_dict
from daemon.data.recorder import Recorder, save_extras_bytes
from daemon.service.cameras import CameraEpisodeHook, build_cameras
from drivers.camera_lerobot import CameraEvent, LeRobotCamera, Mode, verify
from drivers.cameras import Camera, CameraConfig

# LeRobot logs the end of a stream from its read thread by raising there: expected when unplugged
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


def camera(path: Path, **kw) -> LeRobotCamera:
    cfg = dict(width=320, height=240, fps=30.0) | kw
    return LeRobotCamera(CameraConfig("front", device=str(path), **cfg))


def settled(cam: LeRobotCamera, timeout_s: float = 30) -> str:
    wait_for(lambda: cam.state not in ("opening", "verifying"), timeout_s, f"camera settled ({cam.stats()})")
    return cam.state


@pytest.fixture
def pipes(tmp_path, monkeypatch):
    # FFmpeg probes a pipe for 5 MB by default (1.5 s of this stream); a header says it all
    monkeypatch.setenv("OPENCV_FFMPEG_CAPTURE_OPTIONS", "probesize;65536|analyzeduration;0")
    made: list[PipeCamera] = []

    def make(**kw) -> PipeCamera:
        src = PipeCamera(tmp_path / f"video-{len(made)}", **kw).plug()
        made.append(src)
        return src

    yield make
    for src in made:
        src.unplug()


def test_a_pipe_camera_opens_through_lerobot_verified_with_capture_timestamps(pipes):
    src = pipes(width=320, height=240, header_fps=30, rate_fps=30)
    cam = camera(src.path)
    assert isinstance(cam, Camera)
    cam.start()
    try:
        assert settled(cam) == "streaming", cam.stats()
        wait_for(lambda: cam.stats()["frames"] >= 10, 20, "10 frames")
        f1 = cam.latest_frame()
        wait_for(lambda: (cam.latest_frame() or f1).seq > f1.seq, 10, "a newer frame")
        f2 = cam.latest_frame()
        st = cam.stats()
    finally:
        cam.stop()
    assert cam.refusal() == "" or cam.state == "streaming"
    assert f1 is not None and f2 is not None
    assert f2.pixels.shape == (240, 320, 3) and f2.pixels.dtype == np.uint8
    # LeRobot's own capture stamp, on our clock: before we read it, and recent
    assert f1.capture_monotonic_s < f2.capture_monotonic_s <= time.monotonic()
    assert time.monotonic() - f2.capture_monotonic_s < 5
    assert st["kind"] == "opencv" and st["device"] == str(src.path) and st["state"] == "streaming"
    assert st["format"].startswith("320x240") and st["fps_negotiated"] == 30
    assert 24 <= st["fps_verified"] <= 36, st  # delivered at its rate, measured over its first second
    assert st["problems"] == [] and st["error"] == ""
    assert st["last_frame_age_s"] is not None


def test_a_camera_giving_another_size_is_refused_naming_both_even_with_warn(pipes):
    src = pipes(width=320, height=240)
    for on_mismatch in ("refuse", "warn"):
        cam = camera(src.path, width=640, height=480, on_mismatch=on_mismatch)
        cam.start()
        try:
            assert settled(cam) == "refused"
        finally:
            cam.stop()
        why = cam.refusal()
        assert "configured 640x480, the camera gives 320x240" in why, why
        assert cam.latest_frame() is None  # never published at a size the recorder did not ask for
        assert cam.stats()["frames"] == 0


def test_a_camera_that_negotiates_a_lower_rate_is_refused_or_recorded_with_a_note(pipes):
    src = pipes(header_fps=15, rate_fps=15)
    cam = camera(src.path)
    cam.start()
    try:
        assert settled(cam) == "refused"
    finally:
        cam.stop()
    assert "configured 30 fps, the camera negotiated 15 fps" in cam.refusal(), cam.refusal()
    assert 'on_mismatch = "warn"' in cam.refusal()  # says how to record anyway

    cam = camera(src.path, on_mismatch="warn")
    cam.start()
    try:
        assert settled(cam) == "streaming", cam.stats()
        wait_for(lambda: cam.stats()["frames"] >= 5, 20, "frames at the camera's own rate")
    finally:
        cam.stop()
    assert cam.refusal() == ""
    note = cam.mismatch_note()
    assert "configured 30 fps" in note and "15 fps" in note and "warn" in note, note


def test_a_camera_that_silently_delivers_half_its_rate_is_refused_by_measurement(pipes):
    src = pipes(header_fps=30, rate_fps=12)  # says 30, gives 12: what the backend reports is not enough
    cam = camera(src.path)
    cam.start()
    try:
        assert settled(cam) == "refused"
    finally:
        cam.stop()
    v = cam.verification
    assert v is not None and v.negotiated.fps == 30
    assert 8 <= v.measured_fps <= 16, v
    assert "the camera delivers" in cam.refusal() and "(measured)" in cam.refusal(), cam.refusal()


def test_a_refused_camera_is_looked_at_again_stays_refused_meanwhile_and_fits_once_swapped(pipes, monkeypatch, caplog):
    """The operator plugs the wrong camera into the configured port (it gives another rate), sees
    it refused, and swaps in the right one: the daemon finds it without a restart. While refused it
    says so the whole time, and the same refusal is not logged again at each look."""
    import drivers.camera_lerobot as camera_lerobot

    monkeypatch.setattr(camera_lerobot, "REFUSED_RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(camera_lerobot, "REFUSED_RETRY_MAX_S", 0.4)
    caplog.set_level("INFO", logger="so101d.camera")
    wrong = pipes(header_fps=30, rate_fps=12)  # says 30, gives 12: refused only by measuring it
    cam = camera(wrong.path)
    seen: set[str] = set()
    cam.start()
    try:
        assert settled(cam) == "refused"
        why = cam.refusal()
        assert "the camera delivers" in why, why

        def looked_twice() -> bool:
            seen.add(cam.state)
            # the reason stays while it is looked at again (its measured rate may read a little differently)
            assert "the camera delivers" in cam.refusal(), cam.refusal()
            return cam.stats()["refused_looks"] >= 2

        wait_for(looked_twice, 30, f"two more looks ({cam.stats()})")
        assert seen == {"refused"}, seen  # not "opening" / "verifying" flapping on the page
        errors = [r for r in caplog.records if r.levelname == "ERROR" and "the camera delivers" in r.getMessage()]
        assert len(errors) == 1, [r.getMessage() for r in errors]
        wrong.unplug()
        right = type(wrong)(wrong.path, header_fps=30, rate_fps=30).plug()
        try:
            wait_for(lambda: cam.state == "streaming", 30, f"the right camera taken ({cam.stats()})")
            wait_for(lambda: cam.latest_frame() is not None, 10, "its frames")
            assert cam.refusal() == "" and cam.stats()["error"] == ""
        finally:
            right.unplug()
    finally:
        cam.stop()


def test_unplug_marks_the_camera_gone_and_replug_reopens_it_by_its_path(pipes):
    src = pipes()
    cam = camera(src.path)
    cam.start()
    try:
        assert settled(cam) == "streaming"
        wait_for(lambda: cam.latest_frame() is not None, 10, "a frame")
        src.unplug()  # the feeder killed, the path gone: a USB camera pulled out
        wait_for(lambda: cam.state == "gone", 30, "the camera marked gone")
        assert cam.latest_frame() is None  # nothing stale is served as new
        st = cam.stats()
        assert st["gone_events"] == 1 and st["gone_for_s"] is not None and "gone" in st["error"]
        assert "is gone" in cam.refusal() and "gone: gone" not in cam.refusal(), cam.refusal()
        frames_before = st["frames"]
        src.replug()
        wait_for(lambda: cam.state == "streaming", 30, f"the camera back ({cam.stats()})")
        wait_for(lambda: cam.stats()["frames"] > frames_before + 5, 20, "frames again")
        assert cam.latest_frame() is not None
    finally:
        cam.stop()
    kinds = [e.kind for e in cam.events]
    assert kinds == ["gone", "back"], cam.events
    assert cam.events[0].monotonic_s < cam.events[1].monotonic_s


def test_a_video_file_is_read_and_its_end_is_a_camera_gone(tmp_path):
    path = tmp_path / "clip.avi"
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (320, 240))
    for i in range(200):
        w.write(np.full((240, 320, 3), i % 256, np.uint8))
    w.release()
    cam = camera(path, warmup_s=0)
    cam.start()
    try:
        wait_for(lambda: cam.state == "gone", 30, f"the file read to its end ({cam.stats()})")
    finally:
        cam.stop()
    v = cam.verification
    assert v is not None and v.negotiated == Mode(320, 240, 30.0, "MJPG"), v
    assert cam.stats()["frames"] > 0


def test_verification_names_every_difference():
    v = verify(Mode(640, 480, 30, "MJPG"), Mode(640, 480, 30, "YUYV"), 29.5)
    assert v.problems == ("configured FOURCC MJPG, the camera gives YUYV",) and not v.size_problem
    assert v.refused("refuse") and not v.refused("warn")
    assert verify(Mode(640, 480, 30), Mode(640, 480, 30), 27.0).problems == ()


def test_configuration_takes_lerobot_options_and_bad_ones_are_refused(tmp_path):
    cfg = config_from_dict(
        {"cameras": {"front": {"kind": "opencv", "device": "/dev/video9", "fourcc": "MJPG", "rotation": 90}}}
    )
    (cam,) = build_cameras(cfg.cameras)
    assert isinstance(cam, LeRobotCamera) and cam.config.fourcc == "MJPG" and cam.config.rotation == 90
    # "mjpg" is MJPG (V4L2's codes are case-sensitive: the lower-case one would be an unknown format)
    lower = config_from_dict({"cameras": {"front": {"kind": "opencv", "fourcc": "mjpg"}}})
    assert lower.cameras["front"].fourcc == "MJPG"
    assert config_from_dict({"cameras": {"front": {"fourcc": "pBAA"}}}).cameras["front"].fourcc == "pBAA"
    with pytest.raises(ValueError, match="serial_number_or_name"):
        build_cameras(config_from_dict({"cameras": {"d": {"kind": "intelrealsense"}}}).cameras)
    with pytest.raises(ValueError, match="server_address"):
        build_cameras(config_from_dict({"cameras": {"z": {"kind": "zmq"}}}).cameras)


def capture_threads(cam: LeRobotCamera) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == f"camera-{cam.name}" and t.is_alive()]


def test_a_pipe_whose_writer_stops_is_gone_comes_back_with_a_new_writer_and_stops_at_once(pipes):
    # a named pipe with nothing writing to it blocks whoever opens it to read: the camera must
    # wait for a writer where it still sees stop and a new pipe at the path, not inside the open
    src = pipes()
    cam = camera(src.path)
    cam.start()
    try:
        assert settled(cam) == "streaming"
        src.stop_writer()  # the path stays: only its writer is gone
        wait_for(lambda: cam.state == "gone", 30, "the camera marked gone")
        src.resume_writer()  # a writer on the same pipe
        wait_for(lambda: cam.state == "streaming", 30, f"back with a writer on the same pipe ({cam.stats()})")
        src.unplug()
        wait_for(lambda: cam.state == "gone", 30, "gone again")
        src.replug()  # a new pipe at the same path (a by-id link to another node)
        wait_for(lambda: cam.state == "streaming", 30, f"back on a new pipe at its path ({cam.stats()})")
        src.stop_writer()
        wait_for(lambda: cam.state == "gone", 30, "gone a third time")
        wait_for(lambda: "nothing writes" in cam.stats()["error"], 10, f"the status says why ({cam.stats()})")
    finally:
        cam.stop()
    assert capture_threads(cam) == [], "the capture thread outlived stop (stuck opening a pipe with no writer)"
    assert [e.kind for e in cam.events] == ["gone", "back", "gone", "back", "gone"], cam.events


def test_a_pipe_nobody_writes_to_yet_is_opening_says_why_and_stops_at_once(tmp_path):
    path = tmp_path / "video-nowriter"
    os.mkfifo(path)
    cam = camera(path)
    cam.start()
    try:
        wait_for(lambda: "nothing writes" in cam.refusal(), 10, f"the refusal says why ({cam.stats()})")
        assert cam.state == "opening"
    finally:
        cam.stop()
    assert capture_threads(cam) == [], "the capture thread outlived stop (stuck opening a pipe with no writer)"


def test_a_camera_back_is_dated_by_its_first_frame_not_by_the_end_of_its_check(pipes):
    # frames are recorded again from the first one after the reopen (during the second of rate
    # checking too): the tag's "back at" must not claim they were missing for that second
    src = pipes()
    cam = camera(src.path)
    cam.start()
    try:
        assert settled(cam) == "streaming"
        src.unplug()
        wait_for(lambda: cam.state == "gone", 30, "gone")
        src.replug()
        wait_for(lambda: cam.latest_frame() is not None, 30, "a frame after the replug")
        first = cam.latest_frame()
        assert first is not None
        wait_for(lambda: cam.state == "streaming", 30, "back")
    finally:
        cam.stop()
    back = [e for e in cam.events if e.kind == "back"]
    assert len(back) == 1 and back[0].monotonic_s <= first.capture_monotonic_s, (back, first.capture_monotonic_s)


def test_many_gaps_of_one_camera_fit_the_tag_in_one_note():
    cam = LeRobotCamera(CameraConfig("front", device="/dev/v4l/by-id/usb-cam-video-index0", width=320, height=240))
    hook = CameraEpisodeHook([cam])
    cam.state = "streaming"  # as it was when the episode started
    hook.episode_starting(cast(Recorder, None))  # the hook asks nothing of the recorder
    t0 = time.monotonic()  # the episode's start, give or take the microseconds since
    why = "its read thread stopped (unplugged, or the stream ended)"
    for i in range(6):
        cam.events.append(CameraEvent("gone", t0 + 2 * i + 1.0, why))
        cam.events.append(CameraEvent("back", t0 + 2 * i + 1.5))
    cam.events.append(CameraEvent("gone", t0 + 20.0, why))  # and not back by the end
    _, notes = hook.episode_ending(cast(Recorder, None), saved=True)
    extras = json.loads(save_extras_bytes({"origin": "teleop", "notes": ["another hook's note", *notes]}))
    mine = [n for n in extras["notes"] if n.startswith("camera front")]
    assert len(mine) == 1 and not any("dropped" in n for n in extras["notes"]), extras["notes"]
    assert "gone 7 times" in mine[0] and "1.00-1.50" in mine[0] and "20.00-end" in mine[0], mine[0]
    assert "recorded missing" in mine[0], mine[0]


def test_a_camera_that_stops_sending_while_plugged_in_is_gone_until_it_sends_again(pipes):
    # a frozen camera (firmware hang, bandwidth starved) keeps its device open and its read
    # blocked: no frame for seconds must not be shown as "streaming" with the last frame served
    src = pipes()
    cam = camera(src.path)
    cam.start()
    try:
        assert settled(cam) == "streaming"
        src.freeze()
        wait_for(lambda: cam.state == "gone", 30, f"the frozen camera marked gone ({cam.stats()})")
        assert cam.latest_frame() is None
        assert "stopped sending" in cam.refusal(), cam.refusal()
        frames = cam.stats()["frames"]
        src.thaw()
        wait_for(lambda: cam.state == "streaming", 30, f"sending again ({cam.stats()})")
        wait_for(lambda: cam.stats()["frames"] > frames + 5, 20, "frames again")
    finally:
        src.thaw()
        cam.stop()
    assert [e.kind for e in cam.events] == ["gone", "back"], cam.events
    assert "stopped sending" in cam.events[0].why
