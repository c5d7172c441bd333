"""One episode of a dataset at rest, read for replay on an arm, or refused before anything moves.

The episode's ``action`` (and, for a simulated or imported episode, its recorded
``observation.state``: the sim side of the sim-to-real comparison) come back as plain arrays; the
control layer's ``ReplaySource`` plays them. Refused, naming the mismatch: a folder that is not a
LeRobot v3.0 dataset, an episode index out of range, a two-arm (``left_``/``right_``) episode on
one arm, an action or state feature whose dtype, shape, joint names or joint order differ from the
follower's (``daemon.data.schema``: LeRobot SO follower units, body joints in degrees, gripper
0..100).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibration.conventions import FEATURE_NAMES
from daemon.data.schema import ACTION_KEY, STATE_KEY, EpisodeTag, read_episode_tags

# the robot_type a dataset of this arm carries: ours, LeRobot's for the SO-101 / SO-100 (lerobot-record
# and our plugin write "so_follower" or the model's own name); none written: not told, let through
SO_ROBOT_TYPES = frozenset({"so101_follower", "so100_follower", "so_follower", "so101", "so100"})
MAX_INFO_BYTES = 16 << 20  # a LeRobot info.json is some kilobytes; past this it is not one


class ReplayRefused(ValueError):
    """The episode cannot be replayed on this arm (the message names why)."""


@dataclass(frozen=True)
class ReplayEpisode:
    root: Path
    episode_index: int
    fps: float
    task: str
    actions_units: np.ndarray  # (n, 6)
    state_units: np.ndarray | None  # (n, 6) the recorded state, for a sim episode (else None)
    kind: str  # real | emulated | sim | generated (the tag's; "real" when untagged)
    uid: str  # the recording uid in its tag ("" when untagged)


def _feature_mismatch(key: str, feat: dict[str, object] | None, arm: str) -> str:
    want = list(FEATURE_NAMES)
    if feat is None:
        return f"the dataset has no {key!r} feature"
    names = list(feat.get("names") or [])  # type: ignore[call-overload]  # JSON list or None
    if names and all(str(n).startswith(("left_", "right_")) for n in names):
        return (
            f"{key!r} is a two-arm episode ({len(names)} joints, left_/right_) and this daemon drives one arm "
            f"({arm}): replay it on a bimanual bench"
        )
    if feat.get("dtype") not in ("float32", "float64"):
        return f"{key!r} dtype {feat.get('dtype')!r}, the follower's is 'float32'"
    shape = list(feat.get("shape") or [])  # type: ignore[call-overload]
    if shape != [len(want)]:
        return f"{key!r} shape {shape}, the follower's is [{len(want)}]"
    if names != want:
        if sorted(names) == sorted(want):
            return f"{key!r} joint order {names} differs from the follower's {want}"
        return f"{key!r} joints {names} differ from the follower's {want}"
    return ""


def load_replay_episode(root: Path, episode_index: int, arm: str = "follower") -> ReplayEpisode:
    """The episode's arrays, or ReplayRefused naming why not (nothing is read past the refusal).
    A damaged dataset (bad JSON, a truncated parquet, rows of another width) is refused too."""
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.exists():
        raise ReplayRefused(f"{root}: no LeRobot dataset here (meta/info.json missing)")
    try:
        return _load(root, info_path, episode_index, arm)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        if isinstance(exc, ReplayRefused):
            raise
        raise ReplayRefused(f"{root}: the dataset cannot be read: {type(exc).__name__}: {exc}") from None


def _regular(path: Path) -> Path:
    """``path`` if it is a regular file: a FIFO or a device would block the reader for ever."""
    if not path.is_file():
        raise ReplayRefused(f"{path} is not a regular file")
    return path


def _load(root: Path, info_path: Path, episode_index: int, arm: str) -> ReplayEpisode:
    import pyarrow.parquet as pq

    size = _regular(info_path).stat().st_size
    if size > MAX_INFO_BYTES:
        # a request names the folder: the daemon must not read a file of any size into memory
        raise ReplayRefused(f"{info_path} is {size} bytes, not a LeRobot info.json (at most {MAX_INFO_BYTES})")
    info = json.loads(info_path.read_text())
    if not isinstance(info, dict):
        raise ReplayRefused(f"{info_path}: not a JSON object")
    if not str(info.get("codebase_version", "")).startswith("v3"):
        raise ReplayRefused(f"{root}: LeRobot dataset {info.get('codebase_version')}, not v3.0")
    total = int(info.get("total_episodes", 0))
    if not 0 <= episode_index < total:
        last = f"0..{total - 1}" if total else "none"
        raise ReplayRefused(f"episode {episode_index} is out of range: {root} has {total} episodes ({last})")
    robot = info.get("robot_type")
    if robot and str(robot) not in SO_ROBOT_TYPES:
        # another arm's joints may share the names (Koch's do) and pass every feature check, but
        # its angles are other poses on this arm
        raise ReplayRefused(
            f"robot_type {robot!r} is not an SO-100/SO-101 follower ({', '.join(sorted(SO_ROBOT_TYPES))}): "
            "its joint angles mean other poses on this arm"
        )
    feats = info.get("features", {})
    for key in (ACTION_KEY, STATE_KEY):
        why = _feature_mismatch(key, feats.get(key), arm)
        if why:
            raise ReplayRefused(why)
    rows: list[np.ndarray] = []
    states: list[np.ndarray] = []
    for path in sorted((root / "data").glob("chunk-*/file-*.parquet")):
        t = pq.read_table(_regular(path), columns=["episode_index", "frame_index", ACTION_KEY, STATE_KEY])
        eps = t.column("episode_index").to_numpy()
        mask = eps == episode_index
        if not mask.any():
            continue
        t = t.filter(mask)
        order = np.argsort(t.column("frame_index").to_numpy(), kind="stable")
        rows.append(np.asarray(t.column(ACTION_KEY).to_pylist(), np.float64)[order])
        states.append(np.asarray(t.column(STATE_KEY).to_pylist(), np.float64)[order])
    if not rows:
        raise ReplayRefused(f"episode {episode_index} has no rows in {root}/data")
    actions, state = np.concatenate(rows), np.concatenate(states)
    for key, arr in ((ACTION_KEY, actions), (STATE_KEY, state)):
        if arr.ndim != 2 or arr.shape[1] != len(FEATURE_NAMES):
            raise ReplayRefused(
                f"episode {episode_index}: {key!r} rows are {arr.shape[1:]}, not {len(FEATURE_NAMES)} joints"
            )
    if not np.all(np.isfinite(actions)):
        bad = int(np.flatnonzero(~np.isfinite(actions).all(axis=1))[0])
        raise ReplayRefused(f"episode {episode_index}: action is NaN or infinite from frame {bad}")
    tag: EpisodeTag | None = read_episode_tags(root).get(episode_index)
    kind = tag.kind if tag is not None else "real"
    task = ""
    for mpath in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        mt = pq.read_table(_regular(mpath), columns=["episode_index", "tasks"])
        for ep, tasks in zip(mt.column("episode_index").to_pylist(), mt.column("tasks").to_pylist()):
            if int(ep) == episode_index:
                task = ", ".join(tasks or [])
    fps = float(info.get("fps") or 0)
    if not (math.isfinite(fps) and fps > 0):
        raise ReplayRefused(f"{info_path}: fps {info.get('fps')!r} is not a positive rate")
    return ReplayEpisode(
        root=root,
        episode_index=episode_index,
        fps=fps,
        task=task,
        actions_units=actions,
        state_units=state if kind in ("sim", "generated") else None,
        kind=kind,
        uid=tag.uid if tag is not None else "",
    )
