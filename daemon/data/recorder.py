"""The loop-side recorder: takes frames on the fps grid, hands them to the writer process.

``on_cycle`` is called by the control loop every cycle (100 Hz). It costs microseconds: when a
grid point has passed it copies three 6-float vectors, takes *references* to the cameras' latest
frames and appends one tuple to a deque. A feeder thread copies the pixels into the shared-memory
ring (numpy releases the GIL for large copies) and publishes the record; the writer process does
everything else. Nothing here waits on the writer, a camera or the disk.

Grid: frame k of an episode is the state at the first cycle at or after ``t0 + k / fps``; if the
loop stalls past several grid points, each one still gets its row (the same, late state), so the
table's timestamps (``k / fps``) stay true and the episode's EpisodeTag counts the late frames.
"""

from __future__ import annotations

import collections
import json
import logging
import multiprocessing as mp
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from daemon.config.ring_bound import DEFAULT_RING_MAX_MB, bound_refusal
from daemon.control.seams import CycleRecord
from daemon.data.preroll import KeptRows, Preroll, PrerollError, StreamSize
from daemon.data.ring import KIND_DISCARD, KIND_FRAME, KIND_SAVE, KIND_START, TASK_BYTES, Ring
from daemon.data.schema import DEFAULT_FPS, SOURCE_BYTES
from daemon.data.store import (
    DatasetMismatchError,
    DroppedEpisode,
    StoreConfig,
    config_differences,
    reserve_episode_number,
    staging_dir,
)
from daemon.data.writer import store_config_dict
from daemon.data.writer_entry import writer_entry
from daemon.system.logs import RateLimitedLogger
from drivers.camera_lerobot import LeRobotCamera
from drivers.cameras import Camera, VirtualArmCamera

log = logging.getLogger("so101d.recording")

IDLE, RECORDING, ERROR, STARTING, CLOSED = "idle", "recording", "error", "starting", "closed"
# The feeder's queue item that carries the rows ``episode keep`` took from the pre-roll buffer
# (one item, so the verb holds the lock for O(1) and the live rows queue behind them, in order).
KIND_KEPT = -1
# How often the feeder looks for room in the pixel ring while it hands kept rows over.
_ROOM_POLL_S = 0.002


class RecordingError(RuntimeError):
    """A verb that cannot be done now (clear message for the CLI/socket); ``field``: the request
    field at fault, when one is (the socket's refusal names it)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


SHUTDOWN_CHOICES = ("save", "discard")
_MAX_NOTE_CHARS = 200
# How long save_episode waits for its record to reach the writer's ring (normally < 1 ms; a
# feeder stuck behind a full ring answers "handed_to_writer": false instead of blocking the verb).
SAVE_HANDOVER_TIMEOUT_S = 2.0
# How long save_episode waits for the writer to have the episode on disk (staged and synced:
# normally a few ms, the encoders stream during capture). Past it (a writer seconds behind, a
# disk stalling) the answer says "durable": false and the save carries on in the background.
SAVE_DURABLE_TIMEOUT_S = 1.0
DEFAULT_MIN_FREE_MB = 500.0  # [recording] min_free_mb: two 640x480 cameras for a minute, twice, and room
DEFAULT_STOP_TIMEOUT_S = 120.0  # [recording] stop_timeout_s: how long shutdown waits for the writer
# The pipe closes as the writer dies, its exit status a moment later (a loaded machine tears a big
# process down slowly): this long is waited for it, to name how the writer ended.
_WRITER_EXIT_WAIT_S = 10.0


@dataclass
class PendingSave:
    """An episode answered "saved" (queued) and not yet committed to the dataset."""

    seq: int  # the recorder's episode sequence number (negative: recovered from staging at start)
    episode: int  # the number the operator was told (not the dataset index)
    task: str
    frames: int
    staged: bool = False  # durable in staging: a writer crash keeps it (committed at the next start)

    def describe(self) -> str:
        name = f"episode {self.episode}" if self.episode >= 0 else "an episode"
        return f"{name} ({self.task!r}, {self.frames} frames)"


def frame_refusal(expected_hw: tuple[int, int], pixels: Any) -> str:
    """Why a camera image cannot go into the dataset feature (HxWx3 uint8), or "" when it can."""
    shape = getattr(pixels, "shape", None)
    dtype = getattr(pixels, "dtype", None)
    want = (expected_hw[0], expected_hw[1], 3)
    if shape == want and dtype == np.uint8:
        return ""
    return f"got {tuple(shape) if shape is not None else type(pixels).__name__} {dtype}, the dataset feature is {want} uint8"


def depth_refusal(expected_hw: tuple[int, int], depth_mm: np.ndarray | None) -> str:
    """Why a depth map cannot go into the camera's depth feature (HxWx1 uint16 millimetres), or ""."""
    want = (expected_hw[0], expected_hw[1], 1)
    if depth_mm is None:
        return f"no depth map with the frame, the depth feature is {want} uint16"
    if depth_mm.shape == want and depth_mm.dtype == np.uint16:
        return ""
    return f"depth map {tuple(depth_mm.shape)} {depth_mm.dtype}, the depth feature is {want} uint16"


def records_depth(cam: Camera) -> bool:
    """A camera recorded with its depth map: LeRobot's RealSense with ``use_depth``."""
    return isinstance(cam, LeRobotCamera) and cam.use_depth


def save_extras_bytes(extras: dict[str, Any]) -> bytes:
    """The SAVE record's tag extras (origin, follower kind, notes) as JSON in the TASK_BYTES field.

    Notes that do not fit are dropped from the end, with a last note saying how many; the
    writer never sees truncated JSON."""
    notes = [str(n)[:_MAX_NOTE_CHARS] for n in extras.get("notes", [])]
    dropped = 0
    while True:
        data = dict(extras, notes=notes + ([f"{dropped} more notes dropped"] if dropped else []))
        raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
        if len(raw) <= TASK_BYTES or not notes:
            return raw[:TASK_BYTES] if len(raw) <= TASK_BYTES else b"{}"
        notes = notes[:-1]
        dropped += 1


# LeRobot 0.6.1's sentry rotation (lerobot/rollout/strategies/core.py estimate_max_episode_seconds):
# a deliberately low bitrate guess, so the time it gives to fill a video file is on the long side
# and the file has crossed the size when the episode is cut; with no video stream, 300 s.
CONSERVATIVE_BITS_PER_PIXEL = 0.1
NO_VIDEO_ROTATE_S = 300.0
MAX_ROTATE_S = 24 * 3600.0  # one episode a day at most: a rotation longer than this is a typo
MAX_ROTATE_MB = 100_000.0


@dataclass(frozen=True)
class Rotation:
    """Continuous recording (LeRobot's sentry strategy, lerobot/rollout/strategies/sentry.py):
    the episode is cut after ``rotate_s`` seconds or once its video would hold ``rotate_mb`` MB
    (an estimate, as LeRobot's), whichever comes first; None: that limit is off."""

    rotate_s: float | None = None
    rotate_mb: float | None = None

    def problem(self) -> tuple[str, str] | None:
        """(the field at fault, why) when the rotation cannot be used; None when it can."""
        for name, value, top in (
            ("rotate_s", self.rotate_s, MAX_ROTATE_S),
            ("rotate_mb", self.rotate_mb, MAX_ROTATE_MB),
        ):
            if value is not None and not (0 < value <= top):
                return name, f"{name} must be in (0, {top:g}], got {value!r}"
        if self.rotate_s is None and self.rotate_mb is None:
            return "rotate_s", "continuous recording needs rotate_s or rotate_mb (when to start the next episode)"
        return None

    def check(self) -> None:
        """RecordingError naming the field when the rotation cannot be used."""
        bad = self.problem()
        if bad is not None:
            raise RecordingError(bad[1])


def seconds_to_fill_mb(camera_hw: list[tuple[int, int]], fps: float, target_mb: float) -> float:
    """How long the smallest camera's video takes to reach ``target_mb`` MiB at the low bitrate
    guess (the slowest stream decides: each camera has its own file); NO_VIDEO_ROTATE_S without one."""
    if not camera_hw or fps <= 0:
        return NO_VIDEO_ROTATE_S
    smallest_px = min(h * w for h, w in camera_hw)
    bytes_per_s = smallest_px * CONSERVATIVE_BITS_PER_PIXEL * fps / 8.0
    return target_mb * 1024 * 1024 / bytes_per_s if bytes_per_s > 0 else NO_VIDEO_ROTATE_S


def rotation_frames(rotation: Rotation, fps: int, camera_hw: list[tuple[int, int]]) -> tuple[int, str]:
    """(frames per episode, which limit sets it: "rotate_s" or "rotate_mb")."""
    limits: list[tuple[int, str]] = []
    if rotation.rotate_s is not None:
        limits.append((max(1, round(rotation.rotate_s * fps)), "rotate_s"))
    if rotation.rotate_mb is not None:
        limits.append((max(1, round(seconds_to_fill_mb(camera_hw, fps, rotation.rotate_mb) * fps)), "rotate_mb"))
    return min(limits)


