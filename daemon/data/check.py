"""`so101d dataset check ROOT`: a quality report per episode before training.

Works on any LeRobot v3.0 dataset (reads ``observation.state`` and ``action`` from the data
parquet, lengths from ``meta/episodes``); on ours it also reads the episode tags (late / missing
frames), the per-frame timing files (camera gaps, camera-to-state skew) and ``teleop.action``
(how often the safety layer shaped the command).

Checks (thresholds are ``Thresholds`` fields, each a command-line flag):
- nan: a NaN or infinite value in any numeric column (e.g. a broken imported file)
- late / missing frames: share of frames our writer flagged
- camera gap: the longest run of frames with no new image from a camera (a dropped camera)
- skew: worst camera-to-state time offset
- stall: the command moves a joint while the follower's joint does not (stuck or unpowered)
- hold: command and follower both frozen for a while in the middle of the episode (an operator
  pause, an alignment, a fault hold: nothing to learn from)
- shaped: share of frames where the safety layer changed the command (``action`` vs ``teleop.action``)
- tracking: 95th percentile of |command - follower| over joints (leader-follower tracking error)
- pinned: a joint sitting at the dataset's extreme value for a long run (at a limit)
- gripper: the gripper never opened or closed
- duration: far from the dataset's median length
- feasibility: what the real arm cannot do (joint speed over the servo's rated speed, changes
  past the daemon's step limit, single-frame jumps, positions outside the calibrated range,
  gripper excursions): daemon/data/feasibility.py, against the configured follower (``--config``)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from calibration.conventions import FEATURE_NAMES
from daemon.data.feasibility import ArmLimits, arm_limits, check_feasibility
from daemon.data.schema import ACTION_KEY, STATE_KEY, TELEOP_ACTION_KEY
from daemon.data.store import TIMING_DIR


@dataclass
class Thresholds:
    max_late_frac: float = 0.05
    max_missing_frac: float = 0.05
    max_camera_gap_s: float = 0.5
    max_skew_ms: float = 100.0
    stall_window_s: float = 0.5
    stall_command_deg: float = 3.0  # the command moved at least this much in the window ...
    stall_follower_deg: float = 0.3  # ... while the follower moved less than this
    max_hold_s: float = 1.0
    hold_still_deg: float = 0.05
    max_shaped_frac: float = 0.2
    shaped_deg: float = 0.5
    max_tracking_deg: float = 15.0
    max_pinned_s: float = 2.0
    pinned_deg: float = 0.5
    min_gripper_range: float = 10.0
    duration_factor: float = 2.0  # flagged if shorter than median / f or longer than median * f
    jump_deg: float = 30.0  # a body joint moving more than this in one frame is a jump
    gripper_push_pct: float = 20.0  # gripper commanded this far past the recorded one ...
    gripper_push_s: float = 0.5  # ... for this long: closing through the object


@dataclass
class EpisodeReport:
    episode_index: int
    frames: int
    duration_s: float
    task: str
    metrics: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.reasons


def arm_columns(names: list[str]) -> dict[str, list[int]]:
    """A bimanual dataset's joint columns per arm, by LeRobot's ``left_`` / ``right_`` prefixes
    (daemon/data/schema.py ``arm_joint_names``), each arm's in the SO follower's joint order; {}
    for a single arm's names."""
    out: dict[str, list[int]] = {}
    for arm in ("left", "right"):
        cols = [j for j, n in enumerate(names) if n.startswith(f"{arm}_")]
        if cols:
            out[arm] = cols
    return out if len(out) == 2 and all(len(c) == len(FEATURE_NAMES) for c in out.values()) else {}


def _column(table: Any, name: str) -> np.ndarray:
    """A (n, k) float array of a fixed-size-list column (or (n, 1) of a scalar one)."""
    import pyarrow as pa

    col = table.column(name).combine_chunks()
    n = len(col)
    if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
        col = col.flatten()
    return np.asarray(col.to_numpy(zero_copy_only=False), np.float64).reshape(n, -1)


