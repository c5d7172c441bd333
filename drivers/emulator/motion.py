"""Motion sources for an emulated leader: where the hand puts the arm, as a function of time.

A source maps seconds since its start to a pose in LeRobot units (five body joints in degrees,
gripper 0..100 with 0 closed), in ``JOINT_NAMES`` order. The arm converts poses to ticks through
its own (reference) calibration.

- ``DemoMotion``: a smooth, looping pick-and-place (reach, open, lower, grasp, lift, carry,
  lower, release, retreat, rest) of 16 s, eased between keyframes so velocity is continuous.
- ``HandoverMotion("left"|"right")``: one side of a bimanual handover (``so101d emulate
  --bimanual``): the left arm picks an object and carries it to the middle, the right arm takes it
  there and puts it down on its side. Both 16 s loops on one clock, so the two leaders move
  together but on different paths and phases, never as mirror images of one another.
- ``StillMotion``: one fixed pose.
- ``TrajectoryMotion``: a recorded trajectory (CSV or JSON), linearly interpolated, looping.

Files: CSV with a header ``t_s,shoulder_pan,shoulder_lift,elbow_flex,wrist_flex,wrist_roll,gripper``
(``time``/``timestamp`` and ``<joint>.pos`` column names are accepted too); JSON either
``{"t_s": [...], "positions": [[6 numbers], ...]}`` or a list of row objects with the same
column names as the CSV.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
from pathlib import Path
from typing import Protocol

import numpy as np

from calibration.conventions import JOINT_NAMES, NUM_JOINTS

REST_POSE_UNITS = np.array([0.0, -95.0, 92.0, 55.0, 0.0, 2.0])


class MotionError(ValueError):
    """A trajectory file that cannot be used (names the file and the problem)."""


class MotionSource(Protocol):
    def pose_at(self, t_s: float) -> np.ndarray:
        """Pose (6,) in LeRobot units, ``t_s`` seconds after the source started."""
        ...


class StillMotion:
    def __init__(self, pose_units: np.ndarray | list[float] = REST_POSE_UNITS) -> None:
        self.pose = np.asarray(pose_units, dtype=np.float64).copy()
        if self.pose.shape != (NUM_JOINTS,) or not np.all(np.isfinite(self.pose)):
            raise MotionError(f"a pose needs {NUM_JOINTS} finite values, got {pose_units!r}")

    def pose_at(self, t_s: float) -> np.ndarray:
        return self.pose


def _smoothstep(x: float) -> float:
    return x * x * (3.0 - 2.0 * x)


class KeyframeMotion:
    """Eased interpolation between keyframes ``[(t_s, pose), ...]``, looping over the last time."""

    def __init__(self, keyframes: list[tuple[float, list[float]]], loop: bool = True, eased: bool = True) -> None:
        if len(keyframes) < 1:
            raise MotionError("a trajectory needs at least one sample")
        times = [float(t) for t, _ in keyframes]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise MotionError("trajectory times must be strictly increasing")
        if not all(math.isfinite(t) for t in times):
            raise MotionError("trajectory times must be finite")
        poses = np.asarray([p for _, p in keyframes], dtype=np.float64)
        if poses.shape != (len(times), NUM_JOINTS):
            raise MotionError(f"every trajectory sample needs {NUM_JOINTS} joint values")
        if not np.all(np.isfinite(poses)):
            raise MotionError("trajectory contains non-finite joint values")
        self.t0 = times[0]
        self.times = [t - self.t0 for t in times]
        self.poses = poses
        self.loop = loop and len(times) > 1
        self.eased = eased
        self.duration_s = self.times[-1]

    def pose_at(self, t_s: float) -> np.ndarray:
        if len(self.times) == 1:
            return self.poses[0]
        t = t_s % self.duration_s if self.loop else min(max(t_s, 0.0), self.duration_s)
        i = bisect.bisect_right(self.times, t) - 1
        if i >= len(self.times) - 1:
            return self.poses[-1]
        t_a, t_b = self.times[i], self.times[i + 1]
        x = (t - t_a) / (t_b - t_a)
        if self.eased:
            x = _smoothstep(x)
        return self.poses[i] + (self.poses[i + 1] - self.poses[i]) * x


# A pick-and-place cycle inside both presets' calibrated ranges.
DEMO_KEYFRAMES: list[tuple[float, list[float]]] = [
    (0.0, REST_POSE_UNITS.tolist()),
    (2.5, [25.0, -30.0, 40.0, 60.0, 10.0, 70.0]),  # reach above the object, open
    (4.5, [25.0, 5.0, 20.0, 70.0, 10.0, 70.0]),  # lower
    (5.5, [25.0, 5.0, 20.0, 70.0, 10.0, 8.0]),  # grasp
    (7.5, [25.0, -35.0, 45.0, 55.0, 10.0, 8.0]),  # lift
    (10.0, [-30.0, -35.0, 45.0, 55.0, -20.0, 8.0]),  # carry
    (11.5, [-30.0, 0.0, 22.0, 68.0, -20.0, 8.0]),  # lower
    (12.5, [-30.0, 0.0, 22.0, 68.0, -20.0, 70.0]),  # release
    (14.0, [-30.0, -40.0, 60.0, 50.0, 0.0, 40.0]),  # retreat
    (16.0, REST_POSE_UNITS.tolist()),  # rest, then loop
]


class DemoMotion(KeyframeMotion):
    def __init__(self) -> None:
        super().__init__(DEMO_KEYFRAMES, loop=True, eased=True)


# The bimanual handover, one keyframe list per side on a shared 16 s clock (so101d emulate
# --bimanual). Poses stay inside both presets' calibrated ranges, like DEMO_KEYFRAMES. The right
# arm starts moving at once (getting ready) so that both sides move from the first second.
HANDOVER_KEYFRAMES: dict[str, list[tuple[float, list[float]]]] = {
    "left": [
        (0.0, REST_POSE_UNITS.tolist()),
        (2.0, [30.0, -30.0, 40.0, 60.0, 10.0, 70.0]),  # reach above the object, open
        (3.5, [30.0, 5.0, 20.0, 70.0, 10.0, 70.0]),  # lower
        (4.5, [30.0, 5.0, 20.0, 70.0, 10.0, 8.0]),  # grasp
        (6.5, [-15.0, -45.0, 50.0, 40.0, 60.0, 8.0]),  # lift and carry to the middle, rolled toward the partner
        (9.0, [-15.0, -45.0, 50.0, 40.0, 60.0, 8.0]),  # hold while the right arm grasps
        (10.0, [-15.0, -45.0, 50.0, 40.0, 60.0, 70.0]),  # let go
        (12.0, [10.0, -60.0, 70.0, 50.0, 0.0, 40.0]),  # retreat
        (16.0, REST_POSE_UNITS.tolist()),  # rest, then loop
    ],
    "right": [
        (0.0, REST_POSE_UNITS.tolist()),
        (3.0, [-10.0, -60.0, 70.0, 45.0, 0.0, 30.0]),  # get ready
        (6.5, [12.0, -40.0, 45.0, 45.0, -60.0, 75.0]),  # reach into the middle, open
        (8.5, [12.0, -40.0, 45.0, 45.0, -60.0, 10.0]),  # grasp what the left arm holds
        (10.0, [12.0, -40.0, 45.0, 45.0, -60.0, 10.0]),  # hold until the left arm has let go
        (11.5, [-35.0, -30.0, 40.0, 60.0, -20.0, 10.0]),  # carry it to the right
        (12.5, [-35.0, 2.0, 22.0, 68.0, -20.0, 10.0]),  # lower
        (13.5, [-35.0, 2.0, 22.0, 68.0, -20.0, 70.0]),  # release
        (16.0, REST_POSE_UNITS.tolist()),  # rest, then loop
    ],
}
HANDOVER_SIDES: tuple[str, ...] = ("left", "right")


class HandoverMotion(KeyframeMotion):
    """One side (``"left"`` or ``"right"``) of the bimanual handover demo."""

    def __init__(self, side: str) -> None:
        if side not in HANDOVER_KEYFRAMES:
            raise MotionError(f"a handover side is 'left' or 'right', got {side!r}")
        super().__init__(HANDOVER_KEYFRAMES[side], loop=True, eased=True)


_TIME_COLUMNS = ("t_s", "t", "time", "time_s", "timestamp")


def _column_for(joint: str, columns: list[str]) -> str | None:
    for name in (joint, f"{joint}.pos"):
        if name in columns:
            return name
    return None


def _rows_to_keyframes(rows: list[dict], source: str) -> list[tuple[float, list[float]]]:
    if not rows:
        raise MotionError(f"{source}: no samples")
    columns = list(rows[0].keys())
    tcol = next((c for c in _TIME_COLUMNS if c in columns), None)
    if tcol is None:
        raise MotionError(f"{source}: no time column (one of {', '.join(_TIME_COLUMNS)})")
    jcols = []
    for joint in JOINT_NAMES:
        col = _column_for(joint, columns)
        if col is None:
            raise MotionError(f"{source}: missing column for joint '{joint}'")
        jcols.append(col)
    out = []
    for n, row in enumerate(rows):
        try:
            out.append((float(row[tcol]), [float(row[c]) for c in jcols]))
        except (KeyError, TypeError, ValueError) as exc:
            raise MotionError(f"{source}: sample {n}: {exc}") from exc
    return out


def load_trajectory(path: str | Path, loop: bool = True) -> KeyframeMotion:
    """Load a CSV or JSON trajectory (see the module docstring) as a linear, looping source."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise MotionError(f"{path}: cannot read trajectory: {exc.strerror or exc}") from exc
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MotionError(f"{path}: corrupt JSON: {exc}") from exc
        if isinstance(data, dict):
            times = data.get("t_s")
            positions = data.get("positions")
            if not isinstance(times, list) or not isinstance(positions, list) or len(times) != len(positions):
                raise MotionError(f"{path}: expected {{'t_s': [...], 'positions': [[6 values], ...]}} of equal length")
            try:
                frames = [(float(t), [float(v) for v in p]) for t, p in zip(times, positions)]
            except (TypeError, ValueError) as exc:
                raise MotionError(f"{path}: {exc}") from exc
        elif isinstance(data, list) and all(isinstance(r, dict) for r in data):
            frames = _rows_to_keyframes(data, str(path))
        else:
            raise MotionError(f"{path}: expected an object with t_s/positions or a list of row objects")
    else:
        rows = list(csv.DictReader(text.splitlines()))
        frames = _rows_to_keyframes(rows, str(path))
    try:
        return KeyframeMotion(frames, loop=loop, eased=False)
    except MotionError as exc:
        raise MotionError(f"{path}: {exc}") from exc


def motion_from_spec(spec: str) -> MotionSource:
    """``demo``, ``still``, ``handover-left``, ``handover-right`` or a trajectory file path (the CLI's
    --leader-motion; ``so101d emulate --bimanual`` turns ``demo`` into each side's handover)."""
    if spec == "demo":
        return DemoMotion()
    if spec.startswith("handover-") and spec.removeprefix("handover-") in HANDOVER_KEYFRAMES:
        return HandoverMotion(spec.removeprefix("handover-"))
    if spec == "still":
        return StillMotion()
    return load_trajectory(spec)
