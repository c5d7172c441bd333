"""Control-socket verbs the browser console (and any other client) needs beyond ``status``.

Each verb's request and reply is declared in daemon/api/messages.py (``CameraList``,
``CameraPreviewRequest`` / ``CameraPreview``, ``LiveStatus``); the socket checks a request against
its declaration before these handlers see it.

- ``camera.list`` -> ``{"cameras": [{"name", "width", "height", "kind", "stats"}]}``
- ``camera.preview`` ``{"camera": NAME, "max_width": 320, "max_height": 240, "quality": 70,
  "after_seq": N}`` -> ``{"camera", "seq", "width", "height", "age_ms", "jpeg_b64"}``: the
  newest frame of that camera, downscaled (aspect kept) and JPEG-encoded. With ``after_seq`` and
  no newer frame yet the reply says ``"unchanged": true`` and carries no image, so a client polling
  faster than the camera costs no encoding. ``"jpeg_b64": null`` with ``"why"`` when the camera has
  not delivered a frame yet.

- ``status.live`` -> ``{"mode", "reason", "fault", "cycles", "joints": {"leader", "command",
  "follower"}}``: the few fields that change every cycle, for a 20 Hz plot; on a daemon driving
  more than one arm also ``"arms": {NAME: {"mode", "reason", "source", "joints"}}`` (a single-arm
  reply carries nothing more than before). ``status`` computes
  percentiles over every stage's window (about a millisecond of the interpreter's time); asked 20
  times a second it would compete with the loop for the GIL. This one reads references.

Why this costs the control loop nothing: the loop is never asked anything. A camera publishes
its newest ``Frame`` by reference on its own thread (drivers/cameras.py); the verb reads that
reference on a socket worker thread and does the resize and the encode there (OpenCV releases the
GIL for both). The encoded preview is cached per camera, so several pages watching one camera
cost one encode per frame.

The daemon's cameras are the daemon's own (``DaemonContext.cameras``, daemon/service/cameras.py): the
recorder, the policy and these verbs all see the same camera objects.
"""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from daemon.api.messages import CameraPreviewRequest
from daemon.api.server import ControlServer, RequestError
from daemon.control.driven_arm import DrivenArm
from daemon.control.loop import ControlLoop
from daemon.service.context import DaemonContext
from drivers.cameras import Camera

DEFAULT_PREVIEW_WIDTH_PX = 320
DEFAULT_PREVIEW_HEIGHT_PX = 240
DEFAULT_JPEG_QUALITY = 70


def daemon_loop(context: DaemonContext) -> ControlLoop:
    """The control loop whose published state ``status.live`` reads."""
    return context.loop


def daemon_cameras(context: DaemonContext) -> list[Camera]:
    """The cameras the daemon captures from; a bad [cameras.*] section is the client's clear error."""
    try:
        return context.cameras.all()
    except ValueError as exc:
        raise RequestError(f"cameras: {exc}") from exc


@dataclass(frozen=True)
class _Encoded:
    seq: int
    key: tuple[int, int, int]  # (max_width, max_height, quality) it was encoded for
    width: int
    height: int
    capture_monotonic_s: float
    jpeg_b64: str
    encode_ms: float


def encode_preview(pixels_rgb: Any, max_width: int, max_height: int, quality: int) -> tuple[bytes, int, int]:
    """RGB uint8 HxWx3 -> (JPEG bytes, width, height), shrunk to fit max_width x max_height."""
    import cv2

    h, w = int(pixels_rgb.shape[0]), int(pixels_rgb.shape[1])
    scale = min(1.0, max_width / w, max_height / h)
    img = pixels_rgb
    if scale < 1.0:
        w, h = max(1, round(w * scale)), max(1, round(h * scale))
        img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RequestError("the JPEG encoder refused the frame")
    return buf.tobytes(), w, h


def _live_joints(
    leader: np.ndarray | None, command: np.ndarray | None, follower: np.ndarray | None
) -> dict[str, list[float] | None]:
    return {
        "leader": None if leader is None else [round(float(x), 3) for x in leader],
        "command": None if command is None else [round(float(x), 3) for x in command],
        "follower": None if follower is None else [round(float(x), 3) for x in follower],
    }


TRACKING_MODES = frozenset({"aligning", "teleop", "policy"})


def driver_of(arm: DrivenArm, correcting: bool) -> str:
    """Who drives ``arm`` now, in the operator's words: teleop, policy, correction (the operator
    inside a policy episode), replay, client (a LeRobot tool), or "" (nobody: held, idle, fault)."""
    if arm.state.mode not in TRACKING_MODES:
        return ""
    source = arm.source_name
    if source == arm.teleop_source:
        return "correction" if correcting else "teleop"
    if source.startswith("client"):
        return "client"
    return source  # "policy", "replay"


def _live_arm(loop: ControlLoop, arm: DrivenArm, correcting: bool) -> dict[str, Any]:
    st = arm.state
    leader = loop.leaders.get(arm.teleop_source)  # as status: the leader that drives it in teleop
    return {
        "mode": st.mode,
        "reason": st.reason,
        "source": arm.source_name,
        "driver": driver_of(arm, correcting),
        "joints": _live_joints(None if leader is None else leader.units, arm.command, arm.measured),
    }