@dataclass
class ContinuousSession:
    """A continuous recording in progress: one episode after another with no frame between them."""

    rotation: Rotation
    frames_per_episode: int
    limit: str  # "rotate_s" | "rotate_mb": the one that cuts
    first_episode: int  # the session's first episode number (names the session in every tag)
    follower_kind: str  # asked once at the start: a cut happens on the loop's thread
    part: int = 0  # the episode recording now is the session's part-th (0 = first)
    first_frame: int = 0  # the session frame index of the current episode's frame 0
    session_t0: float | None = None  # the session's grid origin (monotonic s): frame n at t0 + n / fps
    next_number: int | None = None  # the next episode's number, kept on the disk ahead of the cut
    rotated: int = 0  # episodes cut so far

    def status(self) -> dict[str, Any]:
        return {
            "rotate_s": self.rotation.rotate_s,
            "rotate_mb": self.rotation.rotate_mb,
            "frames_per_episode": self.frames_per_episode,
            "limit": self.limit,
            "first_episode": self.first_episode,
            "part": self.part,
            "rotated": self.rotated,
        }


class EpisodeHook(Protocol):
    """Called around every episode, whoever starts it (a simulated follower's reset/start/stop,
    staleness notes: daemon/data/sim_episodes.py)."""

    def episode_starting(self, recorder: Recorder) -> None:
        """Before the episode starts; RecordingError: it does not start."""
        ...

    def episode_ending(self, recorder: Recorder, saved: bool) -> tuple[bool | None, list[str]]:
        """After it was saved (or discarded): (the episode's success or None, notes for its tag)."""
        ...


@dataclass
class RecorderConfig:
    root: str
    repo_id: str = "local/so101d"
    fps: int = DEFAULT_FPS
    default_task: str = "so101 teleoperation"
    follower_kind: str = "emulated"
    origin: str = "teleop"
    pixel_ring_s: float = 2.0  # seconds of images the ring holds when the writer falls behind
    n_records: int = 32768  # rows the record ring holds (about 18 min at 30 fps)
    save_durable_timeout_s: float = SAVE_DURABLE_TIMEOUT_S
    # An episode starts only with this much free space where it is staged and committed (its
    # videos are staged, then copied into the dataset: twice their size for a moment).
    min_free_mb: float = DEFAULT_MIN_FREE_MB
    vcodec: str = "h264"
    preset: str = "ultrafast"
    crf: int = 23
    # LeRobot's DepthEncoderConfig fields to set for depth streams ([recording.depth_encoder])
    depth_encoder: dict[str, float | bool] = field(default_factory=dict)
    # Test hook: StoreConfig.fault for the writer; "feeder_raise" makes the feeder thread raise at
    # an episode's 11th frame, "feeder_raise_at_save" at a SAVE record (the health invariant under
    # a thread that dies).
    fault: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # A bimanual rig's arms, in the loop's names and LeRobot's order ("left", "right"): each frame
    # records both arms side by side (schema.with_arms); empty: the primary arm alone.
    arms: tuple[str, ...] = ()
    # The pre-roll buffer (daemon/data/preroll.py): between episodes the last ring_s seconds of
    # frames, at most ring_max_mb MiB of images (checked at open, with the cameras' real sizes); 0: off
    ring_s: float = 0.0
    ring_max_mb: float = DEFAULT_RING_MAX_MB


@runtime_checkable
class KeptEpisodeHook(Protocol):
    """An episode hook that knows what to do when an episode is *kept* (``episode keep``: it began
    ``since_monotonic_s``, before the verb) instead of started; a hook without it (a simulated
    follower's, whose episodes begin with a scene reset) makes ``keep`` refuse."""

    def episode_kept(self, recorder: Recorder, since_monotonic_s: float) -> None:
        """Before the kept episode records; RecordingError: it is not kept (nothing taken)."""
        ...