def _longest_run(mask: np.ndarray) -> tuple[int, int]:
    """(length, start) of the longest run of True."""
    best, best_start, run, start = 0, 0, 0, 0
    for i, v in enumerate(mask):
        if v:
            if run == 0:
                start = i
            run += 1
            if run > best:
                best, best_start = run, start
        else:
            run = 0
    return best, best_start


def _window_range(x: np.ndarray, w: int) -> np.ndarray:
    """max - min of x over each window of w frames, per column: (n - w + 1, k)."""
    from numpy.lib.stride_tricks import sliding_window_view

    v = sliding_window_view(x, w, axis=0)
    return np.asarray(v.max(axis=-1) - v.min(axis=-1))


class DatasetReader:
    """The columns a check needs, per episode, read once."""

    def __init__(self, root: Path) -> None:
        import pyarrow.parquet as pq

        self.root = Path(root)
        info_path = self.root / "meta" / "info.json"
        if not info_path.exists():
            raise FileNotFoundError(f"{root}: no LeRobot dataset here (meta/info.json missing)")
        self.info = json.loads(info_path.read_text())
        if not str(self.info.get("codebase_version", "")).startswith("v3"):
            raise ValueError(f"{root}: LeRobot dataset {self.info.get('codebase_version')}, not v3.0")
        self.fps = float(self.info["fps"])
        feats = self.info["features"]
        self.joint_names = list(feats.get(STATE_KEY, {}).get("names") or [])
        self.numeric = [
            k
            for k, v in feats.items()
            if v["dtype"] in ("float32", "float64", "int32", "int64")
            and k not in ("index", "frame_index", "episode_index", "task_index")
        ]
        self.lengths: dict[int, int] = {}
        self.tasks: dict[int, str] = {}
        for path in sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
            t = pq.read_table(path, columns=["episode_index", "length", "tasks"])
            for ep, n, tasks in zip(*(t.column(c).to_pylist() for c in ("episode_index", "length", "tasks"))):
                self.lengths[int(ep)] = int(n)
                self.tasks[int(ep)] = ", ".join(tasks or [])

    def episodes(self):
        """(episode index, {column: (n, k) array}) for every episode, file by file."""
        import pyarrow.parquet as pq

        cols = ["episode_index", *self.numeric]
        for path in sorted((self.root / "data").glob("chunk-*/file-*.parquet")):
            t = pq.read_table(path, columns=cols)
            eps = t.column("episode_index").to_numpy()
            arrays = {c: _column(t, c) for c in self.numeric if c != "episode_index"}
            bounds = np.flatnonzero(np.diff(eps)) + 1
            for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(eps)]):
                yield int(eps[start]), {c: a[start:stop] for c, a in arrays.items()}

    def timing(self, ep: int) -> dict[str, np.ndarray] | None:
        path = self.root / TIMING_DIR / f"episode_{ep:06d}.npz"
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}


