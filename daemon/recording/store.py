"""The dataset on disk: staged episodes, transactional commits into LeRobot v3.0, crash repair.

LeRobot 0.6.1 keeps its parquet writers open until ``finalize()``; a process killed before that
leaves ``meta/episodes`` unwritten and the whole dataset unloadable (LR#2495, LR#3522). We never
keep a LeRobotDataset open across episodes. Each episode goes through two durable steps:

1. **staged**: while recording, the writer process encodes each camera straight into
   ``<staging>/ep-<uid>/<camera>/video.mp4`` and, at save, writes the table rows (``rows.npz``),
   per-frame timing and ``episode.json`` last (atomic rename: the episode is complete only once
   that file exists).
2. **committed**: ``commit()`` writes a marker with the list of dataset files before the commit
   and a backup of the three files LeRobot rewrites in place (info.json, stats.json,
   tasks.parquet), then ``LeRobotDataset.resume(...)`` (``create`` for the first episode),
   ``save_episode(episode_data=...)``, ``finalize()``, appends the EpisodeTag, and removes the
   marker: that removal is the commit point. After ``resume`` LeRobot writes every episode into
   new data, video and meta/episodes files, so a commit never rewrites an older episode's files.

``repair()`` (every start): a marker left behind means a commit was torn -> delete every dataset
file that was not there before, restore the backups, drop tags past the restored episode count.
Then complete staged episodes not yet committed are committed (a kill right after a save loses
nothing), incomplete ones (the episode in progress) are deleted.

The staging folder is a hidden sibling of the dataset (``.<name>.so101d-staging``): LeRobot's
``create`` refuses an existing root, and the same filesystem keeps the moves atomic.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from daemon.dataset_schema import (
    ACTION_KEY,
    EPISODE_TAGS_FILE,
    IMAGE_KEY_PREFIX,
    ROBOT_TYPE,
    STATE_KEY,
    TELEOP_ACTION_KEY,
    EpisodeTag,
    append_episode_tag,
    dataset_features,
    feature_differences,
    read_episode_tags,
)

from daemon.recording.fmp4 import append as fmp4_append
from daemon.recording.fmp4 import fragment_episode, read_moov_key
from daemon.recording.fmp4 import truncate as fmp4_truncate
from daemon.recording.fmp4 import write_new as fmp4_write_new
from daemon.recording.packing import (
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
from daemon.recording.parquet_append import ParquetTail, append_row_group
from daemon.recording.parquet_append import read_tail as read_parquet_tail
from daemon.recording.parquet_append import restore_tail as restore_parquet_tail
from daemon.recording.parquet_append import write_new as write_parquet

log = logging.getLogger("so101d.recording.store")

MARKER = "commit.json"
TIMING_DIR = "meta/so101d_timing"
# Files LeRobot rewrites in place on every save; everything else a commit writes is new.
REWRITTEN_IN_PLACE = ("meta/info.json", "meta/stats.json", "meta/tasks.parquet")


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
    robot_type: str = ROBOT_TYPE
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

    @property
    def root_path(self) -> Path:
        return Path(self.root).expanduser().resolve()

    def features(self) -> dict[str, dict[str, Any]]:
        return dataset_features({name: (h, w) for name, h, w in self.cameras})

    def video_keys(self) -> list[str]:
        return [IMAGE_KEY_PREFIX + name for name, _, _ in self.cameras]


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
    diffs = feature_differences(cfg.features(), info.get("features", {}))
    if int(info.get("fps", -1)) != int(cfg.fps):
        diffs.append(f"fps {info.get('fps')!r} in the dataset, {cfg.fps!r} configured")
    if info.get("robot_type") not in (cfg.robot_type, None):
        diffs.append(f"robot_type {info.get('robot_type')!r} in the dataset, {cfg.robot_type!r} configured")
    return diffs


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


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
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
                "stop its recording first, or write to another dataset") from None
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
            raise DatasetMismatchError(
                f"dataset {self.root} does not match the configuration: " + "; ".join(diffs))

    def total_episodes(self) -> int:
        info_path = self.root / "meta" / "info.json"
        if not info_path.exists():
            return 0
        return int(json.loads(info_path.read_text()).get("total_episodes", 0))

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
        tags = read_episode_tags(self.root)
        committed_uids = {t.source.get("recording_uid") for t in tags.values()}
        for d in sorted(self.staging.glob("ep-*")):
            if not (d / "episode.json").exists():
                shutil.rmtree(d, ignore_errors=True)
                notes.append(f"dropped incomplete episode {d.name} (recording was interrupted)")
            elif json.loads((d / "episode.json").read_text()).get("uid") in committed_uids:
                shutil.rmtree(d, ignore_errors=True)  # committed, crash before the clean-up
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
            kept = [t for i, t in sorted(read_episode_tags(self.root).items()) if i < total]
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
        existed = (self.root / "meta" / "info.json").exists()
        if existed:
            self.check_compatible()
        journal = _Journal(self.staging / MARKER, self.root, [stage.name for stage in stages])
        journal.begin(created=not existed)
        if not existed:
            self._create()
            self._state = None
        state = self._load_state()
        indices = []
        for stage, meta in zip(stages, metas):
            indices.append(self._append(state, journal, stage, meta))
        # totals last: a reader that sees them sees every file they count
        write_json_atomic(self.root / "meta" / "stats.json", _serialize_stats(state.stats))
        state.info["total_episodes"] = state.tail.total_episodes
        state.info["total_frames"] = state.tail.total_frames
        state.info["total_tasks"] = len(state.tasks)
        state.info["splits"] = {"train": f"0:{state.tail.total_episodes}"}
        write_json_atomic(self.root / "meta" / "info.json", state.info)
        state.tail.info_stamp = info_stamp(self.root)
        for stage, meta, episode_index in zip(stages, metas, indices):
            tag_data = dict(meta["tag"])
            tag_data["episode_index"] = episode_index
            tag_data.setdefault("source", {})["recording_uid"] = meta["uid"]
            append_episode_tag(self.root, EpisodeTag(**tag_data))
        journal.commit()  # commit point: the journal is gone
        commit_s = round(time.monotonic() - t0, 3)
        for stage in stages:
            shutil.rmtree(stage, ignore_errors=True)
        return [{"episode_index": i, "frames": int(m["frames"]), "commit_s": commit_s, "uid": m["uid"]}
                for i, m in zip(indices, metas)]

    def _create(self) -> None:
        """A new dataset: LeRobot's own info.json (no episodes yet), with our size targets."""
        from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

        LeRobotDatasetMetadata.create(
            self.cfg.repo_id, fps=self.cfg.fps, features=self.cfg.features(), robot_type=self.cfg.robot_type,
            root=self.root, use_videos=True, chunks_size=self.cfg.chunks_size,
            data_files_size_in_mb=self.cfg.data_files_size_in_mb,
            video_files_size_in_mb=self.cfg.video_files_size_in_mb)

    def _load_state(self) -> "_State":
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
        self._state = _State(info=info, tail=tail, stats=stats, tasks=tasks,
                             caps=Caps.from_info(info), hf_features=get_hf_features_from_features(features),
                             features=features)
        return self._state

    def _append(self, state: "_State", journal: "_Journal", stage: Path, meta: dict[str, Any]) -> int:
        """Append one staged episode's rows, videos, stats and metadata row to the packed files."""
        import numpy as np

        tail, caps = state.tail, state.caps
        n = int(meta["frames"])
        episode_index = tail.total_episodes
        task = meta["task"]
        if task not in state.tasks:
            journal.backup(self.root / "meta" / "tasks.parquet")
            state.tasks[task] = len(state.tasks)
            _write_tasks(self.root, state.tasks)
        with np.load(stage / "rows.npz", allow_pickle=False) as rows:
            buf: dict[str, Any] = {
                STATE_KEY: np.asarray(rows["state"], np.float32),
                ACTION_KEY: np.asarray(rows["action"], np.float32),
                TELEOP_ACTION_KEY: np.asarray(rows["teleop"], np.float32),
            }
        # the columns LeRobot's save_episode adds (dataset_writer.save_episode)
        buf["timestamp"] = (np.arange(n) / self.cfg.fps).astype(np.float32)
        buf["frame_index"] = np.arange(n)
        buf["episode_index"] = np.full((n,), episode_index)
        buf["index"] = np.arange(tail.total_frames, tail.total_frames + n)
        buf["task_index"] = np.full((n,), state.tasks[task])
        ep_stats = _episode_stats(buf, state.features)

        # data rows
        table = _data_table(buf, state.hf_features)
        ep_meta: dict[str, Any] = {}
        target = tail.data
        if target is not None:
            path = self.root / DATA_PATH.format(chunk_index=target[0], file_index=target[1])
            if (data_needs_new_file(path.stat().st_size, tail.data_frames_in_file, n, caps.data_files_size_in_mb)
                    or not _same_schema(path, table)):
                target = next_file(*target, caps.chunks_size)
                tail.data_frames_in_file = 0
        else:
            target = (0, 0)
        path = self.root / DATA_PATH.format(chunk_index=target[0], file_index=target[1])
        self._write_parquet(journal, path, table, f"episode {episode_index}")
        tail.data = target
        tail.data_frames_in_file += n
        ep_meta.update({"data/chunk_index": target[0], "data/file_index": target[1],
                        "dataset_from_index": tail.total_frames, "dataset_to_index": tail.total_frames + n})

        # videos, one packed file per camera
        for name, _, _ in self.cfg.cameras:
            key = IMAGE_KEY_PREFIX + name
            ep_meta.update(self._append_video(state, journal, key, stage / name / "video.mp4", n, episode_index))
            stats = meta["video_stats"].get(name)
            if stats:  # dataset_writer.save_episode: per channel, scaled to [0, 1]
                ep_stats[key] = {k: np.asarray(v) if k == "count"
                                 else np.squeeze(np.asarray(v).reshape(1, -1, 1, 1) / 255.0, axis=0)
                                 for k, v in stats.items()}
        if episode_index == 0:
            self._video_info(state)

        # meta/episodes row
        from lerobot.utils.utils import flatten_dict

        row: dict[str, Any] = {"episode_index": episode_index, "tasks": [task], "length": n}
        row.update(ep_meta)
        row.update(flatten_dict({"stats": ep_stats}))
        target = tail.episodes
        if target is not None:
            path = self.root / EPISODES_PATH.format(chunk_index=target[0], file_index=target[1])
            if (tail.episodes_rows_in_file >= EPISODES_ROWS_PER_FILE
                    or episodes_needs_new_file(path.stat().st_size, tail.episodes_rows_in_file,
                                               caps.data_files_size_in_mb)):
                target = next_file(*target, caps.chunks_size)
                tail.episodes_rows_in_file = 0
                state.episodes_rows = []
        else:
            target = (0, 0)
        row["meta/episodes/chunk_index"] = target[0]
        row["meta/episodes/file_index"] = target[1]
        rows = state.current_episode_rows(self.root, target) + [row]
        path = self.root / EPISODES_PATH.format(chunk_index=target[0], file_index=target[1])
        journal.replace(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_beside_and_swap(path, _episodes_table(rows))
        state.episodes_rows = rows
        tail.episodes = target
        tail.episodes_rows_in_file = len(rows)

        timing = self.root / TIMING_DIR / f"episode_{episode_index:06d}.npz"
        journal.touch_new(timing)
        timing.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stage / "timing.npz", timing)

        state.stats = _aggregate(state.stats, ep_stats)
        tail.total_episodes += 1
        tail.total_frames += n
        self._fault_point(episode_index)
        return episode_index

    def _write_parquet(self, journal: "_Journal", path: Path, table: Any, what: str) -> None:
        if path.exists():
            journal.touch_parquet(path)
            self._fault_point_rollover(None)
            append_row_group(path, table)
        else:
            journal.touch_new(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_parquet(path, table)
            self._fault_point_rollover(path)

    def _append_video(self, state: "_State", journal: "_Journal", key: str, src: Path, n: int,
                      episode_index: int) -> dict[str, Any]:
        tail, caps = state.tail, state.caps
        frag = fragment_episode(src)
        end = tail.videos.get(key)
        path = None
        if end is not None:
            path = self.root / VIDEO_PATH.format(video_key=key, chunk_index=end.chunk_index, file_index=end.file_index)
            if end.appendable is None:
                end.appendable = read_moov_key(path) == frag.moov_key
            if (not end.appendable or frag.moov_key != state.moov_keys.get(key, frag.moov_key)
                    or video_needs_new_file(path.stat().st_size, len(frag.fragments), caps.video_files_size_in_mb)):
                chunk, file = next_file(end.chunk_index, end.file_index, caps.chunks_size)
                end = VideoEnd(chunk, file, 0.0, appendable=True)
                path = None
        else:
            end = VideoEnd(0, 0, 0.0, appendable=True)
        target = self.root / VIDEO_PATH.format(video_key=key, chunk_index=end.chunk_index, file_index=end.file_index)
        start_ticks = round(end.end_s * frag.timescale)
        if path is None or not target.exists():
            journal.touch_new(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            start_ticks = 0
            fmp4_write_new(target, frag)
            self._fault_point_rollover(target)
        else:
            journal.touch_video(target)
            fmp4_append(target, frag, start_ticks, 1 + round(start_ticks * self.cfg.fps / frag.timescale))
        state.moov_keys[key] = frag.moov_key
        from_s = start_ticks / frag.timescale
        to_s = (start_ticks + frag.duration_ticks) / frag.timescale
        tail.videos[key] = VideoEnd(end.chunk_index, end.file_index, to_s, appendable=True)
        return {f"videos/{key}/chunk_index": end.chunk_index, f"videos/{key}/file_index": end.file_index,
                f"videos/{key}/from_timestamp": from_s, f"videos/{key}/to_timestamp": to_s}

    def _video_info(self, state: "_State") -> None:
        """info.json's per-camera video info, probed from the first file (as LeRobot does)."""
        from lerobot.configs.video import RGBEncoderConfig
        from lerobot.datasets.video_utils import get_video_info

        enc = RGBEncoderConfig(vcodec=self.cfg.vcodec, preset=self.cfg.preset, crf=self.cfg.crf, g=self.cfg.gop)
        for key in self.cfg.video_keys():
            path = self.root / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
            existing = state.info["features"][key].get("info") or {}
            state.info["features"][key]["info"] = {**existing, **get_video_info(path, video_encoder=enc)}

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
        if self.cfg.fault == "kill_in_rollover" and new_file is not None and self._state is not None \
                and self._state.tail.total_episodes > 0:
            os.kill(os.getpid(), 9)

    def rollback_if_torn(self) -> str | None:
        """After a failed commit in this process (e.g. disk full): undo it now."""
        marker = self.staging / MARKER
        if marker.exists():
            return self._rollback(marker)
        return None


# -- the journal: how a commit is undone ------------------------------------------------------------
class _Journal:
    """``commit.json`` in the staging folder: what a commit has touched, written BEFORE each touch.

    Entries: a new file (deleted on rollback), an extended MP4 (its committed length: truncated
    back to it), an extended parquet file (its committed length and footer, saved beside: the
    footer is put back), a small metadata file replaced whole (a copy, put back). Each is made
    durable before the file is touched, so whatever a crash leaves is covered.
    """

    def __init__(self, path: Path, root: Path, stages: list[str]) -> None:
        self.path = path
        self.root = root
        self.dir = path.parent / "journal"
        self.data: dict[str, Any] = {"version": 2, "stages": stages, "files": {}}

    def begin(self, created: bool) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.data["created"] = created
        tags = self.root / EPISODE_TAGS_FILE
        self.data["tags_length"] = tags.stat().st_size if tags.exists() else None
        if not created:
            for rel in ("meta/info.json", "meta/stats.json"):
                self._copy(self.root / rel, rel)
        self._write()

    def _copy(self, src: Path, rel: str) -> None:
        if src.exists():
            dst = self.dir / rel.replace("/", "__")
            shutil.copyfile(src, dst)
            _fsync_file(dst)
            self.data["files"][rel] = {"kind": "copy", "backup": dst.name}
        else:
            self.data["files"][rel] = {"kind": "new"}

    def _known(self, path: Path) -> str | None:
        rel = str(path.relative_to(self.root))
        return None if rel in self.data["files"] else rel

    def backup(self, path: Path) -> None:
        rel = self._known(path)
        if rel is not None and not self.data["created"]:
            self._copy(path, rel)
            self._write()

    def touch_new(self, path: Path) -> None:
        rel = self._known(path)
        if rel is not None and not self.data["created"]:
            self.data["files"][rel] = {"kind": "new"}
            self._write()

    def touch_video(self, path: Path) -> None:
        rel = self._known(path)
        if rel is not None and not self.data["created"]:
            self.data["files"][rel] = {"kind": "append", "length": path.stat().st_size}
            self._write()

    def replace(self, path: Path) -> None:
        """``path`` is about to be replaced whole: keep the old one (a hard link, O(1))."""
        rel = self._known(path)
        if rel is not None and not self.data["created"]:
            if path.exists():
                dst = self.dir / rel.replace("/", "__")
                os.link(path, dst)
                self.data["files"][rel] = {"kind": "replaced", "backup": dst.name}
            else:
                self.data["files"][rel] = {"kind": "new"}
            self._write()

    def touch_parquet(self, path: Path) -> None:
        rel = self._known(path)
        if rel is not None and not self.data["created"]:
            saved = read_parquet_tail(path)
            dst = self.dir / (rel.replace("/", "__") + ".tail")
            dst.write_bytes(saved.tail)
            _fsync_file(dst)
            self.data["files"][rel] = {"kind": "parquet", "length": saved.length, "data_end": saved.data_end,
                                       "tail": dst.name}
            self._write()

    def _write(self) -> None:
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
            if path.exists() and path.stat().st_size != entry["length"] or _tail_differs(path, tail):
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
    episodes_rows: list[dict[str, Any]] | None = None  # the current meta/episodes file's rows

    def current_episode_rows(self, root: Path, target: tuple[int, int]) -> list[dict[str, Any]]:
        """Rows already in the meta/episodes file ``target`` (at most EPISODES_ROWS_PER_FILE)."""
        if self.episodes_rows is None:
            path = root / EPISODES_PATH.format(chunk_index=target[0], file_index=target[1])
            if path.exists():
                import pyarrow.parquet as pq

                self.episodes_rows = pq.read_table(path).to_pylist()
            else:
                self.episodes_rows = []
        return list(self.episodes_rows)


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
    """The episode's rows as LeRobot's _save_episode_data encodes them (HF features schema)."""
    import datasets

    ep_dict = {key: buf[key] for key in hf_features}
    return datasets.Dataset.from_dict(ep_dict, features=hf_features, split="train").with_format("arrow")[:]


def _episodes_table(rows: list[dict[str, Any]]) -> Any:
    """meta/episodes rows as LeRobot's _flush_metadata_buffer encodes them (pa.Table.from_pydict)."""
    import numpy as np
    import pyarrow as pa

    columns: dict[str, list[Any]] = {k: [] for k in rows[0]}
    for row in rows:
        for k, v in row.items():
            columns[k].append(v.tolist() if isinstance(v, np.ndarray) else v)
    return pa.Table.from_pydict(columns)


def _write_beside_and_swap(path: Path, table: Any) -> None:
    """The whole (small) file written beside, made durable, then swapped in by rename."""
    tmp = path.with_name(path.name + ".tmp")
    write_parquet(tmp, table)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _same_schema(path: Path, table: Any) -> bool:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).equals(table.schema)
    except Exception:  # noqa: BLE001 - unreadable: never extend it
        return False
