"""The dataset on disk: staged episodes, constant-cost packed commits into LeRobot v3.0, crash repair.

LeRobot 0.6.1 keeps its parquet writers open until ``finalize()``; a process killed before that
leaves ``meta/episodes`` unwritten and the whole dataset unloadable (LR#2495, LR#3522), and each
``LeRobotDataset.resume`` re-reads every episode's metadata and starts new files, so a commit per
session costs more the bigger the dataset. We never open a LeRobotDataset to write. Each episode
goes through two durable steps:

1. **staged**: while recording, the writer process encodes each camera straight into
   ``<staging>/ep-<uid>/<camera>/video.mp4`` and, at save, writes the table rows (``rows.npz``),
   per-frame timing, syncs them, and writes ``episode.json`` last (atomic rename, synced: the
   episode is complete only once that file exists).
2. **committed**: ``commit()`` appends the episode to LeRobot v3.0's packed files, exactly where
   LeRobot's own writer would put it (packing.py: size targets from info.json, LeRobot's defaults
   for a new dataset; the episodes metadata points into the files as LeRobot's does).

Design note: how an append to a shared file stays atomic
--------------------------------------------------------
A commit touches only what the episode changes: the tail of the current data parquet, the end of
each camera's current MP4, the current meta/episodes file (at most 100 rows), stats.json,
info.json, tasks.parquet (a new task only), the tag line and its timing file. Before touching a
file the commit records in its journal (``<staging>/commit.json`` + ``journal/``, fsynced) what
undoes the touch, in O(1) of the dataset's size:

- **video** (fmp4.py): packed MP4s are fragmented (``ftyp moov moof mdat moof mdat ...``); the
  staged episode is remuxed (stream copy) into fragments whose decode times start where the file
  ends, and appended. Journal: the file's committed length; repair truncates back to it. Earlier
  fragments are never rewritten, LeRobot's decoder reads an episode by its timestamp range.
- **data parquet** (parquet_append.py): one row group per episode, as LeRobot's writer makes
  them. The new row group is written where the old footer began, followed by a new footer
  listing all row groups. Journal: the old length and the old footer bytes; repair cuts the file
  back and puts the old footer back. The rows of earlier episodes are never rewritten.
- **meta/episodes** (~120 columns of per-feature stats, a large footer per row group): the
  current file's rows (at most 100, cached in memory) are written whole beside it and swapped in
  by rename. Journal: a hard link to the old file; repair renames it back.
- **stats.json, info.json, tasks.parquet**: small, replaced by rename; the journal keeps copies.
  info.json (the totals) is written last, then the tag line (the journal keeps the tag file's
  length), then the journal is removed: **that removal is the commit point**.
- A new file (rollover, first episode of a chunk, the timing file) is journaled as "new" and
  deleted by repair. The first episode of a new dataset is journaled as a creation: repair
  removes the folder.

So a power cut at any moment (mid-episode, mid-commit, mid-rollover) leaves either a committed
episode or a journal that undoes the torn one; a failed write (disk full) is undone at once by
``rollback_if_torn``. Only a torn commit's own bytes are ever cut: the bytes of earlier episodes
are never rewritten in place (the parquet footer, which lists them, is restored from the copy).
Cost per commit is independent of the episode count except for the data parquet's footer (about
1 KB per episode in that file, as in LeRobot's own files; measured in bench_recording_scale.py).
The store keeps the end of the dataset in memory (packing.Tail, the current meta/episodes rows,
running stats): a bounded cache. A dataset recorded with one file per episode (before packing)
loads and appends: its plain MP4s are never extended (the next episode opens the next file), and
``so101d dataset pack ROOT`` repacks it.

``repair()`` (every start): a journal left behind means a commit was torn -> undo it (see above).
Then complete staged episodes not yet committed are committed (the save's answer waits until the
episode is staged and synced, so a power cut right after "saved" loses nothing); incomplete ones
(the episode in progress) are deleted, and a staged one whose files cannot be committed is set
aside (``unfinished-ep-*``, kept), as is one whose episode.json is unreadable, or missing although
``staged.ok`` (made after it, before a save is answered durable) says it was on the disk: an
episode answered durable is never deleted. Each of those is named in ``dropped`` (number, task, why).

The staging folder is a hidden sibling of the dataset (``.<name>.so101d-staging``), on the same
filesystem so renames stay atomic.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from daemon.data.fmp4 import append as fmp4_append
from daemon.data.fmp4 import fragment_episode, read_moov_key
from daemon.data.fmp4 import truncate as fmp4_truncate
from daemon.data.fmp4 import write_new as fmp4_write_new
from daemon.data.interventions import INTERVENTION_KEY, intervention_feature, intervention_flags
from daemon.data.packing import (
    DATA_PATH,
    EPISODES_PATH,
    EPISODES_ROWS_PER_FILE,
    VIDEO_PATH,
    Caps,
    Tail,
    VideoEnd,
    data_needs_new_file,
    episodes_needs_new_file,
    info_stamp,
    next_file,
    read_tail,
    video_needs_new_file,
)
from daemon.data.parquet_append import ParquetTail, append_row_group
from daemon.data.parquet_append import read_tail as read_parquet_tail
from daemon.data.parquet_append import restore_tail as restore_parquet_tail
from daemon.data.parquet_append import write_new as write_parquet
from daemon.data.schema import (
    ACTION_KEY,
    BIMANUAL_ROBOT_TYPE,
    EPISODE_TAGS_FILE,
    IMAGE_KEY_PREFIX,
    ROBOT_TYPE,
    SOURCE_KEY,
    STATE_KEY,
    TAG_KEY,
    TELEOP_ACTION_KEY,
    EpisodeTag,
    append_episode_tag,
    dataset_features,
    depth_key,
    feature_differences,
    layout_difference,
    read_episode_tags,
    read_sidecar_tags,
    tag_to_cell,
    with_arms,
)
from daemon.data.tags import migrate_sidecar_tags

log = logging.getLogger("so101d.recording.store")

MARKER = "commit.json"
TIMING_DIR = "meta/so101d_timing"
# Files LeRobot rewrites in place on every save; everything else a commit writes is new.
REWRITTEN_IN_PLACE = ("meta/info.json", "meta/stats.json", "meta/tasks.parquet")


START_FILE = "start.json"  # in a staged episode: its task and number, written when it starts
SAVING_FILE = "saving.json"  # in a staged episode: its save was asked for (the writer read the SAVE)
# in a staged episode: made (and synced) after episode.json, before the save can be answered
# durable: an episode that has it was on the disk when answered, so repair never deletes it
STAGED_FILE = "staged.ok"
# beside the staged episodes: the next operator-facing episode number (never handed out twice)
NUMBERS_FILE = "episode_numbers.json"
SET_ASIDE_PREFIX = "unfinished-"  # a staged episode that cannot be committed, kept for a person
SET_ASIDE_REASON = "reason.txt"
# errno values where the disk, not the episode, is at fault: the episode stays staged and is
# committed once the disk takes it (space freed); any other failure sets the episode aside
# x265's preset for the lossless depth videos (depth_encoder_config): the fastest; lossless, so
# the preset changes only the time and the size, never the codes that come back
DEPTH_X265_PRESET = "ultrafast"
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


def disk_at_fault(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS


@dataclass
class DroppedEpisode:
    """An episode a restart found and could not put into the dataset: deleted (never saved) or
    set aside (saved, but its staged files cannot be committed)."""

    episode: int | None  # the number the operator was told; None: staged before numbers were kept
    task: str
    reason: str
    uid: str = ""

    def describe(self) -> str:
        number = f"episode {self.episode}" if self.episode is not None else "an episode"
        return f"{number} ({self.task!r}): {self.reason}"


def _staged_identity(d: Path) -> tuple[int | None, str]:
    """(number, task) from a staged episode's start.json or episode.json, as far as readable."""
    for name in ("episode.json", START_FILE):
        try:
            data = json.loads((d / name).read_text())
        except (OSError, ValueError):
            continue
        number = data.get("episode")
        return (int(number) if isinstance(number, int) else None), str(data.get("task", "?"))
    return None, "?"