def check_episode(
    ep: int,
    cols: dict[str, np.ndarray],
    reader: DatasetReader,
    th: Thresholds,
    extremes: dict[str, Any],
    tag: Any,
    limits: ArmLimits | None = None,
) -> EpisodeReport:
    n = len(next(iter(cols.values()))) if cols else reader.lengths.get(ep, 0)
    rep = EpisodeReport(ep, n, round(n / reader.fps, 3), reader.tasks.get(ep, ""))
    m, why = rep.metrics, rep.reasons
    names = reader.joint_names
    arms = arm_columns(names)  # a bimanual dataset: each arm's columns; {} for one arm
    grippers = {c[-1] for c in arms.values()}
    arm_body = [j for j in range(len(names)) if j not in grippers]

    def joint(j: int) -> str:
        return names[j] if j < len(names) else f"joint {j}"

    bad = {c: int((~np.isfinite(a)).any(axis=1).sum()) for c, a in cols.items()}
    bad = {c: k for c, k in bad.items() if k}
    m["nan_frames"] = bad
    if bad:
        why.append("NaN/inf in " + ", ".join(f"{c} ({k} frames)" for c, k in sorted(bad.items())))
    if tag is not None and n:
        m["late_frac"] = round(tag.late_frames / n, 4)
        m["missing_frac"] = round(tag.missing_frames / n, 4)
        if m["late_frac"] > th.max_late_frac:
            why.append(f"late frames {tag.late_frames}/{n}")
        if m["missing_frac"] > th.max_missing_frac:
            why.append(f"missing frames {tag.missing_frames}/{n}")
    timing = reader.timing(ep)
    if timing is not None and timing.get("camera_offset_s") is not None and timing["camera_offset_s"].size:
        off = np.asarray(timing["camera_offset_s"], np.float64).reshape(len(timing["camera_offset_s"]), -1)
        cams = [str(c) for c in timing.get("camera_names", [])]
        for c in range(off.shape[1]):
            name = cams[c] if c < len(cams) else str(c)
            gap, at = _longest_run(np.isnan(off[:, c]))
            m[f"camera_gap_s/{name}"] = round(gap / reader.fps, 3)
            if gap / reader.fps > th.max_camera_gap_s:
                why.append(f"camera {name} dropped for {gap / reader.fps:.2f} s from frame {at}")
        finite = off[np.isfinite(off)]
        skew_ms = float(np.abs(finite).max() * 1000) if finite.size else 0.0
        m["worst_skew_ms"] = round(skew_ms, 2)
        if skew_ms > th.max_skew_ms:
            why.append(f"camera-to-state skew {skew_ms:.0f} ms")
    state, action = cols.get(STATE_KEY), cols.get(ACTION_KEY)
    if state is not None and action is not None and n and not bad:
        w = max(2, round(th.stall_window_s * reader.fps))
        if n >= w:
            stalled = (_window_range(action, w) > th.stall_command_deg) & (
                _window_range(state, w) < th.stall_follower_deg
            )
            joints = [joint(j) for j in range(stalled.shape[1]) if stalled[:, j].any()]
            m["stalled_joints"] = joints
            if joints:
                at = int(np.flatnonzero(stalled.any(axis=1))[0])
                why.append(f"stall: command moves {', '.join(joints)} but the follower does not (frame {at})")
        still = (
            np.r_[False, (np.abs(np.diff(action, axis=0)).max(axis=1) < th.hold_still_deg)]
            & np.r_[False, (np.abs(np.diff(state, axis=0)).max(axis=1) < th.hold_still_deg)]
        )
        # a hold at the very start or end is the episode's edge, not a pause in it
        run, at = _longest_run(still)
        in_middle = at > 1 and at + run < n - 1
        m["longest_hold_s"] = round(run / reader.fps, 3)
        if in_middle and run / reader.fps > th.max_hold_s:
            why.append(f"hold for {run / reader.fps:.1f} s in the middle (from frame {at})")
        err = np.abs(action - state)
        p95 = float(np.percentile(err.max(axis=1), 95))
        m["tracking_p95_deg"] = round(p95, 2)
        if p95 > th.max_tracking_deg:
            why.append(f"tracking error {p95:.1f} deg (95th percentile)")
        lo, hi = extremes["min"], extremes["max"]
        pinned = []
        for j in arm_body if arms else range(state.shape[1] - 1):  # the gripper rests at its limit by design
            at_limit = (np.abs(state[:, j] - lo[j]) < th.pinned_deg) | (np.abs(state[:, j] - hi[j]) < th.pinned_deg)
            run_j, _ = _longest_run(at_limit)
            if hi[j] - lo[j] > th.pinned_deg * 4 and run_j / reader.fps > th.max_pinned_s:
                pinned.append(joint(j))
        m["pinned_joints"] = pinned
        if pinned:
            why.append(f"pinned at a limit: {', '.join(pinned)}")
        if names and names[-1].startswith("gripper"):
            g = float(np.ptp(state[:, -1]))
            m["gripper_range"] = round(g, 2)
            if g < th.min_gripper_range:
                why.append(f"gripper never opened or closed (range {g:.1f})")
        for arm, cols_j in arms.items():  # two arms: each one's gripper
            g = float(np.ptp(state[:, cols_j[-1]]))
            m[f"{arm}/gripper_range"] = round(g, 2)
            if g < th.min_gripper_range:
                why.append(f"{arm} gripper never opened or closed (range {g:.1f})")
        teleop = cols.get(TELEOP_ACTION_KEY)
        if teleop is not None:
            shaped = float((np.abs(teleop - action).max(axis=1) > th.shaped_deg).mean())
            m["shaped_frac"] = round(shaped, 4)
            if shaped > th.max_shaped_frac:
                why.append(f"safety shaped the command in {shaped:.0%} of frames")
    if limits is not None and action is not None and not bad and not arms:
        feas = check_feasibility(action, state, reader.fps, limits)
        m["feasibility"] = feas.metrics
        why.extend(feas.reasons)
    elif limits is not None and action is not None and not bad:  # two arms: each against the arm's limits
        m["feasibility"] = {}
        for arm, cols_j in arms.items():
            lim = limits.per_arm.get(arm, limits)  # the arm's own calibrated range, when configured
            feas = check_feasibility(action[:, cols_j], None if state is None else state[:, cols_j], reader.fps, lim)
            m["feasibility"][arm] = feas.metrics
            why.extend(f"{arm} arm: {r}" for r in feas.reasons)
    med = extremes["median_frames"]
    if med and (n < med / th.duration_factor or n > med * th.duration_factor):
        why.append(f"duration {n / reader.fps:.1f} s vs median {med / reader.fps:.1f} s")
    return rep


