"""Isaac Lab / LeIsaac HDF5 demos <-> our LeRobot v3.0 dataset (the Mimic bridge).

Isaac Lab Mimic turns ~10 seed demos into hundreds, but speaks robomimic-style HDF5; trainers
want LeRobot. This module does both directions with h5py alone (no simulator):

- import: ``data/demo_N/{actions, obs/joint_pos, obs/<camera>}`` in LeIsaac joint radians at the
  sim step rate (60 Hz by default) -> episodes in exactly the schema of the daemon's own
  recordings (``daemon.data.schema``): LeRobot units through ``calibration.conventions``
  (LeIsaac's limit table), resampled onto the dataset's fps grid so timestamps tell the truth
  (LeIsaac's own converter writes 60 Hz steps into a dataset that claims 30 fps).
- bi-arm: LeIsaac's bi-arm tasks (``tasks/template/bi_arm_env_cfg.py``: articulations ``left_arm``
  and ``right_arm``, cameras ``left_wrist``, ``right_wrist``, ``top``) record
  ``obs/left_joint_pos`` and ``obs/right_joint_pos`` (6 each) and 12-wide ``actions``, the left
  arm's six joints then the right arm's (``devices/action_process.py``: the bi-so101leader action
  terms left_arm, left_gripper, right_arm, right_gripper; ``utils/constant.py``
  ``BI_ARM_JOINT_NAMES``). Such a demo becomes an episode of the bimanual layout
  (``daemon.data.schema.with_arms``, LeRobot's BiSOFollower names), each arm converted on its
  own exactly as one arm is (``bi_arm_env_cfg.build_lerobot_frame`` converts ``[:, :6]`` and
  ``[:, 6:]`` separately too).
- export: seed demos for Mimic's annotate step must carry the scene state (``initial_state`` of
  every articulation and rigid object) that a LeRobot dataset does not keep. Episodes imported from
  such demos are exported by copying their source demo; every other episode is refused with the
  reason and the way that works: the LeIsaac follower's ``--seed_hdf5`` (``sim_bridge.seed_recorder``).

Import validates every selected demo completely (every key, every chunk of every dataset is
read, shapes and values checked) *before* the dataset is touched, so a truncated or corrupt file
is refused with an error that names the file, the demo and the key, and nothing is half-written.
Both directions stream demo by demo and frame chunk by frame chunk: memory stays bounded.
Imported episodes go through the recorder's own store (``daemon.data.store``): the same
h264 encoding and image statistics as live recordings, and one crash-safe transaction per episode.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np

from calibration.conventions import NUM_JOINTS, sim_rad_to_units, units_to_sim_rad
from daemon.data.schema import (
    BIMANUAL_ROBOT_TYPE,
    DEFAULT_FPS,
    ROBOT_TYPE,
    dataset_arms,
    dataset_features,
    layout_difference,
    layout_text,
    read_episode_tags,
    with_arms,
)

log = logging.getLogger("so101d.hdf5")

DEFAULT_STEP_HZ = 60.0  # LeIsaac: sim step 1/60 s, decimation 1
CAMERA_NAMES = ("front", "wrist")
# LeIsaac's bi-arm template (tasks/template/bi_arm_env_cfg.py, BiArmTaskSceneCfg /
# BiArmObservationsCfg): the arms' scene names, in the order its actions hold them, and its cameras
# (named as LeRobot's BiSOFollower names a per-arm "wrist" camera and a top-level "top" one).
BI_ARM_SIDES = ("left", "right")
BI_ARM_CAMERA_NAMES = ("left_wrist", "right_wrist", "top")
# LeIsaac's converter (scripts/convert/isaaclab2lerobot.py, add_episode): demos with fewer than
# 10 recorded steps are dropped and the first 5 steps of every demo are skipped (the arm settling
# after the reset). Our defaults match it; both are overridable and reported.
LEISAAC_SKIP_FRAMES = 5
LEISAAC_MIN_FRAMES = 10
# Mimic's annotate and generate steps leave IK actions: end-effector position (3) + quaternion (4) +
# gripper (1) (LeIsaac's eef_action_process.py --to_ik builds them; --to_joint takes the joint
# targets back from obs/joint_pos_target, which LeIsaac's recorder writes every step).
IK_ACTION_DIM = 8
JOINT_TARGET_KEY = "obs/joint_pos_target"
DEFAULT_CHUNK_FRAMES = 32  # 32 x 640x480x3 = 29 MB per camera per chunk
COMMIT_BATCH = 16  # demos per dataset transaction
_DEMO_RE = re.compile(r"^demo_(\d+)$")


class HDF5FormatError(ValueError):
    """A file that is not a readable LeIsaac / Isaac Lab demo file. Names file, demo and key."""


@dataclass(frozen=True)
class DemoInfo:
    path: Path
    name: str  # e.g. "demo_3"
    num_samples: int
    success: bool | None
    step_hz: float
    cameras: dict[str, tuple[int, int]]  # name -> (height, width)
    generated: bool
    empty: bool = False  # initial_state only / num_samples = 0 (LeIsaac's recorder after a reset)
    action_key: str = "actions"  # JOINT_TARGET_KEY when the file's actions are Mimic's IK actions
    damaged: str = ""  # why its rows do not add up (torn by a crash or a full disk): skipped, named
    arms: tuple[str, ...] = ()  # BI_ARM_SIDES for a bi-arm demo, () for one arm

    @property
    def n_joints(self) -> int:
        return NUM_JOINTS * max(1, len(self.arms))

    def where(self, key: str = "") -> str:
        return f"{self.path}: {self.name}" + (f"/{key}" if key else "")


@dataclass
class ImportSummary:
    files: list[str] = field(default_factory=list)
    demos_seen: int = 0
    demos_imported: int = 0
    demos_skipped_failed: int = 0  # success attribute false
    demos_skipped_unjudged: int = 0  # no success attribute (LeIsaac's converter: not successful)
    demos_skipped_empty: int = 0  # initial_state only / num_samples = 0
    demos_skipped_short: int = 0  # fewer than min_frames steps
    demos_not_selected: int = 0  # beyond --max-episodes
    demos_skipped_damaged: list[str] = field(default_factory=list)  # torn demos, each named with why
    demos_actions_from_joint_targets: int = 0  # IK actions in the file: action = obs/joint_pos_target
    skip_frames: int = LEISAAC_SKIP_FRAMES
    min_frames: int = LEISAAC_MIN_FRAMES
    frames_written: int = 0
    source_steps: int = 0  # sim steps of the imported demos after --skip-frames (LeIsaac's converter's frame count)
    seconds: float = 0.0
    episode_indices: list[int] = field(default_factory=list)

    @property
    def frames_per_s(self) -> float:
        return self.frames_written / self.seconds if self.seconds > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# Reading and validating
# ---------------------------------------------------------------------------------------------
def _demo_sort_key(name: str) -> tuple[int, str]:
    m = _DEMO_RE.match(name)
    return (int(m.group(1)) if m else 1 << 30, name)


def _attr_float(attrs: h5py.AttributeManager, *names: str) -> float | None:
    for n in names:
        if n in attrs:
            try:
                return float(np.asarray(attrs[n]).item())
            except (TypeError, ValueError):
                continue
    return None


def _file_step_hz(f: h5py.File, default: float) -> float:
    """Sim step rate from the file's attributes where present, else ``default``."""
    data = f["data"]
    hz = _attr_float(data.attrs, "step_hz", "fps", "control_hz")
    if hz:
        return hz
    dt = _attr_float(data.attrs, "step_dt", "dt")
    if dt:
        return 1.0 / dt
    if "env_args" in data.attrs:
        try:
            env_args = json.loads(data.attrs["env_args"])
        except (TypeError, ValueError):
            env_args = {}
        if isinstance(env_args, dict):
            for k in ("step_hz", "fps"):
                if isinstance(env_args.get(k), (int, float)) and env_args[k] > 0:
                    return float(env_args[k])
            sim_dt, decimation = env_args.get("sim_dt"), env_args.get("decimation", 1)
            if isinstance(sim_dt, (int, float)) and sim_dt > 0 and isinstance(decimation, (int, float)):
                return 1.0 / (sim_dt * decimation)
    return default


