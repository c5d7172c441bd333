"""Every unit conversion of the system, in one place.

Three unit systems meet here:

- **ticks**: what the STS3215 reports and accepts (0..4095 per turn, after the servo subtracts
  its Homing_Offset).
- **LeRobot units** (LeRobot 0.6.1's SO follower, ``use_degrees=True``, the default since 0.6):
  the five body joints in degrees, ``(ticks - mid) * 360 / 4095`` with ``mid`` the middle of the
  calibrated range (no clamp); the gripper in 0..100 of its calibrated range, **0 closed,
  100 open**. The legacy body mode ``range_m100_100`` (-100..100 of the range, clamped) is
  supported for old datasets and for LeIsaac's remote-leader stream.
  These are the units of the daemon's control loop, of every dataset we write, and of the
  simulation protocol.
- **LeIsaac simulation radians**: joint positions of the Isaac Lab SO-101 (and of our MuJoCo
  follower). LeIsaac maps LeRobot's normalised units linearly onto its USD joint-limit table
  (``LEISAAC_USD_LIMITS_DEG``): -100 -> lower limit, +100 -> upper (gripper 0 -> lower,
  100 -> upper). We treat the simulated arm as an arm whose calibrated range *is* that table, so
  a body joint's LeRobot degrees are its sim angle measured from the middle of the table's range
  and the gripper's 0..100 spans the table's gripper range. Composed with a calibration that
  spans the table this is exactly LeIsaac's map, and degrees stay degrees.

Rounding: ticks are integers; we round to nearest (LeRobot truncates with ``int()``), which makes
ticks -> units -> ticks the identity. The difference from LeRobot is under one tick.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

import numpy as np


class JointRange(Protocol):
    """What a conversion needs of one joint's calibration (``calibration_file.MotorCalibration``)."""

    @property
    def range_min(self) -> int: ...
    @property
    def range_max(self) -> int: ...
    @property
    def drive_mode(self) -> int: ...


class ArmRanges(Protocol):
    """What a conversion needs of an arm's calibration: its joints by name.

    ``calibration_file.ArmCalibration`` is one. Declared here, not imported, so this module sits
    below the file format (the file module imports the joint table from here).
    """

    def __getitem__(self, joint: str) -> JointRange: ...


JOINT_NAMES: tuple[str, ...] = (
    "shoulder_pan",
    "shoulder_lift",
    "elbow_flex",
    "wrist_flex",
    "wrist_roll",
    "gripper",
)
JOINT_IDS: dict[str, int] = {name: i + 1 for i, name in enumerate(JOINT_NAMES)}
NUM_JOINTS = len(JOINT_NAMES)
GRIPPER_INDEX = JOINT_NAMES.index("gripper")
BODY_INDICES = tuple(i for i in range(NUM_JOINTS) if i != GRIPPER_INDEX)
# Dataset / LeRobot feature names, in joint order.
FEATURE_NAMES: tuple[str, ...] = tuple(f"{name}.pos" for name in JOINT_NAMES)

MAX_TICK = 4095  # LeRobot's model_resolution - 1 for the STS3215
GRIPPER_CLOSED = 0.0
GRIPPER_OPEN = 100.0

BodyMode = Literal["degrees", "range_m100_100"]

# LeIsaac 0.4 (leisaac.assets.robots.lerobot): SO-101 joint limits written in the USD, degrees.
LEISAAC_USD_LIMITS_DEG: dict[str, tuple[float, float]] = {
    "shoulder_pan": (-110.0, 110.0),
    "shoulder_lift": (-100.0, 100.0),
    "elbow_flex": (-100.0, 90.0),
    "wrist_flex": (-95.0, 95.0),
    "wrist_roll": (-160.0, 160.0),
    "gripper": (-10.0, 100.0),
}
# LeIsaac's "motor limits": the normalised LeRobot ranges its linear map starts from.
LEISAAC_MOTOR_LIMITS: dict[str, tuple[float, float]] = {
    **{name: (-100.0, 100.0) for name in JOINT_NAMES if name != "gripper"},
    "gripper": (0.0, 100.0),
}

_SIM_LO_DEG = np.array([LEISAAC_USD_LIMITS_DEG[n][0] for n in JOINT_NAMES])
_SIM_HI_DEG = np.array([LEISAAC_USD_LIMITS_DEG[n][1] for n in JOINT_NAMES])
_SIM_MID_DEG = (_SIM_LO_DEG + _SIM_HI_DEG) / 2
_MOTOR_LO = np.array([LEISAAC_MOTOR_LIMITS[n][0] for n in JOINT_NAMES])
_MOTOR_HI = np.array([LEISAAC_MOTOR_LIMITS[n][1] for n in JOINT_NAMES])


def _ranges(cal: ArmRanges) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo = np.array([cal[n].range_min for n in JOINT_NAMES], dtype=np.float64)
    hi = np.array([cal[n].range_max for n in JOINT_NAMES], dtype=np.float64)
    drive = np.array([cal[n].drive_mode for n in JOINT_NAMES], dtype=bool)
    return lo, hi, drive