class ConsoleApi:
    """The verbs above, bound to one daemon."""

    def __init__(self, context: DaemonContext) -> None:
        self.context = context
        self._cache: dict[str, _Encoded] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def register(self, server: ControlServer) -> None:
        server.register("camera.list", self.camera_list)
        server.register("camera.preview", self.camera_preview)
        server.register("status.live", self.status_live)

    def status_live(self, req: dict[str, Any]) -> dict[str, Any]:
        loop = daemon_loop(self.context)
        st = loop.state  # the loop replaces these objects each cycle, never changes them in place
        reply: dict[str, Any] = {
            "mode": st.mode,
            "reason": st.reason,
            "fault": st.fault,
            "cycles": loop.cycles,
            "joints": _live_joints(loop.leader_units, loop.command, loop.measured),
        }
        arms = tuple(loop.arms)  # an arm added on a running loop joins the list between cycles
        policy = self.context.policy
        correcting = policy is not None and policy.correcting
        reply["driver"] = driver_of(arms[0], correcting) if arms else ""
        if len(arms) > 1:  # a single-arm reply stays as it was: its joints above are that arm's
            reply["arms"] = {arm.name: _live_arm(loop, arm, correcting) for arm in arms}
        return reply

    def _camera(self, name: Any) -> Any:
        cams = daemon_cameras(self.context)
        if not isinstance(name, str) or not name:
            raise RequestError(
                f'"camera" must name a camera ({", ".join(c.name for c in cams) or "none configured"})', "camera"
            )
        for cam in cams:
            if cam.name == name:
                return cam
        raise RequestError(f"no camera {name!r} (configured: {', '.join(c.name for c in cams) or 'none'})", "camera")

    def camera_list(self, req: dict[str, Any]) -> dict[str, Any]:
        out = []
        for cam in daemon_cameras(self.context):
            try:
                stats = cam.stats()
            except Exception as exc:  # a camera's counters must not hide the others
                stats = {"error": f"{type(exc).__name__}: {exc}"}
            out.append(
                {
                    "name": cam.name,
                    "width": int(cam.width),
                    "height": int(cam.height),
                    "kind": str(stats.get("kind") or type(cam).__name__),  # opencv, ...; else the class
                    "stats": stats,
                }
            )
        return {"cameras": out}

    def _lock_for(self, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(name, threading.Lock())

    def camera_preview(self, req: dict[str, Any]) -> dict[str, Any]:
        # the socket checked it against CameraPreviewRequest (types, bounds): read it as one
        r = msgspec.convert(req, CameraPreviewRequest)
        cam = self._camera(r.camera)
        max_w = DEFAULT_PREVIEW_WIDTH_PX if r.max_width is None else r.max_width
        max_h = DEFAULT_PREVIEW_HEIGHT_PX if r.max_height is None else r.max_height
        quality = DEFAULT_JPEG_QUALITY if r.quality is None else r.quality
        after = r.after_seq
        frame = cam.latest_frame()  # a reference read: the camera thread published it
        if frame is None:
            return {"camera": cam.name, "seq": None, "jpeg_b64": None, "why": _no_frame_why(cam)}
        now_s = time.monotonic()
        if after is not None and frame.seq <= after:
            return {"camera": cam.name, "seq": frame.seq, "unchanged": True}
        key = (max_w, max_h, quality)
        with self._lock_for(cam.name):  # two pages on one camera: one encode per frame
            enc = self._cache.get(cam.name)
            if enc is None or enc.seq != frame.seq or enc.key != key:
                t0 = time.perf_counter()
                jpeg, w, h = encode_preview(frame.pixels, max_w, max_h, quality)
                enc = _Encoded(
                    seq=frame.seq,
                    key=key,
                    width=w,
                    height=h,
                    capture_monotonic_s=frame.capture_monotonic_s,
                    jpeg_b64=base64.b64encode(jpeg).decode("ascii"),
                    encode_ms=(time.perf_counter() - t0) * 1000.0,
                )
                self._cache[cam.name] = enc
        return {
            "camera": cam.name,
            "seq": enc.seq,
            "width": enc.width,
            "height": enc.height,
            # how old the image is as it leaves the daemon (capture -> now, same clock)
            "age_ms": round((now_s - enc.capture_monotonic_s) * 1000.0, 2),
            # CLOCK_MONOTONIC is one clock for every process of this machine: a client beside
            # the daemon measures capture -> display with it (bench/bench_console.py)
            "capture_monotonic_s": enc.capture_monotonic_s,
            "encode_ms": round(enc.encode_ms, 2),
            "jpeg_b64": enc.jpeg_b64,
        }


def attach_console_api(context: DaemonContext) -> ConsoleApi:
    """Registers the console's verbs on the daemon's control socket; returns the API object."""
    api = ConsoleApi(context)
    api.register(context.server)
    return api


def _no_frame_why(cam: Camera) -> str:
    """Why a camera has no frame to show: gone (unplugged) or refused says so, with its reason."""
    try:
        stats = cam.stats()
    except Exception as exc:  # the answer still says something true
        return f"no frame from this camera (its state could not be read: {type(exc).__name__}: {exc})"
    state, error = stats.get("state"), str(stats.get("error") or "")
    if state in ("gone", "refused"):
        return f"camera {cam.name} is {state}" + (f": {error}" if error else "")
    if error:
        return f"no frame from this camera: {error}"
    return "no frame from this camera yet"