def _staged_joints(stage: Path) -> int | None:
    """The width of a staged episode's joint rows (6 per arm); None when unreadable (the commit
    then fails on the file itself)."""
    try:
        with np.load(stage / "rows.npz", allow_pickle=False) as rows:
            shape = rows["state"].shape
    except (OSError, ValueError, KeyError):
        return None
    return int(shape[1]) if len(shape) == 2 else None


def set_aside(stage: Path, reason: str) -> DroppedEpisode:
    """Moves a staged episode that cannot be committed out of the way (kept, not deleted)."""
    number, task = _staged_identity(stage)
    dst = stage.with_name(SET_ASIDE_PREFIX + stage.name)
    os.replace(stage, dst)
    (dst / SET_ASIDE_REASON).write_text(reason)
    _fsync_dir(stage.parent)
    return DroppedEpisode(number, task, f"could not be committed ({reason}); its files are kept in {dst}", stage.name)


def reserve_episode_number(root: Path, number: int) -> None:
    """Records durably that ``number`` is handed out: the next one is ``number + 1``."""
    write_json_atomic(staging_dir(root) / NUMBERS_FILE, {"next": number + 1})


class DatasetMismatchError(ValueError):
    """The dataset on disk was recorded with another configuration."""


class DatasetBusyError(RuntimeError):
    """Another so101d process (a recording daemon, an import) owns the dataset right now."""


@dataclass
class StoreConfig:
    root: str
    repo_id: str = "local/so101d"
    fps: int = 30
    cameras: list[tuple[str, int, int]] = field(default_factory=list)  # (name, height, width)
    # cameras recorded with their depth (a RealSense with use_depth): stream "<name>_depth", HxWx1
    depth_cameras: list[str] = field(default_factory=list)
    # LeRobot's DepthEncoderConfig fields to set (depth_min, depth_max, shift, use_log); the rest,
    # and any not given, are LeRobot's defaults
    depth_encoder: dict[str, float | bool] = field(default_factory=dict)
    robot_type: str = ROBOT_TYPE
    # the arms of a bimanual rig, LeRobot's order ("left", "right"): 12-wide joint vectors named
    # as LeRobot's BiSOFollower names them, robot_type "bi_so_follower"; empty: one arm
    arms: list[str] = field(default_factory=list)
    vcodec: str = "h264"  # libx264 through PyAV; AV1 cannot keep up on 2 cores
    preset: str = "ultrafast"
    crf: int = 23
    gop: int = 2  # LeRobot's default keyframe interval: cheap random access when training
    encoder_threads: int = 1
    # LeRobot's packing targets for a NEW dataset (lerobot/datasets/utils.py defaults); an existing
    # dataset keeps the ones in its info.json, as LeRobot does.
    chunks_size: int = 1000
    data_files_size_in_mb: float = 100
    video_files_size_in_mb: float = 200
    # Test-only fault injection: "enospc_in_commit" raises ENOSPC after LeRobot wrote part of a
    # commit; "kill_in_commit" SIGKILLs the process at the same point; ":N" limits it to episode N.
    fault: str = ""

    def __post_init__(self) -> None:
        if self.arms and self.robot_type == ROBOT_TYPE:
            self.robot_type = BIMANUAL_ROBOT_TYPE

    @property
    def root_path(self) -> Path:
        return Path(self.root).expanduser().resolve()

    @property
    def n_joints(self) -> int:
        """The width of the joint vectors (6 per arm)."""
        return len(self.features()[STATE_KEY]["names"])

    def features(self) -> dict[str, dict[str, Any]]:
        return with_arms(dataset_features({name: (h, w) for name, h, w in self.cameras}, self.depth_cameras), self.arms)

    def video_streams(self) -> list[tuple[str, bool]]:
        """Every video the episode stages, in feature order: (stream name, is a depth map)."""
        out: list[tuple[str, bool]] = []
        for name, _, _ in self.cameras:
            out.append((name, False))
            if name in self.depth_cameras:
                out.append((depth_key(name), True))
        return out

    def video_keys(self) -> list[str]:
        return [IMAGE_KEY_PREFIX + name for name, _ in self.video_streams()]

    def rgb_encoder(self) -> Any:
        """LeRobot's encoder settings for the colour videos (what info.json records)."""
        from lerobot.configs.video import RGBEncoderConfig

        return RGBEncoderConfig(vcodec=self.vcodec, preset=self.preset, crf=self.crf, g=self.gop)

    def depth_encoder_config(self) -> Any:
        """LeRobot's DepthEncoderConfig for the depth videos: its defaults (HEVC, gray12le, lossless
        x265, the log quantiser's range), with the fields [recording.depth_encoder] sets.

        Two x265 parameters are added to LeRobot's own: ``bframes=0``, because the packed videos
        are fragmented MP4s appended episode by episode (fmp4.py), which keep no edit list, so a
        B-frame's reordering delay would shift every frame's time (LeRobot's decoder then misses
        frame 0 by two periods); and ``log-level=error``, or x265 prints its settings to the
        journal at every episode. Both are recorded in info.json's ``video.extra_options``.

        And the x265 preset ``ultrafast`` (DEPTH_X265_PRESET, recorded as ``video.preset``):
        lossless either way (the same 12-bit codes come back), about a third of x265's default
        preset's time per frame for some 3% more bytes (bench/bench_depth.py), which is what lets
        a 640x480 depth stream keep up at 30 fps on a 2-core machine."""
        from lerobot.configs.video import DepthEncoderConfig

        lerobot = DepthEncoderConfig()
        extra = dict(lerobot.extra_options)
        preset = lerobot.preset
        if lerobot.vcodec == "hevc":
            params = [p for p in str(extra.get("x265-params", "")).split(":") if p]
            extra["x265-params"] = ":".join([*params, "bframes=0", "log-level=error"])
            preset = DEPTH_X265_PRESET
        return DepthEncoderConfig(extra_options=extra, preset=preset, **self.depth_encoder)


