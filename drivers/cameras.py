"""Cameras: one interface for real (drivers/camera_lerobot.py), virtual (drawn arm) and simulated cameras.

Every camera captures on its own thread and only *publishes* its newest frame; the control loop
and the recorder never wait for a camera. ``latest_frame()`` is a reference read (no copy, no
lock): a published ``Frame`` is immutable by contract, a camera always publishes a fresh array.

A camera that stops delivering is reported (``stats()["stalled"]`` and one log line), never hung
on: the recorder then marks the frames it could not fill as late/missing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

log = logging.getLogger("so101d.camera")

# A camera is "stalled" when no new frame arrived for this many frame periods.
STALL_PERIODS = 5.0


@dataclass(frozen=True)
class Frame:
    """One captured image. ``pixels`` is HxWx3 uint8 RGB and must not be modified once published.

    ``depth_mm`` is the depth map taken with it (a RealSense with ``use_depth``: HxWx1 uint16,
    millimetres, 0 where the sensor saw nothing), the same capture, so the same time; None for a
    camera without depth."""

    pixels: np.ndarray
    capture_monotonic_s: float  # time.monotonic() when the image was taken (best estimate)
    seq: int  # 0, 1, 2, ... per camera; a gap means frames were lost before publication
    depth_mm: np.ndarray | None = None


@runtime_checkable
class Camera(Protocol):
    """What the recorder needs from a camera (real, virtual or simulated)."""

    name: str
    width: int
    height: int

    def start(self) -> None: ...

    def latest_frame(self) -> Frame | None: ...

    def stop(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...


@dataclass
class CameraConfig:
    """One camera of the configuration: ``device`` is an index, a /dev/video path or 'virtual'.

    The fields after ``fps`` are LeRobot's camera options under their names (a real camera opens
    through LeRobot's classes: drivers/camera_lerobot.py); the virtual camera ignores them."""

    name: str
    device: str | int = "virtual"
    width: int = 640
    height: int = 480
    fps: float = 30.0
    kind: str = "opencv"  # opencv | intelrealsense | zmq
    on_mismatch: str = "refuse"  # refuse | warn: what the camera negotiates differs from the above
    fourcc: str = ""
    backend: str = "any"
    rotation: int = 0
    color_mode: str = "rgb"
    warmup_s: int = 1
    serial_number_or_name: str = ""
    use_depth: bool = False  # intelrealsense: a depth map with every frame (Frame.depth_mm)
    server_address: str = ""
    port: int = 5555
    camera_name: str = "zmq_camera"
    timeout_ms: int = 5000