# ---------------------------------------------------------------------------------------------
# ticks <-> LeRobot units
# ---------------------------------------------------------------------------------------------
def ticks_to_units(ticks: np.ndarray, cal: ArmRanges, body_mode: BodyMode = "degrees") -> np.ndarray:
    """Present_Position ticks (6,) -> LeRobot units (6,), exactly as LeRobot 0.6.1 normalises.

    Body joints: degrees from the middle of the calibrated range (not clamped), or
    -100..100 of the range (clamped, sign flipped when drive_mode is 1). Gripper: 0..100 of its
    range, clamped, ``100 - x`` when drive_mode is 1.
    """
    t = np.asarray(ticks, dtype=np.float64)
    lo, hi, drive = _ranges(cal)
    out = np.empty(NUM_JOINTS, dtype=np.float64)
    bounded = np.clip(t, lo, hi)
    for i in BODY_INDICES:
        if body_mode == "degrees":
            out[i] = (t[i] - (lo[i] + hi[i]) / 2) * 360.0 / MAX_TICK
        elif body_mode == "range_m100_100":
            norm = (bounded[i] - lo[i]) / (hi[i] - lo[i]) * 200.0 - 100.0
            out[i] = -norm if drive[i] else norm
        else:
            raise ValueError(f"unknown body mode {body_mode!r}")
    g = GRIPPER_INDEX
    norm = (bounded[g] - lo[g]) / (hi[g] - lo[g]) * 100.0
    out[g] = 100.0 - norm if drive[g] else norm
    return out


def units_to_ticks(units: np.ndarray, cal: ArmRanges, body_mode: BodyMode = "degrees") -> np.ndarray:
    """LeRobot units (6,) -> Goal_Position ticks (6,), int64, the inverse of ``ticks_to_units``.

    Non-finite input raises ValueError: NaN or inf must never reach a bus.
    Normalised modes clamp to their range like LeRobot; degrees do not (the safety layer clamps
    to the calibrated limits before this is called).
    """
    u = np.asarray(units, dtype=np.float64)
    if u.shape != (NUM_JOINTS,):
        raise ValueError(f"expected {NUM_JOINTS} joint values, got shape {u.shape}")
    if not np.all(np.isfinite(u)):
        raise ValueError(f"non-finite joint value(s): {u.tolist()}")
    lo, hi, drive = _ranges(cal)
    out = np.empty(NUM_JOINTS, dtype=np.float64)
    for i in BODY_INDICES:
        if body_mode == "degrees":
            out[i] = u[i] * MAX_TICK / 360.0 + (lo[i] + hi[i]) / 2
        elif body_mode == "range_m100_100":
            v = -u[i] if drive[i] else u[i]
            v = min(100.0, max(-100.0, v))
            out[i] = (v + 100.0) / 200.0 * (hi[i] - lo[i]) + lo[i]
        else:
            raise ValueError(f"unknown body mode {body_mode!r}")
    g = GRIPPER_INDEX
    v = 100.0 - u[g] if drive[g] else u[g]
    v = min(100.0, max(0.0, v))
    out[g] = v / 100.0 * (hi[g] - lo[g]) + lo[g]
    return np.rint(out).astype(np.int64)


def unit_limits(cal: ArmRanges, body_mode: BodyMode = "degrees") -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) reachable positions in LeRobot units from an arm's calibrated ranges."""
    lo, hi, _ = _ranges(cal)
    a = ticks_to_units(lo, cal, body_mode)
    b = ticks_to_units(hi, cal, body_mode)
    return np.minimum(a, b), np.maximum(a, b)


def leader_ticks_to_follower_ticks(
    leader_ticks: np.ndarray, leader_cal: ArmRanges, follower_cal: ArmRanges
) -> np.ndarray:
    """Map a leader pose onto the follower through both arms' own calibrations.

    Leader ticks -> LeRobot units (leader calibration) -> follower ticks (follower calibration),
    with the follower's calibrated range as a hard clamp.
    """
    units = ticks_to_units(leader_ticks, leader_cal)
    ticks = units_to_ticks(units, follower_cal)
    lo, hi, _ = _ranges(follower_cal)
    return np.clip(ticks, lo, hi).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# LeRobot units <-> LeIsaac simulation radians
# ---------------------------------------------------------------------------------------------
def normalized_to_sim_rad(normalized: np.ndarray) -> np.ndarray:
    """LeIsaac's own map: normalised LeRobot units (body -100..100, gripper 0..100) -> sim radians."""
    n = np.asarray(normalized, dtype=np.float64)
    deg = (n - _MOTOR_LO) / (_MOTOR_HI - _MOTOR_LO) * (_SIM_HI_DEG - _SIM_LO_DEG) + _SIM_LO_DEG
    return np.deg2rad(deg)