def staging_dir(root: Path) -> Path:
    return root.parent / f".{root.name}.so101d-staging"


def config_differences(cfg: StoreConfig) -> list[str]:
    """Differences between an existing dataset and the configuration ([] if none or no dataset)."""
    info_path = cfg.root_path / "meta" / "info.json"
    if not info_path.exists():
        return []
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as exc:
        return [f"meta/info.json unreadable: {exc}"]
    # another arm layout (one arm / two) is one refusal naming both, not a dozen feature lines
    layout = layout_difference(cfg.features(), cfg.robot_type, info.get("features", {}), info.get("robot_type"))
    if layout:
        return [layout]
    diffs = feature_differences(cfg.features(), info.get("features", {}))
    if int(info.get("fps", -1)) != int(cfg.fps):
        diffs.append(f"fps {info.get('fps')!r} in the dataset, {cfg.fps!r} configured")
    if info.get("robot_type") not in (cfg.robot_type, None):
        diffs.append(f"robot_type {info.get('robot_type')!r} in the dataset, {cfg.robot_type!r} configured")
    return diffs


def sync_file_data(path: Path) -> None:
    """The file's written bytes on the disk (any descriptor of a file syncs its data: the writer's
    encoder keeps its own open)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """The folder's entries (new names, renames) on the disk."""
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, sync_dir: bool = True) -> None:
    """Written beside, fsynced, renamed in. ``sync_dir=False``: the caller fsyncs the folder later
    (a commit syncs every folder it touched once, before its commit point)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync_dir:
        _fsync_dir(path.parent)


def _list_files(root: Path) -> list[str]:
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink())


class DatasetStore:
    """Commits staged episodes into one LeRobot v3.0 dataset, one transaction each."""

    def __init__(self, cfg: StoreConfig) -> None:
        self.cfg = cfg
        self.root = cfg.root_path
        self.staging = staging_dir(self.root)
        self.staging.mkdir(parents=True, exist_ok=True)
        self._state: _State | None = None  # the end of the dataset, between commits
        self._owner_fd: int | None = None
        # What the last repair() found and could not put into the dataset (reported at start).
        self.dropped: list[DroppedEpisode] = []

    def take_ownership(self, wait_s: float = 0.0) -> None:
        """Become the dataset's only writer for this store's lifetime (advisory lock).

        ``repair()`` deletes staged episodes that are still being written; run by a second process
        it would destroy the first one's episode in progress. So the daemon's writer and
        `so101d import-hdf5` both take this lock first, and the second one is refused.
        """
        if self._owner_fd is not None:
            return
        fd = os.open(self.staging / "owner.lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.1)  # e.g. a killed daemon's writer still committing its saved episodes
                    continue
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DatasetBusyError(
                f"dataset {self.root} is in use by another so101d process (pid {holder}): "
                "stop its recording first, or write to another dataset"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._owner_fd = fd

    def release_ownership(self) -> None:
        if self._owner_fd is not None:
            os.close(self._owner_fd)  # closing the descriptor drops the lock
            self._owner_fd = None

    # -- start-up --------------------------------------------------------------------------------
    def check_compatible(self) -> None:
        diffs = config_differences(self.cfg)
        if diffs:
            raise DatasetMismatchError(f"dataset {self.root} does not match the configuration: " + "; ".join(diffs))

    def total_episodes(self) -> int:
        info_path = self.root / "meta" / "info.json"
        if not info_path.exists():
            return 0
        return int(json.loads(info_path.read_text()).get("total_episodes", 0))

    def next_episode_number(self) -> int:
        """The next operator-facing episode number: past every one handed out (the numbers file),
        committed (tags) or staged, and never below the dataset's episode count (a dataset
        recorded before these numbers, or copied without its staging folder)."""
        best = self.total_episodes()
        try:
            best = max(best, int(json.loads((self.staging / NUMBERS_FILE).read_text())["next"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or unreadable: the other sources still bound it
        if (self.root / "meta" / "info.json").exists():
            for tag in read_episode_tags(self.root).values():
                if tag.episode_number is not None:
                    best = max(best, tag.episode_number + 1)
        for d in list(self.staging.glob("ep-*")) + list(self.staging.glob(SET_ASIDE_PREFIX + "ep-*")):
            number, _ = _staged_identity(d)
            if number is not None:
                best = max(best, number + 1)
        return best

    def repair(self, wait_s: float = 60.0) -> list[str]:
        """Roll back a torn commit, drop incomplete staged episodes. Returns what was done.

        Takes ownership of the dataset first, waiting up to ``wait_s`` for a previous owner (a
        killed daemon's writer finishing its commits); DatasetBusyError after that.
        """
        self.take_ownership(wait_s)
        notes: list[str] = []
        marker = self.staging / MARKER
        if marker.exists():
            notes.append(self._rollback(marker))
        migrated = migrate_sidecar_tags(self.root)  # once: a dataset recorded before the tag column
        if migrated:
            self._state = None
            notes.append(migrated)
        tags = read_episode_tags(self.root)
        committed_uids = {t.source.get("recording_uid") for t in tags.values()}
        self.dropped = []
        for d in sorted(self.staging.glob("ep-*")):
            if not (d / "episode.json").exists() and (d / STAGED_FILE).exists():
                # answered durable, then its episode.json went: keep the rest for a person
                self.dropped.append(
                    set_aside(d, f"{d.name}/episode.json is missing; the episode was staged and on the disk before")
                )
                notes.append(f"set aside {d.name}: {self.dropped[-1].describe()}")
            elif not (d / "episode.json").exists():
                number, task = _staged_identity(d)
                reason = (
                    "killed while it was being saved, before it was on the disk"
                    if (d / SAVING_FILE).exists()
                    else "recording was interrupted before the episode was saved"
                )
                shutil.rmtree(d, ignore_errors=True)
                self.dropped.append(DroppedEpisode(number, task, reason, d.name))
                notes.append(f"dropped incomplete episode {d.name}: {self.dropped[-1].describe()}")
            else:
                try:
                    meta = json.loads((d / "episode.json").read_text())
                    uid = meta.get("uid") if isinstance(meta, dict) else None
                    if not isinstance(meta, dict):
                        raise ValueError("not a JSON object")
                except (OSError, ValueError) as exc:
                    self.dropped.append(set_aside(d, f"{d.name}/episode.json is unreadable: {exc}"))
                    notes.append(f"set aside {d.name}: {self.dropped[-1].describe()}")
                    continue
                if uid in committed_uids:
                    shutil.rmtree(d, ignore_errors=True)  # committed, crash before the clean-up
        just_now = {d.uid for d in self.dropped}
        for d in sorted(self.staging.glob(SET_ASIDE_PREFIX + "ep-*")):  # until a person removes them
            if d.name.removeprefix(SET_ASIDE_PREFIX) in just_now:
                continue
            number, task = _staged_identity(d)
            try:
                why = (d / SET_ASIDE_REASON).read_text().strip()
            except OSError:
                why = "?"
            self.dropped.append(
                DroppedEpisode(number, task, f"set aside earlier, could not be committed ({why}): {d}", d.name)
            )
        for d in self.staging.glob("links-*"):
            shutil.rmtree(d, ignore_errors=True)
        # LeRobot's own temp folders inside the root (tempfile.mkdtemp(dir=root)) from a torn save
        if self.root.exists():
            for d in self.root.glob("tmp*"):
                if d.is_dir():
                    shutil.rmtree(d, ignore_errors=True)
        return notes

    def staged_episodes(self) -> list[Path]:
        """Complete staged episodes waiting for a commit, oldest first."""
        return sorted(d for d in self.staging.glob("ep-*") if (d / "episode.json").exists())

    def _rollback(self, marker: Path) -> str:
        self._state = None
        data = json.loads(marker.read_text())
        if data.get("version") == 2:
            return _rollback_v2(self.root, marker, data)
        # a marker left by the one-LeRobot-session-per-commit writer (before packing)
        before = data.get("files_before")
        if before is None:
            shutil.rmtree(self.root, ignore_errors=True)
            marker.unlink()
            return f"rolled back the torn creation of {self.root}"
        keep = set(before)
        removed = 0
        for rel in _list_files(self.root):
            if rel not in keep:
                (self.root / rel).unlink()
                removed += 1
        backup = self.staging / "backup"
        for rel in REWRITTEN_IN_PLACE:
            src = backup / Path(rel).name
            if src.exists():
                shutil.copy2(src, self.root / rel)
        total = self.total_episodes()
        tags_path = self.root / EPISODE_TAGS_FILE
        if tags_path.exists():
            kept = [t for i, t in sorted(read_sidecar_tags(self.root).items()) if i < total]
            tmp = tags_path.with_name(tags_path.name + ".tmp")
            tmp.write_text("".join(json.dumps(asdict(t), sort_keys=True) + "\n" for t in kept))
            os.replace(tmp, tags_path)
        for d in sorted(self.root.rglob("*"), reverse=True):  # empty folders left by the torn commit
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        marker.unlink()
        return f"rolled back a torn commit ({removed} partial files removed, {total} episodes kept)"

    # -- commit ----------------------------------------------------------------------------------
    def commit(self, stage: Path) -> dict[str, Any]:
        """Commit one staged episode; returns {"episode_index", "frames", "commit_s", "uid"}."""
        return self.commit_many([stage])[0]

    def commit_many(self, stages: list[Path]) -> list[dict[str, Any]]:
        """Commit staged episodes in ONE transaction (all or none); one result per episode.

        Commits are serialised across processes (the daemon's writer and `so101d import-hdf5`
        may append to the same dataset) with an advisory lock; each one reads back the end of the
        dataset (O(1)) when another process appended since this store's last commit.
        """
        with open(self.staging / "commit.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self._commit_locked(stages)
            except BaseException:
                self._state = None  # whatever is cached may describe the torn commit
                raise
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _commit_locked(self, stages: list[Path]) -> list[dict[str, Any]]:
        t0 = time.monotonic()
        metas = [json.loads((stage / "episode.json").read_text()) for stage in stages]
        for stage, meta in zip(stages, metas):
            if int(meta["frames"]) == 0:
                shutil.rmtree(stage, ignore_errors=True)
                raise ValueError(f"episode {stage.name} has no frames")
            # a staged episode of the other arm layout (staged by a bimanual daemon, found by a
            # single-arm one before the dataset existed): never half-written, set aside whole
            joints = _staged_joints(stage)
            if joints is not None and joints != self.cfg.n_joints:
                raise ValueError(
                    f"episode {stage.name} was recorded with {joints} joints a frame, the dataset records "
                    f"{self.cfg.n_joints} ({'two arms' if self.cfg.arms else 'one arm'}): another arm layout"
                )
        existed = (self.root / "meta" / "info.json").exists()
        if existed:
            self.check_compatible()
        journal = _Journal(self.staging / MARKER, self.root, [stage.name for stage in stages])
        journal.begin(created=not existed)
        if not existed:
            # a dataset a policy episode creates gets LeRobot's DAgger column (interventions.py)
            self._create(intervention=metas[0].get("tag", {}).get("origin") == "policy")
            self._state = None
        state = self._load_state()
        indices = []
        tags = []
        for stage, meta in zip(stages, metas):
            tag = _episode_tag(meta, state.tail.total_episodes)
            indices.append(self._append(state, journal, stage, meta, tag))
            tags.append(tag)
        # totals last: a reader that sees them sees every file they count
        write_json_atomic(self.root / "meta" / "stats.json", _serialize_stats(state.stats), sync_dir=False)
        state.info["total_episodes"] = state.tail.total_episodes
        state.info["total_frames"] = state.tail.total_frames
        state.info["total_tasks"] = len(state.tasks)
        state.info["splits"] = {"train": f"0:{state.tail.total_episodes}"}
        write_json_atomic(self.root / "meta" / "info.json", state.info, sync_dir=False)
        state.tail.info_stamp = info_stamp(self.root)
        for tag in tags:
            append_episode_tag(self.root, tag)
        # every rename and new file of this commit durable before its commit point
        for d in sorted(journal.dirs | {self.root / "meta"}):
            _fsync_dir(d)
        journal.commit()  # commit point: the journal is gone
        commit_s = round(time.monotonic() - t0, 3)
        for stage in stages:
            shutil.rmtree(stage, ignore_errors=True)
        return [
            {
                "episode_index": i,
                "episode": m.get("episode"),
                "frames": int(m["frames"]),
                "commit_s": commit_s,
                "uid": m["uid"],
            }
            for i, m in zip(indices, metas)
        ]

    def _create(self, intervention: bool = False) -> None:
        """A new dataset: LeRobot's own info.json (no episodes yet), with our size targets;
        ``intervention``: with LeRobot's ``intervention`` feature (created by a policy episode)."""
        from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

        features = self.cfg.features()
        if intervention:
            features[INTERVENTION_KEY] = intervention_feature()
        LeRobotDatasetMetadata.create(
            self.cfg.repo_id,
            fps=self.cfg.fps,
            features=features,
            robot_type=self.cfg.robot_type,
            root=self.root,
            use_videos=True,
            chunks_size=self.cfg.chunks_size,
            data_files_size_in_mb=self.cfg.data_files_size_in_mb,
            video_files_size_in_mb=self.cfg.video_files_size_in_mb,
        )

    def _load_state(self) -> _State:
        """The cached end of the dataset, re-read (O(1)) if info.json changed behind our back."""
        if self._state is not None and self._state.tail.info_stamp == info_stamp(self.root):
            return self._state
        from lerobot.datasets.feature_utils import get_hf_features_from_features
        from lerobot.datasets.io_utils import cast_stats_to_numpy

        info = json.loads((self.root / "meta" / "info.json").read_text())
        # as lerobot's load_info: shapes are tuples (a (1,) feature is a scalar column)
        features = {k: {**ft, "shape": tuple(ft["shape"])} for k, ft in info["features"].items()}
        tail = read_tail(self.root, self.cfg.video_keys())
        stats_path = self.root / "meta" / "stats.json"
        stats = cast_stats_to_numpy(json.loads(stats_path.read_text())) if stats_path.exists() else None
        tasks: dict[str, int] = {}
        tasks_path = self.root / "meta" / "tasks.parquet"
        if tasks_path.exists():
            import pandas as pd

            df = pd.read_parquet(tasks_path)
            tasks = {str(t): int(i) for t, i in zip(df.index, df["task_index"])}
        self._state = _State(
            info=info,
            tail=tail,
            stats=stats,
            tasks=tasks,
            caps=Caps.from_info(info),
            hf_features=get_hf_features_from_features(features),
            features=features,
        )
        return self._state

    def _append(self, state: _State, journal: _Journal, stage: Path, meta: dict[str, Any], tag: EpisodeTag) -> int:
        """Append one staged episode's rows, videos, stats and metadata row to the packed files.

        First everything is computed and every file it will touch is decided and journaled (one
        journal write per episode), then the files are written."""
        from lerobot.utils.utils import flatten_dict

        tail, caps = state.tail, state.caps
        n = int(meta["frames"])
        episode_index = tail.total_episodes
        task = meta["task"]
        new_task = task not in state.tasks
        task_index = state.tasks.get(task, len(state.tasks))
        with np.load(stage / "rows.npz", allow_pickle=False) as rows:
            buf: dict[str, Any] = {
                STATE_KEY: np.asarray(rows["state"], np.float32),
                ACTION_KEY: np.asarray(rows["action"], np.float32),
                TELEOP_ACTION_KEY: np.asarray(rows["teleop"], np.float32),
            }
            # who drove the arms, per frame (a staged episode from before the column: unknown)
            sources = [str(v) for v in rows["source"]] if "source" in rows.files else [""] * n
        # the columns LeRobot's save_episode adds (dataset_writer.save_episode)
        buf["timestamp"] = (np.arange(n) / self.cfg.fps).astype(np.float32)
        buf["frame_index"] = np.arange(n)
        buf["episode_index"] = np.full((n,), episode_index)
        buf["index"] = np.arange(tail.total_frames, tail.total_frames + n)
        buf["task_index"] = np.full((n,), task_index)
        # the tag on every frame: LeRobot's editing tools carry data columns, nothing else of ours
        buf[TAG_KEY] = [tag_to_cell(tag)] * n
        if SOURCE_KEY in state.features:  # a dataset recorded before the column goes on without it
            buf[SOURCE_KEY] = sources
        if INTERVENTION_KEY in state.features:  # the operator drove: from the same source record
            buf[INTERVENTION_KEY] = intervention_flags(sources)
        ep_stats = _episode_stats(buf, state.features)
        table = _data_table(buf, state.hf_features)

        # where the rows go (dataset_writer._save_episode_data)
        data_target = tail.data
        data_frames = tail.data_frames_in_file
        if data_target is not None:
            path = self.root / DATA_PATH.format(chunk_index=data_target[0], file_index=data_target[1])
            if data_needs_new_file(path.stat().st_size, data_frames, n, caps.data_files_size_in_mb) or not _same_schema(
                path, table, state
            ):
                data_target, data_frames = next_file(*data_target, caps.chunks_size), 0
        else:
            data_target = (0, 0)
        data_path = self.root / DATA_PATH.format(chunk_index=data_target[0], file_index=data_target[1])
        ep_meta: dict[str, Any] = {
            "data/chunk_index": data_target[0],
            "data/file_index": data_target[1],
            "dataset_from_index": tail.total_frames,
            "dataset_to_index": tail.total_frames + n,
        }

        # where each camera's video goes (dataset_writer._save_episode_video)
        video_plans = []
        for name, is_depth in self.cfg.video_streams():
            key = IMAGE_KEY_PREFIX + name
            plan = self._plan_video(state, key, stage / name / "video.mp4")
            video_plans.append(plan)
            ep_meta.update(plan.episode_meta(key))
            stats = meta["video_stats"].get(name)
            # dataset_writer.save_episode: per channel; colour scaled to [0, 1], a depth map's
            # kept in its unit (millimetres: its depth_unit)
            scale = 1.0 if is_depth else 255.0
            if stats:
                ep_stats[key] = {
                    k: np.asarray(v) if k == "count" else np.squeeze(np.asarray(v).reshape(1, -1, 1, 1) / scale, axis=0)
                    for k, v in stats.items()
                }

        # the meta/episodes row and its file (dataset_metadata._save_episode_metadata)
        row: dict[str, Any] = {"episode_index": episode_index, "tasks": [task], "length": n}
        row.update(ep_meta)
        row.update(flatten_dict({"stats": ep_stats}))
        ep_target = tail.episodes
        previous = None
        if ep_target is not None:
            path = self.root / EPISODES_PATH.format(chunk_index=ep_target[0], file_index=ep_target[1])
            previous = state.current_episodes_table(self.root, ep_target)
            row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = ep_target
            if (
                tail.episodes_rows_in_file >= EPISODES_ROWS_PER_FILE
                or episodes_needs_new_file(path.stat().st_size, tail.episodes_rows_in_file, caps.data_files_size_in_mb)
                or _cast_like(_episodes_table([row]), previous) is None
            ):  # another writer's columns
                ep_target, previous = next_file(*ep_target, caps.chunks_size), None
        else:
            ep_target = (0, 0)
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = ep_target
        ep_table = _episodes_table([row])
        if previous is not None:
            import pyarrow as pa

            ep_table = pa.concat_tables([previous, _cast_like(ep_table, previous)]).combine_chunks()
        ep_path = self.root / EPISODES_PATH.format(chunk_index=ep_target[0], file_index=ep_target[1])
        timing = self.root / TIMING_DIR / f"episode_{episode_index:06d}.npz"

        # journal every touch, once, then write
        if new_task:
            journal.replace(self.root / "meta" / "tasks.parquet")
        if data_path.exists():
            journal.touch_parquet(data_path)
        else:
            journal.touch_new(data_path)
        for plan in video_plans:
            if plan.append:
                journal.touch_video(plan.path)
            else:
                journal.touch_new(plan.path)
        journal.replace(ep_path)
        journal.touch_new(timing)
        journal.flush()

        if new_task:
            state.tasks[task] = task_index
            _write_tasks(self.root, state.tasks)
        if data_path.exists():
            append_row_group(data_path, table)
        else:
            data_path.parent.mkdir(parents=True, exist_ok=True)
            write_parquet(data_path, table)
            self._fault_point_rollover(data_path)
        for plan in video_plans:
            plan.write()
            if not plan.append:
                self._fault_point_rollover(plan.path)
        if episode_index == 0:
            self._video_info(state)
        ep_path.parent.mkdir(parents=True, exist_ok=True)
        _write_beside_and_swap(ep_path, ep_table)
        timing.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stage / "timing.npz", timing)

        # the new end of the dataset
        tail.data, tail.data_frames_in_file = data_target, data_frames + n
        for plan in video_plans:
            tail.videos[plan.key] = VideoEnd(plan.chunk_index, plan.file_index, plan.to_s, appendable=True)
            state.moov_keys[plan.key] = plan.frag.moov_key
        state.episodes_table = ep_table
        tail.episodes, tail.episodes_rows_in_file = ep_target, ep_table.num_rows
        state.stats = _aggregate(state.stats, ep_stats)
        tail.total_episodes += 1
        tail.total_frames += n
        self._fault_point(episode_index)
        return episode_index

    def _plan_video(self, state: _State, key: str, src: Path) -> _VideoPlan:
        """Which packed file the episode's video goes into, and at which time."""
        tail, caps = state.tail, state.caps
        frag = fragment_episode(src)
        end = tail.videos.get(key)
        if end is None:
            return _VideoPlan(
                key,
                frag,
                self.root / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0),
                0,
                0,
                0,
                False,
                self.cfg.fps,
            )
        path = self.root / VIDEO_PATH.format(video_key=key, chunk_index=end.chunk_index, file_index=end.file_index)
        if end.appendable is None:
            end.appendable = read_moov_key(path) == frag.moov_key
        if (
            end.appendable
            and frag.moov_key == state.moov_keys.get(key, frag.moov_key)
            and not video_needs_new_file(path.stat().st_size, len(frag.fragments), caps.video_files_size_in_mb)
        ):
            return _VideoPlan(
                key, frag, path, end.chunk_index, end.file_index, round(end.end_s * frag.timescale), True, self.cfg.fps
            )
        chunk, file = next_file(end.chunk_index, end.file_index, caps.chunks_size)
        return _VideoPlan(
            key,
            frag,
            self.root / VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file),
            chunk,
            file,
            0,
            False,
            self.cfg.fps,
        )

    def _video_info(self, state: _State) -> None:
        """info.json's per-camera video info, probed from the first file (as LeRobot does)."""
        from lerobot.configs.video import infer_depth_unit
        from lerobot.datasets.video_utils import get_video_info

        rgb, depth = self.cfg.rgb_encoder(), self.cfg.depth_encoder_config()
        for name, is_depth in self.cfg.video_streams():
            key = IMAGE_KEY_PREFIX + name
            path = self.root / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
            existing = state.info["features"][key].get("info") or {}
            # a depth map: LeRobot's is_depth_map, the quantiser's settings (video.depth_min ...) and,
            # as its add_frame records from the frames' dtype, the unit (uint16: "mm")
            info = {**existing, **get_video_info(path, video_encoder=depth if is_depth else rgb)}
            if is_depth:
                info["depth_unit"] = infer_depth_unit(np.uint16)
            state.info["features"][key]["info"] = info

    def _fault_point(self, episode_index: int) -> None:
        """Test hook: "<fault>" or "<fault>:<episode index>" (only that episode's commit)."""
        if not self.cfg.fault:
            return
        fault, _, at = self.cfg.fault.partition(":")
        if at and int(at) != episode_index:
            return
        if fault == "enospc_in_commit":
            raise OSError(28, "No space left on device (injected)")
        if fault == "kill_in_commit":
            os.kill(os.getpid(), 9)

    def _fault_point_rollover(self, new_file: Path | None) -> None:
        """Test hook "kill_in_rollover": SIGKILL right after a commit started a new packed file
        (of an existing dataset), before the commit point."""
        if (
            self.cfg.fault == "kill_in_rollover"
            and new_file is not None
            and self._state is not None
            and self._state.tail.total_episodes > 0
        ):
            os.kill(os.getpid(), 9)

    def rollback_if_torn(self) -> str | None:
        """After a failed commit in this process (e.g. disk full): undo it now."""
        marker = self.staging / MARKER
        if marker.exists():
            return self._rollback(marker)
        return None