@dataclass
class _Counters:
    frames: int = 0
    read_failures: int = 0
    last_frame_monotonic_s: float = 0.0
    started_monotonic_s: float = 0.0
    stalled: bool = False
    stall_events: int = 0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class ThreadedCamera:
    """Shared machinery: a daemon capture thread, frame publication, stall detection."""

    def __init__(self, name: str, width: int, height: int, fps: float) -> None:
        if width <= 0 or height <= 0:
            raise ValueError(f"camera {name!r}: resolution must be positive, got {width}x{height}")
        if fps <= 0:
            raise ValueError(f"camera {name!r}: fps must be positive, got {fps}")
        self.name = name
        self.width = int(width)
        self.height = int(height)
        self.fps = float(fps)
        self._latest: Frame | None = None
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._c = _Counters()

    # -- to implement -------------------------------------------------------------------------
    def _open(self) -> None:
        """Acquire the device (runs on the capture thread)."""

    def _grab(self) -> np.ndarray | None:
        """Block until the next image (RGB HxWx3 uint8) or return None on a failed read."""
        raise NotImplementedError

    def _close(self) -> None:
        """Release the device (runs on the capture thread)."""

    # -- public -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._c.started_monotonic_s = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"camera-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            if self._thread.is_alive():
                log.warning("camera %s: capture thread did not stop within 2 s (device hung?)", self.name)
        self._thread = None

    def latest_frame(self) -> Frame | None:
        return self._latest

    def is_stalled(self, now_monotonic_s: float | None = None) -> bool:
        now = time.monotonic() if now_monotonic_s is None else now_monotonic_s
        last = self._c.last_frame_monotonic_s or self._c.started_monotonic_s
        if not self._c.started_monotonic_s:
            return False
        return now - last > STALL_PERIODS / self.fps + 0.5

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        stalled = self.is_stalled(now)
        if stalled and not self._c.stalled:
            self._c.stall_events += 1
            log.error(
                "camera %s: no frame for %.1f s: stalled",
                self.name,
                now - (self._c.last_frame_monotonic_s or self._c.started_monotonic_s),
            )
        elif not stalled and self._c.stalled:
            log.warning("camera %s: delivering frames again", self.name)
        self._c.stalled = stalled
        elapsed = max(1e-9, now - self._c.started_monotonic_s) if self._c.started_monotonic_s else 0.0
        return {
            "name": self.name,
            "width": self.width,
            "height": self.height,
            "fps_configured": self.fps,
            "frames": self._c.frames,
            "fps_measured": round(self._c.frames / elapsed, 2) if elapsed else 0.0,
            "read_failures": self._c.read_failures,
            "stalled": stalled,
            "stall_events": self._c.stall_events,
            "last_frame_age_s": round(now - self._c.last_frame_monotonic_s, 3) if self._c.frames else None,
            "error": self._c.error,
            **self._c.extra,
        }

    def _publish(self, pixels: np.ndarray, capture_monotonic_s: float, depth_mm: np.ndarray | None = None) -> None:
        self._latest = Frame(pixels=pixels, capture_monotonic_s=capture_monotonic_s, seq=self._seq, depth_mm=depth_mm)
        self._seq += 1
        self._c.frames += 1
        self._c.last_frame_monotonic_s = capture_monotonic_s

    def _run(self) -> None:
        try:
            self._open()
        except Exception as exc:
            self._c.error = f"open failed: {exc}"
            log.error("camera %s: %s", self.name, self._c.error)
            return
        try:
            while not self._stop.is_set():
                try:
                    pixels = self._grab()
                except Exception as exc:
                    pixels = None
                    self._c.error = f"read failed: {exc}"
                t = time.monotonic()
                if pixels is None:
                    self._c.read_failures += 1
                    self._stop.wait(min(0.1, 1.0 / self.fps))
                    continue
                self._publish(pixels, t)
        finally:
            try:
                self._close()
            except Exception:
                pass


