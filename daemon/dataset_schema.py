"""The one dataset schema every episode uses, whatever drove the follower.

Real (STS3215), emulated, simulated (MuJoCo, LeIsaac), imported (Isaac Lab HDF5) and
policy-driven episodes all land in one LeRobot v3.0 dataset with these keys, this joint order and
these units (LeRobot 0.6.1 SO follower units: body joints in degrees, gripper 0..100 with
0 closed). That sameness is what makes sim + real co-training work.

Features:
- ``observation.state``  the follower's *measured* joint positions at the frame time.
- ``action``             the command actually sent to the follower, after the safety layer
                         (step limit, joint limits, alignment). This is what a policy learns.
- ``teleop.action``      the leader's raw command (or the policy's raw output) before safety.
                         Identical to ``action`` whenever safety did not intervene.
- ``observation.images.<camera>``  video, one per configured camera.

Per-episode facts LeRobot's episode table has no column for (success, origin, timing quality)
go in a sidecar JSON-lines file, ``meta/so101d_episodes.jsonl``, one object per saved episode,
keyed by ``episode_index`` (see ``EpisodeTag``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from calibration.conventions import FEATURE_NAMES

ROBOT_TYPE = "so101_follower"
DEFAULT_FPS = 30
STATE_KEY = "observation.state"
ACTION_KEY = "action"
TELEOP_ACTION_KEY = "teleop.action"
IMAGE_KEY_PREFIX = "observation.images."
EPISODE_TAGS_FILE = "meta/so101d_episodes.jsonl"


def joint_feature() -> dict[str, Any]:
    return {"dtype": "float32", "shape": (len(FEATURE_NAMES),), "names": list(FEATURE_NAMES)}


def camera_feature(height: int, width: int) -> dict[str, Any]:
    return {"dtype": "video", "shape": (height, width, 3), "names": ["height", "width", "channels"]}


def dataset_features(cameras: dict[str, tuple[int, int]]) -> dict[str, dict[str, Any]]:
    """LeRobot feature dict for the given cameras ({name: (height, width)})."""
    features: dict[str, dict[str, Any]] = {
        STATE_KEY: joint_feature(),
        ACTION_KEY: joint_feature(),
        TELEOP_ACTION_KEY: joint_feature(),
    }
    for name, (height, width) in sorted(cameras.items()):
        features[IMAGE_KEY_PREFIX + name] = camera_feature(height, width)
    return features


def feature_differences(expected: dict[str, dict[str, Any]], actual: dict[str, dict[str, Any]]) -> list[str]:
    """Readable list of differences between the configured features (``expected``) and a
    dataset's (``actual``); LeRobot's auto-added keys are ignored."""
    auto = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
    diffs: list[str] = []
    for key in sorted(set(expected) | set(actual)):
        if key in auto:
            continue
        if key not in actual:
            diffs.append(f"feature {key!r} is configured but not in the dataset")
            continue
        if key not in expected:
            diffs.append(f"feature {key!r} is in the dataset but not configured")
            continue
        e, a = expected[key], actual[key]
        for attr in ("dtype", "shape", "names"):
            ev, av = e.get(attr), a.get(attr)
            if attr == "shape":
                ev, av = tuple(ev or ()), tuple(av or ())
            if ev != av and not (attr == "names" and key.startswith(IMAGE_KEY_PREFIX)):
                diffs.append(f"{key}: {attr} {av!r} in the dataset, {ev!r} configured")
    return diffs


@dataclass
class EpisodeTag:
    """What we know about one saved episode beyond LeRobot's own tables."""

    episode_index: int
    success: bool | None = None  # None: not judged
    origin: str = "teleop"  # teleop | policy | import
    follower_kind: str = "feetech"  # feetech | emulated | sim-mujoco | sim-leisaac | hdf5
    source: dict[str, Any] = field(default_factory=dict)  # e.g. {"file": ..., "demo": ..., "generated": true}
    frames: int = 0
    late_frames: int = 0
    missing_frames: int = 0
    worst_camera_skew_ms: float = 0.0
    notes: list[str] = field(default_factory=list)  # e.g. "sim went stale at frame 120"


def append_episode_tag(root: Path, tag: EpisodeTag) -> None:
    """Append one tag line durably (fsync), so a crash right after a save keeps it."""
    path = Path(root) / EPISODE_TAGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(asdict(tag), sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_episode_tags(root: Path) -> dict[int, EpisodeTag]:
    """All tags by episode index; a torn last line (crash mid-write) is skipped, later lines win."""
    path = Path(root) / EPISODE_TAGS_FILE
    tags: dict[int, EpisodeTag] = {}
    if not path.exists():
        return tags
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
            tags[int(data["episode_index"])] = EpisodeTag(**data)
        except (ValueError, KeyError, TypeError):
            continue
    return tags