# -- the journal: how a commit is undone ------------------------------------------------------------
class _Journal:
    """``commit.json`` in the staging folder: what a commit touches, made durable BEFORE the touch.

    Entries: a new file (deleted on rollback), an extended MP4 (its committed length: truncated
    back to it), an extended parquet file (its committed length and footer, saved beside: the
    footer is put back), a file replaced whole by rename (info.json, stats.json, tasks.parquet,
    the current meta/episodes file: a hard link to the old one keeps it, O(1); renamed back).
    Entries are collected per episode and written once (``flush``) before any of them is touched.
    """

    def __init__(self, path: Path, root: Path, stages: list[str]) -> None:
        self.path = path
        self.root = root
        self.dir = path.parent / "journal"
        self.data: dict[str, Any] = {"version": 2, "stages": stages, "files": {}}
        self._pending_fsync: list[Path] = []
        self.dirs: set[Path] = set()  # folders whose entries the commit changed (synced at the end)

    def begin(self, created: bool) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.data["created"] = created
        tags = self.root / EPISODE_TAGS_FILE
        self.data["tags_length"] = tags.stat().st_size if tags.exists() else None
        if not created:
            self.replace(self.root / "meta" / "info.json")
            self.replace(self.root / "meta" / "stats.json")
        else:
            self.flush()  # before the folder exists: a crash from here on removes it
        # else: the first episode's flush makes these entries durable with its own

    def _new_entry(self, path: Path, renames: bool = True) -> str | None:
        """The path's journal key, or None when it is journaled already (or the dataset is new:
        then rollback removes the whole folder). ``renames``: the folder's entries change (a new
        file, a rename), so it is synced before the commit point; an append in place does not."""
        if not renames:
            return (
                None
                if self.data["created"] or str(path.relative_to(self.root)) in self.data["files"]
                else str(path.relative_to(self.root))
            )
        self.dirs.add(path.parent)
        d = path.parent
        while not d.exists():  # folders about to be made: their parents' entries change too
            d = d.parent
            self.dirs.add(d)
        if self.data["created"]:
            return None
        rel = str(path.relative_to(self.root))
        return None if rel in self.data["files"] else rel

    def replace(self, path: Path) -> None:
        """``path`` is about to be replaced whole by a rename: keep the old one (a hard link)."""
        rel = self._new_entry(path)
        if rel is None:
            return
        if path.exists():
            dst = self.dir / rel.replace("/", "__")
            os.link(path, dst)
            self.data["files"][rel] = {"kind": "replaced", "backup": dst.name}
        else:
            self.data["files"][rel] = {"kind": "new"}

    def touch_new(self, path: Path) -> None:
        rel = self._new_entry(path)
        if rel is not None:
            self.data["files"][rel] = {"kind": "new"}

    def touch_video(self, path: Path) -> None:
        rel = self._new_entry(path, renames=False)
        if rel is not None:
            self.data["files"][rel] = {"kind": "append", "length": path.stat().st_size}

    def touch_parquet(self, path: Path) -> None:
        rel = self._new_entry(path, renames=False)
        if rel is None:
            return
        saved = read_parquet_tail(path)
        dst = self.dir / (rel.replace("/", "__") + ".tail")
        dst.write_bytes(saved.tail)
        self._pending_fsync.append(dst)
        self.data["files"][rel] = {
            "kind": "parquet",
            "length": saved.length,
            "data_end": saved.data_end,
            "tail": dst.name,
        }

    def flush(self) -> None:
        """Make the entries durable: saved footers, the journal folder's links, the journal."""
        for p in self._pending_fsync:
            _fsync_file(p)
        self._pending_fsync = []
        _fsync_dir(self.dir)
        write_json_atomic(self.path, self.data)

    def commit(self) -> None:
        self.path.unlink()
        _fsync_dir(self.path.parent)
        shutil.rmtree(self.dir, ignore_errors=True)


