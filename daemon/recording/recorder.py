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
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from daemon.dataset_schema import DEFAULT_FPS
from daemon.logs import RateLimitedLogger
from daemon.recording.cameras import Camera, VirtualArmCamera
from daemon.recording.ring import KIND_DISCARD, KIND_FRAME, KIND_SAVE, KIND_START, TASK_BYTES, Ring
from daemon.recording.store import DatasetMismatchError, StoreConfig, config_differences
from daemon.recording.writer import store_config_dict, writer_main

log = logging.getLogger("so101d.recording")

IDLE, RECORDING, ERROR, STARTING, CLOSED = "idle", "recording", "error", "starting", "closed"


class RecordingError(RuntimeError):
    """A verb that cannot be done now (clear message for the CLI/socket)."""


SHUTDOWN_CHOICES = ("save", "discard")
_MAX_NOTE_CHARS = 200


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
    vcodec: str = "h264"
    preset: str = "ultrafast"
    crf: int = 23
    fault: str = ""  # test hook, see StoreConfig.fault
    extra: dict[str, Any] = field(default_factory=dict)


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
        self.store_cfg = StoreConfig(root=cfg.root, repo_id=cfg.repo_id, fps=cfg.fps,
                                     cameras=[(c.name, c.height, c.width) for c in self.cameras],
                                     vcodec=cfg.vcodec, preset=cfg.preset, crf=cfg.crf, fault=cfg.fault)
        self._lock = threading.Lock()
        self._q: collections.deque[tuple] = collections.deque()
        self._wake = threading.Event()
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
        self._saves_in_flight = 0
        self._last_saved: dict[str, Any] = {}
        self._last_staged: dict[str, Any] = {}
        self._counters = {"frames_taken": 0, "frames_without_pixels": 0, "records_lost": 0,
                          "episodes_saved": 0, "episodes_discarded": 0}
        self._rl = RateLimitedLogger(log, period_s=5.0, burst=2)
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        # Episode hooks (a simulated follower's reset/start/stop, staleness notes): objects with
        # ``episode_starting(recorder)`` (may raise RecordingError: the episode does not start) and
        # ``episode_ending(recorder, saved) -> (success | None, notes)``.
        self._episode_hooks: list[Any] = []
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

    # -- life cycle ------------------------------------------------------------------------------
    def open(self) -> None:
        """Checks the dataset, starts cameras, ring, feeder and writer. Returns at once; see wait_ready."""
        diffs = config_differences(self.store_cfg)
        if diffs:
            raise DatasetMismatchError(
                f"dataset {self.store_cfg.root_path} was recorded with another configuration: " + "; ".join(diffs))
        slots = max(2, int(round(self.cfg.pixel_ring_s * self.cfg.fps))) if self.cameras else 0
        self._ring = Ring.create([(c.name, c.height, c.width) for c in self.cameras], self.cfg.n_records, slots)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        spec = self._ring.spec
        import os

        self._proc = ctx.Process(
            target=writer_main, name="so101d-writer",
            args=(store_config_dict(self.store_cfg),
                  {"records_name": spec.records_name, "pixels_name": spec.pixels_name,
                   "counters_name": spec.counters_name, "n_records": spec.n_records,
                   "n_pixel_slots": spec.n_pixel_slots, "cameras": [list(c) for c in spec.cameras]},
                  child, os.getpid(), self.cfg.follower_kind, self.cfg.origin))
        self._proc.start()
        child.close()
        for cam in self.cameras:
            cam.start()
        self._running = True
        self._phase = STARTING
        for target, name in ((self._feeder, "rec-feeder"), (self._events, "rec-events")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        if not self._ready.wait(timeout_s):
            raise RecordingError(f"writer process not ready after {timeout_s:.0f} s")
        if self._phase == ERROR:
            raise RecordingError(self._error)

    def close(self, timeout_s: float = 120.0, on_episode: str = "discard") -> None:
        """Stops recording, lets the writer commit every saved episode, stops it.

        ``on_episode``: what happens to the episode in progress: "discard", or "save" (tagged
        "saved at shutdown", success unjudged unless an episode hook says otherwise)."""
        if on_episode not in SHUTDOWN_CHOICES:
            raise ValueError(f"on_episode must be one of {SHUTDOWN_CHOICES}, got {on_episode!r}")
        if self._phase == CLOSED:
            return
        if self._phase == RECORDING and on_episode == "save":
            try:
                r = self.save_episode(None, notes=["saved at shutdown (daemon stopping)"])
                log.warning("shutdown: episode %d in progress saved (%d frames)", r["episode"], r["frames"])
            except RecordingError as exc:
                log.warning("shutdown: episode in progress not saved: %s", exc)
        with self._lock:
            if self._phase == RECORDING:
                self._q.append((KIND_DISCARD, self._seq))
                log.warning("shutdown: episode %d in progress discarded ([recording] on_shutdown)",
                            self.episode_number)
                discarding = True
            else:
                discarding = False
            self._phase = CLOSED
        if discarding:
            self._run_ending_hooks(saved=False)
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        while self._q and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send({"cmd": "stop"})
            except (OSError, BrokenPipeError):
                pass
            self._proc.join(max(0.1, deadline - time.monotonic()))
            if self._proc.is_alive():
                log.error("writer process did not finish within %.0f s; terminating it", timeout_s)
                self._proc.terminate()
                self._proc.join(5)
        self._running = False
        self._wake.set()
        for t in self._threads:
            t.join(timeout=2)
        for cam in self.cameras:
            cam.stop()
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    def add_episode_hook(self, hook: Any) -> None:
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
    def on_cycle(self, now_monotonic_s: float, state_units: Any, action_units: Any,
                 teleop_action_units: Any) -> None:
        """Every control cycle. Never blocks: at most a few vector copies and a deque append."""
        if self._virtual:
            snapshot = np.array(state_units, dtype=np.float64)
            for cam in self._virtual:
                cam.set_state(snapshot)
        if self._phase != RECORDING or now_monotonic_s < self._next_grid_s:
            return
        with self._lock:
            if self._phase != RECORDING:
                return
            if self._t0 is None:
                self._t0 = now_monotonic_s
                self._next_grid_s = now_monotonic_s
            state = np.array(state_units, dtype=np.float32)
            action = np.array(action_units, dtype=np.float32)
            teleop = np.array(teleop_action_units if teleop_action_units is not None else action_units,
                              dtype=np.float32)
            frames = [cam.latest_frame() for cam in self.cameras]
            while self._next_grid_s <= now_monotonic_s:
                k = self._frame_index
                self._q.append((KIND_FRAME, self._seq, k, k / self.cfg.fps, now_monotonic_s,
                                state, action, teleop, frames))
                self._frame_index += 1
                self._next_grid_s = self._t0 + self._frame_index / self.cfg.fps
        self._wake.set()

    # -- episode verbs -----------------------------------------------------------------------------
    def start_episode(self, task: str | None = None, origin: str | None = None) -> dict[str, Any]:
        """Starts an episode. ``origin`` goes into its tag: "teleop" (default), "policy", ..."""
        task = (task or self._task or self.cfg.default_task).strip()
        if not task:
            raise RecordingError("the task text must not be empty")
        if len(task.encode("utf-8")) > TASK_BYTES:
            raise RecordingError(f"task text longer than {TASK_BYTES} bytes")
        origin = (origin or self.cfg.origin).strip()
        if not origin or len(origin) > 32:
            raise RecordingError(f"origin must be a short word (teleop, policy...), got {origin!r}")
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
        except Exception as exc:  # noqa: BLE001 - a hook's failure is this verb's error, named
            with self._lock:
                self._starting = False
            raise RecordingError(f"episode not started: {type(exc).__name__}: {exc}") from None
        with self._lock:
            self._starting = False
            self._check_can_start()
            self._seq += 1
            self._task = task
            self._origin = origin
            self._notes = []
            self._frame_index = 0
            self._t0 = None
            self._next_grid_s = 0.0
            self._episode_started_s = time.monotonic()
            self._q.append((KIND_START, self._seq, task))
            self._phase = RECORDING
        self._wake.set()
        return {"episode": self.episode_number, "task": task, "origin": origin}

    def _check_can_start(self) -> None:
        """Under the lock: raises RecordingError when no episode can start now."""
        if self._starting:
            raise RecordingError("another episode is starting")
        if self._phase == STARTING:
            raise RecordingError("recorder still starting (writer process loading), try again in a moment")
        if self._phase == ERROR:
            raise RecordingError(f"recording stopped: {self._error}")
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
            except Exception as exc:  # noqa: BLE001 - ending must always work
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
        ``notes`` are added to the episode's tag."""
        with self._lock:
            if self._phase != RECORDING:
                raise RecordingError("no episode is recording")
        verdict, hook_notes = self._run_ending_hooks(saved=True)
        if success is None:
            success = verdict
        with self._lock:
            if self._phase != RECORDING:
                raise RecordingError("no episode is recording")
            frames = self._frame_index
            number = self.episode_number
            if frames == 0:
                self._q.append((KIND_DISCARD, self._seq))
                self._phase = IDLE
                self._wake.set()
                raise RecordingError("the episode has no frames yet (is the control loop running?); discarded")
            kind = self.follower_kind_fn() if self.follower_kind_fn is not None else self.cfg.follower_kind
            extras = save_extras_bytes({"origin": self._origin, "follower_kind": str(kind),
                                        "notes": self._notes + hook_notes + list(notes or [])})
            self._q.append((KIND_SAVE, self._seq, -1 if success is None else int(bool(success)), extras))
            self._saves_in_flight += 1
            self._phase = IDLE
        self._wake.set()
        return {"episode": number, "frames": frames, "success": success, "queued": True}

    def discard_episode(self) -> dict[str, Any]:
        with self._lock:
            if self._phase != RECORDING:
                raise RecordingError("no episode is recording")
            self._q.append((KIND_DISCARD, self._seq))
            frames = self._frame_index
            self._phase = IDLE
            self._counters["episodes_discarded"] += 1
        self._wake.set()
        self._run_ending_hooks(saved=False)
        return {"episode": self.episode_number, "discarded_frames": frames}

    @property
    def episode_number(self) -> int:
        """Dataset index of the episode recording now (or of the next one)."""
        return self._committed_total + self._saves_in_flight

    @property
    def phase(self) -> str:
        return self._phase

    def pending_saves(self) -> int:
        return self._saves_in_flight

    def wait_saved(self, timeout_s: float = 60.0) -> bool:
        """Waits until every queued save is committed (tests, `record` at the end)."""
        deadline = time.monotonic() + timeout_s
        while self._saves_in_flight > 0 and time.monotonic() < deadline:
            if self._phase == ERROR or (self._proc is not None and not self._proc.is_alive()):
                return False
            time.sleep(0.02)
        return self._saves_in_flight == 0

    def status(self) -> dict[str, Any]:
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
            "episodes_in_dataset": self._committed_total,
            "saves_pending": self._saves_in_flight,
            "writer_alive": bool(self._proc is not None and self._proc.is_alive()),
            "writer_backlog_frames": ring.pixel_backlog() if ring is not None else 0,
            "writer_backlog_records": ring.pending() if ring is not None else 0,
            "last_staged": self._last_staged,
            "last_saved": self._last_saved,
            "counters": dict(self._counters),
            "cameras": [c.stats() for c in self.cameras],
        }

    def register(self, server: Any) -> None:
        """Registers the episode verbs on the daemon's control socket."""
        server.register("episode.start", lambda req: self.start_episode(req.get("task"), req.get("origin")))
        server.register("episode.save", lambda req: self.save_episode(req.get("success")))
        server.register("episode.discard", lambda req: self.discard_episode())
        server.register("episode.status", lambda req: self.status())

    # -- threads -----------------------------------------------------------------------------------
    def _fail(self, message: str) -> None:
        with self._lock:
            if self._phase == RECORDING:
                self._q.append((KIND_DISCARD, self._seq))
            if self._phase != CLOSED:
                self._phase = ERROR
            self._error = message
        log.error("recording stopped: %s (teleoperation continues)", message)

    def _feeder(self) -> None:
        ring = self._ring
        assert ring is not None
        while self._running:
            self._wake.wait(0.1)
            self._wake.clear()
            while self._q:
                item = self._q.popleft()
                if ring.records_free() <= 0:
                    self._counters["records_lost"] += 1
                    self._rl.error("records", "recording: writer %d records behind, record ring full: row LOST",
                                   ring.pending())
                    continue
                rec = ring.next_record()
                kind = item[0]
                rec["kind"] = kind
                rec["episode_seq"] = item[1]
                if kind == KIND_FRAME:
                    self._fill_frame(ring, rec, item)
                elif kind == KIND_START:
                    rec["task"] = item[2].encode("utf-8")
                elif kind == KIND_SAVE:
                    rec["success"] = item[2]
                    rec["task"] = item[3] if len(item) > 3 else b""
                ring.publish_record()

    def _fill_frame(self, ring: Ring, rec: np.ndarray, item: tuple) -> None:
        _, _, k, grid, now, state, action, teleop, frames = item
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
                for c, (cam, fr) in enumerate(zip(self.cameras, frames)):
                    if fr is None:
                        continue
                    if fr.pixels.shape != (cam.height, cam.width, 3):
                        self._rl.error(f"shape-{cam.name}", "camera %s delivered %s, expected %s",
                                       cam.name, fr.pixels.shape, (cam.height, cam.width, 3))
                        continue
                    np.copyto(ring.image_view(slot, c), fr.pixels)
                    cap[c] = fr.capture_monotonic_s
                    seqs[c] = fr.seq
                ring.publish_pixel_slot()
            else:
                self._counters["frames_without_pixels"] += 1
                self._rl.error("pixels", "recording: writer behind (%d frames queued), image ring full: "
                               "frame %d repeats the previous image and is counted missing", ring.pixel_backlog(), k)
                for c, fr in enumerate(frames):
                    if fr is not None:
                        seqs[c] = fr.seq
        rec["pixel_slot"] = slot
        rec["cam_capture_s"] = cap
        rec["cam_seq"] = seqs
        self._counters["frames_taken"] += 1

    def _events(self) -> None:
        conn = self._conn
        while self._running or (self._proc is not None and self._proc.is_alive()):
            try:
                if not conn.poll(0.2):
                    if self._proc is not None and not self._proc.is_alive() and self._phase not in (CLOSED,):
                        if not self._ready.is_set() or self._phase != ERROR:
                            self._fail(f"writer process exited (code {self._proc.exitcode})")
                            self._ready.set()
                        return
                    continue
                msg = conn.recv()
            except (EOFError, OSError):
                if self._phase != CLOSED:
                    self._fail("writer process connection lost")
                self._ready.set()
                return
            self._handle_event(msg)
            for fn in self._listeners:
                try:
                    fn(msg)
                except Exception:  # noqa: BLE001
                    log.exception("recording listener failed")

    def _handle_event(self, msg: dict[str, Any]) -> None:
        ev = msg.get("event")
        if ev == "ready":
            self._committed_total = int(msg.get("total_episodes", 0))
            self._saves_in_flight += int(msg.get("recovered", 0))
            for note in msg.get("repair", []):
                log.warning("dataset repair: %s", note)
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
            tag = msg.get("tag", {})
            if tag.get("missing_frames") or tag.get("late_frames"):
                log.warning("episode %s: %d frames, %d late, %d missing, worst camera skew %.1f ms",
                            msg.get("episode_seq"), tag.get("frames", 0), tag.get("late_frames", 0),
                            tag.get("missing_frames", 0), tag.get("worst_camera_skew_ms", 0.0))
        elif ev == "saved":
            self._committed_total = int(msg["episode_index"]) + 1
            self._saves_in_flight = max(0, self._saves_in_flight - 1)
            self._counters["episodes_saved"] += 1
            self._last_saved = {k: msg.get(k) for k in ("episode_index", "frames", "commit_s")}
            log.info("episode %d saved (%d frames, commit %.2f s)", msg["episode_index"], msg["frames"],
                     msg["commit_s"])
        elif ev == "discarded":
            if msg.get("reason") in ("no frames", "lost"):
                self._saves_in_flight = max(0, self._saves_in_flight - 1)
        elif ev == "error":
            if msg.get("save_lost") or msg.get("staged"):
                self._saves_in_flight = max(0, self._saves_in_flight - 1)
            if msg.get("fatal"):
                self._fail(msg.get("error", "writer error"))
            else:
                log.error("recording: %s", msg.get("error"))
                self._error = msg.get("error", "")
