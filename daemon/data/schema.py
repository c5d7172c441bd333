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
- ``observation.images.<camera>_depth``  a RealSense camera's depth (``use_depth``): a video
                     feature of shape (H, W, 1) flagged ``info.is_depth_map`` and ``depth_unit``
                     "mm", 12-bit codes in HEVC as LeRobot 0.6.1 stores depth (DepthEncoderConfig);
                     LeRobotDataset decodes it back to millimetres.

- ``so101d.source``   who drove the arms at that frame: ``follower=leader``, ``follower=policy``
                     (``left=policy,right=leader`` on two arms); a per-frame string, like the
                     tag, so a correction handed from the policy to the operator and back inside
                     one episode can be found frame by frame.
- ``so101d.episode``  the episode's tag (``EpisodeTag`` as JSON, without its index), the same
                     string on every frame of the episode.

Per-episode facts LeRobot's episode table has no column for (success, origin, follower kind,
bench, timing quality) are an ``EpisodeTag``. Where they live was found by test
(tests/test_dataset_tags.py) against LeRobot 0.6.1's ``lerobot-edit-dataset``: delete_episodes
and split rebuild ``meta/episodes`` from a fixed list of keys (dataset_tools.
_copy_and_reindex_episodes_metadata), so extra columns there are dropped, and any file of ours
under ``meta/`` is left behind in the old folder; the data parquet's columns (every feature in
info.json, a ``string`` feature included) are copied through delete, split and merge
(dataset_tools._copy_and_reindex_data, aggregate.aggregate_data). So the tag rides in the data
table, keyed by the recording uid inside it, and survives renumbering. The sidecar
``meta/so101d_episodes.jsonl`` (one line per saved episode, by index) is still written as a
plain-text index; a dataset recorded before the column existed is migrated on open
(daemon/data/tags.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from calibration.conventions import FEATURE_NAMES
from daemon.data.interventions import INTERVENTION_KEY

ROBOT_TYPE = "so101_follower"
DEFAULT_FPS = 30
STATE_KEY = "observation.state"
ACTION_KEY = "action"
TELEOP_ACTION_KEY = "teleop.action"
IMAGE_KEY_PREFIX = "observation.images."
EPISODE_TAGS_FILE = "meta/so101d_episodes.jsonl"
TAG_KEY = "so101d.episode"
SOURCE_KEY = "so101d.source"
SOURCE_BYTES = 64  # the ring's field for it: "follower=leader" and its two-arm forms fit
# Our string columns a dataset may lack (recorded before they existed): never a mismatch.
OPTIONAL_KEYS = (TAG_KEY, SOURCE_KEY)
# The columns every LeRobot dataset has; never ours to configure.
LEROBOT_AUTO_KEYS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def joint_feature() -> dict[str, Any]:
    return {"dtype": "float32", "shape": (len(FEATURE_NAMES),), "names": list(FEATURE_NAMES)}


def camera_feature(height: int, width: int) -> dict[str, Any]:
    return {"dtype": "video", "shape": (height, width, 3), "names": ["height", "width", "channels"]}


def depth_feature(height: int, width: int) -> dict[str, Any]:
    """A depth map stored as LeRobot stores one (utils/feature_utils.hw_to_dataset_features: a
    single-channel camera is flagged ``is_depth_map``); its writer adds ``depth_unit`` and the
    quantiser's settings (``video.depth_min`` ...) to ``info`` with the first episode."""
    return {
        "dtype": "video",
        "shape": (height, width, 1),
        "names": ["height", "width", "channels"],
        "info": {"is_depth_map": True},
    }


def depth_key(camera: str) -> str:
    """The stream name of a camera's depth: LeRobot's robots name it ``<camera>_depth``."""
    return f"{camera}_depth"


def tag_feature() -> dict[str, Any]:
    """A per-frame string feature (LeRobot 0.6.1 stores it, skips it in stats and training)."""
    return {"dtype": "string", "shape": (1,), "names": None}


def dataset_features(
    cameras: dict[str, tuple[int, int]], depth_cameras: tuple[str, ...] | list[str] = ()
) -> dict[str, dict[str, Any]]:
    """LeRobot feature dict for the given cameras ({name: (height, width)}), with a depth feature
    for each camera named in ``depth_cameras``."""
    features: dict[str, dict[str, Any]] = {
        STATE_KEY: joint_feature(),
        ACTION_KEY: joint_feature(),
        TELEOP_ACTION_KEY: joint_feature(),
        TAG_KEY: tag_feature(),
        SOURCE_KEY: tag_feature(),
    }
    for name, (height, width) in sorted(cameras.items()):
        features[IMAGE_KEY_PREFIX + name] = camera_feature(height, width)
        if name in depth_cameras:
            features[IMAGE_KEY_PREFIX + depth_key(name)] = depth_feature(height, width)
    return features


# -------------------------------------------------------------------------------------------------
# Two arms (a bimanual rig): one dataset, both arms' joints in one 12-wide vector
# -------------------------------------------------------------------------------------------------
# LeRobot 0.6.1's bimanual follower, lerobot/robots/bi_so_follower/bi_so_follower.py
# (``BiSOFollower._motors_ft``): the left arm's motor features prefixed "left_", then the right
# arm's prefixed "right_", each in the SO follower's motor order; per-arm cameras prefixed by
# their side, top-level cameras unprefixed (``_cameras_ft``). Same units per arm as one arm.
BIMANUAL_ROBOT_TYPE = "bi_so_follower"
JOINT_KEYS = (STATE_KEY, ACTION_KEY, TELEOP_ACTION_KEY)  # the joint vectors a layout shapes


def arm_joint_names(arms: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The joint vector's names: one arm's (``arms`` empty), or each side's prefixed, in order."""
    if not arms:
        return list(FEATURE_NAMES)
    return [f"{arm}_{name}" for arm in arms for name in FEATURE_NAMES]


def with_arms(features: dict[str, dict[str, Any]], arms: tuple[str, ...] | list[str]) -> dict[str, dict[str, Any]]:
    """``features`` (``dataset_features``) for a rig of ``arms`` ("left", "right"): the joint
    vectors widened to every arm's joints, named and ordered as LeRobot 0.6.1's
    lerobot/robots/bi_so_follower/bi_so_follower.py declares them (``BiSOFollower._motors_ft``:
    ``left_shoulder_pan.pos`` .. ``left_gripper.pos``, then ``right_...``); unchanged for one arm."""
    if not arms:
        return features
    names = arm_joint_names(arms)
    wide = {"dtype": "float32", "shape": (len(names),), "names": names}
    return {k: (dict(wide, names=list(names)) if k in JOINT_KEYS else v) for k, v in features.items()}


def dataset_arms(features: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    """The arms of a dataset from its joint names: () for one arm, ("left", "right") for
    LeRobot's BiSOFollower layout (``with_arms``), in the order the vector holds them."""
    names = list((features.get(STATE_KEY) or {}).get("names") or [])
    sides: list[str] = []
    for n in names:
        side, sep, _ = n.partition("_")
        if sep and side in ("left", "right") and side not in sides:
            sides.append(side)
    return tuple(sides)


def layout_text(features: dict[str, dict[str, Any]], robot_type: str | None) -> str:
    """A dataset's arm layout in words, from its ``observation.state`` names and robot type:
    "single-arm (so101_follower, 6 joints shoulder_pan.pos .. gripper.pos)"."""
    names = list((features.get(STATE_KEY) or {}).get("names") or [])
    arms = "bimanual" if any(n.startswith(("left_", "right_")) for n in names) else "single-arm"
    span = f" {names[0]} .. {names[-1]}" if names else ""
    return f"{arms} ({robot_type or 'no robot_type'}, {len(names)} joints{span})"


def layout_difference(
    expected: dict[str, dict[str, Any]],
    expected_robot: str,
    actual: dict[str, dict[str, Any]],
    actual_robot: str | None,
    ours: str = "the configuration records",
    instead: str = "record into another dataset: [recording] repo_id",
) -> str:
    """ "" when a dataset's arm layout is the configured one, else the refusal naming both
    (``ours``: who wants ``expected``, ``instead``: the way that works; an import says its own)."""
    want = list((expected.get(STATE_KEY) or {}).get("names") or [])
    have = list((actual.get(STATE_KEY) or {}).get("names") or [])
    if want == have or not have:
        return ""
    return (
        f"the dataset is {layout_text(actual, actual_robot)}, {ours} "
        f"{layout_text(expected, expected_robot)}: an episode of one layout is never appended to a "
        f"dataset of the other ({instead})"
    )


def feature_differences(expected: dict[str, dict[str, Any]], actual: dict[str, dict[str, Any]]) -> list[str]:
    """Readable list of differences between the configured features (``expected``) and a
    dataset's (``actual``); LeRobot's auto-added keys are ignored, and so is a missing tag
    column (a dataset recorded before it existed gains it on open, daemon/data/tags.py) or source
    column (such a dataset is recorded on without one)."""
    diffs: list[str] = []
    for key in sorted(set(expected) | set(actual)):
        if key in LEROBOT_AUTO_KEYS or (key in OPTIONAL_KEYS and key not in actual):
            continue
        if key == INTERVENTION_KEY:  # decided when the dataset is created (daemon/data/interventions.py)
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
    bench: str = ""  # which bench (daemon) recorded it: the host name unless configured
    source: dict[str, Any] = field(default_factory=dict)  # e.g. {"file": ..., "demo": ..., "generated": true}
    frames: int = 0
    late_frames: int = 0
    missing_frames: int = 0
    worst_camera_skew_ms: float = 0.0
    notes: list[str] = field(default_factory=list)  # e.g. "sim went stale at frame 120"
    # the number the operator was told at `episode start` (never reused, unlike episode_index,
    # which LeRobot keeps gap-free); None: recorded before these numbers were kept
    episode_number: int | None = None
    # operator corrections inside a policy episode (``policy correct`` ... ``resume``): how many,
    # and their total length in seconds (daemon/data/interventions.py)
    interventions: int = 0
    intervention_s: float = 0.0
    # a part of a continuous recording (`record --continuous`, LeRobot's sentry): the session
    # (its first episode's number), the part, why it ended ("rotate_s", "rotate_mb" or "stop"),
    # its first frame in the session and its frame 0's monotonic time; {}: an episode of its own
    continuous: dict[str, Any] = field(default_factory=dict)
    # begun by `episode keep --last S`: its first ``frames`` rows came from the pre-roll buffer
    # (recorded before the verb, ``last_s`` asked for, frame 0's monotonic grid time
    # ``grid_t0_s``), the rest live; {}: an episode started with `episode start`
    kept: dict[str, Any] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return str(self.source.get("recording_uid", ""))

    @property
    def kind(self) -> str:
        """real | emulated | sim | generated: what co-training mixes are chosen by."""
        if self.source.get("generated"):
            return "generated"
        if self.follower_kind.startswith("sim"):
            return "sim"
        if self.follower_kind == "emulated":
            return "emulated"
        return "real"

    def outcome(self) -> str:
        return "unknown" if self.success is None else ("success" if self.success else "failure")


def tag_to_cell(tag: EpisodeTag) -> str:
    """The per-frame tag column's value: the tag without its index (LeRobot's tools renumber)."""
    data = asdict(tag)
    data.pop("episode_index")
    return json.dumps(data, sort_keys=True)


def tag_from_cell(cell: str, episode_index: int) -> EpisodeTag | None:
    """The tag in a tag-column cell, or None for an empty / unreadable one."""
    if not cell:
        return None
    try:
        data = json.loads(cell)
        known = {k: v for k, v in data.items() if k in EpisodeTag.__dataclass_fields__}
        known["episode_index"] = episode_index
        return EpisodeTag(**known)
    except (ValueError, TypeError):
        return None


def append_episode_tag(root: Path, tag: EpisodeTag) -> None:
    """Append one tag line durably (fsync), so a crash right after a save keeps it."""
    path = Path(root) / EPISODE_TAGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(asdict(tag), sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_sidecar_tags(root: Path) -> dict[int, EpisodeTag]:
    """The sidecar's tags by episode index; a torn last line (crash mid-write) is skipped, later
    lines win."""
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


def has_tag_column(root: Path) -> bool:
    info = Path(root) / "meta" / "info.json"
    return info.exists() and TAG_KEY in json.loads(info.read_text()).get("features", {})


def read_column_tags(root: Path) -> dict[int, EpisodeTag]:
    """Tags from the data table's tag column (first frame of each episode), by episode index."""
    import pyarrow.parquet as pq

    tags: dict[int, EpisodeTag] = {}
    for path in sorted((Path(root) / "data").glob("chunk-*/file-*.parquet")):
        table = pq.read_table(path, columns=["episode_index", TAG_KEY])
        episodes = table.column("episode_index").to_pylist()
        cells = table.column(TAG_KEY).to_pylist()
        for ep, cell in zip(episodes, cells):
            if ep not in tags:
                tag = tag_from_cell(cell or "", int(ep))
                if tag is not None:
                    tags[int(ep)] = tag
    return tags


def read_episode_tags(root: Path) -> dict[int, EpisodeTag]:
    """All tags by episode index: from the tag column when the dataset has one (it survives
    LeRobot's own editing tools), else from the sidecar (a dataset not migrated yet)."""
    if has_tag_column(root):
        return read_column_tags(root)
    return read_sidecar_tags(root)