def check_dataset(
    root: Path, th: Thresholds | None = None, limits: ArmLimits | None = None, episodes: set[int] | None = None
) -> list[EpisodeReport]:
    """One report per episode (``episodes``: only those), in episode order; ``limits``: the
    feasibility checks against that arm too."""
    from daemon.data.tags import tag_report

    th = th or Thresholds()
    reader = DatasetReader(root)
    tags = tag_report(root).tags if (Path(root) / "meta" / "info.json").exists() else {}
    lengths = list(reader.lengths.values())
    extremes: dict[str, Any] = {"median_frames": float(np.median(lengths)) if lengths else 0.0}
    # dataset-wide joint extremes (NaN-free episodes): where "at a limit" is
    per_ep = list(reader.episodes())
    states = [c[STATE_KEY] for _, c in per_ep if STATE_KEY in c and np.isfinite(c[STATE_KEY]).all()]
    if states:
        extremes["min"] = np.min([s.min(axis=0) for s in states], axis=0)
        extremes["max"] = np.max([s.max(axis=0) for s in states], axis=0)
    else:
        extremes["min"] = extremes["max"] = np.zeros(len(reader.joint_names) or 1)
    if limits is not None:

        def with_thresholds(lim: ArmLimits) -> ArmLimits:
            return replace(
                lim, jump_deg=th.jump_deg, gripper_push_pct=th.gripper_push_pct, gripper_push_s=th.gripper_push_s
            )

        per_arm = {side: with_thresholds(lim) for side, lim in limits.per_arm.items()}
        limits = replace(with_thresholds(limits), per_arm=per_arm)
    return [
        check_episode(ep, cols, reader, th, extremes, tags.get(ep), limits)
        for ep, cols in per_ep
        if episodes is None or ep in episodes
    ]


def feasibility_limits(config: Path | None, root: Path) -> ArmLimits:
    """The configured follower's limits (``config``: a daemon configuration; None: the defaults,
    without a calibrated range) at the dataset's fps."""
    from daemon.config.settings import Config, load_config

    fps = float(json.loads((Path(root) / "meta" / "info.json").read_text())["fps"])
    cfg = load_config(config) if config is not None else Config()
    return arm_limits(cfg, with_calibration=config is not None, fps=fps)