def _rollback_v2(root: Path, marker: Path, data: dict[str, Any]) -> str:
    """Undo a torn packed commit from its journal (see _Journal)."""
    jdir = marker.parent / "journal"
    if data.get("created"):
        shutil.rmtree(root, ignore_errors=True)
        marker.unlink()
        shutil.rmtree(jdir, ignore_errors=True)
        return f"rolled back the torn creation of {root}"
    undone = 0
    for rel, entry in data["files"].items():
        path = root / rel
        kind = entry["kind"]
        tmp = path.with_name(path.name + ".tmp")  # written beside, never renamed in
        if tmp.exists():
            tmp.unlink()
        if kind == "new":
            if path.exists():
                path.unlink()
                undone += 1
        elif kind == "replaced":
            os.replace(jdir / entry["backup"], path)
            undone += 1
        elif kind == "copy":
            tmp = path.with_name(path.name + ".restore")
            shutil.copyfile(jdir / entry["backup"], tmp)
            _fsync_file(tmp)
            os.replace(tmp, path)
        elif kind == "append":
            if path.exists() and path.stat().st_size != entry["length"]:
                fmp4_truncate(path, int(entry["length"]))
                undone += 1
        elif kind == "parquet":
            tail = (jdir / entry["tail"]).read_bytes()
            if (path.exists() and path.stat().st_size != entry["length"]) or _tail_differs(path, tail):
                restore_parquet_tail(path, ParquetTail(int(entry["length"]), int(entry["data_end"]), tail))
                undone += 1
    tags_path = root / EPISODE_TAGS_FILE
    if data.get("tags_length") is None:
        if tags_path.exists():
            tags_path.unlink()
    elif tags_path.exists() and tags_path.stat().st_size > int(data["tags_length"]):
        with open(tags_path, "r+b") as fh:
            fh.truncate(int(data["tags_length"]))
            os.fsync(fh.fileno())
    for d in sorted(root.rglob("*"), reverse=True):  # empty folders left by a torn rollover
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    total = json.loads((root / "meta" / "info.json").read_text()).get("total_episodes", 0)
    marker.unlink()
    _fsync_dir(marker.parent)
    shutil.rmtree(jdir, ignore_errors=True)
    return f"rolled back a torn commit ({undone} files cut back or removed, {total} episodes kept)"


