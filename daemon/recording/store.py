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


class _StagedVideos:
    """Stands in for LeRobot's StreamingVideoEncoder: the videos are already encoded.

    ``save_episode`` asks the streaming encoder for ``{video_key: (mp4_path, stats)}``; we hand
    it the staged files (hard links, so the staged copy survives until the commit completes).
    """

    def __init__(self) -> None:
        self.results: dict[str, tuple[Path, dict | None]] = {}

    def start_episode(self, *args: Any, **kwargs: Any) -> None:
        pass

    def feed_frame(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("so101d encodes videos itself; frames are not fed through LeRobot")

    def finish_episode(self) -> dict[str, tuple[Path, dict | None]]:
        results, self.results = self.results, {}
        return results

    def cancel_episode(self) -> None:
        self.results = {}

    def close(self) -> None:
        pass


def _abandon(ds: Any) -> None:
    """Close a dataset whose commit failed, and make sure LeRobot's __del__ never flushes it again.

    Whatever it writes now is removed by the rollback that follows."""
    try:
        ds.finalize()
    except BaseException:  # noqa: BLE001 - e.g. disk still full
        pass
    for part in (getattr(ds, "writer", None), getattr(ds, "meta", None)):
        if part is not None:
            part._finalized = True
            for attr in ("_pq_writer",):
                w = getattr(part, attr, None)
                if w is not None:
                    try:
                        w.close()
                    except BaseException:  # noqa: BLE001
                        pass
                    setattr(part, attr, None)
            if hasattr(part, "_metadata_buffer"):
                part._metadata_buffer = []


def _dataset_class() -> type:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    class StagedVideoDataset(LeRobotDataset):
        @staticmethod
        def _build_streaming_encoder(*args: Any, **kwargs: Any) -> _StagedVideos:  # type: ignore[override]
            return _StagedVideos()

    return StagedVideoDataset


class DatasetStore:
    """Commits staged episodes into one LeRobot v3.0 dataset, one transaction each."""

    def __init__(self, cfg: StoreConfig) -> None:
        self.cfg = cfg
        self.root = cfg.root_path
        self.staging = staging_dir(self.root)
        self.staging.mkdir(parents=True, exist_ok=True)
        self._cls: type | None = None
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
        data = json.loads(marker.read_text())
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

        LeRobot's ``resume`` re-reads every episode's metadata and each resumed session writes new
        files, so a commit costs more the bigger the dataset: bulk writers (the HDF5 import) commit
        in batches. Commits are serialised across processes (the daemon's writer and
        `so101d import-hdf5` may append to the same dataset) with an advisory lock.
        """
        with open(self.staging / "commit.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self._commit_locked(stages)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _commit_locked(self, stages: list[Path]) -> list[dict[str, Any]]:
        t0 = time.monotonic()
        metas = [json.loads((stage / "episode.json").read_text()) for stage in stages]
        rows = [np.load(stage / "rows.npz", allow_pickle=False) for stage in stages]
        for stage, meta in zip(stages, metas):
            if int(meta["frames"]) == 0:
                shutil.rmtree(stage, ignore_errors=True)
                raise ValueError(f"episode {stage.name} has no frames")
        existed = (self.root / "meta" / "info.json").exists()
        if existed:
            self.check_compatible()
        backup = self.staging / "backup"
        backup.mkdir(exist_ok=True)
        for rel in REWRITTEN_IN_PLACE:
            src = self.root / rel
            if src.exists():
                shutil.copy2(src, backup / src.name)
            elif (backup / src.name).exists():
                (backup / src.name).unlink()
        write_json_atomic(self.staging / MARKER, {
            "stages": [stage.name for stage in stages], "files_before": _list_files(self.root) if existed else None})

        links = [self.staging / f"links-{meta['uid']}" for meta in metas]
        videos: list[dict[str, tuple[Path, dict | None]]] = []
        for stage, meta, link_dir in zip(stages, metas, links):
            per_camera: dict[str, tuple[Path, dict | None]] = {}
            for name, _, _ in self.cfg.cameras:
                d = link_dir / name
                d.mkdir(parents=True, exist_ok=True)
                link = d / "video.mp4"
                if link.exists():
                    link.unlink()
                os.link(stage / name / "video.mp4", link)
                stats = meta["video_stats"].get(name)
                per_camera[IMAGE_KEY_PREFIX + name] = (
                    link, {k: np.asarray(v) for k, v in stats.items()} if stats else None)
            videos.append(per_camera)

        ds = None
        try:
            ds = self._open(existed)
            indices = [self._save(ds, meta, r, int(meta["frames"]), v) for meta, r, v in zip(metas, rows, videos)]
            ds.finalize()
        except BaseException:
            if ds is not None:
                _abandon(ds)
            raise
        finally:
            del ds  # nothing of a failed commit may be flushed later by LeRobot's __del__

        timing_dir = self.root / TIMING_DIR
        timing_dir.mkdir(parents=True, exist_ok=True)
        for stage, meta, episode_index in zip(stages, metas, indices):
            shutil.copy2(stage / "timing.npz", timing_dir / f"episode_{episode_index:06d}.npz")
            tag_data = dict(meta["tag"])
            tag_data["episode_index"] = episode_index
            tag_data.setdefault("source", {})["recording_uid"] = meta["uid"]
            append_episode_tag(self.root, EpisodeTag(**tag_data))
        (self.staging / MARKER).unlink()  # commit point
        _fsync_dir(self.staging)
        commit_s = round(time.monotonic() - t0, 3)
        for stage, link_dir in zip(stages, links):
            shutil.rmtree(link_dir, ignore_errors=True)
            shutil.rmtree(stage, ignore_errors=True)
        return [{"episode_index": i, "frames": int(m["frames"]), "commit_s": commit_s, "uid": m["uid"]}
                for i, m in zip(indices, metas)]

    def _save(self, ds: Any, meta: dict[str, Any], rows: Any, n: int,
              videos: dict[str, tuple[Path, dict | None]]) -> int:
        """Append one episode to an open dataset (the caller finalizes once for the batch)."""
        if videos:  # LeRobot only builds the (streaming) encoder when there are video keys
            ds.writer._streaming_encoder.results = videos
        episode_index = ds.meta.total_episodes
        buf: dict[str, Any] = {key: [] for key in ds.meta.features}
        buf.update({
            "size": n,
            "task": [meta["task"]] * n,
            "episode_index": episode_index,
            "frame_index": list(range(n)),
            "timestamp": [i / self.cfg.fps for i in range(n)],
            STATE_KEY: list(rows["state"]),
            ACTION_KEY: list(rows["action"]),
            TELEOP_ACTION_KEY: list(rows["teleop"]),
        })
        for key in self.cfg.video_keys():
            buf[key] = [None] * n
        ds.save_episode(episode_data=buf)
        self._fault_point(episode_index)
        return episode_index

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

    def _open(self, existed: bool) -> Any:
        from lerobot.configs.video import RGBEncoderConfig

        if self._cls is None:
            self._cls = _dataset_class()
        enc = RGBEncoderConfig(vcodec=self.cfg.vcodec, preset=self.cfg.preset, crf=self.cfg.crf, g=self.cfg.gop)
        streaming = bool(self.cfg.cameras)
        # The writer never decodes video: naming the decoder skips LeRobot's torchcodec probe, which
        # logs a long traceback per commit where torchcodec cannot load FFmpeg's libraries.
        if existed:
            return self._cls.resume(self.cfg.repo_id, root=self.root, rgb_encoder=enc, video_backend="pyav",
                                    streaming_encoding=streaming, encoder_threads=self.cfg.encoder_threads)
        return self._cls.create(self.cfg.repo_id, fps=self.cfg.fps, features=self.cfg.features(), root=self.root,
                                robot_type=self.cfg.robot_type, use_videos=True, rgb_encoder=enc, video_backend="pyav",
                                streaming_encoding=streaming, encoder_threads=self.cfg.encoder_threads)

    def rollback_if_torn(self) -> str | None:
        """After a failed commit in this process (e.g. disk full): undo it now."""
        marker = self.staging / MARKER
        if marker.exists():
            return self._rollback(marker)
        return None