class Recorder:
    """Episode verbs + ``on_cycle``; owns the ring, the feeder thread and the writer process."""

    def __init__(self, cfg: RecorderConfig, cameras: list[Camera] | None = None) -> None:
        if cfg.fps <= 0:
            raise ValueError(f"fps must be positive, got {cfg.fps}")
        self.cfg = cfg
        self.cameras: list[Camera] = list(cameras or [])
        names = [c.name for c in self.cameras]
        if len(set(names)) != len(names):
            raise ValueError(f"camera names must be unique, got {names}")
        self.cameras.sort(key=lambda c: c.name)  # dataset order (dataset_features sorts by name)
        self._virtual = [c for c in self.cameras if isinstance(c, VirtualArmCamera)]
        # cameras whose frames carry a depth map, recorded as the stream "<name>_depth"
        self._depth = [records_depth(c) for c in self.cameras]
        self.store_cfg = StoreConfig(
            root=cfg.root,
            repo_id=cfg.repo_id,
            fps=cfg.fps,
            cameras=[(c.name, c.height, c.width) for c in self.cameras],
            depth_cameras=[c.name for c, d in zip(self.cameras, self._depth) if d],
            depth_encoder=dict(cfg.depth_encoder),
            vcodec=cfg.vcodec,
            preset=cfg.preset,
            crf=cfg.crf,
            fault=cfg.fault,
            arms=list(cfg.arms),
        )
        # per arm (bimanual): its newest (state, command, raw target), for a cycle it is missing from
        self._arm_last: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._arms_noted_stale: set[str] = set()  # arms the episode's tag already says repeated
        # the arm a virtual camera draws: a per-arm camera's, by LeRobot's name prefix
        # ("right_wrist": the right arm), else the primary arm (a top-level camera)
        self._virtual_sides = [
            (cam, next((a for a in cfg.arms if cam.name.startswith(f"{a}_")), cfg.arms[0] if cfg.arms else ""))
            for cam in self._virtual
        ]
        self._lock = threading.Lock()
        self._q: collections.deque[tuple] = collections.deque()
        self._wake = threading.Event()
        # The newest episode whose save record the feeder has published into the shared ring: from
        # then on the writer process commits it even if this process is SIGKILLed (save_episode
        # waits for it before it answers "queued").
        self._handed_over = threading.Condition()
        self._handed_over_seq = -1
        # Signalled when the writer reports an episode staged (on disk, synced) or recording fails.
        self._staged_cv = threading.Condition()
        self._phase = CLOSED
        self._error = ""
        self._seq = 0
        self._frame_index = 0
        self._t0: float | None = None
        self._next_grid_s = 0.0
        self._episode_started_s = 0.0
        self._task = cfg.default_task
        self._ready = threading.Event()
        self._committed_total = 0
        # operator-facing episode numbers: handed out at start, kept on the disk, never reused
        # (the dataset index differs once an episode is dropped or set aside: LeRobot has no gaps)
        self._number = 0  # the episode recording now
        self._next_number = 0
        # Saves answered "queued" and not committed yet, by episode seq (insertion = commit order).
        self._pending: dict[int, PendingSave] = {}
        self._lost: list[str] = []  # episodes that will never be in the dataset (logged, status, exit code)
        self._gone_seqs: set[int] = set()  # saves lost or dropped: never "durable"
        # Episodes the restart's repair (or a commit) could not put into the dataset: named with
        # number, task and reason (status, console, log).
        self._dropped: list[str] = []
        self._disk_full = False  # recording stopped on a full disk: resumes once there is room
        self._disk_error = ""  # what failed on it, without the figures (those change)
        self._kept_in_staging: list[str] = []  # filled at close: staged, committed at the next start
        # Frames refused at the edge (wrong shape/dtype for the dataset feature), per camera.
        self._refused: dict[str, int] = {c.name: 0 for c in self.cameras}
        self._refused_last: dict[str, str] = {}
        self._episode_refused: dict[str, int] = {}
        self._expected_hw: list[tuple[int, int]] = []  # fixed when the ring is created
        self._waiting_for = ""  # what a deferred open waits for (a sim camera's announced size)
        self._last_saved: dict[str, Any] = {}
        self._last_staged: dict[str, Any] = {}
        self._counters = {
            "frames_taken": 0,
            "frames_without_pixels": 0,
            "records_lost": 0,
            "frames_refused": 0,
            "episodes_saved": 0,
            "episodes_discarded": 0,
            "episodes_rotated": 0,
        }
        self._rl = RateLimitedLogger(log, period_s=5.0, burst=2)
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        # Episode hooks (a simulated follower's reset/start/stop, staleness notes): see EpisodeHook.
        self._episode_hooks: list[EpisodeHook] = []
        self._origin = cfg.origin
        self._notes: list[str] = []
        self._starting = False
        # The follower kind for the episode tag, asked at save time (a sim names its backend only
        # once it has said hello); None: cfg.follower_kind.
        self.follower_kind_fn: Callable[[], str] | None = None
        self._ring: Ring | None = None
        self._proc: Any = None
        self._conn: Any = None
        self._threads: list[threading.Thread] = []
        self._running = False
        self._closing = threading.Event()
        self._fault = cfg.fault
        # Continuous recording (start_episode with a Rotation): the loop's thread cuts the episode
        # (_rotate_locked); the rec-rotate thread keeps the next episode's number on the disk ahead
        # of the cut (no disk write on the loop's thread) and watches the cut episodes reach it.
        self._cont: ContinuousSession | None = None
        self._rotate_wake = threading.Event()
        self._reserve_lock = threading.Lock()  # one reservation write at a time (taken before _lock)
        self._rotated_seqs: collections.deque[int] = collections.deque()
        # The pre-roll buffer, fed on the loop's thread (under the lock) while no episode records;
        # rebuilt at open with the cameras' real sizes (a sim camera's are known only then).
        self._preroll = Preroll(cfg.ring_s, cfg.fps, self._stream_sizes())
        self._kept: dict[str, Any] = {}  # the episode in progress was kept: what its tag says of it
        # The feeder hands kept rows over (waiting for pixel-ring room): how many are left, which
        # episode they belong to, and the episodes discarded meanwhile (their rows are dropped).
        self._kept_left = 0
        self._kept_seq = -1
        self._kept_cancelled: set[int] = set()
        # a kept episode's live rows wait for pixel room too (queued behind its kept rows, the
        # writer is seconds behind for a while): the episode's, until the next one
        self._catch_up_seq = -1

    def _stream_sizes(self) -> list[StreamSize]:
        return [StreamSize(c.width, c.height, d) for c, d in zip(self.cameras, self._depth)]

    # -- life cycle ------------------------------------------------------------------------------
    def open(self) -> None:
        """Checks the dataset, starts cameras, ring, feeder and writer. Returns at once; see wait_ready.

        A camera whose size is not known yet (a sim camera before the simulator announced it:
        width/height 0) defers the rest to a thread: the recorder stays "starting" (episode start
        says what it waits for) until every size is known, and goes to "error" when a camera
        reports ``size_error`` (a configured size the simulator does not render)."""
        if self._phase != CLOSED or self._running:
            raise RecordingError("recorder already open")
        for cam in self.cameras:
            cam.start()
        if all(c.width > 0 and c.height > 0 for c in self.cameras):
            self._open_now()
            return
        self._running = True
        self._phase = STARTING
        t = threading.Thread(target=self._open_when_sized, name="rec-open", daemon=True)
        t.start()
        self._threads.append(t)

    def _unsized(self) -> list[str]:
        return [c.name for c in self.cameras if c.width <= 0 or c.height <= 0]

    def _open_when_sized(self) -> None:
        try:
            while self._running:
                errors = [str(getattr(c, "size_error", "") or "") for c in self.cameras]
                errors = [e for e in errors if e]
                if errors:
                    self._fail("; ".join(errors))
                    return
                unsized = self._unsized()
                if not unsized:
                    break
                self._waiting_for = (
                    f"camera {', '.join(unsized)}: waiting for the simulator to announce "
                    "its image size (is the simulator running?)"
                )
                time.sleep(0.05)
            if not self._running or self._closing.is_set():
                return
            self._waiting_for = ""
            self.store_cfg.cameras = [(c.name, c.height, c.width) for c in self.cameras]
            self._open_now()
        except BaseException as exc:
            self._fail(f"{type(exc).__name__}: {exc}" if not isinstance(exc, RecordingError) else str(exc))
        finally:
            if self._phase == ERROR:
                self._ready.set()

    def _open_now(self) -> None:
        diffs = config_differences(self.store_cfg)
        if diffs:
            raise DatasetMismatchError(
                f"dataset {self.store_cfg.root_path} was recorded with another configuration: " + "; ".join(diffs)
            )
        if self.cfg.ring_s > 0:  # the real sizes now (a sim camera's were not known at load)
            why = bound_refusal(self.cfg.ring_s, self.cfg.fps, self._stream_sizes(), self.cfg.ring_max_mb)
            if why:
                raise RecordingError(why)
        with self._lock:
            self._preroll = Preroll(self.cfg.ring_s, self.cfg.fps, self._stream_sizes())
        slots = max(2, round(self.cfg.pixel_ring_s * self.cfg.fps)) if self.cameras else 0
        sizes = [(c.name, c.height, c.width) for c in self.cameras]
        self.store_cfg.cameras = sizes
        self._expected_hw = [(h, w) for _, h, w in sizes]
        self._ring = Ring.create(
            sizes,
            self.cfg.n_records,
            slots,
            [c for c, d in enumerate(self._depth) if d],
            n_joints=self.store_cfg.n_joints,
        )
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        spec = self._ring.spec
        import os

        proc = ctx.Process(
            target=writer_entry,
            name="so101d-writer",
            args=(
                store_config_dict(self.store_cfg),
                {
                    "records_name": spec.records_name,
                    "pixels_name": spec.pixels_name,
                    "counters_name": spec.counters_name,
                    "n_records": spec.n_records,
                    "n_pixel_slots": spec.n_pixel_slots,
                    "cameras": [list(c) for c in spec.cameras],
                    "depths": list(spec.depths),
                    "n_joints": spec.n_joints,
                },
                child,
                os.getpid(),
                self.cfg.follower_kind,
                self.cfg.origin,
            ),
        )
        proc.start()
        # Published only once started: a health check meanwhile (a sim camera opens the recorder on
        # its own thread, while `status` and `episode start` run) took an unstarted process for a
        # dead writer ("writer process exited (code None)") and stopped recording for good.
        self._proc = proc
        child.close()
        self._running = True
        with self._lock:
            if self._phase in (CLOSED, STARTING):
                self._phase = STARTING
        for target, name in ((self._feeder, "rec-feeder"), (self._events, "rec-events"), (self._rotator, "rec-rotate")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        if not self._ready.wait(timeout_s):
            raise RecordingError(f"writer process not ready after {timeout_s:.0f} s")
        if self._phase == ERROR:
            raise RecordingError(self._error)

    def close(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S, on_episode: str = "discard") -> list[str]:
        """Stops recording, lets the writer commit every saved episode (at most ``timeout_s``), stops it.

        ``on_episode``: what happens to the episode in progress: "discard", or "save" (tagged
        "saved at shutdown", success unjudged unless an episode hook says otherwise).

        Returns the episodes LOST (answered saved, or in progress when recording failed, and
        never written), also logged as an error; an empty list when nothing was lost. Episodes
        staged durably but not committed are kept for the next start (logged, not lost)."""
        if on_episode not in SHUTDOWN_CHOICES:
            raise ValueError(f"on_episode must be one of {SHUTDOWN_CHOICES}, got {on_episode!r}")
        if self._closing.is_set():
            return list(self._lost)
        self._check_health()
        if self._phase == RECORDING and on_episode == "save":
            try:
                r = self.save_episode(None, notes=["saved at shutdown (daemon stopping)"])
                log.warning("shutdown: episode %d in progress saved (%d frames)", r["episode"], r["frames"])
            except RecordingError as exc:
                log.warning("shutdown: episode in progress not saved: %s", exc)
        self._closing.set()
        with self._lock:
            if self._phase == RECORDING:
                self._cont = None
                self._cancel_kept_locked()
                self._q.append((KIND_DISCARD, self._seq))
                log.warning("shutdown: episode %d in progress discarded ([recording] on_shutdown)", self.episode_number)
                discarding = True
            else:
                discarding = False
            failed = self._phase == ERROR
            self._phase = CLOSED
        if discarding:
            self._run_ending_hooks(saved=False)
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        writer_alive = self._proc is not None and self._proc.is_alive()
        if self._pending and writer_alive:
            log.info(
                "shutdown: waiting up to %.0f s ([recording] stop_timeout_s) for the writer to commit "
                "%d saved episode(s)",
                timeout_s,
                len(self._pending),
            )
        feeder = next((t for t in self._threads if t.name == "rec-feeder"), None)
        while (
            (self._q or self._kept_left)
            and feeder is not None
            and feeder.is_alive()
            and writer_alive
            and time.monotonic() < deadline
        ):
            time.sleep(0.01)
            writer_alive = self._proc.is_alive()
        if self._proc is not None and self._proc.is_alive() and not self._ready.is_set():
            # Still starting (importing LeRobot: minutes at nice 19 on a busy machine): nothing of
            # this session is in it yet, and a staged episode it was to commit stays staged for
            # the next start, so stopping it now loses nothing, as a power cut there would not.
            log.info("shutdown: the dataset writer was still starting; stopped at once")
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send({"cmd": "stop"})
            except (OSError, BrokenPipeError):
                pass
            self._proc.join(max(0.1, deadline - time.monotonic()))
            if self._proc.is_alive():
                log.error(
                    "writer process did not finish within %.0f s ([recording] stop_timeout_s); killing it (staged episodes stay for the next start)",
                    timeout_s,
                )
                self._proc.kill()  # it ignores SIGTERM (systemd's stop reaches the whole group)
                self._proc.join(5)
        self._running = False
        self._wake.set()
        for t in self._threads:
            t.join(timeout=2)  # the events thread reads the writer's last "saved" events first
        for cam in self.cameras:
            cam.stop()
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        with self._lock:
            for p in self._pending.values():
                if p.staged:
                    self._kept_in_staging.append(p.describe())
                else:
                    self._lost.append(f"{p.describe()}: saved but never written")
            self._pending.clear()
        if self._kept_in_staging:
            log.warning(
                "shutdown: %d episode(s) staged on disk but not committed, kept for the next start: %s",
                len(self._kept_in_staging),
                "; ".join(self._kept_in_staging),
            )
        if self._lost:
            log.error(
                "shutdown: %d episode(s) LOST, not in the dataset%s: %s",
                len(self._lost),
                f" (recording had stopped: {self._error})" if failed else "",
                "; ".join(self._lost),
            )
        return list(self._lost)

    @property
    def lost_episodes(self) -> list[str]:
        """Episodes that will never be in the dataset (see ``close``)."""
        return list(self._lost)

    @property
    def writer_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def add_episode_hook(self, hook: EpisodeHook) -> None:
        """See ``_episode_hooks``: called around every episode, whoever starts it (verb, policy, demo)."""
        self._episode_hooks.append(hook)

    def add_note(self, text: str) -> bool:
        """Adds a note to the episode in progress' tag (e.g. "sim went stale at frame 120").
        Returns False (nothing recorded) when no episode is recording."""
        with self._lock:
            if self._phase != RECORDING:
                return False
            self._notes.append(str(text))
        return True

    @property
    def frames_recorded(self) -> int:
        """Frames of the episode in progress so far (0 when idle)."""
        return self._frame_index if self._phase == RECORDING else 0

    def add_listener(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """Called (on the events thread) with every writer event dict: saved, error, ..."""
        self._listeners.append(fn)

    # -- the loop's hook ---------------------------------------------------------------------------
    def on_record(self, record: CycleRecord) -> None:
        """The loop's RecordHook (daemon/control/seams.py), every control cycle: the primary arm's
        state, command and raw target, and who drove every arm (the ``so101d.source`` column)."""
        arm = record.arms[0]
        # a join of a few words: only when a row may be taken (an episode, or the pre-roll buffer)
        source = record.sources_text() if self._phase == RECORDING or self._preroll.enabled else ""
        if not self.cfg.arms:
            if not record.primary_current:
                return  # the arm this dataset records is not current: a gap, as on a single-arm loop
            self.on_cycle(record.now_monotonic_s, arm.state_units, arm.action_units, arm.teleop_action_units, source)
            return
        # two arms: both side by side, in the configured order; an arm whose pose is not current
        # this cycle (its follower lost for a moment) repeats its newest values
        for a in record.arms:
            self._arm_last[a.arm] = (a.state_units, a.action_units, a.teleop_action_units)
        for cam, side in self._virtual_sides:  # each virtual camera draws its own arm
            if side in self._arm_last:
                cam.set_state(np.array(self._arm_last[side][0], dtype=np.float64))
        if not self._row_due(record.now_monotonic_s):
            return  # no frame due: nothing joined (on_cycle would drop it)
        parts = [self._arm_last.get(name) for name in self.cfg.arms]
        if any(p is None for p in parts):
            return  # an arm never seen yet: no frame until every arm has a pose (the grid catches up)
        if len(record.arms) < len(self.cfg.arms):
            self._note_stale_arms({a.arm for a in record.arms})
        self.on_cycle(
            record.now_monotonic_s,
            np.concatenate([p[0] for p in parts]),  # type: ignore[index]  # None ruled out above
            np.concatenate([p[1] for p in parts]),  # type: ignore[index]
            np.concatenate([p[2] for p in parts]),  # type: ignore[index]
            source,
            draw_virtual=False,
        )

    def _row_due(self, now_monotonic_s: float) -> bool:
        """A row is due this cycle: the episode's grid point, or between episodes the buffer's."""
        if self._phase == RECORDING:
            return now_monotonic_s >= self._next_grid_s
        return self._phase == IDLE and self._preroll.due(now_monotonic_s)

    def _note_stale_arms(self, present: set[str]) -> None:
        """Once per arm and episode: the tag says from which frame an arm's values repeated."""
        with self._lock:
            for name in self.cfg.arms:
                if name not in present and name not in self._arms_noted_stale and self._phase == RECORDING:
                    self._arms_noted_stale.add(name)
                    self._notes.append(
                        f"{name} arm: pose not current from frame {self._frame_index}: its newest values repeat"
                    )

    def on_cycle(
        self,
        now_monotonic_s: float,
        state_units: np.ndarray,
        action_units: np.ndarray,
        teleop_action_units: np.ndarray | None,
        source: str = "",
        draw_virtual: bool = True,
    ) -> None:
        """One control cycle's sample (``on_record`` passes the loop's; tests and benchmarks call
        it directly). Never blocks: at most a few vector copies and a deque append.
        ``draw_virtual``: the virtual cameras draw this state (one arm's)."""
        if self._virtual and draw_virtual:
            snapshot = np.array(state_units, dtype=np.float64)
            for cam in self._virtual:
                cam.set_state(snapshot)
        if self._phase != RECORDING or now_monotonic_s < self._next_grid_s:
            if self._phase == IDLE and self._preroll.due(now_monotonic_s):
                self._buffer_row(now_monotonic_s, state_units, action_units, teleop_action_units, source)
            return
        with self._lock:
            if self._phase != RECORDING:
                return
            if self._t0 is None:
                self._t0 = now_monotonic_s
                self._next_grid_s = now_monotonic_s
            state = np.array(state_units, dtype=np.float32)
            action = np.array(action_units, dtype=np.float32)
            teleop = np.array(
                teleop_action_units if teleop_action_units is not None else action_units, dtype=np.float32
            )
            frames = [self._admit(c, cam.latest_frame()) for c, cam in enumerate(self.cameras)]
            cont = self._cont
            if cont is not None and cont.session_t0 is None:
                cont.session_t0 = self._t0
            while self._next_grid_s <= now_monotonic_s:
                if cont is not None and self._frame_index >= cont.frames_per_episode and cont.next_number is not None:
                    # the cut: the grid point due now is the next episode's frame 0 (none lost, none twice)
                    self._rotate_locked(cont)
                k = self._frame_index
                self._q.append(
                    (KIND_FRAME, self._seq, k, k / self.cfg.fps, now_monotonic_s, state, action, teleop, frames, source)
                )
                self._frame_index += 1
                self._next_grid_s = self._t0 + self._frame_index / self.cfg.fps
        self._wake.set()

    def _buffer_row(
        self,
        now_monotonic_s: float,
        state_units: np.ndarray,
        action_units: np.ndarray,
        teleop_action_units: np.ndarray | None,
        source: str,
    ) -> None:
        """Between episodes: this cycle's row into the pre-roll buffer, as an episode would take it
        (three small copies and a reference to each camera's newest frame; no pixel is copied)."""
        with self._lock:
            if self._phase != IDLE or not self._preroll.due(now_monotonic_s):
                return
            teleop = teleop_action_units if teleop_action_units is not None else action_units
            self._preroll.feed(
                now_monotonic_s,
                np.array(state_units, dtype=np.float32),
                np.array(action_units, dtype=np.float32),
                np.array(teleop, dtype=np.float32),
                tuple(self._admit(c, cam.latest_frame()) for c, cam in enumerate(self.cameras)),
                source,
            )

    def _rotate_locked(self, cont: ContinuousSession) -> None:
        """Under the lock, on the loop's thread (no disk, no waiting): the episode recording now is
        saved exactly as ``episode save`` saves one (the same SAVE record: the writer stages it
        durably, then commits it), and the next one starts on the same grid, its number already
        kept on the disk (rec-rotate). Episode hooks are not run: the scene is not reset between
        the parts of one continuous recording (as LeRobot's sentry does not reset the robot)."""
        frames = self._frame_index
        seq = self._seq
        extras = self._save_extras_locked(cont.follower_kind, [], self._continuous_tag(cont, frames, cont.limit))
        self._q.append((KIND_SAVE, seq, -1, extras))
        self._pending[seq] = PendingSave(seq, self._number, self._task, frames)
        self._rotated_seqs.append(seq)
        self._counters["episodes_rotated"] += 1
        number = cont.next_number
        assert number is not None  # the caller checked
        cont.next_number = None
        cont.part += 1
        cont.rotated += 1
        cont.first_frame += frames
        assert cont.session_t0 is not None
        self._number = number
        self._seq += 1
        self._notes = []
        self._arms_noted_stale = set()
        self._episode_refused = {}
        self._frame_index = 0
        # the same grid: this episode's frame 0 is the session's frame first_frame
        self._t0 = cont.session_t0 + cont.first_frame / self.cfg.fps
        self._next_grid_s = self._t0
        self._episode_started_s = time.monotonic()
        self._q.append((KIND_START, self._seq, self._task, number))
        self._rotate_wake.set()

    def _continuous_tag(self, cont: ContinuousSession, frames: int, ended: str) -> dict[str, Any]:
        """What the episode's tag says of the continuous recording it is a part of: ``ended`` is
        "rotate_s"/"rotate_mb" (cut by that limit) or "stop" (the session's last, partial one)."""
        t0 = (cont.session_t0 or 0.0) + cont.first_frame / self.cfg.fps
        return {
            "session": cont.first_episode,
            "part": cont.part,
            "ended": ended,
            "rotated": ended != "stop",
            "first_frame": cont.first_frame,  # in the session: episode i+1 starts where i ended
            "frames": frames,
            "grid_t0_s": round(t0, 6),  # monotonic seconds of this episode's frame 0
            "rotate_s": cont.rotation.rotate_s,
            "rotate_mb": cont.rotation.rotate_mb,
        }

    def _save_extras_locked(self, kind: str, more_notes: list[str], continuous: dict[str, Any] | None) -> bytes:
        refused = [
            f"camera {n}: {k} frames refused ({self._refused_last.get(n, '')}), recorded as missing"
            for n, k in sorted(self._episode_refused.items())
            if k
        ]
        extras: dict[str, Any] = {"origin": self._origin, "follower_kind": str(kind)}
        if continuous is not None:
            extras["continuous"] = continuous
        if self._kept:
            extras["kept"] = self._kept
        extras["notes"] = refused + self._notes + more_notes
        return save_extras_bytes(extras)

    def _rotator(self) -> None:
        try:
            while self._running:
                self._rotate_wake.wait(0.2)
                self._rotate_wake.clear()
                self._reserve_next_number()
                self._report_rotated()
        except BaseException as exc:
            log.exception("recording thread rec-rotate failed")
            self._fail(f"recording thread rec-rotate failed: {type(exc).__name__}: {exc}")

    def _reserve_next_number(self) -> None:
        """Keeps the next part's number on the disk before the cut needs it (the cut waits for it:
        an episode grows a few frames longer rather than a number being handed out unkept)."""
        with self._reserve_lock:
            with self._lock:
                cont = self._cont
                if cont is None or cont.next_number is not None or self._phase != RECORDING:
                    return
                candidate = self._next_number
            try:
                reserve_episode_number(self.store_cfg.root_path, candidate)
            except OSError as exc:
                self._rl.error("reserve", "continuous recording: next episode number not kept (%s); retrying", exc)
                return
            with self._lock:
                if self._cont is cont and cont.next_number is None and self._next_number == candidate:
                    cont.next_number = candidate
                    self._next_number = candidate + 1
                    return
                given_back = self._next_number == candidate
            if given_back:  # the session ended meanwhile: the number is free again
                reserve_episode_number(self.store_cfg.root_path, candidate - 1)

    def _report_rotated(self) -> None:
        """Logs each cut episode once it is on the disk (staged), as ``episode save`` answers."""
        while self._rotated_seqs:
            seq = self._rotated_seqs[0]
            p = self._pending.get(seq)
            number = p.episode if p is not None else -1
            if not self._wait_staged(seq, self.cfg.save_durable_timeout_s):
                if seq in self._gone_seqs or self._phase == ERROR:
                    self._rotated_seqs.popleft()
                    continue
                log.warning("continuous recording: episode %d is not on the disk yet; still being written", number)
                return  # looked at again at the next wake-up
            self._rotated_seqs.popleft()
            log.info("continuous recording: episode %d rotated and on the disk", number)

    def _end_continuous_locked(self) -> ContinuousSession | None:
        """Under the lock: the session ends with the episode in progress; a number kept ahead for
        the next part is given back (the next episode takes it)."""
        cont, self._cont = self._cont, None
        if cont is not None and cont.next_number is not None and self._next_number == cont.next_number + 1:
            try:
                reserve_episode_number(self.store_cfg.root_path, cont.next_number - 1)
                self._next_number = cont.next_number
            except OSError as exc:
                log.warning("continuous recording: episode number %d stays used (%s)", cont.next_number, exc)
        return cont

    def _admit(self, c: int, frame: Any) -> Any:
        """The edge: a frame that does not fit the dataset feature (shape/dtype) is refused here,
        counted per camera and logged, and the row records that camera's image as missing; it
        never reaches the feeder thread. Under the lock, on the loop's thread: a tuple compare."""
        if frame is None:
            return None
        why = frame_refusal(self._expected_hw[c], frame.pixels)
        if not why and self._depth[c]:
            why = depth_refusal(self._expected_hw[c], frame.depth_mm)  # the pair or neither
        if not why:
            return frame
        name = self.cameras[c].name
        self._refused[name] = self._refused.get(name, 0) + 1
        self._episode_refused[name] = self._episode_refused.get(name, 0) + 1
        self._refused_last[name] = why
        self._counters["frames_refused"] += 1
        self._rl.error(f"refused-{name}", "camera %s: frame refused (%s); recorded as missing", name, why)
        return None

    # -- episode verbs -----------------------------------------------------------------------------
    def _checked_task_and_origin(self, task: str | None, origin: str | None) -> tuple[str, str]:
        """An episode's task (given, else the session's, else [recording] task) and origin, or RecordingError."""
        task = (task or self._task or self.cfg.default_task).strip()
        if not task:
            raise RecordingError("the task text must not be empty")
        if len(task.encode("utf-8")) > TASK_BYTES:
            raise RecordingError(f"task text longer than {TASK_BYTES} bytes")
        origin = (origin or self.cfg.origin).strip()
        if not origin or len(origin) > 32:
            raise RecordingError(f"origin must be a short word (teleop, policy...), got {origin!r}")
        return task, origin

    def start_episode(
        self, task: str | None = None, origin: str | None = None, rotation: Rotation | None = None
    ) -> dict[str, Any]:
        """Starts an episode. ``origin`` goes into its tag: "teleop" (default), "policy", ...

        ``rotation``: continuous recording (LeRobot's sentry strategy): the episode is saved and the
        next one started by the recorder itself each time a limit is reached, on the frame grid, so
        the frame after the last of one episode is the first of the next; ``episode save`` (or
        discard) ends the session with the partial episode in progress."""
        if rotation is not None:
            rotation.check()
        task, origin = self._checked_task_and_origin(task, origin)
        self._check_health()
        self._resume_after_disk_full()
        self._check_free_space()
        with self._lock:
            self._check_can_start()
            self._starting = True
        try:
            for hook in self._episode_hooks:  # e.g. the sim resets its scene (seconds at most)
                hook.episode_starting(self)
        except RecordingError:
            with self._lock:
                self._starting = False
            raise
        except Exception as exc:
            with self._lock:
                self._starting = False
            raise RecordingError(f"episode not started: {type(exc).__name__}: {exc}") from None
        with self._lock:
            self._starting = False
            self._check_can_start()
            number = self._next_number
            try:
                reserve_episode_number(self.store_cfg.root_path, number)  # synced before it is answered
            except OSError as exc:
                raise RecordingError(f"episode not started: its number could not be kept on the disk: {exc}") from None
            self._open_episode_locked(number, task, origin)
            self._frame_index = 0
            self._t0 = None
            self._next_grid_s = 0.0
            self._episode_started_s = time.monotonic()
            self._cont = None
            if rotation is not None:
                frames_per_episode, limit = rotation_frames(rotation, self.cfg.fps, self._expected_hw)
                kind = self.follower_kind_fn() if self.follower_kind_fn is not None else self.cfg.follower_kind
                self._cont = ContinuousSession(rotation, frames_per_episode, limit, number, str(kind))
            self._q.append((KIND_START, self._seq, task, number))
            self._phase = RECORDING
            self._preroll.episode_started()  # rows before the episode are not kept past its start
            self._kept = {}
        self._wake.set()
        reply: dict[str, Any] = {"episode": number, "task": task, "origin": origin}
        if self._cont is not None:
            self._rotate_wake.set()  # keep the next part's number on the disk now
            reply["continuous"] = self._cont.status()
            log.info(
                "episode %d started (%r), continuous: a new episode every %d frames (%s)",
                number,
                task,
                self._cont.frames_per_episode,
                self._cont.limit,
            )
        else:
            log.info("episode %d started (%r)", number, task)
        return reply

    def keep_episode(self, last_s: float, task: str | None = None, origin: str | None = None) -> dict[str, Any]:
        """``episode keep --last S``: the newest ``last_s`` seconds of the pre-roll buffer become
        the start of a new episode, which then records live until it is saved or discarded (the
        usual verbs). Its frame 0 is the first row kept (frame indices and timestamps rebased); the
        live rows go on on the buffer's grid, so the frame after the last kept row is the first
        live one: none lost, none twice. The kept rows reach the writer from the feeder thread,
        which waits for room in the pixel ring (the loop never waits); the live rows queue behind
        them, in order. RecordingError, nothing changed: the buffer is off, ``last_s`` is not in
        (0, ring_s], nothing is buffered yet, an episode is recording (or anything that refuses
        ``episode start``)."""
        task, origin = self._checked_task_and_origin(task, origin)
        self._check_health()
        with self._lock:
            self._check_keep_locked(last_s)
        self._resume_after_disk_full()
        self._check_free_space()
        blind = [type(h).__name__ for h in self._episode_hooks if not isinstance(h, KeptEpisodeHook)]
        if blind:
            raise RecordingError(
                f"episode keep: {', '.join(blind)} starts its episodes itself (a simulated follower resets its "
                "scene first), so an episode cannot begin in the past here; use episode start"
            )
        with self._lock:
            self._check_can_start()
            self._check_keep_locked(last_s)
            self._starting = True
            since_s = time.monotonic() - min(float(last_s), self._preroll.buffered_s)
        try:
            for hook in self._episode_hooks:
                assert isinstance(hook, KeptEpisodeHook)  # checked above
                hook.episode_kept(self, since_s)
            with self._reserve_lock:  # the number kept on the disk first: no disk write under the lock
                with self._lock:
                    number = self._next_number
                try:
                    reserve_episode_number(self.store_cfg.root_path, number)
                except OSError as exc:
                    raise RecordingError(f"episode not kept: its number could not be kept on the disk: {exc}") from None
                with self._lock:
                    self._starting = False
                    try:
                        self._check_can_start()
                        kept = self._preroll.take(last_s)
                    except (RecordingError, PrerollError):
                        if self._next_number == number:  # nothing else took a number: give it back
                            self._give_back_number(number)
                        raise
                    self._begin_kept_locked(kept, number, task, origin, float(last_s))
        except PrerollError as exc:
            raise RecordingError(f"episode keep: {exc}", exc.field) from None
        except RecordingError:
            raise
        except Exception as exc:
            raise RecordingError(f"episode not kept: {type(exc).__name__}: {exc}") from None
        finally:
            with self._lock:
                self._starting = False
        self._wake.set()
        log.info(
            "episode %d kept (%r): the last %.2f s (%d frames) before the verb, recording on live",
            number,
            task,
            kept.seconds,
            kept.frames,
        )
        return {
            "episode": number,
            "task": task,
            "origin": origin,
            "frames": kept.frames,
            "kept_frames": kept.frames,
            "kept_s": round(kept.seconds, 6),
        }

    def _check_keep_locked(self, last_s: float) -> None:
        """Under the lock: RecordingError unless the buffer can give ``last_s`` seconds now."""
        if self._phase == RECORDING:
            raise RecordingError(
                f"episode keep: episode {self.episode_number} already recording (the buffer is kept only "
                "between episodes); save or discard it first"
            )
        refused = self._preroll.refusal(last_s)
        if refused is not None:
            raise RecordingError(f"episode keep: {refused}", refused.field)

    def _cancel_kept_locked(self) -> None:
        """Under the lock, as the episode in progress is thrown away: its kept rows still waiting
        in the feeder are dropped there, not written (the writer would drop them anyway)."""
        if self._kept_seq == self._seq:
            self._kept_cancelled.add(self._seq)

    def _give_back_number(self, number: int) -> None:
        try:
            reserve_episode_number(self.store_cfg.root_path, number - 1)  # next = number
        except OSError as exc:
            log.warning("episode number %d stays used (%s)", number, exc)

    def _open_episode_locked(self, number: int, task: str, origin: str) -> None:
        """Under the lock: episode ``number`` is the one in progress (started or kept), nothing noted yet."""
        self._next_number = number + 1
        self._number = number
        self._seq += 1
        self._task = task
        self._origin = origin
        self._notes = []
        self._arms_noted_stale = set()
        self._episode_refused = {}

    def _begin_kept_locked(self, kept: KeptRows, number: int, task: str, origin: str, last_s: float) -> None:
        """Under the lock, with the rows just taken: the episode records from its first kept row
        on. O(1): the rows go to the feeder as one item, the live ones queue behind it."""
        self._open_episode_locked(number, task, origin)
        self._cont = None
        # the grid the rows were taken on: frame k at t0 + k / fps, the next live row is frame n
        self._t0 = kept.grid_t0_s
        self._frame_index = kept.frames
        self._next_grid_s = kept.next_grid_s
        self._episode_started_s = kept.grid_t0_s
        self._kept = {"frames": kept.frames, "last_s": last_s, "grid_t0_s": round(kept.grid_t0_s, 6)}
        self._kept_seq = self._seq
        self._kept_left = kept.frames  # the feeder counts them down
        self._q.append((KIND_START, self._seq, task, number))
        self._q.append((KIND_KEPT, self._seq, kept))
        self._phase = RECORDING

    def _free_mb(self) -> float | None:
        """Free space where episodes are staged and committed (one filesystem), in MB."""
        d = staging_dir(self.store_cfg.root_path)
        while not d.exists() and d != d.parent:
            d = d.parent
        try:
            return round(shutil.disk_usage(d).free / 1e6, 1)
        except OSError:
            return None

    def _check_free_space(self) -> None:
        """Refuse an episode that may not fit, before it starts (not a full disk mid-episode)."""
        free = self._free_mb()
        if free is not None and free < self.cfg.min_free_mb:
            raise RecordingError(
                f"not enough free disk space to record an episode: {free:.1f} MB free for "
                f"{self.store_cfg.root_path}, at least {self.cfg.min_free_mb:.0f} MB needed "
                "([recording] min_free_mb); free some space and start again"
            )

    def _disk_figures(self) -> str:
        """What a full disk message adds: the figures, as the start refusal gives them."""
        free = self._free_mb()
        shown = f"{free:.1f} MB" if free is not None else "unknown space"
        return (
            f"; {shown} free for {self.store_cfg.root_path}, at least {self.cfg.min_free_mb:.0f} MB needed "
            "([recording] min_free_mb); free some space and start again (no restart needed)"
        )

    def _resume_after_disk_full(self) -> None:
        """After a full disk stopped recording: once there is room again, the writer commits the
        staged episodes (in order, before any new one) and recording goes on; no restart."""
        if not (self._phase == ERROR and self._disk_full and self._running):
            return
        free = self._free_mb()
        if free is None or free < self.cfg.min_free_mb:
            raise RecordingError(f"recording stopped, the disk is full: {self._disk_error}{self._disk_figures()}")
        try:
            self._conn.send({"cmd": "resume"})
        except (OSError, BrokenPipeError) as exc:
            raise RecordingError(f"recording cannot resume: writer unreachable: {exc}") from None
        with self._lock:
            self._phase = IDLE
            self._preroll.episode_ended()  # between episodes again: the buffer fills anew
            self._error = ""
            self._disk_full = False
        log.info("recording resumes: %.1f MB free; staged episodes are committed first", free)

    def _check_can_start(self) -> None:
        """Under the lock: raises RecordingError when no episode can start now."""
        if self._starting:
            raise RecordingError("another episode is starting")
        if self._phase == STARTING:
            if self._waiting_for:
                raise RecordingError(f"recorder still starting: {self._waiting_for}")
            raise RecordingError("recorder still starting (writer process loading), try again in a moment")
        if self._phase == ERROR:
            raise RecordingError(f"recording stopped: {self._error} (restart the daemon to record again)")
        if self._phase == CLOSED:
            raise RecordingError("recorder is closed")
        if self._phase == RECORDING:
            raise RecordingError(f"episode {self.episode_number} already recording; save or discard it first")

    def _run_ending_hooks(self, saved: bool) -> tuple[bool | None, list[str]]:
        """Episode hooks at the end of an episode: their verdict (first one given) and notes."""
        verdict: bool | None = None
        notes: list[str] = []
        for hook in self._episode_hooks:
            try:
                v, n = hook.episode_ending(self, saved)
            except Exception as exc:
                log.error("episode hook failed at the end of the episode: %s", exc)
                notes.append(f"episode hook failed: {exc}")
                continue
            if verdict is None and v is not None:
                verdict = bool(v)
            notes.extend(n)
        return verdict, notes

    def save_episode(self, success: bool | None = None, notes: list[str] | None = None) -> dict[str, Any]:
        """Ends the episode; returns as soon as it is queued (encoding/commit go on in the writer).

        ``success`` None: the episode hooks' verdict (a sim's success signal) if any, else unjudged.
        ``notes`` are added to the episode's tag.
        Never answers for an episode that cannot be committed: with recording stopped (a thread or
        the writer died) it raises RecordingError naming why and what was lost."""
        self._check_health()
        with self._lock:
            self._check_can_end("saved")
        verdict, hook_notes = self._run_ending_hooks(saved=True)
        if success is None:
            success = verdict
        with self._lock:
            self._check_can_end("saved")
            frames = self._frame_index
            number = self.episode_number
            if frames == 0:
                self._end_continuous_locked()
                self._q.append((KIND_DISCARD, self._seq))
                self._phase = IDLE
                self._preroll.episode_ended()  # between episodes again: the buffer fills anew
                self._wake.set()
                raise RecordingError("the episode has no frames yet (is the control loop running?); discarded")
            kind = self.follower_kind_fn() if self.follower_kind_fn is not None else self.cfg.follower_kind
            cont = self._end_continuous_locked()
            continuous = self._continuous_tag(cont, frames, "stop") if cont is not None else None
            extras = self._save_extras_locked(str(kind), hook_notes + list(notes or []), continuous)
            seq = self._seq
            self._q.append((KIND_SAVE, seq, -1 if success is None else int(bool(success)), extras))
            self._pending[seq] = PendingSave(seq, number, self._task, frames)
            self._phase = IDLE
            self._preroll.episode_ended()  # between episodes again: the buffer fills anew
        self._wake.set()
        # Answer only once the save is in the writer's hands (the shared ring): an answer given
        # while the save still sat in this process's queue was a promise a SIGKILL could break.
        handed = self._wait_handed_over(seq, SAVE_HANDOVER_TIMEOUT_S)
        if not handed:
            self._check_health()  # the feeder or the writer died meanwhile: say so, not "queued"
            if self._phase == ERROR:
                raise RecordingError(
                    f"episode {number} not saved: recording stopped before the writer got it: {self._error}"
                )
            log.warning("recording: episode %d is queued but not yet handed to the writer", number)
        # "Saved" means on disk: answer once the writer has staged and synced the episode, which
        # a restart commits whatever happens next (a power cut included).
        durable = handed and self._wait_staged(seq, self.cfg.save_durable_timeout_s)
        if seq in self._gone_seqs:
            lost = next((x for x in reversed(self._lost) if x.startswith(f"episode {number} ")), "")
            raise RecordingError(f"episode {number} not saved: {lost or self._error}")
        if not durable:
            log.warning(
                "recording: episode %d answered before it is on disk (durable: false); still being written", number
            )
        return {
            "episode": number,
            "frames": frames,
            "success": success,
            "queued": True,
            "handed_to_writer": handed,
            "durable": durable,
        }

    def _wait_staged(self, seq: int, timeout_s: float) -> bool:
        def staged() -> bool:
            p = self._pending.get(seq)
            # committed already (no longer pending) counts too, unless the save was lost
            return (p.staged if p is not None else seq not in self._gone_seqs) or self._phase == ERROR

        with self._staged_cv:
            self._staged_cv.wait_for(staged, timeout_s)
        p = self._pending.get(seq)
        return p.staged if p is not None else seq not in self._gone_seqs

    def _wait_handed_over(self, seq: int, timeout_s: float) -> bool:
        with self._handed_over:
            return (
                self._handed_over.wait_for(lambda: self._handed_over_seq >= seq or self._phase == ERROR, timeout_s)
                and self._handed_over_seq >= seq
            )

    def _check_can_end(self, what: str) -> None:
        """Under the lock: raises RecordingError unless an episode is recording."""
        if self._phase == ERROR:
            lost = f"; lost: {self._lost[-1]}" if self._lost else ""
            raise RecordingError(f"nothing {what}: recording stopped: {self._error}{lost}")
        if self._phase != RECORDING:
            raise RecordingError("no episode is recording")

    def discard_episode(self) -> dict[str, Any]:
        self._check_health()
        with self._lock:
            self._check_can_end("discarded")
            self._end_continuous_locked()  # the session's earlier parts are saved already
            self._cancel_kept_locked()
            self._q.append((KIND_DISCARD, self._seq))
            frames = self._frame_index
            number = self._number
            if self._next_number == number + 1:
                # The operator threw this one away, so its number names nothing: the redo takes it,
                # as LeRobot's re-record keeps the episode index. A number lost to a crash is not given back.
                try:
                    reserve_episode_number(self.store_cfg.root_path, number - 1)  # next = number
                    self._next_number = number
                except OSError as exc:
                    log.warning("episode %d discarded; its number stays used (%s)", number, exc)
            self._phase = IDLE
            self._preroll.episode_ended()  # between episodes again: the buffer fills anew
            self._counters["episodes_discarded"] += 1
        self._wake.set()
        self._run_ending_hooks(saved=False)
        return {"episode": number, "discarded_frames": frames}

    @property
    def episode_number(self) -> int:
        """The operator's number of the episode recording now (or of the next one): handed out
        once, never reused. Not the dataset index: that one closes up when an episode is dropped."""
        return self._number if self._phase == RECORDING else self._next_number

    @property
    def phase(self) -> str:
        return self._phase

    def pending_saves(self) -> int:
        return len(self._pending)

    def wait_saved(self, timeout_s: float = 60.0) -> bool:
        """Waits until every queued save is committed (tests, `record` at the end)."""
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            self._check_health()
            if self._phase == ERROR:
                return False
            time.sleep(0.02)
        return not self._pending

    def status(self) -> dict[str, Any]:
        self._check_health()
        ring = self._ring
        recording = self._phase == RECORDING
        return {
            "phase": self._phase,
            "error": self._error,
            "dataset": str(self.store_cfg.root_path),
            "repo_id": self.cfg.repo_id,
            "fps": self.cfg.fps,
            "episode": self.episode_number,
            "task": self._task,
            "origin": self._origin if recording else None,
            "notes": list(self._notes) if recording else [],
            "elapsed_s": round(time.monotonic() - self._episode_started_s, 2) if recording else 0.0,
            "frames": self._frame_index if recording else 0,
            "continuous": self._cont.status() if recording and self._cont is not None else None,
            "preroll": self._preroll.status() if self._preroll.enabled else None,
            # the episode in progress was kept: how many rows before the verb, and how many of
            # them the feeder has still to hand to the writer
            "kept": dict(self._kept, flush_left=self._kept_left) if recording and self._kept else None,
            "episodes_in_dataset": self._committed_total,
            "saves_pending": len(self._pending),
            "lost_episodes": list(self._lost),
            "dropped_episodes": list(self._dropped),
            # answered "saved" with durable: false, not on the disk yet (the CLI shows "saving…")
            "saving": [p.episode for p in list(self._pending.values()) if not p.staged],
            "disk_free_mb": self._free_mb(),
            "min_free_mb": self.cfg.min_free_mb,
            "waiting_for": self._waiting_for,
            "frames_refused": {
                n: {"count": k, "last": self._refused_last.get(n, "")} for n, k in sorted(self._refused.items()) if k
            },
            "writer_alive": bool(self._proc is not None and self._proc.is_alive()),
            "writer_pid": self.writer_pid,
            "writer_backlog_frames": ring.pixel_backlog() if ring is not None else 0,
            "writer_backlog_records": ring.pending() if ring is not None else 0,
            "last_staged": self._last_staged,
            "last_saved": self._last_saved,
            # "episode 4 (dataset episode 3)": the operator's number and where it is in the dataset
            "last_committed": (
                episode_name(self._last_saved.get("episode"), self._last_saved.get("episode_index"))
                if self._last_saved
                else None
            ),
            "counters": dict(self._counters),
            "cameras": [c.stats() for c in self.cameras],
        }

    def register(self, server: Any) -> None:
        """Registers the episode verbs on the daemon's control socket."""
        server.register("episode.start", lambda req: self.start_episode(req.get("task"), req.get("origin")))
        server.register("episode.save", lambda req: self.save_episode(req.get("success")))
        server.register("episode.discard", lambda req: self.discard_episode())
        server.register("episode.keep", lambda req: self.keep_episode(req.get("last_s"), req.get("task")))
        server.register("episode.status", lambda req: self.status())

    # -- threads -----------------------------------------------------------------------------------
    def _fail(self, message: str) -> None:
        """Health invariant: the recorder goes to "error" at once; the episode in progress is lost
        (named); later verbs are refused with ``message``. The control loop is not touched."""
        with self._lock:
            if self._phase == ERROR:
                return  # the first cause is the one to report
            lost = ""
            if self._phase == RECORDING:
                self._cancel_kept_locked()
                self._q.append((KIND_DISCARD, self._seq))
                lost = f"episode {self.episode_number} ({self._task!r}, {self._frame_index} frames, in progress)"
                self._lost.append(f"{lost}: recording stopped")
            if self._phase != CLOSED:
                self._phase = ERROR
            self._cont = None
            self._error = message
        with self._handed_over:  # a save waiting for its hand-over hears of the failure at once
            self._handed_over.notify_all()
        with self._staged_cv:
            self._staged_cv.notify_all()
        log.error("recording stopped: %s%s (teleoperation continues)", message, f"; LOST {lost}" if lost else "")

    def _check_health(self) -> None:
        """Every recorder thread and the writer process must be alive while the recorder is open;
        the first one found dead puts the recorder in "error" (its own handler usually did already,
        with the exception; this catches a death that left no word, e.g. SIGKILL)."""
        if not self._running or self._closing.is_set() or self._phase in (ERROR, CLOSED):
            return
        for t in self._threads:
            if t.name != "rec-open" and not t.is_alive():
                self._fail(f"recording thread {t.name} stopped")
                return
        proc = self._proc
        if proc is not None and not proc.is_alive():
            self._fail(_writer_exit_text(proc.exitcode))
            self._ready.set()

    def _feeder(self) -> None:
        try:
            self._feed()
        except BaseException as exc:
            log.exception("recording thread rec-feeder failed")
            self._fail(f"recording thread rec-feeder failed: {type(exc).__name__}: {exc}")

    def _feed(self) -> None:
        ring = self._ring
        assert ring is not None
        while self._running:
            self._wake.wait(0.1)
            self._wake.clear()
            while self._q:
                item = self._q.popleft()
                if item[0] == KIND_KEPT:
                    self._feed_kept(ring, item[1], item[2])
                    continue
                if item[0] == KIND_FRAME and item[1] == self._catch_up_seq:
                    self._wait_for_room(ring, item[1], len(self._q))
                self._publish(ring, item)

    def _publish(self, ring: Ring, item: tuple) -> None:
        """One queue item into the record ring (a frame's pixels into the pixel ring, if room)."""
        if ring.records_free() <= 0:
            self._counters["records_lost"] += 1
            self._rl.error("records", "recording: writer %d records behind, record ring full: row LOST", ring.pending())
            return
        rec = ring.next_record()
        kind = item[0]
        rec["kind"] = kind
        rec["episode_seq"] = item[1]
        if kind == KIND_FRAME:
            self._fill_frame(ring, rec, item)
        elif kind == KIND_START:
            rec["task"] = item[2].encode("utf-8")
            rec["frame_index"] = item[3]  # the episode's number, as the operator was told
        elif kind == KIND_SAVE:
            rec["success"] = item[2]
            rec["task"] = item[3] if len(item) > 3 else b""
        if (self._fault == "feeder_raise" and kind == KIND_FRAME and item[2] == 10) or (
            self._fault == "feeder_raise_at_save" and kind == KIND_SAVE
        ):
            raise RuntimeError(f"injected fault (RecorderConfig.fault = {self._fault!r})")
        ring.publish_record()
        if kind == KIND_SAVE:
            with self._handed_over:
                self._handed_over_seq = item[1]
                self._handed_over.notify_all()

    def _feed_kept(self, ring: Ring, seq: int, kept: KeptRows) -> None:
        """The rows ``episode keep`` took, as the episode's frames 0..n-1, each waiting for room in
        the pixel ring (seconds of them at once would overrun its ~2 s). Rows of an episode
        discarded meanwhile are dropped unsent; the live rows queued behind wait their turn and
        then for room the same way (``_catch_up_seq``: the whole episode, bounded as below)."""
        fps = self.cfg.fps
        k = 0
        self._catch_up_seq = seq
        try:
            while (row := kept.pop_kept()) is not None:
                self._kept_left = kept.remaining() + 1
                if seq in self._kept_cancelled or not self._running:
                    continue  # discarded (or closing): nothing of it is written
                self._wait_for_room(ring, seq, kept.remaining() + len(self._q))
                item = (KIND_FRAME, seq, k, k / fps, row.now_monotonic_s, row.state, row.action, row.teleop)
                self._publish(ring, (*item, row.frames, row.source))
                k += 1
                # hand the interpreter to the loop between rows: back-to-back rows would hold it
                # until the switch interval forces it away, and the loop's cycle would wait that long
                time.sleep(0)
        finally:
            self._kept_left = 0
            self._kept_cancelled.discard(seq)

    def _wait_for_room(self, ring: Ring, seq: int, behind: int) -> None:
        """On the feeder thread only: until the rings have room for one more frame of episode
        ``seq``. Gives up (the frame goes as the writer-behind path sends it: counted missing)
        once the rows queued behind exceed the pre-roll's bound (a writer slower than real time
        must not grow this process's memory past it), the episode is discarded, or the writer
        or the recorder stops."""
        limit = max(self._preroll.max_frames, 1)
        while not (ring.records_free() > 0 and (not self.cameras or ring.pixel_slot_free())):
            if behind > limit or seq in self._kept_cancelled or not self._running or self._phase == ERROR:
                return
            proc = self._proc
            if proc is not None and not proc.is_alive():
                return
            time.sleep(_ROOM_POLL_S)
            behind = self._kept_left + len(self._q)

    def _fill_frame(self, ring: Ring, rec: np.ndarray, item: tuple) -> None:
        _, _, k, grid, now, state, action, teleop, frames, source = item
        rec["source"] = source.encode("ascii", "replace")[:SOURCE_BYTES]
        rec["frame_index"] = k
        rec["grid_s"] = grid
        rec["taken_s"] = time.monotonic()
        rec["state_s"] = now
        rec["state"] = state
        rec["action"] = action
        rec["teleop"] = teleop
        cap = np.full(4, np.nan)
        seqs = np.full(4, -1, dtype=np.int64)
        slot = -1
        if self.cameras:
            if ring.pixel_slot_free():
                slot = ring.claim_pixel_slot()
                for c, (_cam, fr) in enumerate(zip(self.cameras, frames)):
                    if fr is None or frame_refusal(self._expected_hw[c], fr.pixels):
                        continue  # refused at the edge already (on_cycle); never copied
                    np.copyto(ring.image_view(slot, c), fr.pixels)
                    if self._depth[c] and fr.depth_mm is not None:  # admitted with its depth (_admit)
                        np.copyto(ring.depth_view(slot, c), fr.depth_mm)
                    cap[c] = fr.capture_monotonic_s
                    seqs[c] = fr.seq
                ring.publish_pixel_slot()
            else:
                self._counters["frames_without_pixels"] += 1
                self._rl.error(
                    "pixels",
                    "recording: writer behind (%d frames queued), image ring full: "
                    "frame %d repeats the previous image and is counted missing",
                    ring.pixel_backlog(),
                    k,
                )
                for c, fr in enumerate(frames):
                    if fr is not None:
                        seqs[c] = fr.seq
        rec["pixel_slot"] = slot
        rec["cam_capture_s"] = cap
        rec["cam_seq"] = seqs
        self._counters["frames_taken"] += 1

    def _events(self) -> None:
        try:
            self._read_events()
        except BaseException as exc:
            log.exception("recording thread rec-events failed")
            self._fail(f"recording thread rec-events failed: {type(exc).__name__}: {exc}")
            self._ready.set()

    def _read_events(self) -> None:
        conn = self._conn
        while self._running or (self._proc is not None and self._proc.is_alive()):
            try:
                if not conn.poll(0.2):
                    if self._proc is not None and not self._proc.is_alive():
                        if self._phase != CLOSED:
                            self._fail(_writer_exit_text(self._proc.exitcode))
                        self._ready.set()
                        return
                    continue
                msg = conn.recv()
            except (EOFError, OSError):
                if self._phase != CLOSED:
                    proc = self._proc
                    if proc is not None:
                        proc.join(_WRITER_EXIT_WAIT_S)  # the pipe closed: name how it ended
                    dead = proc is not None and not proc.is_alive()
                    self._fail(_writer_exit_text(proc.exitcode) if dead else "writer process connection lost")
                self._ready.set()
                return
            self._handle_event(msg)
            for fn in self._listeners:
                try:
                    fn(msg)
                except Exception:
                    log.exception("recording listener failed")

    def _handle_event(self, msg: dict[str, Any]) -> None:
        ev = msg.get("event")
        if ev == "ready":
            self._committed_total = int(msg.get("total_episodes", 0))
            numbers = list(msg.get("recovered_numbers", []))
            with self._lock:
                self._next_number = max(self._next_number, int(msg.get("next_episode_number", self._committed_total)))
                for i in range(int(msg.get("recovered", 0))):  # staged before a crash, committed first
                    number = numbers[i] if i < len(numbers) and numbers[i] is not None else -1
                    self._pending[-(i + 1)] = PendingSave(-(i + 1), number, "(recovered from staging)", 0, staged=True)
            for note in msg.get("repair", []):
                log.warning("dataset repair: %s", note)
            for d in msg.get("dropped", []):
                self._note_dropped(DroppedEpisode(**d), "at restart")
            with self._lock:
                if self._phase == STARTING:
                    self._phase = IDLE
            self._ready.set()
            log.info("recording to %s (%d episodes already)", self.store_cfg.root_path, self._committed_total)
        elif ev == "fatal":
            self._fail(msg.get("error", "writer failed"))
            self._ready.set()
        elif ev == "staged":
            self._last_staged = {k: msg.get(k) for k in ("episode_seq", "frames", "tag")}
            with self._lock:
                p = self._pending.get(int(msg.get("episode_seq", -(10**9))))
                if p is not None:
                    p.staged = True
            with self._staged_cv:
                self._staged_cv.notify_all()
            tag = msg.get("tag", {})
            if tag.get("missing_frames") or tag.get("late_frames"):
                log.warning(
                    "episode %s: %d frames, %d late, %d missing, worst camera skew %.1f ms",
                    p.episode if p is not None else "?",
                    tag.get("frames", 0),
                    tag.get("late_frames", 0),
                    tag.get("missing_frames", 0),
                    tag.get("worst_camera_skew_ms", 0.0),
                )
        elif ev == "saved":
            self._committed_total = int(msg["episode_index"]) + 1
            self._take_pending(msg.get("episode_seq"))
            self._counters["episodes_saved"] += 1
            self._last_saved = {k: msg.get(k) for k in ("episode", "episode_index", "frames", "commit_s")}
            log.info(
                "%s committed (%d frames, commit %.2f s)",
                episode_name(msg.get("episode"), int(msg["episode_index"])),
                msg["frames"],
                msg["commit_s"],
            )
        elif ev == "dropped":
            self._take_pending(msg.get("episode_seq"))
            seq = msg.get("episode_seq")
            if seq is not None:
                self._gone_seqs.add(int(seq))
            self._note_dropped(DroppedEpisode(**msg["dropped"]), "")
        elif ev == "discarded":
            if msg.get("reason") in ("no frames", "lost"):  # a save whose frames never reached the writer
                p = self._take_pending(msg.get("episode_seq"))
                if p is not None:
                    self._note_lost(p, f"its frames never reached the writer ({msg.get('reason')})")
        elif ev == "error":
            if msg.get("save_lost"):
                p = self._take_pending(msg.get("episode_seq"))
                if p is not None:
                    self._note_lost(p, str(msg.get("error", "writer error")))
            # msg["staged"]: the commit failed, the episode stays staged (committed at the next start)
            if msg.get("fatal"):
                error = str(msg.get("error", "writer error"))
                if msg.get("disk_full"):
                    self._disk_full = True
                    self._disk_error = error
                    error += self._disk_figures()
                self._fail(error)
            else:
                log.error("recording: %s", msg.get("error"))
                self._error = msg.get("error", "")

    def _take_pending(self, seq: Any) -> PendingSave | None:
        """Removes a pending save by seq; None (a recovered episode) takes the oldest recovered one."""
        with self._lock:
            if seq is None:
                seq = next((k for k in self._pending if k < 0), None)
            return self._pending.pop(int(seq), None) if seq is not None else None

    def _note_dropped(self, d: DroppedEpisode, when: str) -> None:
        text = f"{d.describe()}" + (f" (found {when})" if when else "")
        if d.episode is not None:
            text += f"; episode number {d.episode} is not given to another episode"
        with self._lock:
            self._dropped.append(text)
        log.error("episode DROPPED, not in the dataset: %s", text)

    def _note_lost(self, p: PendingSave, why: str) -> None:
        text = f"{p.describe()}: {why}"
        with self._lock:
            self._lost.append(text)
            self._gone_seqs.add(p.seq)
        with self._staged_cv:
            self._staged_cv.notify_all()
        log.error("episode LOST: %s", text)


def episode_name(number: int | None, dataset_index: int | None) -> str:
    """ "episode 4 (dataset episode 3)" where the operator's number and the dataset index differ."""
    if number is None:
        return f"dataset episode {dataset_index}"
    if dataset_index is None or dataset_index == number:
        return f"episode {number}"
    return f"episode {number} (dataset episode {dataset_index})"


def _writer_exit_text(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        import signal

        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"writer process died ({name})"
    return f"writer process exited (code {exitcode})"
