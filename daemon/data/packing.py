"""LeRobot v3.0's packed layout: which file the next episode goes into, and where it ends.

Mirrors ``lerobot/datasets/dataset_writer.py`` (``_save_episode_data``, ``_save_episode_video``)
and ``dataset_metadata.py`` (``_save_episode_metadata``) of lerobot 0.6.1:

- data: the episode's rows go into the current ``data/chunk-XXX/file-YYY.parquet`` unless
  ``size + size_per_frame * frames >= data_files_size_in_mb`` (size per frame averaged over the
  file), then into the next file;
- video, per camera: the current ``videos/<key>/chunk-XXX/file-YYY.mp4`` unless
  ``size + episode_size >= video_files_size_in_mb``; the episode's ``from_timestamp`` is where
  the file ended, ``to_timestamp`` that plus the episode's duration;
- meta/episodes: one row per episode, same size cap as data (we average per row; LeRobot divides
  by the episode index), and at most EPISODES_ROWS_PER_FILE rows per file: its rows are rewritten
  whole at each commit, and LeRobot itself starts a new one each recording session, so its
  loaders expect several;
- "next file": ``file_index + 1``, or ``chunk_index + 1`` and file 0 past ``chunks_size`` files
  (``utils.update_chunk_file_indices``).

Unlike LeRobot we never start a new file just because a new process resumes the dataset: the
current file is extended (see store.py's design note on why that is atomic). A file we cannot
extend (a plain MP4 from LeRobot's own writer, a parquet file with another schema) is closed: the
episode goes into the next file, as LeRobot's rollover would put it.

``Tail`` is everything a commit needs to know about the end of the dataset, kept in memory between
commits and read back from disk in O(1) (the last row of the last meta/episodes file, the info
and stats files) when another process appended in between.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
BYTES_PER_MB = 1024**2  # LeRobot's io_utils.get_file_size_in_mb
# A meta/episodes row has ~120 columns (per-feature stats); such a file is rewritten whole at each
# commit, so it is closed after this many rows (LeRobot itself starts a new one per session).
EPISODES_ROWS_PER_FILE = 100


@dataclass(frozen=True)
class Caps:
    """LeRobot's size targets (info.json: chunks_size, data/video_files_size_in_mb)."""

    chunks_size: int
    data_files_size_in_mb: float
    video_files_size_in_mb: float

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> Caps:
        return cls(
            int(info["chunks_size"]), float(info["data_files_size_in_mb"]), float(info["video_files_size_in_mb"])
        )


def next_file(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """lerobot.datasets.utils.update_chunk_file_indices."""
    if file_index == chunks_size - 1:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1


def data_needs_new_file(size_bytes: int, frames_in_file: int, episode_frames: int, cap_mb: float) -> bool:
    """dataset_writer._save_episode_data's rollover test."""
    size_mb = size_bytes / BYTES_PER_MB
    per_frame_mb = size_mb / frames_in_file if frames_in_file > 0 else 0.0
    return size_mb + per_frame_mb * episode_frames >= cap_mb


def video_needs_new_file(size_bytes: int, episode_bytes: int, cap_mb: float) -> bool:
    """dataset_writer._save_episode_video's rollover test."""
    return (size_bytes + episode_bytes) / BYTES_PER_MB >= cap_mb


def episodes_needs_new_file(size_bytes: int, rows_in_file: int, cap_mb: float) -> bool:
    """dataset_metadata._save_episode_metadata's rollover test (per row of this file)."""
    size_mb = size_bytes / BYTES_PER_MB
    per_row_mb = size_mb / rows_in_file if rows_in_file > 0 else 0.0
    return size_mb + per_row_mb >= cap_mb


@dataclass
class VideoEnd:
    chunk_index: int
    file_index: int
    end_s: float  # where the file ends: the next episode's from_timestamp
    appendable: bool | None = None  # None: not checked yet in this process


@dataclass
class Tail:
    """The end of the dataset: where the next episode goes."""

    total_episodes: int = 0
    total_frames: int = 0
    data: tuple[int, int] | None = None  # (chunk, file) of the last episode's rows
    data_frames_in_file: int = 0
    episodes: tuple[int, int] | None = None
    episodes_rows_in_file: int = 0
    videos: dict[str, VideoEnd] = field(default_factory=dict)
    info_stamp: tuple[int, int] = (0, 0)  # (mtime_ns, size) of info.json when this was read


def info_stamp(root: Path) -> tuple[int, int]:
    st = (root / "meta" / "info.json").stat()
    return (st.st_mtime_ns, st.st_size)


def last_episodes_file(root: Path) -> Path | None:
    chunks = sorted((root / "meta" / "episodes").glob("chunk-*"))
    for chunk in reversed(chunks):
        files = sorted(chunk.glob("file-*.parquet"))
        if files:
            return files[-1]
    return None


def _indices(path: Path) -> tuple[int, int]:
    return int(path.parent.name.split("-")[1]), int(path.stem.split("-")[1])


def read_tail(root: Path, video_keys: list[str]) -> Tail:
    """The dataset's end from disk: reads info.json and the last meta/episodes row only."""
    import pyarrow.parquet as pq

    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    tail = Tail(
        total_episodes=int(info.get("total_episodes", 0)),
        total_frames=int(info.get("total_frames", 0)),
        info_stamp=info_stamp(root),
    )
    if tail.total_episodes == 0:
        return tail
    ep_file = last_episodes_file(root)
    if ep_file is None:
        raise ValueError(f"{root}: info.json counts {tail.total_episodes} episodes but meta/episodes is empty")
    pf = pq.ParquetFile(ep_file)
    last = None
    if pf.num_row_groups:
        group = pf.read_row_group(pf.num_row_groups - 1)
        last = group.slice(group.num_rows - 1).to_pylist()[0] if group.num_rows else None
    if last is None or int(last["episode_index"]) != tail.total_episodes - 1:
        raise ValueError(
            f"{root}: the last row of {ep_file.relative_to(root)} is not episode "
            f"{tail.total_episodes - 1} (info.json and meta/episodes disagree)"
        )
    tail.episodes = _indices(ep_file)
    tail.episodes_rows_in_file = pf.metadata.num_rows
    tail.data = (int(last["data/chunk_index"]), int(last["data/file_index"]))
    data_file = root / DATA_PATH.format(chunk_index=tail.data[0], file_index=tail.data[1])
    tail.data_frames_in_file = pq.read_metadata(data_file).num_rows
    for key in video_keys:
        tail.videos[key] = VideoEnd(
            int(last[f"videos/{key}/chunk_index"]),
            int(last[f"videos/{key}/file_index"]),
            float(last[f"videos/{key}/to_timestamp"]),
        )
    return tail