def sim_rad_to_normalized(rad: np.ndarray) -> np.ndarray:
    """Inverse of ``normalized_to_sim_rad``."""
    deg = np.rad2deg(np.asarray(rad, dtype=np.float64))
    return (deg - _SIM_LO_DEG) / (_SIM_HI_DEG - _SIM_LO_DEG) * (_MOTOR_HI - _MOTOR_LO) + _MOTOR_LO


def units_to_sim_rad(units: np.ndarray) -> np.ndarray:
    """LeRobot units (body degrees, gripper 0..100) -> LeIsaac joint radians.

    Body: the sim angle is the LeRobot angle measured from the middle of LeIsaac's limit range.
    Gripper: 0 (closed) -> LeIsaac's lower gripper limit, 100 (open) -> its upper limit.
    """
    u = np.asarray(units, dtype=np.float64)
    deg = u + _SIM_MID_DEG
    g = GRIPPER_INDEX
    deg[..., g] = u[..., g] / 100.0 * (_SIM_HI_DEG[g] - _SIM_LO_DEG[g]) + _SIM_LO_DEG[g]
    return np.deg2rad(deg)


def sim_rad_to_units(rad: np.ndarray) -> np.ndarray:
    """LeIsaac joint radians -> LeRobot units (inverse of ``units_to_sim_rad``)."""
    deg = np.rad2deg(np.asarray(rad, dtype=np.float64))
    units = deg - _SIM_MID_DEG
    g = GRIPPER_INDEX
    units[..., g] = (deg[..., g] - _SIM_LO_DEG[g]) / (_SIM_HI_DEG[g] - _SIM_LO_DEG[g]) * 100.0
    return units


def sim_unit_limits() -> tuple[np.ndarray, np.ndarray]:
    """Joint limits of the simulated arm in LeRobot units (its 'calibrated range')."""
    return sim_rad_to_units(np.deg2rad(_SIM_LO_DEG)), sim_rad_to_units(np.deg2rad(_SIM_HI_DEG))


def degrees_to_rad(deg: float) -> float:
    return deg * math.pi / 180.0


# ---------------------------------------------------------------------------------------------
# Leader -> simulated follower: the two sim mappings ([follower] sim_mapping)
# ---------------------------------------------------------------------------------------------
SimMapping = Literal["degrees", "leisaac"]
SIM_MAPPINGS: tuple[str, ...] = ("degrees", "leisaac")


def leader_units_to_leisaac_sim_units(leader_units: np.ndarray, leader_cal: ArmRanges) -> np.ndarray:
    """``sim_mapping = "leisaac"``: the sim follower's units (see ``sim_rad_to_units``) for a leader
    reading, exactly as LeIsaac maps its own SO-101 leader.

    LeIsaac 0.4.0 reads the leader's Present_Position, normalises it with the leader's calibrated
    range (``devices/lerobot/common/motors/motors_bus.py`` ``_normalize``: body RANGE_M100_100 of
    the range clamped to it, sign flipped by drive_mode; gripper RANGE_0_100) and maps -100..100
    (gripper 0..100) linearly onto its USD joint-limit table
    (``devices/action_process.py`` ``convert_action_from_so101_leader``). The leader's whole
    calibrated range therefore spans the sim joint's whole range: ranges are stretched, angles are
    not kept. ``leader_units`` are the daemon's leader reading (LeRobot degrees, gripper 0..100):
    the ticks behind them are recovered exactly (``units_to_ticks`` without rounding).
    """
    u = np.asarray(leader_units, dtype=np.float64)
    lo, hi, drive = _ranges(leader_cal)
    normalized = np.empty(NUM_JOINTS, dtype=np.float64)
    for i in BODY_INDICES:
        ticks = u[i] * MAX_TICK / 360.0 + (lo[i] + hi[i]) / 2
        bounded = min(hi[i], max(lo[i], ticks))
        norm = (bounded - lo[i]) / (hi[i] - lo[i]) * 200.0 - 100.0
        normalized[i] = -norm if drive[i] else norm
    g = GRIPPER_INDEX
    normalized[g] = min(100.0, max(0.0, u[g]))  # already LeIsaac's RANGE_0_100 (drive_mode applied)
    return sim_rad_to_units(normalized_to_sim_rad(normalized))


def map_leader_to_sim(leader_units: np.ndarray, mapping: SimMapping, leader_cal: ArmRanges | None) -> np.ndarray:
    """The sim follower's target for a leader reading under ``mapping``.

    ``degrees`` (the default): LeRobot degrees are the sim's degrees (angles kept, each joint's
    zero at the middle of LeIsaac's limit range; gripper 0..100 over its range). ``leisaac``:
    ``leader_units_to_leisaac_sim_units`` (LeIsaac's own map; needs the leader's calibration).
    """
    if mapping == "degrees":
        return np.asarray(leader_units, dtype=np.float64)
    if mapping == "leisaac":
        if leader_cal is None:
            raise ValueError('sim_mapping = "leisaac" needs the leader\'s calibration')
        return leader_units_to_leisaac_sim_units(leader_units, leader_cal)
    raise ValueError(f"unknown sim_mapping {mapping!r} (use one of {', '.join(SIM_MAPPINGS)})")