def _success_attr(g: h5py.Group) -> bool | None:
    """Isaac Lab's HDF5DatasetFileHandler.load_episode: ``success`` only when the attribute exists."""
    return bool(np.asarray(g.attrs["success"]).item()) if "success" in g.attrs else None


def joint_pos_keys(arms: tuple[str, ...]) -> tuple[str, ...]:
    """Where a demo's measured joints are: ``obs/joint_pos`` (one arm; LeIsaac's single-arm
    templates), or one ``obs/<side>_joint_pos`` per arm (bi_arm_env_cfg.py's PolicyCfg)."""
    return tuple(f"obs/{side}_joint_pos" for side in arms) if arms else ("obs/joint_pos",)


def _demo_arms(g: h5py.Group, where: str) -> tuple[str, ...]:
    """BI_ARM_SIDES when the demo holds any arm's ``obs/<side>_joint_pos``, () otherwise; a bi-arm
    demo lacking one arm's joints is refused naming the missing key (its actions would then
    hold joints no state matches)."""
    obs = g.get("obs")
    if not isinstance(obs, h5py.Group):
        return ()
    present = [side for side in BI_ARM_SIDES if f"{side}_joint_pos" in obs]
    if not present:
        return ()
    for side in BI_ARM_SIDES:
        if side not in present:
            raise HDF5FormatError(
                f"{where}: missing key 'obs/{side}_joint_pos' (a bi-arm demo: it has "
                + ", ".join(f"'obs/{p}_joint_pos'" for p in present)
                + f"; LeIsaac's bi-arm tasks record both arms, {', '.join(BI_ARM_SIDES)})"
            )
    return BI_ARM_SIDES


def layout_name(arms: tuple[str, ...]) -> str:
    """An arm layout in the words the store's refusals use (``schema.layout_text``)."""
    robot = BIMANUAL_ROBOT_TYPE if arms else ROBOT_TYPE
    return layout_text(with_arms(dataset_features({}), arms), robot)


