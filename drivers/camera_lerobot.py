"""Real cameras through LeRobot's camera classes (lerobot/cameras/: opencv, realsense, zmq).

LeRobot's classes open the device, apply FOURCC, size, rate, backend, rotation and colour order,
and read on their own thread. Around one of them this adds what the daemon needs and they do not:

- opening, reading and reopening on our capture thread: ``start`` returns at once, the loop and
  the recorder only ever take a reference to the newest ``Frame``;
- each frame keeps LeRobot's own capture timestamp (taken on its read thread right after the
  read), not the time we happened to look;
- what the camera really negotiated (size, rate, FOURCC) and the rate it really delivers over its
  first second, compared with the configuration (``verification``);
- a camera that goes away (unplugged: LeRobot's read thread ends after its consecutive failures)
  is marked gone, its frames become missing, and it is reopened by its configured path (a
  /dev/v4l/by-id path finds the same camera on whatever /dev/videoN it comes back as).
- a RealSense with ``use_depth`` publishes its depth map with each colour frame (``Frame.depth_mm``:
  HxWx1 uint16 millimetres), the pair LeRobot's read thread took from one frameset, so both carry
  the colour frame's capture time.

A device that does not take the configured mode makes LeRobot's strict open fail ("failed to set
fps=30"); an OpenCV camera is then opened with the size and FOURCC asked and the rate left to it,
and failing that (or another kind) as it is, and judged by what it delivers, so the answer names
the configured and the delivered values. A source that takes no settings at all (a video file, a pipe:
OpenCV's ``set`` answers False) is opened as it is at once and judged the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import select
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from drivers.cameras import Camera, CameraConfig, ThreadedCamera, VirtualArmCamera

log = logging.getLogger("so101d.camera")

LEROBOT_KINDS = ("opencv", "intelrealsense", "zmq")
# The measured rate must reach this share of the configured one (a camera that gives 15 fps when
# 30 was asked is refused; scheduling noise on a busy machine is not).
MIN_RATE_SHARE = 0.8
VERIFY_WINDOW_S = 1.0  # frames timed after open before the rate is judged
VERIFY_MIN_FRAMES = 8
REOPEN_PERIOD_S = 0.5  # a gone camera is looked for this often
# A refused camera is opened and judged again after this, then twice as long each time up to the
# most: the same camera gives the same answer (so not often: each look opens the device), but a
# camera swapped on the port, or one another program had held in another mode, may fit now.
REFUSED_RETRY_FIRST_S = 5.0
REFUSED_RETRY_MAX_S = 60.0
PIPE_WAIT_S = 0.5  # one wait for something to write to a named pipe source
# No frame for this long from an open camera (its read blocked: frozen, starved of bandwidth) is a
# camera gone until it sends again; long enough that a loaded machine's scheduling is not one.
FROZEN_S = 2.0
FRAME_WAIT_S = 0.2  # one wait for LeRobot's next frame (then: is its read thread still alive?)
RECENT_FRAMES = 60  # the recent rate is measured over this many frames


@dataclass(frozen=True)
class Mode:
    """What a stream is: size, rate and pixel format ("" where the backend does not say)."""

    width: int
    height: int
    fps: float
    fourcc: str = ""

    def text(self) -> str:
        return f"{self.width}x{self.height} {self.fourcc or '(format not reported)'} @ {self.fps:g} fps"


@dataclass(frozen=True)
class Verification:
    """The configuration against what the camera negotiated and delivered."""

    configured: Mode
    negotiated: Mode  # as the backend reports it after open
    measured_fps: float  # frames over the first VERIFY_WINDOW_S
    problems: tuple[str, ...]  # each names the configured and the real value
    size_problem: bool  # a different image size: never recordable under this configuration

    def refused(self, on_mismatch: str) -> bool:
        return bool(self.problems) and (self.size_problem or on_mismatch != "warn")


def lerobot_config(cfg: CameraConfig, request: bool = True) -> Any:
    """LeRobot's camera configuration for ours. ``request`` False asks for nothing (size, rate):
    the source is opened as it is. ValueError (LeRobot's own message) for a bad option."""
    from lerobot.cameras.configs import ColorMode, Cv2Backends, Cv2Rotation

    if cfg.use_depth and cfg.kind != "intelrealsense":
        raise ValueError(
            f"use_depth is a RealSense option (kind 'intelrealsense'); LeRobot's {cfg.kind} camera has no depth stream"
        )

    fps = round(cfg.fps) if request else None
    width = int(cfg.width) if request else None
    height = int(cfg.height) if request else None
    color_mode = ColorMode(cfg.color_mode)
    if cfg.kind == "opencv":
        from lerobot.cameras.opencv import OpenCVCameraConfig

        dev = str(cfg.device)
        return OpenCVCameraConfig(
            index_or_path=int(dev) if dev.isdigit() else Path(dev),
            fps=fps,
            width=width,
            height=height,
            color_mode=color_mode,
            rotation=Cv2Rotation(cfg.rotation),
            warmup_s=cfg.warmup_s,
            fourcc=cfg.fourcc or None,
            backend=Cv2Backends[cfg.backend.upper()],
        )
    if cfg.kind == "intelrealsense":
        from lerobot.cameras.realsense.configuration_realsense import RealSenseCameraConfig

        if not cfg.serial_number_or_name:
            raise ValueError("kind 'intelrealsense' needs serial_number_or_name")
        return RealSenseCameraConfig(
            serial_number_or_name=cfg.serial_number_or_name,
            fps=fps,
            width=width,
            height=height,
            color_mode=color_mode,
            use_depth=cfg.use_depth,
            rotation=Cv2Rotation(cfg.rotation),
            warmup_s=cfg.warmup_s,
        )
    if cfg.kind == "zmq":
        from lerobot.cameras.zmq.configuration_zmq import ZMQCameraConfig

        return ZMQCameraConfig(
            server_address=cfg.server_address,
            port=cfg.port,
            camera_name=cfg.camera_name,
            fps=fps,
            width=width,
            height=height,
            color_mode=color_mode,
            timeout_ms=cfg.timeout_ms,
            warmup_s=cfg.warmup_s,
        )
    raise ValueError(f"unknown camera kind {cfg.kind!r} (one of {', '.join(LEROBOT_KINDS)})")


def _fourcc_text(code: float) -> str:
    n = int(code)
    text = "".join(chr((n >> (8 * i)) & 0xFF) for i in range(4))
    return text if n and text.isprintable() else ""


def verify(configured: Mode, negotiated: Mode, measured_fps: float) -> Verification:
    """Compare; every problem names both values."""
    problems: list[str] = []
    size_problem = (negotiated.width, negotiated.height) != (configured.width, configured.height)
    if size_problem:
        problems.append(
            f"configured {configured.width}x{configured.height}, the camera gives {negotiated.width}x{negotiated.height}"
        )
    if negotiated.fps > 0 and not math.isclose(negotiated.fps, configured.fps, rel_tol=1e-3):
        problems.append(f"configured {configured.fps:g} fps, the camera negotiated {negotiated.fps:g} fps")
    if measured_fps < MIN_RATE_SHARE * configured.fps:
        problems.append(f"configured {configured.fps:g} fps, the camera delivers {measured_fps:.1f} fps (measured)")
    if configured.fourcc and negotiated.fourcc != configured.fourcc:
        problems.append(
            f"configured FOURCC {configured.fourcc}, the camera gives {negotiated.fourcc or '(not reported)'}"
        )
    return Verification(configured, negotiated, round(measured_fps, 2), tuple(problems), size_problem)


class LeRobotReadErrors(logging.Handler):
    """The last read error each LeRobot camera's read thread logged ("Error reading frame in
    background thread for RealSenseCamera(123): <why>"), by the camera's name there. That thread
    swallows its errors (and ends by raising after ten in a row): its log is the only place the
    reason is said, so a camera whose read thread stopped can say why."""

    PREFIX = "Error reading frame in background thread for "
    LOGGERS = ("lerobot.cameras.realsense.camera_realsense", "lerobot.cameras.opencv.camera_opencv")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._last: dict[str, str] = {}
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if not text.startswith(self.PREFIX):
            return
        who, _, why = text[len(self.PREFIX) :].partition(": ")
        with self._guard:
            self._last[who] = why

    def take(self, who: str) -> str:
        """The last read error of the LeRobot camera ``who`` (its ``str``), forgotten once taken."""
        with self._guard:
            return self._last.pop(who, "")

    def forget(self, who: str) -> None:
        with self._guard:
            self._last.pop(who, None)


_read_errors: LeRobotReadErrors | None = None


def read_errors() -> LeRobotReadErrors:
    """The one handler, on LeRobot's camera loggers from the first camera opened."""
    global _read_errors
    if _read_errors is None:
        _read_errors = LeRobotReadErrors()
        for name in LeRobotReadErrors.LOGGERS:
            logging.getLogger(name).addHandler(_read_errors)
    return _read_errors


def depth_problem(depth: np.ndarray | None, height: int, width: int) -> str:
    """Why a depth map from LeRobot's read thread is not the depth feature's (HxWx1 uint16 mm), or ""."""
    want = (height, width, 1)
    if depth is None:
        return f"no depth map with the colour frame (the depth stream is {want} uint16 mm)"
    if depth.shape == want and depth.dtype == np.uint16:
        return ""
    return f"the depth map from the camera is {tuple(depth.shape)} {depth.dtype}, the depth stream is {want} uint16 mm"


@dataclass(frozen=True)
class CameraEvent:
    """A camera going away or coming back, at ``monotonic_s``."""

    kind: str  # "gone" | "back"
    monotonic_s: float
    why: str = ""


class LeRobotCamera(ThreadedCamera):
    """One real camera (LeRobot's OpenCV, RealSense or ZMQ class) behind our ``Camera`` interface."""

    def __init__(self, config: CameraConfig) -> None:
        super().__init__(config.name, config.width, config.height, config.fps)
        self.config = config
        self.kind = config.kind
        self.device = str(config.device) if config.kind == "opencv" else self._device_text(config)
        self.on_mismatch = config.on_mismatch
        # a depth map with every frame, recorded as the stream ``<name>_depth``
        self.use_depth = config.kind == "intelrealsense" and config.use_depth
        self.depth_stream = f"{config.name}_depth" if self.use_depth else ""
        self._depth_frames = 0
        self._depth_refused = 0
        self._depth_problem = ""  # why the newest depth maps are refused ("" while they fit)
        lerobot_config(config)  # a bad option fails here, at build time, with LeRobot's message
        self._configured = Mode(self.width, self.height, self.fps, config.fourcc)
        self._lr: Any = None  # the LeRobot camera while open
        self._clock_offset_s = time.monotonic() - time.perf_counter()  # LeRobot stamps perf_counter
        self.state = "opening"  # opening | verifying | streaming | refused | gone
        self.verification: Verification | None = None
        self.events: list[CameraEvent] = []
        self._recent: deque[float] = deque(maxlen=RECENT_FRAMES)
        self._dropped = 0
        self._gone_since_s = 0.0
        self._gone_why = ""
        self._refused_retry_s = REFUSED_RETRY_FIRST_S
        self.refused_looks = 0  # times a refused camera was opened and judged again
        self._events_lock = threading.Lock()

    @staticmethod
    def _device_text(config: CameraConfig) -> str:
        if config.kind == "intelrealsense":
            return f"realsense:{config.serial_number_or_name}"
        return f"zmq:tcp://{config.server_address}:{config.port}/{config.camera_name}"

    # -- open, verify --------------------------------------------------------------------------
    def _connect(self) -> Any:
        """LeRobot's camera, connected: asked for the configured mode first; a source that takes no
        settings at all is opened as it is (then judged by what it gives)."""
        from lerobot.cameras.utils import make_cameras_from_configs

        if self.kind == "zmq":
            # No warm-up inside LeRobot's connect: with no image server there, its failed warm-up
            # closes the socket its read thread is still receiving on, and libzmq aborts the whole
            # process ("Assertion failed: pfd.revents & POLLIN"). The frames are waited for here.
            cam = make_cameras_from_configs({self.name: lerobot_config(self.config)})[self.name]
            cam.connect(warmup=False)
            return cam
        if not self._takes_settings():
            cam = make_cameras_from_configs({self.name: lerobot_config(self.config, request=False)})[self.name]
            cam.connect()
            return cam
        try:
            cam = make_cameras_from_configs({self.name: lerobot_config(self.config)})[self.name]
            cam.connect()
            return cam
        except RuntimeError as exc:  # LeRobot: "failed to set fps=30 (actual_fps=15.0)" and the like
            log.info("camera %s: %s; opening it as it is to see what it gives", self.name, exc)
        if self.kind == "opencv":
            # The size and FOURCC asked, the rate left to the camera: opened with nothing asked,
            # OpenCV's V4L2 backend sets its own 640x480 and first format (cap_v4l.cpp), so a camera
            # that only missed the rate would be judged (and refused, even with "warn") by a size
            # and format it was never asked for. Its rate is then what it negotiated.
            sized = dataclasses.replace(lerobot_config(self.config), fps=None)
            try:
                cam = make_cameras_from_configs({self.name: sized})[self.name]
                cam.connect()
                return cam
            except RuntimeError as exc:  # the size not taken either: as it is, judged by what it gives
                log.info("camera %s: %s; opening it as it is", self.name, exc)
        cam = make_cameras_from_configs({self.name: lerobot_config(self.config, request=False)})[self.name]
        cam.connect()
        return cam

    def _negotiated(self, cam: Any) -> Mode:
        import cv2

        width, height = int(cam.width or 0), int(cam.height or 0)
        if self.kind == "opencv" and cam.videocapture is not None:
            vc = cam.videocapture
            return Mode(width, height, float(vc.get(cv2.CAP_PROP_FPS)), _fourcc_text(vc.get(cv2.CAP_PROP_FOURCC)))
        return Mode(width, height, float(cam.fps or 0))

    def _next_frame(self, cam: Any) -> tuple[np.ndarray, float, np.ndarray | None] | None:
        """LeRobot's newest unread frame, its capture time (perf_counter) and, for a RealSense
        with depth, the depth map of the same frameset; None after FRAME_WAIT_S.

        Read under LeRobot's frame lock, where its read thread stores them together: the time is
        that frame's, the depth that frame's (its public ``async_read`` gives no time, and a
        separate ``read_latest_depth`` could return the next frameset's depth). The OpenCV and
        ZMQ classes keep ``latest_frame``; the RealSense class ``latest_color_frame`` and
        ``latest_depth_frame``."""
        if not cam.new_frame_event.wait(FRAME_WAIT_S):
            return None
        depth: np.ndarray | None = None
        with cam.frame_lock:
            if self.kind == "intelrealsense":
                frame, depth, stamp = cam.latest_color_frame, cam.latest_depth_frame, cam.latest_timestamp
            else:
                frame, stamp = cam.latest_frame, cam.latest_timestamp
            cam.new_frame_event.clear()
        if frame is None or stamp is None:
            return None
        return frame, float(stamp), depth if self.use_depth else None

    def _frozen_why(self, cam: Any) -> tuple[str, str]:
        """Why an open camera sends nothing (short, for the tag; more for its error). A RealSense that is no longer enumerated was
        unplugged: LeRobot's read thread is still waiting in the SDK (10 s, then the SDK's own
        reconnect, then its failures until it stops), so say so rather than "still open"."""
        if self.kind == "intelrealsense":
            from lerobot.cameras.realsense.camera_realsense import RealSenseCamera

            serial = str(cam.serial_number)
            try:
                connected = {str(found["id"]) for found in RealSenseCamera.find_cameras()}
            except Exception as exc:  # the SDK's enumeration failing says nothing about this camera
                log.debug("camera %s: RealSense enumeration failed: %s", self.name, exc)
                connected = {serial}
            if serial not in connected:
                return (
                    f"no frame for {FROZEN_S:g} s: serial {serial} is not connected (unplugged?)",
                    "it is picked up again when it is back",
                )
        return f"no frame for {FROZEN_S:g} s: it stopped sending, still open", ""

    def _stop_zmq_reader(self, cam: Any) -> None:
        """A ZMQ camera's read thread stopped before LeRobot's disconnect closes its socket: that
        waits 2 s for the thread, which can sit in a receive for ``timeout_ms`` (5 s by default),
        and a socket closed under a receive aborts the process (libzmq's assertion)."""
        if self.kind != "zmq" or cam.thread is None or cam.stop_event is None:
            return
        cam.stop_event.set()
        cam.thread.join(timeout=self.config.timeout_ms / 1000.0 + 1.0)

    @staticmethod
    def _reader_alive(cam: Any) -> bool:
        thread = cam.thread
        return thread is not None and thread.is_alive()

    # -- the capture thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._source_present():
                self._open_failed(f"{self.device} does not exist (not plugged in?)")
                continue
            held = self._pipe_with_writer() if self._is_pipe() else None
            if self._is_pipe() and held is None:
                self._open_failed(f"{self.device} is a named pipe nothing writes to")
                continue
            try:
                cam = self._connect()
            except Exception as exc:
                mode = self._mode_not_offered(exc)
                if mode:
                    self._refuse_at_open(mode)
                    continue
                self._open_failed(str(exc))
                continue
            finally:
                if held is not None:
                    os.close(held)
            self._lr = cam
            try:
                self._stream(cam)
            finally:
                self._lr = None
                self._latest = None
                try:
                    self._stop_zmq_reader(cam)
                    cam.disconnect()
                except Exception as exc:  # already half gone: nothing more to release
                    log.debug("camera %s: disconnect: %s", self.name, exc)
            if self.state == "refused":
                log.info("camera %s: refused; looking again in %g s", self.name, self._refused_retry_s)
                if self._stop.wait(self._refused_retry_s):
                    return
                self._refused_retry_s = min(2 * self._refused_retry_s, REFUSED_RETRY_MAX_S)
                self.refused_looks += 1

    def _mode_not_offered(self, exc: BaseException) -> str:
        """For a RealSense that is plugged in but would not start in the configured mode (the
        SDK's "Couldn't resolve requests" under LeRobot's "Failed to open"): the refusal, naming
        the mode asked for and the camera's default one; "" for any other failure."""
        if self.kind != "intelrealsense" or "Couldn't resolve requests" not in str(exc.__cause__ or ""):
            return ""
        from lerobot.cameras.realsense.camera_realsense import RealSenseCamera

        want = self.config.serial_number_or_name
        try:
            found = [c for c in RealSenseCamera.find_cameras() if want in (str(c["id"]), str(c["name"]))]
        except Exception:  # the SDK's enumeration failing: no more to say than its open did
            return ""
        if not found:
            return ""
        default = found[0].get("default_stream_profile") or {}
        offers = (
            f"; its default is {default['width']}x{default['height']} @ {default['fps']} fps"
            if {"width", "height", "fps"} <= set(default)
            else ""
        )
        streams = "colour and depth" if self.use_depth else "colour"
        return (
            f"camera {self.name}: the RealSense {found[0]['id']} is plugged in but does not stream "
            f"{self.width}x{self.height} @ {self.fps:g} fps ({streams}; the SDK: {exc.__cause__}){offers}; "
            "configure a mode it offers (`lerobot-find-cameras realsense`)"
        )

    def _refuse_at_open(self, why: str) -> None:
        """Refused (recording may not start), said once, looked at again later and less often:
        the same camera gives the same answer, but another may be plugged in with its serial."""
        again = self.state == "refused" and self._c.error == why
        self.state = "refused"
        self._c.error = why
        (log.info if again else log.error)("%s", why)
        if self._stop.wait(self._refused_retry_s):
            return
        self._refused_retry_s = min(2 * self._refused_retry_s, REFUSED_RETRY_MAX_S)
        self.refused_looks += 1

    def _open_failed(self, why: str) -> None:
        """Said once (logged, in ``error``), then tried again; a gone camera keeps saying it is gone."""
        text = f"gone: {self._gone_why}; reopening: {why}" if self.state == "gone" else f"open failed: {why}"
        if text != self._c.error and self.state != "gone":
            log.error("camera %s: %s", self.name, text)
        self._c.error = text
        self._stop.wait(REOPEN_PERIOD_S)

    def _takes_settings(self) -> bool:
        """A video file or a pipe takes no size or rate (OpenCV's ``set`` answers False); asking
        would only open it twice, and a pipe's second reader gets the stream mid-way."""
        dev = str(self.config.device)
        if self.kind != "opencv" or dev.isdigit():
            return True
        try:
            return stat.S_ISCHR(os.stat(dev).st_mode)
        except OSError:
            return True  # not there: the open answers why

    def _is_pipe(self) -> bool:
        dev = str(self.config.device)
        if self.kind != "opencv" or dev.isdigit():
            return False
        try:
            return stat.S_ISFIFO(os.stat(dev).st_mode)
        except OSError:
            return False

    def _pipe_with_writer(self) -> int | None:
        """A read end of the named pipe, held open once something has written to it, or None after
        PIPE_WAIT_S. Opening a pipe to read blocks until a writer comes: inside OpenCV's open that
        wait would see neither ``stop`` nor a new pipe put at the path (the writer replugged), so
        it is done here, and held open while OpenCV opens, so the writer keeps a reader meanwhile."""
        try:
            fd = os.open(str(self.config.device), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if any(ev & select.POLLIN for _, ev in poller.poll(PIPE_WAIT_S * 1000)):
            return fd
        os.close(fd)
        return None

    def _source_present(self) -> bool:
        """A path source that is not there (unplugged: its by-id link is gone) is not opened:
        OpenCV would only log its failure every half second."""
        dev = str(self.config.device)
        if self.kind != "opencv" or dev.isdigit():
            return True
        return os.path.exists(dev)

    def _stream(self, cam: Any) -> None:
        read_errors().forget(str(cam))  # an error from before this open is not this stream's
        negotiated = self._negotiated(cam)
        was_gone = self.state == "gone"
        rechecking = self.state == "refused"  # stays refused, with its reason, until it passes
        self._depth_problem = ""  # judged again on this stream's depth maps
        if not rechecking:
            self._c.error = ""
        self._recent.clear()
        # size, negotiated rate and format are known at once; only the delivered rate needs frames
        if not self._judge(negotiated, None, was_gone):
            return
        verifying = True
        if not rechecking:
            self.state = "verifying"
        first: float | None = None
        timed = 0
        last: float | None = None
        while not self._stop.is_set():
            got = self._next_frame(cam)
            if got is None:
                if not self._reader_alive(cam):
                    read_error = read_errors().take(str(cam))
                    self._went_away(
                        "its read thread stopped (unplugged, or the stream ended)",
                        detail=f"its last read error: {read_error}" if read_error else "",
                    )
                    return
                if self.state == "streaming" and last is not None and time.monotonic() - last > FROZEN_S:
                    why, detail = self._frozen_why(cam)
                    self._went_away(why, reopen=False, detail=detail)
                continue
            pixels, stamp, depth = got
            t = stamp + self._clock_offset_s
            if self.state == "gone":  # frames again on the same open: it was frozen, not unplugged
                self._c.error = ""
                self._add_event(CameraEvent("back", t))
                self.state = "streaming"
                log.warning("camera %s: sending again after %.1f s", self.name, t - self._gone_since_s)
            # counted from the first frame, through its check too (doctor reads them as that ends); a
            # refused camera looked at again counts once it passes (its frames are not published before)
            if last is not None and negotiated.fps > 0 and not (verifying and rechecking):
                gap_periods = (t - last) * negotiated.fps
                if gap_periods > 1.5:
                    self._dropped += round(gap_periods) - 1
            last = t
            self._recent.append(t)
            if verifying:
                first = t if first is None else first
                timed += 1
                if t - first >= VERIFY_WINDOW_S and timed >= VERIFY_MIN_FRAMES:
                    measured = (timed - 1) / (t - first)
                    if not self._judge(negotiated, measured, was_gone, first):
                        return
                    verifying = False
            if verifying and rechecking:
                continue  # a refused camera's frames are published once it passed its check again
            if pixels.shape[0] != self.height or pixels.shape[1] != self.width:
                continue  # judged above: never published at a size the recorder did not ask for
            if self.use_depth:
                why = depth_problem(depth, self.height, self.width)
                if why:  # the pair or nothing: a colour frame alone would record no depth
                    self._depth_refused += 1
                    self._latest = None  # its frames are missing from now, the last pair is not re-used
                    if why != self._depth_problem:
                        log.error("camera %s: %s; its frames are not published", self.name, why)
                    self._depth_problem = why
                    self._c.error = f"camera {self.name}: {why}; its frames are not published"
                    continue
                if self._depth_problem:
                    log.warning("camera %s: depth maps fit again (%s before)", self.name, self._depth_problem)
                    self._depth_problem = ""
                    self._c.error = ""
                self._depth_frames += 1
            self._publish(pixels, t, depth)

    def _judge(self, negotiated: Mode, measured_fps: float | None, was_gone: bool, first_frame_s: float = 0.0) -> bool:
        """False (and the camera refused) when it may not record; ``measured_fps`` None: the
        checks that need no frames, at open. A camera back is dated by ``first_frame_s``: its
        frames are published (and recorded) from the first one, while its rate is checked."""
        v = verify(self._configured, negotiated, self.fps if measured_fps is None else measured_fps)
        self.verification = v
        if v.refused(self.on_mismatch):
            again = self.state == "refused"  # looked at again: the same answer is not news
            self.state = "refused"
            hint = "" if v.size_problem else ' (or set on_mismatch = "warn" to record what it gives)'
            self._c.error = f"camera {self.name}: " + "; ".join(v.problems) + hint
            (log.info if again else log.error)("%s", self._c.error)
            return False
        if measured_fps is None:
            return True
        if self.state == "refused":
            log.warning("camera %s: now fits its configuration (it was refused: %s)", self.name, self._c.error)
            self._c.error = ""
        self._refused_retry_s = REFUSED_RETRY_FIRST_S
        if v.problems:
            log.warning("camera %s: %s; recording what it gives (on_mismatch = warn)", self.name, "; ".join(v.problems))
        if was_gone:
            self._add_event(CameraEvent("back", first_frame_s or time.monotonic()))
        self.state = "streaming"
        if was_gone:
            gone_for = time.monotonic() - self._gone_since_s
            log.warning("camera %s: back after %.1f s, delivering %s", self.name, gone_for, negotiated.text())
        else:
            log.info("camera %s: %s (measured %.1f fps)", self.name, negotiated.text(), measured_fps)
        return True

    def _went_away(self, why: str, reopen: bool = True, detail: str = "") -> None:
        """``why`` is short (the episode's tag quotes it, in a few hundred bytes); ``detail`` goes
        only to the camera's error (status) and the log."""
        now = time.monotonic()
        self._latest = None  # the recorder marks its frames missing, the console shows none
        said = f"{why}; {detail}" if detail else why
        self._gone_why = said
        self._c.error = f"gone: {said}"
        if self.state != "gone":  # frozen, then its read thread ended: still the one gap
            self._gone_since_s = now
            self._add_event(CameraEvent("gone", now, why))
        self.state = "gone"  # last: whoever sees the state sees its event and its reason
        then = f"reopening {self.device} when it is back" if reopen else "waiting for its next frame"
        log.error("camera %s: gone (%s); %s", self.name, said, then)

    def _add_event(self, event: CameraEvent) -> None:
        with self._events_lock:
            self.events.append(event)

    def events_since(self, monotonic_s: float) -> list[CameraEvent]:
        with self._events_lock:
            return [e for e in self.events if e.monotonic_s >= monotonic_s]

    def refusal(self) -> str:
        """Why recording must not start with this camera, or "" when it may."""
        if self.state == "refused":
            return self._c.error
        if self._depth_problem:
            return self._c.error
        if self.state == "gone":
            return f"camera {self.name} ({self.device}) is gone: {self._c.error.removeprefix('gone: ')}"
        if self.state in ("opening", "verifying"):
            why = f": {self._c.error}" if self._c.error else ""
            return f"camera {self.name} ({self.device}) is still opening (checking what it delivers){why}"
        return ""

    def mismatch_note(self) -> str:
        """The tag's note for a camera recording at a rate/format other than configured."""
        v = self.verification
        if v is None or not v.problems or v.refused(self.on_mismatch):
            return ""
        return f"camera {self.name}: " + "; ".join(v.problems) + " (on_mismatch = warn)"

    # -- what status shows -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        recent = list(self._recent)
        fps_recent = (len(recent) - 1) / (recent[-1] - recent[0]) if len(recent) > 2 and recent[-1] > recent[0] else 0.0
        v = self.verification
        self._c.extra = {
            "kind": self.kind,
            "device": self.device,
            "state": self.state,
            "format": v.negotiated.text() if v else "",
            "fourcc": v.negotiated.fourcc if v else "",
            "fps_negotiated": v.negotiated.fps if v else None,
            "fps_verified": v.measured_fps if v else None,
            "fps_recent": round(fps_recent, 2),
            "frames_dropped": self._dropped,
            "gone_events": sum(1 for e in self.events if e.kind == "gone"),
            "gone_for_s": round(time.monotonic() - self._gone_since_s, 1) if self.state == "gone" else None,
            "problems": list(v.problems) if v else [],
            "refused_looks": self.refused_looks,
            "depth": (
                {
                    "stream": self.depth_stream,
                    "shape": [self.height, self.width, 1],
                    "unit": "mm",
                    "frames": self._depth_frames,
                    "refused": self._depth_refused,
                }
                if self.use_depth
                else None
            ),
        }
        return super().stats()


def make_camera(config: CameraConfig) -> Camera:
    """Camera for one configuration entry: 'virtual' draws the arm, anything else opens through LeRobot."""
    if str(config.device) == "virtual":
        return VirtualArmCamera(config)
    return LeRobotCamera(config)
