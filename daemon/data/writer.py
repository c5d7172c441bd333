"""The writer process: drains the shared-memory rings, encodes, stages and commits episodes.

Runs in its own (spawned) process so encoding and parquet writing never touch the control loop's
interpreter. Three activities:

- the **drain** (main thread) reads records in order; frames go to one encoder thread per camera
  (PyAV libx264, GIL released while encoding) through a small bounded queue. When the encoders
  fall behind, the drain blocks, the pixel ring fills up and the recorder starts sending frames
  without pixels (counted as missing, loudly) instead of growing memory;
- at SAVE the encoders are flushed (they are nearly caught up: encoding streams during capture)
  and the episode is **staged** durably, then queued for commit; the drain goes straight on with
  the next episode;
- the **commit** thread moves staged episodes into the LeRobot dataset (store.DatasetStore).

Events to the parent are plain dicts on a Pipe. If the parent dies, the writer drains what is in
the ring, stages and commits every episode that was saved, drops the one in progress, and exits.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import threading
import time
import uuid
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from daemon.data.interventions import intervention_runs
from daemon.data.ring import KIND_DISCARD, KIND_FRAME, KIND_SAVE, KIND_START, Ring, RingSpec
from daemon.data.schema import depth_key
from daemon.data.store import (
    SAVING_FILE,
    STAGED_FILE,
    START_FILE,
    DatasetMismatchError,
    DatasetStore,
    StoreConfig,
    disk_at_fault,
    fsync_dir,
    set_aside,
    sync_file_data,
    write_json_atomic,
)

if TYPE_CHECKING:
    from lerobot.configs.video import VideoEncoderConfig

log = logging.getLogger("so101d.recording.writer")

ENCODER_QUEUE_FRAMES = 6
# How often an encoder pushes its MP4's written bytes to the disk while recording: at save only
# the last second is left to sync, so the durable save stays tens of milliseconds.
VIDEO_SYNC_EVERY_S = 1.0
WRITER_NICE = 5  # below the loop, but not starved on a busy machine (nice 10 ~ 1/10 of a share)


def stats_sampled(frame_index: int) -> bool:
    """Frames that feed the image statistics: the first two, then every 6th.

    LeRobot's running quantile stats cost ~8 ms per 640x480 frame here (more than encoding:
    ~2 ms); LeRobot itself samples frames for image stats in its default path (about n**0.75 of
    them), about every 6th frame for a one-minute episode at 30 fps.
    """
    return frame_index < 2 or frame_index % 6 == 0


class CameraEncoder(threading.Thread):
    """Encodes one camera's frames of one episode into an MP4, computing LeRobot's image stats.

    A depth stream (``depth``: HxWx1 uint16 millimetres) is encoded as LeRobot 0.6.1 encodes
    depth: its DepthEncoderConfig (HEVC, gray12le, lossless x265) and its ``quantize_depth`` to
    12-bit codes with that config's range; its stats stay in millimetres (LeRobot's streaming
    encoder, datasets/video_utils._CameraEncoderThread, keeps a depth map's stats unscaled)."""

    def __init__(
        self, path: Path, fps: int, cfg: StoreConfig, depth: bool = False, encoder: VideoEncoderConfig | None = None
    ) -> None:
        super().__init__(name=f"encode-{path.parent.name}", daemon=True)
        self.path = path
        self.fps = fps
        self.cfg = cfg
        self.depth = depth
        # the store's encoder settings unless given (bench/bench_depth.py compares x265 settings)
        self.encoder = encoder
        self.q: queue.Queue[np.ndarray | None] = queue.Queue(maxsize=ENCODER_QUEUE_FRAMES)
        self.frames = 0
        self.sampled = 0
        self.error: BaseException | None = None
        self.stats: dict[str, Any] | None = None
        self._cancel = threading.Event()

    def feed(self, img: np.ndarray) -> None:
        """Blocks while the queue is full (back-pressure), but never on a dead encoder."""
        while True:
            if self.error is not None:
                raise RuntimeError(f"encoder for {self.path.parent.name} failed: {self.error}")
            try:
                self.q.put(img, timeout=0.5)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        import av
        from lerobot.datasets.compute_stats import RunningQuantileStats, auto_downsample_height_width
        from lerobot.datasets.depth_utils import quantize_depth

        enc = self.encoder or (self.cfg.depth_encoder_config() if self.depth else self.cfg.rgb_encoder())
        container: Any = None
        stream: Any = None
        tracker = RunningQuantileStats()
        try:
            while True:
                img = self.q.get()
                if img is None or self._cancel.is_set():
                    break
                if container is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    container = av.open(str(self.path), "w")
                    stream = container.add_stream(
                        enc.vcodec, self.fps, options=enc.get_codec_options(self.cfg.encoder_threads, as_strings=True)
                    )
                    stream.pix_fmt = enc.pix_fmt
                    stream.height, stream.width = img.shape[:2]
                    stream.time_base = Fraction(1, self.fps)
                if self.depth:
                    frame = quantize_depth(
                        img,
                        depth_min=enc.depth_min,
                        depth_max=enc.depth_max,
                        shift=enc.shift,
                        use_log=enc.use_log,
                        pix_fmt=enc.pix_fmt,
                        video_backend="pyav",
                    )
                else:
                    frame = av.VideoFrame.from_ndarray(img, format="rgb24")
                frame.pts = self.frames
                frame.time_base = Fraction(1, self.fps)
                for packet in stream.encode(frame):
                    container.mux(packet)
                if stats_sampled(self.frames):
                    small = auto_downsample_height_width(img.transpose(2, 0, 1))
                    tracker.update(small.transpose(1, 2, 0).reshape(-1, small.shape[0]))
                    self.sampled += 1
                self.frames += 1
                if self.frames % max(1, round(self.fps * VIDEO_SYNC_EVERY_S)) == 0:
                    sync_file_data(self.path)
            if container is not None:
                if not self._cancel.is_set():
                    for packet in stream.encode():
                        container.mux(packet)
                container.close()
            if self.sampled >= 2:
                self.stats = {k: np.asarray(v).tolist() for k, v in tracker.get_statistics().items()}
        except BaseException as exc:
            self.error = exc
            if container is not None:
                try:
                    container.close()
                except Exception:
                    pass

    def finish(self) -> None:
        self.q.put(None)
        self.join()
        if self.error is not None:
            raise RuntimeError(f"encoder for {self.path.parent.name} failed: {self.error}")

    def cancel(self) -> None:
        self._cancel.set()
        try:
            self.q.put_nowait(None)
        except queue.Full:
            pass
        self.join(timeout=5)