def scan_file(path: Path, step_hz: float | None = None, generated: bool | None = None) -> list[DemoInfo]:
    """List the demos of one file (structure and attributes only; no bulk reads).

    ``generated``: None = auto (a file written by Mimic's generation step is usually named
    ``generated_*.hdf5``; the demos then carry no human origin), else forced.
    """
    path = Path(path)
    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as exc:
        raise HDF5FormatError(f"{path}: not a readable HDF5 file ({exc})") from exc
    with f:
        if "data" not in f or not isinstance(f["data"], h5py.Group):
            raise HDF5FormatError(f"{path}: no 'data' group (not an Isaac Lab / LeIsaac demo file)")
        hz = step_hz or _file_step_hz(f, DEFAULT_STEP_HZ)
        is_generated = generated if generated is not None else ("generated" in path.name.lower())
        demos: list[DemoInfo] = []
        for name in sorted(f["data"].keys(), key=_demo_sort_key):
            g = f["data"][name]
            if not isinstance(g, h5py.Group):
                continue
            info_where = f"{path}: {name}"
            declared_n = int(np.asarray(g.attrs["num_samples"]).item()) if "num_samples" in g.attrs else None
            if "actions" not in g and (declared_n == 0 or (declared_n is None and "initial_state" in g)):
                # LeIsaac's streaming recorder writes the initial_state of the episode that began
                # at the last reset even when no step followed (num_samples = 0): an empty demo.
                demos.append(DemoInfo(path, name, 0, _success_attr(g), hz, {}, is_generated, empty=True))
                continue
            arms = _demo_arms(g, info_where)
            for key in ("actions", *joint_pos_keys(arms)):
                if key not in g:
                    raise HDF5FormatError(f"{info_where}: missing key '{key}'")
            n = int(g["actions"].shape[0]) if g["actions"].ndim >= 1 else 0
            success = _success_attr(g)
            if "num_samples" in g.attrs:
                declared = int(np.asarray(g.attrs["num_samples"]).item())
                if declared != n:
                    # one torn demo (a crash or a full disk mid-write) must not keep the file's other
                    # demos out: it is skipped and named, and stays in the file as it is
                    why = (
                        f"attribute num_samples={declared} but 'actions' has {n} rows (torn by a crash or a full disk?)"
                    )
                    demos.append(DemoInfo(path, name, n, success, hz, {}, is_generated, damaged=why, arms=arms))
                    continue
            # Mimic's IK actions exist for one arm only (LeIsaac has no bi-arm Mimic task)
            action_key = _action_key(g, info_where, path) if not arms else "actions"
            cameras: dict[str, tuple[int, int]] = {}
            obs = g["obs"]
            for cam in BI_ARM_CAMERA_NAMES if arms else CAMERA_NAMES:
                if cam in obs:
                    ds = obs[cam]
                    if ds.ndim != 4 or ds.shape[-1] != 3:
                        raise HDF5FormatError(
                            f"{info_where}: key 'obs/{cam}' has shape {ds.shape}, expected (N, H, W, 3)"
                        )
                    cameras[cam] = (int(ds.shape[1]), int(ds.shape[2]))
            demos.append(DemoInfo(path, name, n, success, hz, cameras, is_generated, action_key=action_key, arms=arms))
        return demos


def _action_key(g: h5py.Group, where: str, path: Path) -> str:
    """Where a demo's joint actions are: ``actions``, or for Mimic's 8-D IK actions the joint
    targets LeIsaac's recorder wrote beside them (what eef_action_process.py --to_joint uses)."""
    act = g["actions"]
    if act.ndim != 2 or act.shape[1] != IK_ACTION_DIM:
        return "actions"  # joint actions (their joint count is checked with the data)
    target = g.get(JOINT_TARGET_KEY)
    what = (
        f"{where}/actions: {IK_ACTION_DIM}-D actions (end-effector pose + gripper, as Isaac Lab Mimic's "
        "annotate_demos.py / generate_dataset.py leave them)"
    )
    if isinstance(target, h5py.Dataset):
        if target.ndim == 2 and target.shape[1] == NUM_JOINTS:
            return JOINT_TARGET_KEY
        raise HDF5FormatError(
            f"{what}, and its {JOINT_TARGET_KEY} has shape {target.shape}, expected (N, {NUM_JOINTS}) joint "
            "targets: the file's joint targets are not the SO-101's six joints, so no joint action can be "
            "taken from it (LeIsaac's eef_action_process.py --to_joint copies exactly that dataset)"
        )
    # eef_action_process.py --to_joint (ik_action_to_joint) reads obs/joint_pos_target itself, so it
    # cannot convert this file either: the joint targets were never recorded in it.
    raise HDF5FormatError(
        f"{what}, and no {JOINT_TARGET_KEY}: the joint targets were not recorded, so neither this import "
        "nor LeIsaac's eef_action_process.py --to_joint (which copies that dataset) can turn these actions "
        "back into joint actions. Import the file the demos came from instead (the seed or annotated file, "
        "whose actions are joint positions), or generate again with a recorder that writes "
        f"{JOINT_TARGET_KEY} (LeIsaac's does)"
    )


def _check_rows(info: DemoInfo, key: str, ds: h5py.Dataset, n: int, row_shape: tuple[int, ...]) -> None:
    if ds.shape[0] != n:
        raise HDF5FormatError(f"{info.where(key)}: {ds.shape[0]} rows, expected {n} (like 'actions')")
    if tuple(ds.shape[1:]) != row_shape:
        what = "joint count" if len(row_shape) == 1 else "shape"
        raise HDF5FormatError(f"{info.where(key)}: {what} {tuple(ds.shape[1:])}, expected {row_shape}")


def validate_demo(f: h5py.File, info: DemoInfo, chunk_frames: int = DEFAULT_CHUNK_FRAMES) -> None:
    """Read every chunk of every dataset the import needs; raise HDF5FormatError on any problem."""
    g = f["data"][info.name]
    n = info.num_samples
    keys: list[tuple[str, tuple[int, ...]]] = [(info.action_key, (info.n_joints,))]
    keys += [(key, (NUM_JOINTS,)) for key in joint_pos_keys(info.arms)]
    keys += [(f"obs/{cam}", (h, w, 3)) for cam, (h, w) in info.cameras.items()]
    for key, row_shape in keys:
        ds = g[key]
        _check_rows(info, key, ds, n, row_shape)
        step = chunk_frames if len(row_shape) > 1 else max(chunk_frames, 4096)
        for start in range(0, n, step):
            try:
                block = ds[start : start + step]
            except (OSError, ValueError, KeyError) as exc:
                raise HDF5FormatError(f"{info.where(key)}: unreadable rows {start}..{start + step} ({exc})") from exc
            if len(row_shape) == 1:
                if not np.all(np.isfinite(block)):
                    bad = int(np.argwhere(~np.isfinite(block))[0][0]) + start
                    raise HDF5FormatError(f"{info.where(key)}: non-finite value at row {bad}")
            elif block.dtype != np.uint8:
                raise HDF5FormatError(f"{info.where(key)}: dtype {block.dtype}, expected uint8 RGB")


