"""Can the real arm do what an episode's ``action`` asks? Offline, no arm needed.

A generated trajectory (Mimic, a simulator) that the STS3215 arm cannot follow teaches a policy
something the arm will never do. Per episode, on its ``action``:
- speed: a body joint faster than the servo's rated no-load speed at the configured supply
  voltage (``RATED_SPEED_DEG_S``), as runs of frames;
- step limit: a frame-to-frame change larger than the daemon's own step limit lets through in
  one frame's worth of cycles (safety would spread it: the arm lags the recorded motion);
- single-frame jumps (a discontinuity at a subtask boundary): larger than ``jump_deg`` in one frame;
- calibrated range: positions outside the follower's calibrated limits (safety clamps them);
- gripper excursions: a gripper command outside 0..100, or commanded well past where the
  recorded gripper stopped for a while (closing through the object).
Peak acceleration is reported as a figure (deg/s^2) without a verdict: the servo's acceleration
limit depends on its Acceleration register, not on a rated figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from calibration.conventions import FEATURE_NAMES, GRIPPER_INDEX
from daemon.config.settings import ARM_SIDES, Config

# Rated no-load speed of the servo, deg/s, by model and supply voltage. STS3215 figures as
# collected in ../shared/reference/so101-facts.md section 1 from Feetech's data: 7.4 V about
# 0.19 s per 60 degrees (52 rpm), 12 V about 45 rpm.
RATED_SPEED_DEG_S: dict[str, dict[float, float]] = {
    "sts3215": {7.4: 60.0 / 0.19, 12.0: 45.0 * 360.0 / 60.0},
}
_VOLTAGE_TOLERANCE_V = 0.6


def rated_speed_deg_s(model: str, supply_voltage_v: float) -> float:
    """The table's rated speed, or ValueError naming what the table has."""
    table = RATED_SPEED_DEG_S.get(model)
    if table is None:
        raise ValueError(
            f"follower.servo_model {model!r}: no rated speed known (known: {', '.join(RATED_SPEED_DEG_S)})"
        )
    for volts, speed in table.items():
        if abs(volts - supply_voltage_v) <= _VOLTAGE_TOLERANCE_V:
            return speed
    known = ", ".join(f"{v:g} V" for v in table)
    raise ValueError(f"follower.supply_voltage_v {supply_voltage_v:g}: the {model} table has {known}")


@dataclass(frozen=True)
class ArmLimits:
    """What the episode is checked against (from the configuration and the follower's calibration)."""

    rated_speed_deg_s: float
    model: str
    supply_voltage_v: float
    max_step_per_frame: np.ndarray  # (6,) the step limit x cycles per frame (deg; gripper %)
    step_text: str  # how that was derived ("10 deg per cycle at 50 Hz = ..."), for the reasons
    lower: np.ndarray | None = None  # calibrated range, LeRobot units (None: no calibration found)
    upper: np.ndarray | None = None
    jump_deg: float = 30.0
    gripper_push_pct: float = 20.0
    gripper_push_s: float = 0.5
    # a bimanual rig's arms, each with its own calibrated range ("left", "right"); these fields
    # are then the left arm's
    per_arm: dict[str, ArmLimits] = field(default_factory=dict)


