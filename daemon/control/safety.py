"""The safety layer and mode logic of the control loop, as one pure function.

A person stands next to this arm, so everything that decides what the follower is told lives
here, free of I/O and clocks (ros2_control's read -> update -> write split): ``update(state,
inputs, params)`` returns the next state and the command to write. Tests drive it cycle by cycle.

Rules it enforces:
- **Alignment** (IT#730: an uncommanded full-speed jump at t=0 stripped a gear): whenever tracking
  starts (connect, after a hold, after a fault, after a stale leader), the command starts at the
  follower's *measured* pose and moves toward the target at ``align_speed`` (deg/s, gripper %/s)
  until every joint is within ``align_tolerance``; only then does 1:1 tracking start.
- **Step limit**: while tracking, each cycle's command moves at most ``max_step`` from the previous
  command, so a leader jump (a glitch, a re-plugged arm) is spread over several cycles.
- **Joint limits**: targets are clamped to the follower's calibrated range.
- **Stale target**: no fresh target for ``target_stale_s`` -> hold the measured pose (captured once
  when the hold starts, so a sagging arm does not ratchet itself down); re-align when it returns.
- **Faults** latch: hold the pose or switch torque off (config), until the operator clears them
  (``teleop start``) and the servos report no fault.
- **NaN/inf** never leaves this function: a non-finite target counts as no target; a command that
  is not finite and inside the limits is never returned.

Modes: disconnected, idle, aligning, teleop, policy, hold, fault. The operator's *intent* (idle,
hold, teleop, policy) and torque wish come in with the inputs; the mode is what actually happens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from calibration.conventions import GRIPPER_INDEX, NUM_JOINTS

Mode = Literal["disconnected", "idle", "aligning", "teleop", "policy", "hold", "fault"]
Intent = Literal["idle", "hold", "teleop", "policy"]
_MAX_DT_PERIODS = 2.0  # alignment: one cycle moves at most this many nominal periods' worth
MODES: tuple[str, ...] = ("disconnected", "idle", "aligning", "teleop", "policy", "hold", "fault")
INTENTS: tuple[str, ...] = ("idle", "hold", "teleop", "policy")


def _per_joint(body: float, gripper: float) -> np.ndarray:
    v = np.full(NUM_JOINTS, float(body))
    v[GRIPPER_INDEX] = float(gripper)
    return v


@dataclass(frozen=True)
class SafetyParams:
    """Per-cycle limits, derived once from the configuration and the follower's calibration."""

    lower: np.ndarray  # joint limits, LeRobot units
    upper: np.ndarray
    max_step: np.ndarray  # per-cycle step limit while tracking
    align_step: np.ndarray  # per-cycle step while aligning at the nominal period (= speed x period)
    align_tolerance: float
    target_stale_s: float
    on_fault: Literal["hold", "torque_off"] = "hold"
    period_s: float = 0.01  # nominal loop period

    @property
    def max_align_step(self) -> np.ndarray:
        """The largest alignment step of one cycle: a late cycle may catch up at most one period."""
        return self.align_step * _MAX_DT_PERIODS

    @classmethod
    def from_config(cls, safety, lower: np.ndarray, upper: np.ndarray, period_s: float) -> SafetyParams:
        """``safety`` is a ``daemon.config.settings.SafetyConfig``."""
        lo = np.asarray(lower, dtype=np.float64).copy()
        hi = np.asarray(upper, dtype=np.float64).copy()
        if (
            lo.shape != (NUM_JOINTS,)
            or hi.shape != (NUM_JOINTS,)
            or not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)))
        ):
            raise ValueError(f"joint limits must be two finite arrays of {NUM_JOINTS}: {lo}, {hi}")
        if np.any(lo >= hi):
            raise ValueError(f"joint limits are empty: lower {lo.tolist()} upper {hi.tolist()}")
        return cls(
            lower=lo,
            upper=hi,
            max_step=_per_joint(safety.max_step_deg, safety.max_step_gripper_pct),
            align_step=_per_joint(safety.align_speed_deg_s * period_s, safety.align_gripper_speed_pct_s * period_s),
            align_tolerance=float(safety.align_tolerance_deg),
            target_stale_s=float(safety.leader_stale_s),
            on_fault=safety.on_fault,
            period_s=float(period_s),
        )


