"""`so101d doctor`'s camera part: the USB 2 bandwidth of the configured streams (uncompressed ones
that do not fit one bus, and MJPG that would), and each camera opened through LeRobot's OpenCV
camera to show what it really delivers (a named pipe camera, tests/cameras_support.py)."""

from __future__ import annotations

import pytest
from cameras_support import PipeCamera

from daemon.apps.commands.doctor import FAIL, PASS, camera_report, render_text
from daemon.config.settings import config_from_dict
from drivers.camera_bandwidth import Stream, advice, estimate

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


def test_two_yuyv_vga_streams_do_not_fit_one_usb2_bus_and_mjpg_would():
    two = [Stream("front", 640, 480, 30, "YUYV"), Stream("wrist", 640, 480, 30, "")]  # "" = default YUYV
    est = estimate(two)
    assert est.reserved_mb_s == pytest.approx(2 * 24.576)  # 18.4 MB/s each: the largest alternate setting
    assert not est.fits and est.mjpg_fits
    status, text = advice(est)
    assert status == FAIL and "uncompressed streams will not fit" in text and 'fourcc = "MJPG"' in text, text
    one = estimate(two[:1])
    assert one.fits and advice(one)[0] == PASS
    mjpg = estimate([Stream("front", 640, 480, 30, "MJPG"), Stream("wrist", 640, 480, 30, "MJPG")])
    assert mjpg.fits and advice(mjpg)[0] == PASS
    hd = estimate([Stream("front", 1280, 720, 30, "YUYV")])  # 55 MB/s: more than one camera gets
    assert hd.too_big == ("front",) and not hd.fits
    assert "cannot be carried" in advice(hd)[1] and "MJPG" in advice(hd)[1]


def test_doctor_shows_each_camera_and_the_bandwidth(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENCV_FFMPEG_CAPTURE_OPTIONS", "probesize;65536|analyzeduration;0")
    good = PipeCamera(tmp_path / "good", width=160, height=120).plug()
    slow = PipeCamera(tmp_path / "slow", width=160, height=120, header_fps=30, rate_fps=12).plug()
    try:
        cfg = config_from_dict(
            {
                "cameras": {
                    "front": {"device": str(good.path), "width": 160, "height": 120},
                    "wrist": {"device": str(slow.path), "width": 160, "height": 120},
                    "top": {"kind": "virtual"},
                    "gone": {"device": str(tmp_path / "nothing-here"), "width": 160, "height": 120},
                }
            }
        )
        rep = camera_report(cfg.cameras, open_cameras=True)
    finally:
        good.unplug()
        slow.unplug()
    assert rep is not None
    checks = {c.name: c for c in rep.checks}
    assert checks["usb bandwidth"].status == PASS, checks["usb bandwidth"]
    front = checks["camera front"]
    assert front.status == PASS and str(good.path) in front.detail and "160x120" in front.detail, front
    assert (
        "configured 30 fps, measured" in front.detail and "dropped" in front.detail and "newest frame" in front.detail
    )
    wrist = checks["camera wrist"]
    assert wrist.status == FAIL and "the camera delivers" in wrist.detail, wrist
    assert checks["camera gone"].status == FAIL and "does not exist" in checks["camera gone"].detail
    assert "camera top" not in checks  # virtual: nothing to check
    text = render_text({}, [rep])
    assert "[cameras] front, gone, wrist" in text and "adapter" not in text, text


def test_a_1080p30_mjpg_camera_is_not_called_too_big_for_usb2():
    # USB 2 webcams deliver 1080p30 as MJPG (the camera compresses into its largest alternate
    # setting): the estimate of its payload may not turn into "cannot be carried"
    fhd = estimate([Stream("front", 1920, 1080, 30, "MJPG")])
    assert fhd.too_big == () and fhd.fits, fhd
    assert fhd.reserved_mb_s == pytest.approx(24.576)
    status, text = advice(fhd)
    assert status == PASS and "cannot be carried" not in text, text
    # two of them reserve two of the largest settings: more than one bus carries
    two = estimate([Stream("front", 1920, 1080, 30, "MJPG"), Stream("wrist", 1920, 1080, 30, "MJPG")])
    assert not two.fits and two.too_big == ()
    status, text = advice(two)
    assert status == FAIL and "separate USB buses" in text and "cannot be carried" not in text, text
    # uncompressed 1080p stays what no USB 2 camera can send
    assert estimate([Stream("front", 1920, 1080, 30, "YUYV")]).too_big == ("front",)