def resample_indices(num_samples: int, step_hz: float, fps: float, skip_frames: int = 0) -> np.ndarray:
    """Source row for each output frame on the fps grid (nearest sample, never past the end).

    Output frame k sits at k / fps seconds after the first kept sample; a 60 Hz demo of 2 s
    becomes 60 frames at 30 fps whose timestamps are exactly the sim time of their samples.
    """
    usable = num_samples - skip_frames
    if usable <= 0:
        return np.zeros(0, dtype=np.int64)
    duration_s = (usable - 1) / step_hz
    n_out = int(np.floor(duration_s * fps + 1e-9)) + 1
    src = np.rint(np.arange(n_out) * step_hz / fps).astype(np.int64)
    return np.minimum(src, usable - 1) + skip_frames


# ---------------------------------------------------------------------------------------------
# The dataset side
# ---------------------------------------------------------------------------------------------
def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def repo_id_for(root: Path) -> str:
    return f"local/{Path(root).name}"


def open_store(
    root: Path,
    cameras: dict[str, tuple[int, int]],
    fps: int,
    repo_id: str | None = None,
    arms: tuple[str, ...] = (),
):
    """The recording store of the dataset at ``root``, refusing a schema mismatch up front.

    Imports go through the same store as the daemon's recordings: the same h264 encoder and image
    statistics, and one crash-safe transaction per episode (a killed import keeps every episode it
    committed and nothing half-written; the next start of either repairs a torn commit).
    """
    _offline()
    from daemon.data.store import DatasetBusyError, DatasetStore, StoreConfig, config_differences

    cfg = StoreConfig(
        root=str(root),
        repo_id=repo_id or repo_id_for(root),
        fps=fps,
        cameras=[(name, h, w) for name, (h, w) in sorted(cameras.items())],
        arms=list(arms),
    )
    # the store's own layout check (what refuses a daemon of the other layout), in an import's words
    info_path = Path(root) / "meta" / "info.json"
    if info_path.exists():
        info = json.loads(info_path.read_text())
        layout = layout_difference(
            cfg.features(),
            cfg.robot_type,
            info.get("features", {}),
            info.get("robot_type"),
            ours="the demos are",
            instead="import them into another --dataset",
        )
        if layout:
            raise HDF5FormatError(f"dataset {root}: {layout}")
    diffs = config_differences(cfg)
    if diffs:
        raise HDF5FormatError(f"dataset {root} does not match the demos' schema:\n  " + "\n  ".join(diffs))
    store = DatasetStore(cfg)
    try:
        notes = store.repair(wait_s=0.0)  # never wait on a recording daemon: say so
    except DatasetBusyError as exc:
        raise HDF5FormatError(str(exc)) from None
    for note in notes:
        log.warning("%s", note)
    leftover = store.staged_episodes()  # complete episodes of an interrupted import or recording
    if leftover:
        store.commit_many(leftover)
        log.warning("committed %d staged episode(s) left by an interrupted writer", len(leftover))
    return store


def dataset_fps(root: Path, default: int = DEFAULT_FPS) -> int:
    info_path = Path(root) / "meta" / "info.json"
    if info_path.exists():
        return int(json.loads(info_path.read_text()).get("fps", default))
    return default


# ---------------------------------------------------------------------------------------------
# Import
# ---------------------------------------------------------------------------------------------
@dataclass
class Selection:
    chosen: list[DemoInfo] = field(default_factory=list)
    failed: int = 0
    unjudged: int = 0
    empty: int = 0
    short: int = 0
    not_selected: int = 0
    damaged: list[str] = field(default_factory=list)  # "<file>: <demo>: why"


def select_demos(
    demos: Sequence[DemoInfo],
    successful_only: bool,
    skip_frames: int,
    max_episodes: int | None,
    min_frames: int = LEISAAC_MIN_FRAMES,
    keep_unjudged: bool = False,
) -> Selection:
    """Which demos are imported, LeIsaac's converter's rules by default, every skip counted.

    Order of the checks: empty (nothing recorded), failed / unjudged (``--all`` keeps both,
    ``keep_unjudged`` keeps demos without a success attribute), fewer than ``min_frames`` steps,
    nothing left after ``skip_frames`` (at least 2 steps must remain), ``max_episodes``.
    """
    sel = Selection()
    for d in demos:
        if d.damaged:
            sel.damaged.append(f"{d.where()}: {d.damaged}")
            continue
        if d.empty:
            sel.empty += 1
            continue
        if successful_only and d.success is False:
            sel.failed += 1
            continue
        if successful_only and d.success is None and not keep_unjudged:
            sel.unjudged += 1
            continue
        if d.num_samples < min_frames or d.num_samples - skip_frames < 2:
            sel.short += 1
            continue
        if max_episodes is not None and len(sel.chosen) >= max_episodes:
            sel.not_selected += 1
            continue
        sel.chosen.append(d)
    return sel