class VirtualArmCamera(ThreadedCamera):
    """Draws a side view of the (emulated) follower from its joint angles, at a fixed rate.

    The loop hands it the latest state with ``set_state(units)`` (one attribute store); the
    camera thread renders on its own clock. Lift, elbow and wrist flex are drawn as a planar
    chain, the gripper as two jaws whose opening follows the gripper value (0 closed, 100 open),
    the pan as a bar at the base and the roll as a tick on the wrist, so recorded videos move
    with the arm. ``view`` "front" and "wrist" give two different pictures of the same state.
    """

    LINKS_PX = (0.28, 0.25, 0.12)  # upper arm, forearm, hand, as fractions of the image height

    def __init__(self, config: CameraConfig, view: str | None = None) -> None:
        super().__init__(config.name, config.width, config.height, config.fps)
        self.view = view or ("wrist" if "wrist" in config.name else "front")
        self._state: np.ndarray = np.zeros(6, dtype=np.float64)
        self._next_s = 0.0
        self._background = self._make_background()

    def set_state(self, state_units: Any) -> None:
        """Latest follower state in LeRobot units (degrees, gripper 0..100). Cheap: one store."""
        self._state = state_units

    def _make_background(self) -> np.ndarray:
        import cv2

        img = np.full((self.height, self.width, 3), 235, dtype=np.uint8)
        step = max(8, self.height // 12)
        for y in range(0, self.height, step):
            cv2.line(img, (0, y), (self.width, y), (215, 215, 215), 1)
        for x in range(0, self.width, step):
            cv2.line(img, (x, 0), (x, self.height), (215, 215, 215), 1)
        cv2.rectangle(img, (0, int(self.height * 0.85)), (self.width, self.height), (150, 120, 90), -1)
        return img

    def _grab(self) -> np.ndarray | None:
        now = time.monotonic()
        if self._next_s == 0.0:
            self._next_s = now
        delay = self._next_s - now
        if delay > 0:
            self._stop.wait(delay)
        self._next_s += 1.0 / self.fps
        if self._next_s < time.monotonic() - 1.0 / self.fps:
            self._next_s = time.monotonic()  # fell behind: do not burst to catch up
        return self.render(np.asarray(self._state, dtype=np.float64))

    def render(self, state_units: np.ndarray) -> np.ndarray:
        """The picture for one state (also used by tests and the sim fallback)."""
        import cv2

        img = self._background.copy()
        h, w = self.height, self.width
        pan, lift, elbow, wflex, roll, grip = (float(v) for v in state_units[:6])
        if self.view == "wrist":
            return self._render_wrist(img, roll, grip)
        base = (int(w * 0.35), int(h * 0.85))
        # pan: a bar whose length shows cos(pan) (foreshortening in a side view)
        half = int(w * 0.08 * max(0.15, abs(np.cos(np.radians(pan)))))
        cv2.rectangle(img, (base[0] - half, base[1] - 10), (base[0] + half, base[1]), (60, 60, 60), -1)
        # planar chain: 0 deg lift = upright; each joint angle adds to the previous one
        angles = np.radians(np.cumsum([lift, elbow + 90.0, wflex]))
        pts = [np.array(base, dtype=np.float64)]
        for length, a in zip(self.LINKS_PX, angles):
            d = np.array([np.sin(a), -np.cos(a)]) * length * h
            pts.append(pts[-1] + d)
        colors = ((40, 90, 200), (40, 160, 80), (200, 120, 30))
        for i in range(3):
            p0, p1 = tuple(int(v) for v in pts[i]), tuple(int(v) for v in pts[i + 1])
            cv2.line(img, p0, p1, colors[i], max(2, h // 40), cv2.LINE_AA)
            cv2.circle(img, p0, max(3, h // 50), (20, 20, 20), -1, cv2.LINE_AA)
        tip = pts[-1]
        a = angles[-1]
        along = np.array([np.sin(a), -np.cos(a)])
        across = np.array([np.cos(a), np.sin(a)])
        opening = (np.clip(grip, 0.0, 100.0) / 100.0) * 0.06 * h + 2
        jaw = 0.06 * h
        for s in (-1.0, 1.0):
            j0 = tip + across * s * opening
            j1 = j0 + along * jaw
            cv2.line(
                img, tuple(int(v) for v in j0), tuple(int(v) for v in j1), (30, 30, 30), max(2, h // 80), cv2.LINE_AA
            )
        # roll: a tick around the wrist
        r = np.radians(roll)
        wrist = pts[2]
        tick = wrist + np.array([np.cos(r), np.sin(r)]) * 0.04 * h
        cv2.line(img, tuple(int(v) for v in wrist), tuple(int(v) for v in tick), (180, 30, 160), 2, cv2.LINE_AA)
        return img

    def _render_wrist(self, img: np.ndarray, roll: float, grip: float) -> np.ndarray:
        import cv2

        h, w = self.height, self.width
        c = np.array([w / 2, h / 2])
        r = np.radians(roll)
        across = np.array([np.cos(r), np.sin(r)])
        along = np.array([-np.sin(r), np.cos(r)])
        opening = (np.clip(grip, 0.0, 100.0) / 100.0) * 0.35 * w + 0.02 * w
        for s in (-1.0, 1.0):
            centre = c + across * s * opening / 2
            p0 = centre - along * 0.3 * h
            p1 = centre + along * 0.3 * h
            cv2.line(
                img, tuple(int(v) for v in p0), tuple(int(v) for v in p1), (40, 40, 40), max(4, w // 30), cv2.LINE_AA
            )
        cv2.circle(img, tuple(int(v) for v in c), max(3, h // 40), (200, 60, 60), -1, cv2.LINE_AA)
        return img