@dataclass(frozen=True)
class ControllerState:
    mode: str = "disconnected"
    command: np.ndarray | None = None  # the last command written (LeRobot units)
    hold_pose: np.ndarray | None = None  # pose held in idle/hold/fault (captured on entry)
    aligned: bool = False  # alignment done since tracking (re)started
    torque_on: bool | None = None  # what we last asked the follower (None: unknown, after connect)
    fault: str = ""  # latched fault description; "" when none
    reason: str = ""  # why the mode is what it is (shown in status)


@dataclass(frozen=True)
class CycleInputs:
    intent: str  # operator intent: idle, hold, teleop, policy
    torque_wanted: bool  # operator's torque wish (torque on|off)
    follower_ok: bool  # follower connected and its pose read this cycle (or recently)
    measured: np.ndarray | None  # follower's measured pose
    target: np.ndarray | None  # latest target of the active source (leader or policy)
    target_age_s: float  # age of that target (inf when there never was one)
    fault_now: str = ""  # a fault seen on the follower right now ("" when none)
    clear_fault: bool = False  # the operator asked to resume (one cycle)
    target_name: str = "leader"  # for the reason text
    target_error: str = ""  # why the source gave no target this cycle (it raised, or answered junk)
    dt_s: float | None = None  # time since the previous cycle (None: the nominal period)
    # The follower was moved under us (a simulator's scene reset): tracking restarts with
    # alignment from the measured pose, as after a hold, instead of stepping from the last command.
    realign: bool = False
    # with intent "hold": why (another arm of the same task faulted), instead of "hold requested"
    hold_reason: str = ""


@dataclass(frozen=True)
class CycleOutput:
    state: ControllerState
    command: np.ndarray | None  # goals to write this cycle, or None: write nothing
    torque: bool | None  # torque change to apply before writing (None: no change)
    limited: bool = False  # safety changed the target this cycle (clamped, step-limited, aligning)


# This runs every cycle on the loop thread and, for every client action, on the socket's thread
# (its prediction), cold there on a busy machine: the array methods and the ufuncs below are a
# few C calls each, where np.all, np.any, np.clip and np.array_equal go through layers of Python
# first (the same values: clip is documented as minimum(maximum(a, lo), hi)).
def _finite(v: np.ndarray | None) -> bool:
    return v is not None and v.shape == (NUM_JOINTS,) and bool(np.isfinite(v).all())


def _clip(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(v, lo), hi)


def _safe(cmd: np.ndarray, p: SafetyParams) -> np.ndarray | None:
    """The last gate before the bus: finite and within the limits, or nothing at all."""
    if not _finite(cmd) or ((cmd < p.lower) | (cmd > p.upper)).any():
        return None
    return cmd


def _torque_change(state: ControllerState, want: bool) -> bool | None:
    return None if state.torque_on is want else want


def disconnected(fault: str, reason: str) -> CycleOutput:
    """No follower to command: nothing is written, the fault stays latched, and tracking restarts
    with alignment once the follower is back (the state keeps no command or hold pose)."""
    return CycleOutput(ControllerState(mode="disconnected", fault=fault, reason=reason), None, None)