def rad_to_units(rad: np.ndarray) -> np.ndarray:
    """(N, 6 * arms) LeIsaac radians -> LeRobot units, each arm's six on their own through the
    single-arm conversion (every LeIsaac arm is the same SO101_FOLLOWER_CFG, one limit table)."""
    r = np.asarray(rad, dtype=np.float64)
    return sim_rad_to_units(r.reshape(len(r), -1, NUM_JOINTS)).reshape(r.shape)


def units_to_rad(units: np.ndarray) -> np.ndarray:
    """Inverse of ``rad_to_units``."""
    u = np.asarray(units, dtype=np.float64)
    return units_to_sim_rad(u.reshape(len(u), -1, NUM_JOINTS)).reshape(u.shape)


def _frames_of(
    f: h5py.File, info: DemoInfo, rows: np.ndarray, chunk_frames: int
) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """Yield (state_units, action_units, {camera: rgb}) for each output row, reading in chunks."""
    g = f["data"][info.name]
    for start in range(0, len(rows), chunk_frames):
        sel = rows[start : start + chunk_frames]
        lo, hi = int(sel[0]), int(sel[-1]) + 1  # a contiguous slab: h5py reads it in one go
        joint = np.concatenate([g[key][lo:hi][sel - lo] for key in joint_pos_keys(info.arms)], axis=1)
        act = g[info.action_key][lo:hi][sel - lo]
        images = {cam: g[f"obs/{cam}"][lo:hi][sel - lo] for cam in info.cameras}
        state_units = rad_to_units(joint).astype(np.float32)
        action_units = rad_to_units(act).astype(np.float32)
        for i in range(len(sel)):
            yield state_units[i], action_units[i], {cam: images[cam][i] for cam in info.cameras}


def _stage_demo(store, d: DemoInfo, rows: np.ndarray, fps: int, task: str, chunk_frames: int) -> Path:
    """Write one demo as a staged episode (the recorder's on-disk format), ready for commit."""

    from daemon.data.store import write_json_atomic
    from daemon.data.writer import CameraEncoder

    uid = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
    stage = store.staging / f"ep-{uid}"
    stage.mkdir(parents=True)
    try:
        cams = sorted(d.cameras)
        encoders = {cam: CameraEncoder(stage / cam / "video.mp4", fps, store.cfg) for cam in cams}
        for e in encoders.values():
            e.start()
        states, actions = [], []
        with h5py.File(d.path, "r") as f:
            for state, action, images in _frames_of(f, d, rows, chunk_frames):
                states.append(state)
                actions.append(action)
                for cam, img in images.items():
                    encoders[cam].feed(np.ascontiguousarray(img))
        for e in encoders.values():
            e.finish()
        n = len(rows)
        state_arr = np.asarray(states, np.float32).reshape(n, d.n_joints)
        action_arr = np.asarray(actions, np.float32).reshape(n, d.n_joints)
        np.savez(stage / "rows.npz", state=state_arr, action=action_arr, teleop=action_arr)
        np.savez(
            stage / "timing.npz",
            grid_s=np.arange(n) / fps,
            state_offset_s=(rows - rows[0]) / d.step_hz - np.arange(n) / fps,  # sim time vs grid
            camera_offset_s=np.zeros((n, len(cams))),
            camera_names=np.asarray(cams, dtype=str),
        )
        tag: dict[str, Any] = {
            "success": d.success,
            "origin": "import",
            "follower_kind": "sim-leisaac",
            "frames": n,
            "late_frames": 0,
            "missing_frames": 0,
            "worst_camera_skew_ms": 0.0,
            "notes": (
                [f"action from {d.action_key} (the file's actions are Mimic's end-effector actions)"]
                if d.action_key != "actions"
                else []
            ),
            "source": {"file": str(d.path), "demo": d.name, "generated": d.generated, "step_hz": d.step_hz}
            | ({"arms": list(d.arms)} if d.arms else {}),
        }
        write_json_atomic(
            stage / "episode.json",
            {
                "uid": uid,
                "task": task,
                "frames": n,
                "tag": tag,
                "video_stats": {cam: encoders[cam].stats for cam in cams},
            },
        )
    except BaseException:
        import shutil

        shutil.rmtree(stage, ignore_errors=True)
        raise
    return stage


class ImportProgress(Protocol):
    """Where an import reports its progress (the CLI draws a bar with rate and ETA)."""

    def begin(self, demos: int, frames: int) -> None: ...
    def advance(self, demos: int, frames: int) -> None: ...
    def end(self) -> None: ...