class EpisodeBuild:
    """One episode being recorded: rows, timing and its camera encoders."""

    def __init__(self, store: DatasetStore, fps: int, task: str, seq: int, number: int) -> None:
        self.uid = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        self.dir = store.staging / f"ep-{self.uid}"
        self.dir.mkdir(parents=True)
        self.staging = store.staging
        self.fps = fps
        self.task = task
        self.seq = seq
        self.number = number  # the episode number the operator was told (not the dataset index)
        # not synced: it only names the episode should a restart find it unfinished
        (self.dir / START_FILE).write_text(json.dumps({"uid": self.uid, "task": task, "episode": number}))
        self.cameras = [name for name, _, _ in store.cfg.cameras]
        self.n_joints = store.cfg.n_joints  # 6, or 12 for two arms
        self.encoders = [CameraEncoder(self.dir / name / "video.mp4", fps, store.cfg) for name in self.cameras]
        # a camera recorded with depth: its depth stream's encoder, by camera index
        self.depth_encoders = {
            c: CameraEncoder(self.dir / depth_key(name) / "video.mp4", fps, store.cfg, depth=True)
            for c, name in enumerate(self.cameras)
            if name in store.cfg.depth_cameras
        }
        for e in self.all_encoders():
            e.start()
        self.rows: dict[str, list[np.ndarray]] = {"state": [], "action": [], "teleop": []}
        self.sources: list[str] = []  # per frame: who drove the arms (schema.SOURCE_KEY)
        self.grid_s: list[float] = []
        self.state_offset_s: list[float] = []
        self.cam_offset_s: list[list[float]] = []  # capture - grid, per camera (NaN: no image)
        self.last_img: list[np.ndarray | None] = [None] * len(self.cameras)
        self.last_depth: dict[int, np.ndarray] = {}
        self.last_seq = [-1] * len(self.cameras)
        self.missing = 0
        self.late = 0
        self.no_pixels = 0
        self.worst_skew_s = 0.0
        self.notes: list[str] = []
        self.continuous: dict[str, Any] = {}  # a part of a continuous recording: where it sits (EpisodeTag)
        self.kept: dict[str, Any] = {}  # begun by `episode keep`: the rows from the pre-roll buffer (EpisodeTag)
        self.state_s: list[float] = []  # the loop's cycle time of each row's state (monotonic s)
        self.t0: float | None = None

    def all_encoders(self) -> list[CameraEncoder]:
        """Every stream's encoder: the colour ones, then the depth ones."""
        return [*self.encoders, *self.depth_encoders.values()]

    def streams(self) -> list[tuple[str, CameraEncoder]]:
        """(stream name, its encoder), colour then depth (a depth stream is "<camera>_depth")."""
        return [
            *zip(self.cameras, self.encoders),
            *((depth_key(self.cameras[c]), e) for c, e in self.depth_encoders.items()),
        ]

    def add(self, rec: np.ndarray, ring: Ring) -> None:
        slot = int(rec["pixel_slot"][0])
        grid = float(rec["grid_s"][0])
        state_s = float(rec["state_s"][0])
        if self.t0 is None:
            self.t0 = state_s - grid  # episode start on the monotonic clock
        t_grid = self.t0 + grid
        period = 1.0 / self.fps
        missing = late = False
        offsets = []
        for c, enc in enumerate(self.encoders):
            cap = float(rec["cam_capture_s"][0][c])
            seq = int(rec["cam_seq"][0][c])
            if slot >= 0 and not np.isnan(cap):
                img = ring.image_view(slot, c).copy()
                self.last_img[c] = img
            else:
                missing = True
                previous = self.last_img[c]
                if previous is None:
                    _, h, w = ring.spec.cameras[c]
                    previous = np.zeros((h, w, 3), dtype=np.uint8)
                    self.last_img[c] = previous
                img = previous
            if not np.isnan(cap):
                skew = state_s - cap
                self.worst_skew_s = max(self.worst_skew_s, abs(skew))
                if abs(skew) > period:
                    late = True
                if seq == self.last_seq[c] and len(self.grid_s) > 0 and abs(skew) > period:
                    missing = True  # the camera produced nothing new for over a period
                self.last_seq[c] = seq
            offsets.append(cap - t_grid)
            enc.feed(img)
            depth_enc = self.depth_encoders.get(c)
            if depth_enc is not None:  # the same frame's depth map, or the previous one with its image
                if slot >= 0 and not np.isnan(cap):
                    self.last_depth[c] = ring.depth_view(slot, c).copy()
                elif c not in self.last_depth:
                    self.last_depth[c] = np.zeros((*img.shape[:2], 1), dtype=np.uint16)
                depth_enc.feed(self.last_depth[c])
        if slot < 0 and self.encoders:
            self.no_pixels += 1
        if abs(state_s - t_grid) > period / 2:
            late = True
        self.missing += missing
        self.late += late
        self.rows["state"].append(rec["state"][0].copy())
        self.rows["action"].append(rec["action"][0].copy())
        self.rows["teleop"].append(rec["teleop"][0].copy())
        self.sources.append(bytes(rec["source"][0]).decode("ascii", "replace"))
        self.grid_s.append(grid)
        self.state_s.append(state_s)
        self.state_offset_s.append(state_s - t_grid)
        self.cam_offset_s.append(offsets)

    def mark_saving(self) -> None:
        """The save was asked for: a restart that finds the episode unfinished says so."""
        (self.dir / SAVING_FILE).write_text(json.dumps({"episode": self.number}))

    def stage(self, success: bool | None, follower_kind: str, origin: str) -> dict[str, Any]:
        """Flush the encoders and write the episode durably: every file it needs synced to the
        disk, then ``episode.json`` (the episode is complete once that name exists, synced with its
        folder). What a restart's repair commits from; returns its episode.json content."""
        for e in self.all_encoders():
            e.finish()
        n = len(self.grid_s)
        for name, e in self.streams():
            if e.frames != n:
                raise RuntimeError(f"camera {name}: {e.frames} video frames for {n} rows")
        np.savez(
            self.dir / "rows.npz",
            state=np.asarray(self.rows["state"], np.float32).reshape(n, self.n_joints),
            action=np.asarray(self.rows["action"], np.float32).reshape(n, self.n_joints),
            teleop=np.asarray(self.rows["teleop"], np.float32).reshape(n, self.n_joints),
            source=np.asarray(self.sources, dtype=str).reshape(n),
        )
        np.savez(
            self.dir / "timing.npz",
            grid_s=np.asarray(self.grid_s, np.float64),
            # absolute, so the parts of a continuous recording can be laid end to end
            state_s=np.asarray(self.state_s, np.float64),
            state_offset_s=np.asarray(self.state_offset_s, np.float64),
            camera_offset_s=np.asarray(self.cam_offset_s, np.float64).reshape(n, len(self.cameras)),
            camera_names=np.asarray(self.cameras, dtype=str),
        )
        for path in [self.dir / "rows.npz", self.dir / "timing.npz"] + [e.path for e in self.all_encoders()]:
            sync_file_data(path)
        for name, _ in self.streams():
            fsync_dir(self.dir / name)
        if self.no_pixels:
            self.notes.append(f"writer fell behind: {self.no_pixels} frames repeat the previous image")
        tag: dict[str, Any] = {
            "success": success,
            "origin": origin,
            "follower_kind": follower_kind,
            "frames": n,
            "late_frames": self.late,
            "missing_frames": self.missing,
            "worst_camera_skew_ms": round(self.worst_skew_s * 1000, 3),
            "notes": self.notes,
            "source": {},
        }
        if self.continuous:
            tag["continuous"] = self.continuous
        if self.kept:
            tag["kept"] = self.kept
        if origin == "policy":  # the operator's corrections inside it (from the per-frame source record)
            tag["interventions"], tag["intervention_s"] = intervention_runs(self.sources, self.fps)
        meta = {
            "uid": self.uid,
            "task": self.task,
            "episode": self.number,
            "frames": n,
            "tag": tag,
            "video_stats": {name: e.stats for name, e in self.streams()},
        }
        write_json_atomic(self.dir / "episode.json", meta)  # synced, with the episode's folder
        (self.dir / STAGED_FILE).touch()  # empty: its name is its content, the folder sync keeps it
        fsync_dir(self.dir)
        fsync_dir(self.staging)  # the episode's folder itself, made at start
        return meta

    def cancel(self) -> None:
        for e in self.all_encoders():
            e.cancel()
        shutil.rmtree(self.dir, ignore_errors=True)