def update(s: ControllerState, inp: CycleInputs, p: SafetyParams) -> CycleOutput:
    """One control decision. Pure: the same (state, inputs, params) always give the same output."""
    # --- fault latch -------------------------------------------------------------------------
    fault = s.fault
    if inp.fault_now and not fault:
        fault = inp.fault_now
    elif fault and inp.clear_fault and not inp.fault_now:
        fault = ""

    # --- no follower: nothing to command; everything restarts with alignment ------------------
    measured = inp.measured
    if not inp.follower_ok or not _finite(measured):
        return disconnected(fault, "follower not connected" if not inp.follower_ok else "follower pose not finite")
    assert measured is not None
    here = _clip(measured, p.lower, p.upper)

    # --- fault: hold or torque off ---------------------------------------------------------
    if fault:
        # the operator's torque off is obeyed during a fault too (a trapped hand, a smoking servo)
        if p.on_fault == "torque_off" or not inp.torque_wanted:
            st = ControllerState(mode="fault", torque_on=False, fault=fault, reason=f"{fault}: torque off")
            return CycleOutput(st, None, _torque_change(s, False))
        hold = s.hold_pose if s.mode == "fault" and s.hold_pose is not None else here
        st = ControllerState(
            mode="fault", command=hold, hold_pose=hold, torque_on=s.torque_on, fault=fault, reason=f"{fault}: holding"
        )
        return CycleOutput(st, _safe(hold, p) if s.torque_on is not False else None, None)

    # --- torque off on request: idle, limp ---------------------------------------------------
    if not inp.torque_wanted:
        st = ControllerState(mode="idle", torque_on=False, reason="torque off")
        return CycleOutput(st, None, _torque_change(s, False))
    torque = _torque_change(s, True)

    def holding(mode: str, reason: str) -> CycleOutput:
        # Keep the pose captured when the hold began; re-capture after any tracking mode.
        keep = s.mode in ("idle", "hold") and s.torque_on is True
        hold = s.hold_pose if keep and s.hold_pose is not None else here
        st = ControllerState(mode=mode, command=hold, hold_pose=hold, torque_on=True, reason=reason)
        return CycleOutput(st, _safe(hold, p), torque)

    if inp.intent == "idle":
        return holding("idle", "idle: not tracking")
    if inp.intent == "hold":
        return holding("hold", inp.hold_reason or "hold requested")
    if inp.intent not in ("teleop", "policy"):
        return holding("hold", f"unknown intent {inp.intent!r}")

    # --- tracking intents --------------------------------------------------------------------
    target = inp.target
    if target is None and inp.target_error:
        return holding("hold", f"{inp.target_name} failed: {inp.target_error}")
    if target is None or inp.target_age_s > p.target_stale_s:
        return holding("hold", f"{inp.target_name} stale")
    if not _finite(target):
        return holding("hold", f"{inp.target_name} target not finite")
    goal = _clip(target, p.lower, p.upper)
    # A switch of source (teleop <-> policy) restarts alignment: the new target may be far away,
    # and max_step alone would let it move at max_step per cycle (1000 deg/s at the defaults).
    tracking = s.mode in ("aligning", inp.intent) and s.command is not None and s.torque_on is True and not inp.realign
    start = s.command if tracking else here
    assert start is not None

    if not (s.aligned and tracking):
        # Alignment: bounded speed from the measured pose (or from where alignment has got to).
        # Speed in time, not per cycle: a loop that runs late (or free) still aligns at the configured
        # deg/s, but one cycle never moves more than two periods' worth.
        scale = 1.0 if inp.dt_s is None else min(max(inp.dt_s, 0.0) / p.period_s, _MAX_DT_PERIODS)
        lim = p.align_step * scale
        step = _clip(goal - start, -lim, lim)
        cmd = start + step
        done = bool((np.abs(goal - cmd) <= p.align_tolerance).all())
        mode = inp.intent if done else "aligning"
        reason = f"aligned to {inp.target_name}" if done else f"aligning to {inp.target_name}"
        st = ControllerState(mode=mode, command=cmd, aligned=done, torque_on=True, reason=reason)
        return CycleOutput(st, _safe(cmd, p), torque, limited=True)

    step = _clip(goal - start, -p.max_step, p.max_step)
    cmd = start + step
    limited = not bool((cmd == target).all())
    st = ControllerState(
        mode=inp.intent, command=cmd, aligned=True, torque_on=True, reason=f"following {inp.target_name}"
    )
    return CycleOutput(st, _safe(cmd, p), torque, limited=limited)