def import_hdf5(
    files: Sequence[Path],
    dataset_root: Path,
    task: str = "",
    successful_only: bool = True,
    skip_frames: int = LEISAAC_SKIP_FRAMES,
    max_episodes: int | None = None,
    step_hz: float | None = None,
    fps: int | None = None,
    generated: bool | None = None,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    progress: ImportProgress | None = None,
    min_frames: int = LEISAAC_MIN_FRAMES,
    keep_unjudged: bool = False,
) -> ImportSummary:
    """Append the selected demos of ``files`` to the dataset at ``dataset_root``.

    Defaults follow LeIsaac's converter: empty demos skipped, missing success = failure, fewer
    than 10 steps dropped, first 5 steps skipped; every skip is counted in the summary. A demo
    whose ``num_samples`` does not match its rows (torn by a crash or a full disk) is skipped and
    named in ``demos_skipped_damaged``; the file's other demos are imported.
    Everything is validated before the dataset is opened; on any other format error nothing is written.
    """
    summary = ImportSummary(files=[str(p) for p in files], skip_frames=skip_frames, min_frames=min_frames)
    plan: list[DemoInfo] = []
    remaining = max_episodes
    for path in files:
        demos = scan_file(Path(path), step_hz=step_hz, generated=generated)
        summary.demos_seen += len(demos)
        sel = select_demos(demos, successful_only, skip_frames, remaining, min_frames, keep_unjudged)
        summary.demos_skipped_failed += sel.failed
        summary.demos_skipped_unjudged += sel.unjudged
        summary.demos_skipped_empty += sel.empty
        summary.demos_skipped_short += sel.short
        summary.demos_not_selected += sel.not_selected
        summary.demos_skipped_damaged += sel.damaged
        summary.demos_actions_from_joint_targets += sum(d.action_key != "actions" for d in sel.chosen)
        plan += sel.chosen
        if remaining is not None:
            remaining -= len(sel.chosen)
    if not plan:
        log.info("nothing to import (no demo selected)")
        return summary
    cameras, arms = plan[0].cameras, plan[0].arms
    for d in plan:
        if d.arms != arms:  # before the cameras: a bi-arm demo's cameras differ anyway
            raise HDF5FormatError(
                f"{d.where()} is a {layout_name(d.arms)} demo, {plan[0].where()} a {layout_name(arms)} one: "
                "one dataset holds one arm layout (import them into separate --dataset roots)"
            )
        if d.cameras != cameras:
            raise HDF5FormatError(f"{d.where()}: cameras {d.cameras} differ from {plan[0].where()}'s {cameras}")
    # Pass 1: validate every byte we will read.
    for d in plan:
        with h5py.File(d.path, "r") as f:
            validate_demo(f, d, chunk_frames)
    target_fps = fps or dataset_fps(dataset_root)
    # Pass 2: write, one committed episode at a time.
    t0 = time.monotonic()
    rows_of = [resample_indices(d.num_samples, d.step_hz, target_fps, skip_frames) for d in plan]
    if progress is not None:
        progress.begin(len(plan), int(sum(len(r) for r in rows_of)))
    store = open_store(dataset_root, cameras, target_fps, arms=arms)
    try:
        with _quiet_ffmpeg():
            _write_plan(store, plan, rows_of, summary, target_fps, task, chunk_frames, progress)
    finally:
        store.release_ownership()
        if progress is not None:
            progress.end()
    summary.seconds = time.monotonic() - t0
    return summary


def _libavutil() -> Any:
    """The libavutil PyAV itself loaded (its wheel bundles FFmpeg in ``av.libs``), or None."""
    import ctypes
    import glob

    import av

    pkg = os.path.dirname(os.path.dirname(av.__file__))
    for path in sorted(glob.glob(os.path.join(pkg, "av.libs", "libavutil*.so*"))):
        try:
            return ctypes.CDLL(path)  # already loaded by av: dlopen hands back the same library
        except OSError:
            continue
    return None


@contextlib.contextmanager
def _quiet_ffmpeg() -> Iterator[None]:
    """LeRobot's per-video INFO lines, HF datasets' "Map" bars and FFmpeg's own log (libx264 statistics, "[mp4 @ ...] Starting second pass" muxer lines) stays
    off the terminal during an import: only its errors get through.

    ``av.logging.set_level`` alone does not hold: LeRobot's ``get_video_info`` (called for every
    committed video) ends with ``av.logging.restore_default_callback()``, after which FFmpeg's
    default callback prints at FFmpeg's own level (INFO). So FFmpeg's level is lowered too, in
    the libavutil PyAV bundles; both are restored afterwards."""
    try:
        import av
    except ImportError:  # pragma: no cover - av comes with lerobot's dataset extra
        yield
        return
    util = _libavutil()
    c_before = util.av_log_get_level() if util is not None else None
    # LeRobot's "Using video codec: ..." INFO lines, once per video per commit, say nothing useful
    # here (and name hevc for h264 videos): below our INFO for the import's duration.
    lerobot_log = logging.getLogger("lerobot")
    lerobot_before = lerobot_log.level
    lerobot_log.setLevel(max(logging.WARNING, lerobot_before))
    # HF datasets draws a "Map: 100%" bar per commit; our own bar says the same, once.
    from datasets.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    py_before = av.logging.get_level()
    av.logging.set_level(av.logging.ERROR)
    if util is not None:
        util.av_log_set_level(av.logging.ERROR)
    try:
        yield
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
        lerobot_log.setLevel(lerobot_before)
        av.logging.set_level(py_before)
        if util is not None:
            util.av_log_set_level(c_before)


def _write_plan(
    store,
    plan: list[DemoInfo],
    rows_of: list[np.ndarray],
    summary: ImportSummary,
    fps: int,
    task: str,
    chunk_frames: int,
    progress: ImportProgress | None,
) -> None:
    """Stage each demo, committing every ``COMMIT_BATCH`` as one transaction.

    Batches keep a 200-demo import from paying LeRobot's per-session cost (re-reading all episode
    metadata, new files) 200 times; a crash keeps every batch committed before it, and staged
    demos of the torn batch are committed by the next writer of the dataset.
    """
    pending: list[tuple[Path, DemoInfo, int]] = []

    def flush() -> None:
        results = store.commit_many([stage for stage, _, _ in pending])
        for (_, d, n), result in zip(pending, results):
            summary.episode_indices.append(result["episode_index"])
            summary.demos_imported += 1
            summary.frames_written += n
            summary.source_steps += d.num_samples - summary.skip_frames
            log.debug("imported %s -> episode %d (%d frames at %d fps)", d.where(), result["episode_index"], n, fps)
        pending.clear()

    for d, rows in zip(plan, rows_of):
        stage = _stage_demo(store, d, rows, fps, task or f"imported from {d.path.name}", chunk_frames)
        pending.append((stage, d, len(rows)))
        if progress is not None:
            progress.advance(1, len(rows))
        if len(pending) >= COMMIT_BATCH:
            flush()
    if pending:
        flush()