def _exit_if_orphaned_until(parent_pid: int, ready: threading.Event) -> None:
    """Until the writer is ready it holds nothing of its own (staged episodes wait on disk for the
    next start), yet at nice 19 on a busy machine its imports take minutes: a daemon killed in that
    window (a power cut, kill -9) must not leave a writer behind that nobody will ever stop."""

    def watch() -> None:
        while not ready.wait(0.25):
            if os.getppid() != parent_pid:
                log.warning("the daemon died before the dataset writer was ready: the writer exits")
                os._exit(0)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def writer_main(
    store_cfg: dict[str, Any],
    ring_spec: dict[str, Any],
    conn: Any,
    parent_pid: int,
    follower_kind: str,
    origin: str,
    scheduling: str = "",
) -> None:
    """The spawned writer process (arguments are plain data), entered through writer_entry."""
    # Our log format and level, third-party chatter (libx264 statistics, LeRobot's codec notes,
    # datasets' progress bars) below our INFO: PyAV is imported and quieted here, before encoding.
    from daemon.system.logs import setup_logging

    setup_logging(libav=True)
    # Encoding and parquet writing are background work: on a 2-core machine they must yield the
    # CPU to the control loop (the ring and the staging absorb the delay).
    # Ctrl-C at a terminal and systemd's stop signal reach the whole process group: the writer
    # ignores them and stops when the recorder says so (or its parent is gone), after committing
    # every saved episode.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    serving = threading.Event()  # from here on the main loop watches the parent itself
    _exit_if_orphaned_until(parent_pid, serving)
    # SCHED_BATCH: the kernel does not let a batch task preempt a waking task, so the loop's
    # wake-ups are served first. Both settings are inherited by the threads created below.
    try:
        os.nice(WRITER_NICE)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    log.debug("writer scheduling: %s", scheduling)  # no real time: writer_entry took the right
    cfg = StoreConfig(**store_cfg)
    cfg.cameras = [tuple(c) for c in cfg.cameras]  # type: ignore[misc]
    spec = RingSpec(**ring_spec)
    spec.cameras = [tuple(c) for c in spec.cameras]  # type: ignore[misc]
    send_lock = threading.Lock()

    def send(msg: dict[str, Any]) -> None:
        with send_lock:
            try:
                conn.send(msg)
            except (OSError, EOFError, BrokenPipeError):
                pass

    try:
        store = DatasetStore(cfg)
        store.check_compatible()
        notes = store.repair()
        for note in notes:
            log.warning("%s", note)
    except DatasetMismatchError as exc:
        send({"event": "fatal", "error": str(exc)})
        return
    except Exception as exc:
        send({"event": "fatal", "error": f"cannot open dataset {cfg.root}: {exc}"})
        return
    # Import the heavy parts now, not inside the first episode's encoders (seconds on 2 cores).
    import av

    av.logging.set_level(av.logging.WARNING)  # no libx264 summary lines per episode in the journal
    from lerobot.datasets.compute_stats import RunningQuantileStats  # noqa: F401
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401

    ring = Ring.attach(spec)
    # (staged episode, its recorder seq; None for one recovered from a previous run)
    commits: queue.Queue[tuple[Path, int | None] | None] = queue.Queue()
    # failed: a commit hit a full (or failing) disk; the staged episodes wait in `held`, in order,
    # until the recorder says the disk has room again ("resume")
    state = {"failed": False}
    held: list[tuple[Path, int | None]] = []
    held_lock = threading.Lock()

    def commit_worker() -> None:
        while True:
            item = commits.get()
            if item is None:
                return
            stage, seq = item
            with held_lock:
                if state["failed"]:
                    held.append(item)  # kept staged: committed on resume, or at the next start
                    continue
            try:
                res = store.commit(stage)
                send({"event": "saved", **res, "episode_seq": seq, "pending": commits.qsize()})
            except Exception as exc:
                note = None
                try:
                    note = store.rollback_if_torn()
                except Exception as exc2:
                    note = f"rollback failed too: {exc2}"
                log.error("commit of %s failed: %s (%s)", stage.name, exc, note)
                if not disk_at_fault(exc) and (stage / "episode.json").exists():
                    # the episode's own files are broken (a truncated video...): it can never be
                    # committed; set it aside (kept) and go on with the next one
                    try:
                        dropped = set_aside(stage, f"{type(exc).__name__}: {exc}")
                    except OSError as exc2:
                        log.error("could not set %s aside: %s", stage.name, exc2)
                    else:
                        log.error("episode DROPPED: %s", dropped.describe())
                        send({"event": "dropped", "episode_seq": seq, "dropped": asdict(dropped)})
                        continue
                with held_lock:
                    state["failed"] = True
                    held.append(item)
                send(
                    {
                        "event": "error",
                        "error": f"saving the episode failed: {exc}",
                        "detail": note,
                        "staged": str(stage),
                        "episode_seq": seq,
                        "fatal": True,
                        "disk_full": disk_at_fault(exc),
                    }
                )

    def resume() -> None:
        """The disk has room again: commit the held episodes (in order), record again."""
        with held_lock:
            state["failed"] = False
            again = list(held)
            held.clear()
        for item in again:
            commits.put(item)
        log.info("recording resumes: %d staged episode(s) to commit", len(again))

    recovered = store.staged_episodes()  # saved before a crash, never committed
    recovered_numbers = [_staged_number(stage) for stage in recovered]
    next_number = store.next_episode_number()
    for stage in recovered:
        commits.put((stage, None))
    committer = threading.Thread(target=commit_worker, name="commit", daemon=True)
    serving.set()
    committer.start()
    send(
        {
            "event": "ready",
            "total_episodes": store.total_episodes(),
            "repair": notes,
            "recovered": len(recovered),
            "recovered_numbers": recovered_numbers,
            "next_episode_number": next_number,
            "dropped": [asdict(d) for d in store.dropped],
        }
    )

    current: EpisodeBuild | None = None
    stop_requested = False
    parent_gone = False
    try:
        while True:
            if ring.pending() == 0:
                if not parent_gone and os.getppid() != parent_pid:
                    parent_gone = True
                    log.warning("parent process died: finishing saved episodes, dropping the one in progress")
                if conn.poll(0):
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        msg = {"cmd": "stop"}
                        parent_gone = True
                    if msg.get("cmd") == "stop":
                        stop_requested = True
                    elif msg.get("cmd") == "resume":
                        resume()
                if stop_requested or parent_gone:
                    break
                time.sleep(0.004)
                continue
            rec = ring.record_at_tail()
            kind = int(rec["kind"][0])
            had_pixels = kind == KIND_FRAME and int(rec["pixel_slot"][0]) >= 0
            try:
                if kind == KIND_START:
                    if current is not None:
                        current.cancel()
                    task = bytes(rec["task"][0]).rstrip(b"\0").decode("utf-8", "replace")
                    current = EpisodeBuild(store, cfg.fps, task, int(rec["episode_seq"][0]), int(rec["frame_index"][0]))
                elif kind == KIND_FRAME:
                    if current is not None and int(rec["episode_seq"][0]) == current.seq:
                        current.add(rec, ring)
                elif kind == KIND_SAVE:
                    seq = int(rec["episode_seq"][0])
                    if current is None or seq != current.seq:
                        # its frames were lost already (reported then); account for the save
                        send({"event": "discarded", "episode_seq": seq, "reason": "lost"})
                    else:
                        s = int(rec["success"][0])
                        if not current.grid_s:
                            current.cancel()
                            current = None
                            send({"event": "discarded", "episode_seq": seq, "reason": "no frames"})
                        else:
                            current.mark_saving()
                            extras = save_extras(bytes(rec["task"][0]))
                            current.notes.extend(str(n) for n in extras.get("notes", []) if n)
                            if isinstance(extras.get("continuous"), dict):
                                current.continuous = extras["continuous"]
                            if isinstance(extras.get("kept"), dict):
                                current.kept = extras["kept"]
                            meta = current.stage(
                                None if s < 0 else bool(s),
                                str(extras.get("follower_kind") or follower_kind),
                                str(extras.get("origin") or origin),
                            )
                            stage_dir, current = current.dir, None
                            send({"event": "staged", "episode_seq": seq, "frames": meta["frames"], "tag": meta["tag"]})
                            commits.put((stage_dir, seq))
                elif kind == KIND_DISCARD and current is not None:
                    current.cancel()
                    send({"event": "discarded", "episode_seq": current.seq, "reason": "discarded"})
                    current = None
            except Exception as exc:
                log.error("episode failed: %s", exc)
                if current is not None:
                    current.cancel()
                    current = None
                disk_full = "No space left" in str(exc) or disk_at_fault(exc)
                send(
                    {
                        "event": "error",
                        "error": f"recording the episode failed: {exc}",
                        "fatal": disk_full,
                        "disk_full": disk_full,
                        "save_lost": kind == KIND_SAVE,
                        "episode_seq": int(rec["episode_seq"][0]),
                    }
                )
            ring.release_record(had_pixels)
    finally:
        if current is not None:
            current.cancel()
        commits.put(None)
        committer.join()
        send({"event": "stopped", "total_episodes": store.total_episodes()})
        ring.close()
        try:
            conn.close()
        except OSError:
            pass


def _staged_number(stage: Path) -> int | None:
    try:
        number = json.loads((stage / "episode.json").read_text()).get("episode")
    except (OSError, ValueError, AttributeError):
        return None
    return number if isinstance(number, int) else None


def save_extras(raw: bytes) -> dict[str, Any]:
    """The SAVE record's tag extras (origin, follower_kind, notes); {} when absent or unreadable."""
    raw = raw.rstrip(b"\0")
    if not raw:
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        log.error("unreadable tag extras in a SAVE record: %r", raw[:80])
        return {}
    if not isinstance(data, dict):
        return {}
    if not isinstance(data.get("notes", []), list):
        data["notes"] = [str(data["notes"])]
    return data


def store_config_dict(cfg: StoreConfig) -> dict[str, Any]:
    return asdict(cfg)