def _tail_differs(path: Path, tail: bytes) -> bool:
    if not path.exists():
        return False
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - len(tail)))
        return fh.read() != tail


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


@dataclass
class _VideoPlan:
    """One camera's video of one episode: a new packed file, or appended to the current one."""

    key: str
    frag: Any  # fmp4.Fragmented
    path: Path
    chunk_index: int
    file_index: int
    start_ticks: int
    append: bool
    fps: int

    @property
    def from_s(self) -> float:
        return self.start_ticks / self.frag.timescale

    @property
    def to_s(self) -> float:
        return (self.start_ticks + self.frag.duration_ticks) / self.frag.timescale

    def episode_meta(self, key: str) -> dict[str, Any]:
        return {
            f"videos/{key}/chunk_index": self.chunk_index,
            f"videos/{key}/file_index": self.file_index,
            f"videos/{key}/from_timestamp": self.from_s,
            f"videos/{key}/to_timestamp": self.to_s,
        }

    def write(self) -> None:
        if self.append:
            # fragment numbers only need to grow: number them by frame
            fmp4_append(self.path, self.frag, self.start_ticks, 1 + round(self.from_s * self.fps))
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fmp4_write_new(self.path, self.frag)


# -- what a commit keeps in memory between episodes ------------------------------------------------
@dataclass
class _State:
    """The end of the dataset and its running totals: constant size, whatever the episode count."""

    info: dict[str, Any]
    tail: Tail
    stats: dict[str, dict[str, Any]] | None
    tasks: dict[str, int]
    caps: Caps
    hf_features: Any
    features: dict[str, dict[str, Any]]
    moov_keys: dict[str, bytes] = field(default_factory=dict)
    episodes_table: Any = None  # the current meta/episodes file's rows (Arrow, at most 100)
    data_schema_ok: dict[Path, bool] = field(default_factory=dict)  # the current data file only

    def current_episodes_table(self, root: Path, target: tuple[int, int]) -> Any:
        """Rows already in the meta/episodes file ``target``, read once per process."""
        if self.episodes_table is None:
            import pyarrow.parquet as pq

            self.episodes_table = pq.read_table(
                root / EPISODES_PATH.format(chunk_index=target[0], file_index=target[1])
            )
        return self.episodes_table