# ---------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------
def parse_episode_selection(sel: str, total: int) -> list[int]:
    """'all', '3', '0-4', '1,3,7-9' -> sorted episode indices (each checked against ``total``)."""
    if sel.strip().lower() == "all":
        return list(range(total))
    out: set[int] = set()
    for part in sel.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        try:
            idx = range(int(m.group(1)), int(m.group(2)) + 1) if m else [int(part)]
        except ValueError as exc:
            raise ValueError(f"bad episode selection {part!r} (use e.g. 'all', '3', '0-4', '1,3,7-9')") from exc
        for i in idx:
            if not 0 <= i < total:
                raise ValueError(f"episode {i} does not exist (dataset has {total})")
            out.add(i)
    if not out:
        raise ValueError("empty episode selection")
    return sorted(out)


class ExportRefused(ValueError):
    """Episodes that cannot become Mimic seed demos; the message says why and what to do."""


# What Mimic does with a seed file: its envs take 8-D end-effector actions (pose + gripper) while
# seed demos hold the 6 joint targets, so LeIsaac's eef_action_process.py --to_ik runs first.
MIMIC_NEXT_STEPS = (
    "in the LeIsaac checkout, convert the joint actions to Mimic's end-effector actions first: "
    "python scripts/mimic/eef_action_process.py --input_file FILE --output_file processed.hdf5 --to_ik --headless, "
    "then python scripts/mimic/annotate_demos.py --task LeIsaac-SO101-...-Mimic-v0 --input_file processed.hdf5 ..."
)
SEED_HOWTO = (
    "record seed demos on the LeIsaac follower instead: start it with --seed_hdf5 FILE "
    "(python -m sim_bridge.leisaac_follower --task ... --seed_hdf5 seeds.hdf5); every episode the daemon "
    "records there is also written to FILE with the full scene state and its seed; " + MIMIC_NEXT_STEPS
)


# What a bi-arm demo is for: LeIsaac has no bi-arm Mimic task; its replay script steps a bi-arm
# task (get_task_type: "BiArm" in the name -> bi-so101leader) with the demo's 12-wide actions after
# env.reset_to(initial_state) (scripts/environments/teleoperation/replay.py).
BI_ARM_NEXT_STEPS = (
    "in the LeIsaac checkout, replay the demos on their bi-arm task: python scripts/environments/teleoperation/"
    "replay.py --task LeIsaac-SO101-...-BiArm-v0 --dataset_file FILE"
)
BI_ARM_HOWTO = (
    "record bi-arm demos in LeIsaac itself (scripts/environments/teleoperation/teleop_se3_agent.py --task "
    "LeIsaac-SO101-...-BiArm-v0 --teleop_device bi-so101leader --record) and import them (so101d import-hdf5): "
    "their episodes export; " + BI_ARM_NEXT_STEPS
)


def next_steps(arms: tuple[str, ...]) -> str:
    """What to run on an exported file: Mimic's first step (one arm) or LeIsaac's replay (two)."""
    return BI_ARM_NEXT_STEPS if arms else MIMIC_NEXT_STEPS


def dataset_arms_at(root: Path) -> tuple[str, ...]:
    """The arms of the dataset at ``root`` (``schema.dataset_arms`` of its info.json)."""
    info = json.loads((Path(root) / "meta" / "info.json").read_text())
    return dataset_arms(info.get("features", {}))


def full_scene_state(g: h5py.Group, articulations: tuple[str, ...] = ()) -> bool:
    """Does this demo carry what Isaac Lab's ``InteractiveScene.reset_to`` reads: every
    articulation with root_pose / root_velocity / joint_position / joint_velocity, and the rigid
    objects with root_pose / root_velocity (a scene without objects has none)? ``articulations``:
    the ones the task's scene has, each required (a bi-arm scene's ``left_arm`` and ``right_arm``)."""
    init = g.get("initial_state")
    if not isinstance(init, h5py.Group) or "articulation" not in init or not len(init["articulation"]):
        return False
    if any(name not in init["articulation"] for name in articulations):
        return False
    for art in init["articulation"].values():
        if any(k not in art for k in ("root_pose", "root_velocity", "joint_position", "joint_velocity")):
            return False
    for obj in init.get("rigid_object", {}).values():
        if any(k not in obj for k in ("root_pose", "root_velocity")):
            return False
    return "actions" in g