def tag_findings(root: Path, reports: list[EpisodeReport]) -> list[int]:
    """Write each flagged episode's reasons into its tag's notes ("check: ..."), so they travel with
    the episode; returns the episodes tagged (ours only: an untagged episode has no tag to extend)."""
    from daemon.data.edit import owned
    from daemon.data.schema import read_episode_tags
    from daemon.data.tags import write_tags

    with owned(Path(root).resolve()):
        tags = read_episode_tags(root)
        changed = []
        for r in reports:
            t = tags.get(r.episode_index)
            if t is None or r.clean:
                continue
            t.notes = [n for n in t.notes if not n.startswith("check: ")] + [f"check: {w}"[:200] for w in r.reasons]
            changed.append(t)
        if changed:
            write_tags(root, changed)
    return [t.episode_index for t in changed]


def training_episodes_arg(reports: list[EpisodeReport]) -> str:
    """The clean episodes as `lerobot-train --dataset.episodes=[...]` takes them."""
    return "--dataset.episodes=[" + ",".join(str(r.episode_index) for r in reports if r.clean) + "]"


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", type=Path)
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument(
        "--episodes-for-training",
        action="store_true",
        help="print only the clean episodes, as lerobot-train's --dataset.episodes=[...]",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="daemon configuration: check feasibility against its follower (calibrated range, step limit, "
        "servo model and supply voltage); default: the defaults, no calibrated range",
    )
    p.add_argument("--tag", action="store_true", help="write each flagged episode's reasons into its tag's notes")
    for f in fields(Thresholds):
        p.add_argument("--" + f.name.replace("_", "-"), type=float, default=f.default, help=f"(default {f.default})")


def run_check(args: argparse.Namespace) -> int:
    th = Thresholds(**{f.name: getattr(args, f.name) for f in fields(Thresholds)})
    try:
        limits = feasibility_limits(args.config, args.root)
        reports = check_dataset(args.root, th, limits)
    except (FileNotFoundError, ValueError, KeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    tagged: list[int] | None = None
    tag_error = ""
    if args.tag:
        # a dataset that cannot be written (read-only, another's) still gets its findings printed
        from daemon.data.store import DatasetBusyError

        try:
            tagged = tag_findings(args.root, reports)
        except (OSError, ValueError, DatasetBusyError) as exc:
            tag_error = f"error: --tag: no tag was written: {type(exc).__name__}: {exc}"
    rc = 1 if tag_error else 0
    if args.episodes_for_training:
        print(training_episodes_arg(reports))
        _say(tag_error)
        return rc
    if args.json:
        print(
            json.dumps(
                {"thresholds": asdict(th), "episodes": [asdict(r) | {"clean": r.clean} for r in reports]}, indent=2
            )
        )
        _say(tag_error)
        return rc
    print(f"{'episode':>7}  {'frames':>6}  {'seconds':>7}  verdict")
    for r in reports:
        print(f"{r.episode_index:>7}  {r.frames:>6}  {r.duration_s:>7.1f}  " + ("ok" if r.clean else "FLAGGED"))
        for reason in r.reasons:
            print(f"{'':>27}- {reason}")
    flagged = sum(1 for r in reports if not r.clean)
    print(
        f"feasibility against: {limits.model.upper()} at {limits.supply_voltage_v:g} V "
        f"(rated {limits.rated_speed_deg_s:.0f} deg/s), step limit {limits.step_text}, "
        + (
            "each arm's calibrated range"
            if limits.per_arm and limits.lower is not None
            else "the follower's calibrated range"
            if limits.lower is not None
            else "no calibrated range (give --config)"
        )
    )
    if tagged is not None:
        print(f"tagged {len(tagged)} flagged episodes with their reasons" + (f": {tagged}" if tagged else ""))
    print(f"{len(reports) - flagged} clean, {flagged} flagged; train on the clean ones with:")
    print(f"  lerobot-train ... {training_episodes_arg(reports)}")
    _say(tag_error)
    return rc


def _say(error: str) -> None:
    if error:
        print(error, file=sys.stderr)