@dataclass
class Feasibility:
    reasons: list[str] = field(default_factory=list)
    metrics: dict[str, float | int | list[str]] = field(default_factory=dict)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end] (inclusive) of every run of True."""
    if not mask.any():
        return []
    m = np.r_[False, mask, False].astype(np.int8)
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1).tolist(), (np.flatnonzero(d == -1) - 1).tolist()))


def _frames(runs: list[tuple[int, int]], most: int = 4) -> str:
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (f" (+{len(runs) - most} more)" if len(runs) > most else "")


def check_feasibility(action: np.ndarray, state: np.ndarray | None, fps: float, lim: ArmLimits) -> Feasibility:
    """The findings for one episode (frame numbers are the episode's frame_index)."""
    out = Feasibility()
    a = np.asarray(action, np.float64)
    n = len(a)
    if n == 0 or not np.isfinite(a).all():
        return out
    names = list(FEATURE_NAMES)
    _check_positions(a, lim, names, out)
    if n < 2:  # one frame has no motion to judge, but its pose can still be out of reach
        return out
    body = [j for j in range(a.shape[1]) if j != GRIPPER_INDEX]
    step = np.r_[np.zeros((1, a.shape[1])), np.abs(np.diff(a, axis=0))]  # step[i]: frame i-1 -> i
    speed = step * fps
    acc = np.abs(np.diff(a, n=2, axis=0)) * fps * fps
    out.metrics["peak_speed_deg_s"] = round(float(speed[:, body].max()), 1)
    out.metrics["peak_accel_deg_s2"] = round(float(acc[:, body].max()), 1) if len(acc) else 0.0
    jumps = step > lim.jump_deg
    jumps[:, GRIPPER_INDEX] = False
    for j in body:
        for s, e in _runs(jumps[:, j]):
            out.reasons.append(f"jump: {names[j]} moves {step[s : e + 1, j].max():.0f} deg in one frame at frame {s}")
        fast = (speed[:, j] > lim.rated_speed_deg_s) & ~jumps[:, j]
        runs = _runs(fast)
        if runs:
            peak = float(speed[fast, j].max())
            out.reasons.append(
                f"speed: {names[j]} at up to {peak:.0f} deg/s, {peak / lim.rated_speed_deg_s:.1f}x the "
                f"{lim.model.upper()}'s rated {lim.rated_speed_deg_s:.0f} deg/s at {lim.supply_voltage_v:g} V, "
                f"frames {_frames(runs)}"
            )
    shaped = step > lim.max_step_per_frame
    rows = shaped.any(axis=1)
    out.metrics["step_limited_frames"] = int(rows.sum())
    if rows.any():
        joints = [names[j] for j in range(a.shape[1]) if shaped[:, j].any()]
        out.reasons.append(
            f"step limit: {', '.join(joints)} change faster than the daemon's step limit lets through "
            f"({lim.step_text}) at frames {_frames(_runs(rows))}"
        )
    g = a[:, GRIPPER_INDEX]
    if state is not None and np.isfinite(state).all():
        push = np.asarray(state, np.float64)[:, GRIPPER_INDEX] - g > lim.gripper_push_pct
        long_runs = [(s, e) for s, e in _runs(push) if (e - s + 1) / fps >= lim.gripper_push_s]
        if long_runs:
            out.reasons.append(
                f"gripper: commanded more than {lim.gripper_push_pct:g} % past where it stopped "
                f"(closing through the object?) at frames {_frames(long_runs)}"
            )
    return out


def _check_positions(a: np.ndarray, lim: ArmLimits, names: list[str], out: Feasibility) -> None:
    """Poses out of reach: outside the calibrated range, a gripper command outside 0..100."""
    if lim.lower is not None and lim.upper is not None:
        outside = (a < lim.lower - 1e-6) | (a > lim.upper + 1e-6)
        for j in range(a.shape[1]):
            runs = _runs(outside[:, j])
            if runs:
                out.reasons.append(
                    f"range: {names[j]} outside the follower's calibrated {lim.lower[j]:.1f}..{lim.upper[j]:.1f} "
                    f"at frames {_frames(runs)}"
                )
    g = a[:, GRIPPER_INDEX]
    runs = _runs((g < 0.0) | (g > 100.0))
    if runs:
        out.reasons.append(f"gripper: command outside 0..100 at frames {_frames(runs)}")


def arm_limits(cfg: Config, with_calibration: bool, fps: float, follower_id: str = "") -> ArmLimits:
    """The limits of the configured follower: rated speed (model, supply voltage), the daemon's
    step limit at its rate, and (``with_calibration``) its calibrated range. ValueError names
    the key or the missing calibration file. ``follower_id``: that arm's calibration (a bimanual
    pair's ``arms.<side>.follower_id``) instead of [follower] id; a bimanual configuration
    without one gives each arm's limits in ``per_arm``."""
    if cfg.bimanual and not follower_id:
        sides = {
            side: arm_limits(cfg, with_calibration, fps, cfg.arms[side].follower_id)
            for side in ARM_SIDES
            if side in cfg.arms
        }
        return replace(next(iter(sides.values())), per_arm=sides)
    from calibration.calibration_file import CalibrationError, load_calibration
    from calibration.conventions import unit_limits

    rated = rated_speed_deg_s(cfg.follower.servo_model, cfg.follower.supply_voltage_v)
    cycles = cfg.control.rate_hz / fps
    per_cycle = np.full(len(FEATURE_NAMES), cfg.safety.max_step_deg)
    per_cycle[GRIPPER_INDEX] = cfg.safety.max_step_gripper_pct
    text = (
        f"{cfg.safety.max_step_deg:g} deg per cycle at {cfg.control.rate_hz:g} Hz "
        f"= {cfg.safety.max_step_deg * cycles:.1f} deg per frame at {fps:g} fps"
    )
    lower = upper = None
    if with_calibration:
        try:
            cal = load_calibration("follower", follower_id or cfg.follower.id, cfg.calibration_root())
        except CalibrationError as exc:
            raise ValueError(str(exc)) from None
        lower, upper = unit_limits(cal)
    return ArmLimits(
        rated_speed_deg_s=rated,
        model=cfg.follower.servo_model,
        supply_voltage_v=cfg.follower.supply_voltage_v,
        max_step_per_frame=per_cycle * cycles,
        step_text=text,
        lower=lower,
        upper=upper,
    )