def _why_not_a_seed(ep: int, tag, root: Path, arms: tuple[str, ...] = ()) -> str | None:
    """None when ``ep`` can be exported (its source demo has the full scene state), else why not.

    ``arms``: the dataset's (``BI_ARM_SIDES`` for a bimanual one): the source demo must be of that
    layout, and a bi-arm one needs both arms' initial state and no seed (LeIsaac's replay.py seeds
    the env only when the demo has one; annotate_demos.py, which needs it, has no bi-arm task)."""
    kind = tag.follower_kind if tag else "unknown"
    src = tag.source if tag else {}
    if src.get("file") and src.get("demo"):
        path = Path(src["file"])
        if not path.is_absolute() and not path.exists():
            path = root / path
        if not path.exists():
            return f"episode {ep}: imported from {src['file']} {src['demo']}, but that file is gone"
        try:
            f = h5py.File(path, "r")
        except (OSError, ValueError) as exc:
            return f"episode {ep}: its source file {src['file']} is not a readable HDF5 file any more ({exc})"
        with f:
            g = f.get(f"data/{src['demo']}")
            if g is None:
                return f"episode {ep}: {src['file']} has no {src['demo']} any more"
            try:
                src_arms = _demo_arms(g, f"{src['file']}: {src['demo']}")
            except HDF5FormatError as exc:
                return f"episode {ep}: its source is not a bi-arm demo any more: {exc}"
            if src_arms != arms:
                return (
                    f"episode {ep}: its source {src['file']} {src['demo']} is a {layout_name(src_arms)} demo, "
                    f"the dataset is {layout_name(arms)}"
                )
            articulations = tuple(f"{side}_arm" for side in arms)
            if not full_scene_state(g, articulations):
                return (
                    f"episode {ep}: its source {src['file']} {src['demo']} has no full initial_state "
                    "(articulations' root pose and joint state, rigid objects' poses"
                    + (f"; a bi-arm scene's {' and '.join(articulations)}" if arms else "")
                    + ")"
                )
            if not arms and "seed" not in g.attrs:
                return (
                    f"episode {ep}: its source {src['file']} {src['demo']} has no seed attribute; LeIsaac's "
                    "annotate_demos.py calls env.seed(int(episode.seed)) on every demo and stops at it"
                )
        return None
    if kind in ("feetech", "emulated"):
        what = "on the real arm" if kind == "feetech" else "on the emulated arm"
        return (
            f"episode {ep} was recorded {what}: there are no object poses in it. Mimic's annotate step resets "
            "the scene to each demo's initial_state (every articulation and every object, e.g. PickOrange's "
            "three oranges and plate) and keeps only demos whose success check passes after replay, so such "
            "a demo would fail or be dropped silently"
        )
    if kind == "sim-mujoco":
        return (
            f"episode {ep} was recorded on the MuJoCo follower: its scene is not LeIsaac's and the dataset "
            "keeps no object state"
        )
    return f"episode {ep} ({kind}) has no scene state in the dataset (LeRobot datasets keep joints and images only)"


def export_hdf5(
    dataset_root: Path,
    episodes: str,
    out: Path,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Write dataset episodes as Isaac Lab Mimic seed demos (a bimanual dataset's: LeIsaac bi-arm
    demos, see ``_why_not_a_seed``), or refuse with the reason.

    A seed demo must replay in LeIsaac: ``initial_state`` with every articulation and rigid
    object, ``actions``, ``obs/ee_frame_state`` ... (see ``sim_bridge.seed_recorder``). Only
    episodes imported from such a demo can be exported (their source demo is copied verbatim, with
    ``so101d_episode_index`` added); any other selected episode refuses the whole export, naming
    each episode, why, and what to do. The file is written to a temp name and renamed, so a
    refusal or a crash never leaves a file at ``out``.
    """
    say = progress or (lambda msg: log.info("%s", msg))
    root = Path(dataset_root)
    info_path = root / "meta" / "info.json"
    if not info_path.exists():
        raise FileNotFoundError(f"{root}: no LeRobot dataset here (meta/info.json missing)")
    total = int(json.loads(info_path.read_text()).get("total_episodes", 0))
    tags = read_episode_tags(root)
    indices = parse_episode_selection(episodes, total)
    arms = dataset_arms_at(root)
    problems = [why for ep in indices if (why := _why_not_a_seed(ep, tags.get(ep), root, arms))]
    if problems:
        what, howto = ("bi-arm demos", BI_ARM_HOWTO) if arms else ("Mimic seed demos", SEED_HOWTO)
        raise ExportRefused(f"cannot export {what}:\n  " + "\n  ".join(problems) + "\n" + howto)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    total_steps = 0
    env_name = ""
    try:
        with h5py.File(tmp, "w") as f:
            data = f.create_group("data")
            for demo_i, ep in enumerate(indices):
                src = tags[ep].source
                path = Path(src["file"]) if Path(src["file"]).exists() else root / src["file"]
                try:
                    with h5py.File(path, "r") as s_f:
                        if not env_name and "env_args" in s_f["data"].attrs:
                            env_name = json.loads(s_f["data"].attrs["env_args"]).get("env_name", "")
                        s_f.copy(s_f[f"data/{src['demo']}"], data, name=f"demo_{demo_i}")
                except (OSError, KeyError, RuntimeError) as exc:  # damaged beyond what the check read
                    raise ExportRefused(
                        f"cannot export Mimic seed demos: episode {ep}: reading {src['demo']} from its source "
                        f"file {src['file']} failed ({exc})"
                    ) from None
                g = data[f"demo_{demo_i}"]
                g.attrs["so101d_episode_index"] = ep
                total_steps += int(np.asarray(g.attrs.get("num_samples", g["actions"].shape[0])).item())
                say(f"episode {ep} -> demo_{demo_i} (from {src['file']} {src['demo']})")
            data.attrs["env_args"] = json.dumps({"env_name": env_name, "type": 2})
            data.attrs["total"] = total_steps
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return len(indices)


# ---------------------------------------------------------------------------------------------
# Dataset summary
# ---------------------------------------------------------------------------------------------
def dataset_summary(root: Path) -> dict:
    """Counts of real / emulated / sim / generated episodes; see daemon/data/summary.py."""
    from daemon.data.summary import dataset_summary as summary

    return summary(root)