def _episode_tag(meta: dict[str, Any], episode_index: int) -> EpisodeTag:
    """The staged episode's tag, with its index here and the recording uid that outlives it."""
    tag_data = dict(meta["tag"])
    tag_data["episode_index"] = episode_index
    if isinstance(meta.get("episode"), int):
        tag_data["episode_number"] = meta["episode"]
    # an episode copied from another dataset (repack) keeps the uid it was recorded under
    tag_data["source"] = {"recording_uid": meta["uid"], **(tag_data.get("source") or {})}
    # which bench recorded it: one daemon per bench, so the host, unless SO101D_BENCH names it
    # (two virtual benches on one machine, a bench moved to another PC)
    tag_data["bench"] = tag_data.get("bench") or os.environ.get("SO101D_BENCH") or socket.gethostname()
    known = {k: v for k, v in tag_data.items() if k in EpisodeTag.__dataclass_fields__}
    return EpisodeTag(**known)


def _episode_stats(buf: dict[str, Any], features: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from lerobot.datasets.compute_stats import compute_episode_stats

    non_video = {k: v for k, v in features.items() if v["dtype"] not in ("video", "image")}
    return compute_episode_stats({k: v for k, v in buf.items() if k in non_video}, non_video)


def _aggregate(stats: dict[str, Any] | None, ep_stats: dict[str, Any]) -> dict[str, Any]:
    from lerobot.datasets.compute_stats import aggregate_stats

    return aggregate_stats([stats, ep_stats]) if stats is not None else ep_stats


def _serialize_stats(stats: dict[str, Any] | None) -> dict[str, Any]:
    from lerobot.datasets.utils import serialize_dict

    return serialize_dict(stats or {})


def _write_tasks(root: Path, tasks: dict[str, int]) -> None:
    """meta/tasks.parquet as LeRobot writes it (pandas, task as index), replaced atomically."""
    import pandas as pd

    df = pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name="task"))
    path = root / "meta" / "tasks.parquet"
    tmp = path.with_name(path.name + ".tmp")
    df.to_parquet(tmp)
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _data_table(buf: dict[str, Any], hf_features: Any) -> Any:
    """The episode's rows as LeRobot's _save_episode_data encodes them: the same Arrow schema,
    Hugging Face features metadata included (what datasets.Dataset.from_dict(...).with_format
    ("arrow") gives, without its per-call fingerprint hashing)."""
    import pyarrow as pa

    schema = hf_features.arrow_schema
    cols = []
    for fld in schema:
        v = buf[fld.name]
        if getattr(v, "ndim", 1) == 2:
            cols.append(
                pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1), type=fld.type.value_type), v.shape[1])
            )
        else:
            cols.append(pa.array(v, type=fld.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _episodes_table(rows: list[dict[str, Any]]) -> Any:
    """meta/episodes rows as LeRobot's _flush_metadata_buffer encodes them (pa.Table.from_pydict)."""
    import pyarrow as pa

    columns: dict[str, list[Any]] = {k: [] for k in rows[0]}
    for row in rows:
        for k, v in row.items():
            columns[k].append(v.tolist() if isinstance(v, np.ndarray) else v)
    return pa.Table.from_pydict(columns)


def _cast_like(table: Any, like: Any) -> Any:
    """``table`` with ``like``'s schema (same columns, same order), or None if it cannot be."""
    if table.schema.names != like.schema.names:
        return None
    try:
        return table.cast(like.schema)
    except Exception:
        return None


def _write_beside_and_swap(path: Path, table: Any) -> None:
    """The whole (small) file written beside, made durable, then swapped in by rename."""
    tmp = path.with_name(path.name + ".tmp")
    write_parquet(tmp, table)
    os.replace(tmp, path)  # its folder is synced before the commit point


def _same_schema(path: Path, table: Any, state: _State) -> bool:
    """May the rows be appended to ``path``? (its schema read once per file and process)"""
    import pyarrow.parquet as pq

    if state.data_schema_ok.get(path) is None:
        try:
            state.data_schema_ok = {path: pq.read_schema(path).equals(table.schema)}
        except Exception:
            state.data_schema_ok = {path: False}
    return state.data_schema_ok[path]
