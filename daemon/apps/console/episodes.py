"""The dataset's episodes for the console page: the list with tags, one episode's joints, its videos.

Read from the LeRobot v3.0 files on disk (the console runs beside the daemon; the dataset path
comes from the daemon's ``status``): ``meta/info.json``, ``meta/episodes/*/*.parquet`` (one row per
episode: length, tasks, where its data rows and video span are), ``data/*/*.parquet`` and
``meta/so101d_episodes.jsonl`` (our tags; a replayed episode's also say which episode it
replayed and how well the arm followed). Nothing here writes. A video of a packed dataset holds
several episodes; the page plays the span ``from_timestamp`` .. ``to_timestamp`` of the file.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from daemon.data.schema import ACTION_KEY, IMAGE_KEY_PREFIX, STATE_KEY, EpisodeTag, read_episode_tags

DATA_PATH = "data/chunk-{chunk:03d}/file-{file:03d}.parquet"
VIDEO_PATH = "videos/{key}/chunk-{chunk:03d}/file-{file:03d}.mp4"


class EpisodeNotFound(LookupError):
    pass


def _episode_rows(root: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for f in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        cols = [c for c in pq.read_schema(f).names if not c.startswith("stats/")]
        rows.extend(pq.read_table(f, columns=cols).to_pylist())
    rows.sort(key=lambda r: int(r["episode_index"]))
    return rows


def _info(root: Path) -> dict[str, Any]:
    path = root / "meta" / "info.json"
    if not path.exists():
        raise FileNotFoundError(f"{root} has no meta/info.json yet (no episode saved?)")
    info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return info


def camera_keys(info: dict[str, Any]) -> list[str]:
    return sorted(k for k, f in info.get("features", {}).items() if f.get("dtype") == "video")


def list_episodes(root: str | Path) -> dict[str, Any]:
    """Every saved episode with its tags, newest last."""
    root = Path(root)
    info = _info(root)
    tags = read_episode_tags(root)
    index_of_uid = {t.uid: i for i, t in tags.items() if t.uid}
    out = []
    for r in _episode_rows(root):
        i = int(r["episode_index"])
        tag = tags.get(i)
        out.append(
            {
                "episode_index": i,
                "length": int(r["length"]),
                "tasks": list(r.get("tasks") or []),
                "tag": asdict(tag) if tag is not None else None,
                **(replay_of(tag, index_of_uid) if tag is not None and tag.origin == "replay" else {}),
            }
        )
    return {
        "root": str(root),
        "repo_id": _repo_id(root),
        "fps": int(info.get("fps", 30)),
        "cameras": camera_keys(info),
        "episodes": out,
    }


def replay_of(tag: EpisodeTag, index_of_uid: dict[str, int]) -> dict[str, Any]:
    """What a replayed episode's tag notes say (daemon/service/attach_replay.py writes them):
    ``replay_of``, the index of the episode it replayed in this dataset (found by its recording
    uid, so an edit that renumbered the episodes does not mislead; None: not in this dataset),
    ``replay_note``, that note as written, and ``tracking``, the report's one-line summary."""
    source = next((n for n in tag.notes if n.startswith("replay_of=")), "")
    uid = source.removeprefix("replay_of=").split(" ", 1)[0]
    return {
        "replay_of": index_of_uid.get(uid) if uid and uid != "untagged" else None,
        "replay_note": source,
        "tracking": next((n for n in tag.notes if "tracking p99" in n), ""),
    }


def _repo_id(root: Path) -> str:
    # <dataset_root>/<owner>/<name>: the last two parts (what LeRobot names a local dataset)
    return f"{root.parent.name}/{root.name}"


def viz_command(root: str | Path, episode_index: int) -> str:
    """One line that opens the episode in LeRobot's own viewer (``lerobot-dataset-viz``)."""
    root = Path(root)
    return (
        f"HF_HUB_OFFLINE=1 lerobot-dataset-viz --repo-id {_repo_id(root)} --root {root} --episode-index {episode_index}"
    )


def episode_detail(root: str | Path, episode_index: int) -> dict[str, Any]:
    """One episode: its joints per frame (state, action) and where each camera's span is."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = Path(root)
    info = _info(root)
    row = next((r for r in _episode_rows(root) if int(r["episode_index"]) == episode_index), None)
    if row is None:
        raise EpisodeNotFound(f"no episode {episode_index} in {root}")
    data_file = root / DATA_PATH.format(chunk=int(row["data/chunk_index"]), file=int(row["data/file_index"]))
    table = pq.read_table(data_file, columns=["episode_index", "timestamp", STATE_KEY, ACTION_KEY])
    table = table.filter(pc.equal(table["episode_index"], episode_index))
    videos = {}
    for key in camera_keys(info):
        videos[key.removeprefix(IMAGE_KEY_PREFIX)] = {
            "url": f"/dataset/{VIDEO_PATH.format(key=key, chunk=int(row[f'videos/{key}/chunk_index']), file=int(row[f'videos/{key}/file_index']))}",
            "from_s": float(row[f"videos/{key}/from_timestamp"]),
            "to_s": float(row[f"videos/{key}/to_timestamp"]),
        }
    tag = read_episode_tags(root).get(episode_index)
    return {
        "episode_index": episode_index,
        "fps": int(info.get("fps", 30)),
        "length": int(row["length"]),
        "tasks": list(row.get("tasks") or []),
        "names": list(info["features"][STATE_KEY].get("names") or []),
        "timestamp": table["timestamp"].to_pylist(),
        "state": table[STATE_KEY].to_pylist(),
        "action": table[ACTION_KEY].to_pylist(),
        "videos": videos,
        "tag": asdict(tag) if tag is not None else None,
        "viz_command": viz_command(root, episode_index),
    }


def dataset_file(root: str | Path, relative: str) -> Path:
    """A file under the dataset's videos/ folder, refusing any path that leaves it."""
    base = (Path(root) / "videos").resolve()
    path = (Path(root) / relative).resolve()
    if not path.is_relative_to(base) or path.suffix != ".mp4":
        raise PermissionError(f"{relative!r} is not a video of this dataset")
    if not path.is_file():
        raise FileNotFoundError(f"no video {relative!r} in this dataset")
    return path
