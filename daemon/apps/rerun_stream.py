"""The daemon's live joints and camera frames in a Rerun viewer (`so101d rerun`).

A client of the documented control API, like the browser console: ``status.live`` (mode, reason
and the three joint vectors) and ``camera.list`` / ``camera.preview`` with ``after_seq`` (the
newest JPEG, encoded on a socket worker, never on the control thread). It runs in a process of
its own: the Rerun SDK's threads, its encoder and the GIL they take never touch the daemon's
control thread, so the loop pays what it pays for a console page: nothing measurable.

What the viewer gets (the names LeRobot's ``--display_data`` uses, so a LeRobot user finds them):
- ``observation.<joint>.pos``: the follower's measured position (the dataset's observation.state);
- ``action.<joint>.pos``: the command sent to the follower, after safety (the dataset's action);
- ``teleop.action.<joint>.pos``: the leader's target before safety (the dataset's teleop.action);
- ``observation.<camera>``: each configured camera as a JPEG (``rr.EncodedImage``);
- ``so101d.mode``: the mode and its reason, when it changes (hold, fault, policy...).
On a bimanual daemon each arm's joints carry LeRobot's bimanual prefix, as its bi_so_follower /
bi_so_leader keys do: ``observation.left_<joint>.pos`` ... ``observation.right_<joint>.pos``.
Everything is stamped on the ``daemon_cycle`` timeline (the control loop's cycle counter at the
newest ``status.live``; a frame gets the cycle it was fetched at) as well as Rerun's ``log_time``. A blueprint puts one plot per joint (its three series together, as on
the console) beside the camera views.

A viewer that is not there yet, or goes away, is said once and waited for (nothing is buffered
meanwhile); a daemon that stops or restarts likewise. Only a missing rerun-sdk ends the process.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from calibration.conventions import JOINT_NAMES
from daemon.api.client import ControlClient, DaemonUnavailable, next_poll_s
from daemon.api.messages import CameraList, CameraPreview, ErrorReply, LiveStatus

log = logging.getLogger("so101d.rerun")

DEFAULT_VIEWER = "127.0.0.1:9876"  # where `rerun` (the viewer) listens for SDKs by default
JOINTS_HZ = 30.0  # status.live polls: the dataset's rate; the reply is read by reference
CAMERA_FPS = 15.0  # previews per camera; a slower camera costs no extra encode (after_seq)
PREVIEW_MAX_PX = (640, 480)  # a 640x480 camera arrives whole; a larger one is shrunk in the daemon
RETRY_S = 1.0  # daemon or viewer away: try again this often
VIEWER_CHECK_S = 1.0  # how often the stream is flushed, which is when a lost viewer shows
FLUSH_TIMEOUT_S = 5.0
APPLICATION_ID = "so101d"
MODE_ENTITY = "so101d.mode"
# (status.live joint vector, entity prefix): the dataset key each one is recorded under
JOINT_SERIES: tuple[tuple[str, str], ...] = (
    ("leader", "teleop.action"),
    ("command", "action"),
    ("follower", "observation"),
)
RERUN_SDK = "rerun-sdk>=0.24.0,<0.34.0"  # LeRobot 0.6.1's viz extra


class RerunMissing(RuntimeError):
    """rerun-sdk cannot be imported; the message says how to install it."""


def joint_entity(prefix: str, joint: str) -> str:
    return f"{prefix}.{joint}.pos"


def camera_entity(camera: str) -> str:
    return f"observation.{camera}"


def viewer_url(host: str, port: int) -> str:
    """The gRPC URL the SDK connects to (Rerun >= 0.23: ``rerun+http://HOST:PORT/proxy``)."""
    shown = f"[{host}]" if ":" in host else host
    return f"rerun+http://{shown}:{port}/proxy"


def import_rerun() -> Any:
    """The rerun module; RerunMissing naming the package when it is not installed."""
    # The SDK's own (Rust) log lines would repeat what is said here in other words, with colour
    # codes, into the daemon's log; RUST_LOG=warn (or any) set by the operator wins.
    os.environ.setdefault("RUST_LOG", "off")
    try:
        import rerun
    except ImportError as exc:
        raise RerunMissing(
            f"rerun-sdk is not installed ({exc}): pip install '{RERUN_SDK}' (LeRobot's viz extra) "
            "into the daemon's environment"
        ) from None
    return rerun


@dataclass(frozen=True)
class StreamConfig:
    socket_path: str
    host: str
    port: int
    joints_hz: float = JOINTS_HZ
    camera_fps: float = CAMERA_FPS

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"


def viewer_reachable(host: str, port: int, timeout_s: float = 1.0) -> str | None:
    """None when something accepts TCP connections at host:port, else why not.

    The SDK itself never says: it buffers everything for a viewer that may come later."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


class RerunStreamer:
    """Polls the daemon and logs to one Rerun recording until ``wait`` says stop.

    ``wait(seconds)`` sleeps at most that long and returns True when the streamer must stop (a
    signal); the streamer has no thread of its own."""

    def __init__(self, cfg: StreamConfig, rr: Any, wait: Callable[[float], bool]) -> None:
        self.cfg = cfg
        self.rr = rr
        self.wait = wait
        self.url = viewer_url(cfg.host, cfg.port)
        # one recording for the streamer's life: a viewer that comes back continues it
        self.rec = rr.RecordingStream(APPLICATION_ID)
        self.client = ControlClient(cfg.socket_path, timeout_s=3.0, connect_retry_s=0.5)
        self.cameras: list[str] | None = None  # None: ask camera.list (again, after a daemon restart)
        self.after_seq: dict[str, int | None] = {}
        self.mode: tuple[str, str] | None = None
        self.joint_rows = 0  # joint samples sent (the daemon's replies that carried joints)
        # the joints' key prefixes: "" for one arm; "left_", "right_" for a bimanual pair's
        self.arm_prefixes: list[str] = [""]
        self.images = 0

    # ------------------------------------------------------------------ the viewer
    def run(self) -> None:
        try:
            while self._await_viewer():
                self.rec.connect_grpc(self.url)
                log.info("streaming to the Rerun viewer at %s (daemon socket %s)", self.cfg.where, self.cfg.socket_path)
                self.cameras, self.mode = None, None  # this viewer gets the blueprint and the mode too
                if not self._stream():
                    break
        finally:
            self.client.close()
            self.rec.disconnect()

    def _await_viewer(self) -> bool:
        """True once a viewer listens at the address; False when asked to stop meanwhile."""
        said: str | None = None
        while True:
            why = viewer_reachable(self.cfg.host, self.cfg.port)
            if why is None:
                return True
            if why != said:
                log.warning(
                    "no Rerun viewer at %s (%s): start one there (`rerun`, or `rerun --port %d`); trying every %g s",
                    self.cfg.where,
                    why,
                    self.cfg.port,
                    RETRY_S,
                )
                said = why
            if self.wait(RETRY_S):
                return False

    # ------------------------------------------------------------------ the daemon
    def _stream(self) -> bool:
        """Poll and log until the viewer goes away (True) or a stop is asked (False)."""
        joints_period_s = 1.0 / self.cfg.joints_hz
        camera_period_s = 1.0 / self.cfg.camera_fps
        now_s = time.monotonic()
        next_joints_s, next_check_s = now_s, now_s + VIEWER_CHECK_S
        next_camera_s: dict[str, float] = {}
        daemon_said: bool | None = None  # last said: True connected, False away
        while True:
            now_s = time.monotonic()
            try:
                if self.cameras is None:
                    self._start_cameras()
                    next_camera_s = dict.fromkeys(self.cameras or [], now_s)
                if now_s >= next_joints_s:
                    self._log_live(self.client.call_as(LiveStatus, "status.live"))
                    next_joints_s = next_poll_s(next_joints_s, joints_period_s, time.monotonic())
                for camera, due_s in next_camera_s.items():
                    if now_s >= due_s:
                        self._log_preview(camera)
                        next_camera_s[camera] = next_poll_s(due_s, camera_period_s, time.monotonic())
                if daemon_said is not True:
                    log.info("daemon at %s: streaming joints and cameras %s", self.cfg.socket_path, self.cameras)
                    daemon_said = True
            except DaemonUnavailable as exc:
                self.client.close()
                self.cameras, self.mode = None, None  # a restarted daemon may have other cameras
                next_camera_s = {}
                if daemon_said is not False:
                    log.warning("daemon unavailable (%s): waiting for it", exc)
                    daemon_said = False
                if self.wait(RETRY_S):
                    return False
                continue
            if now_s >= next_check_s:
                try:
                    self.rec.flush(timeout_sec=FLUSH_TIMEOUT_S)
                except RuntimeError as exc:  # "gRPC connection severed": the viewer was closed
                    log.warning("the Rerun viewer at %s went away (%s): waiting for it", self.cfg.where, exc)
                    self.rec.disconnect()
                    return True
                next_check_s = time.monotonic() + VIEWER_CHECK_S
            due_s = min([next_joints_s, next_check_s, *next_camera_s.values()])
            if self.wait(max(0.0, due_s - time.monotonic())):
                return False

    def _start_cameras(self) -> None:
        reply = self.client.call_as(CameraList, "camera.list")
        self.cameras = [] if isinstance(reply, ErrorReply) else [c.name for c in reply.cameras]
        live = self.client.call_as(LiveStatus, "status.live")  # which arms: the plots' names
        arms = None if isinstance(live, ErrorReply) else live.arms
        self.arm_prefixes = [f"{name}_" for name in arms] if arms else [""]
        self.after_seq = dict.fromkeys(self.cameras)
        self.rec.send_blueprint(self._blueprint(self.cameras))

    def _blueprint(self, cameras: list[str]) -> Any:
        rrb = self.rr.blueprint
        plots = [
            rrb.TimeSeriesView(
                name=f"{arm}{joint}",
                origin="/",
                contents=[f"+ /{joint_entity(prefix, arm + joint)}" for _, prefix in JOINT_SERIES],
            )
            for arm in self.arm_prefixes
            for joint in JOINT_NAMES
        ]
        images = [rrb.Spatial2DView(name=c, origin=f"/{camera_entity(c)}") for c in cameras]
        return rrb.Blueprint(rrb.Horizontal(rrb.Grid(*plots), *([rrb.Vertical(*images)] if images else [])))

    def _log_live(self, reply: LiveStatus | ErrorReply) -> None:
        if isinstance(reply, ErrorReply):
            return
        rr, rec = self.rr, self.rec
        rec.set_time("daemon_cycle", sequence=reply.cycles)
        mode = (reply.mode, reply.reason or "")
        if mode != self.mode:
            level = rr.TextLogLevel.WARN if mode[0] == "fault" else rr.TextLogLevel.INFO
            rec.log(MODE_ENTITY, rr.TextLog(f"{mode[0]}: {mode[1]}" if mode[1] else mode[0], level=level))
            self.mode = mode
        each = [(f"{name}_", arm.joints) for name, arm in reply.arms.items()] if reply.arms else [("", reply.joints)]
        logged = False
        for arm, j in each:
            for values, (_, prefix) in zip((j.leader, j.command, j.follower), JOINT_SERIES):
                if not values:  # None before the arm is read (or no leader: a policy drives)
                    continue
                for joint, value in zip(JOINT_NAMES, values):
                    rec.log(joint_entity(prefix, arm + joint), rr.Scalars(float(value)))
                logged = True
        self.joint_rows += logged

    def _log_preview(self, camera: str) -> None:
        w, h = PREVIEW_MAX_PX
        reply = self.client.call_as(
            CameraPreview,
            "camera.preview",
            camera=camera,
            max_width=w,
            max_height=h,
            after_seq=self.after_seq.get(camera),
        )
        if isinstance(reply, ErrorReply) or not reply.jpeg_b64 or reply.seq is None:
            return  # unchanged since the last one, no frame yet, or the camera went away
        self.after_seq[camera] = reply.seq
        jpeg = base64.b64decode(reply.jpeg_b64)
        self.rec.log(camera_entity(camera), self.rr.EncodedImage(contents=jpeg, media_type="image/jpeg"))
        self.images += 1
