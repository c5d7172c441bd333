"""Take-over: from policy to teleop without a jump (LeRobot issue 3723).

When the operator takes over, the leader (torque off, wherever the operator left it) and the
follower (wherever the policy left it) disagree. Re-aligning the *follower* to the leader would
move the arm the policy just positioned; instead the *leader* is brought to the follower:

  torque_on   leader torque enabled (the driver first sets goals := present, so nothing moves)
  moving      leader goals ramp from its own pose to the follower's at a bounded speed
  settling    the leader stays within tolerance of the follower's pose for ``settle_s``
  releasing   leader torque off (the operator's hand takes it from here)
  done        1:1 tracking may resume (the loop's own alignment then has nothing left to do)
  failed      any error or the timeout: leader torque is switched off, the reason is kept

``Takeover.step(now_s, follower_pose_units)`` advances the machine by one tick (call it at
~50 Hz); it never raises: bus errors put it in ``failed`` with the leader released.

The leader needs ``set_torque(bool)``, ``write_goals(units)`` and ``read_joints()``
(``TakeoverLeader``); our Feetech leader has them (``LeaderActuator`` is its name for the part).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from calibration.conventions import GRIPPER_INDEX, NUM_JOINTS

log = logging.getLogger("so101d.policy.takeover")


class TakeoverLeader(Protocol):
    def set_torque(self, enabled: bool) -> None: ...

    def write_goals(self, goals_units: np.ndarray) -> None: ...

    def read_joints(self) -> np.ndarray: ...


@dataclass
class TakeoverConfig:
    speed_deg_s: float = 45.0  # leader body joints while being moved by its own motors
    gripper_speed_pct_s: float = 60.0
    tolerance_deg: float = 3.0  # leader within this of the follower (gripper: same number in %)
    settle_s: float = 0.15
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("speed_deg_s", "gripper_speed_pct_s", "tolerance_deg", "timeout_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"takeover {name} must be > 0, got {v!r}")


PHASES = ("torque_on", "moving", "settling", "releasing", "done", "failed")


class Takeover:
    def __init__(self, leader: TakeoverLeader, config: TakeoverConfig | None = None):
        self.leader = leader
        self.cfg = config or TakeoverConfig()
        self.phase = "torque_on"
        self.error: str | None = None
        self.started_s: float | None = None
        self._last_s: float | None = None
        self._cmd: np.ndarray | None = None
        self._settled_since: float | None = None
        self.max_error: float | None = None  # leader vs follower at release
        self.commands: list[tuple[float, np.ndarray]] = []  # (time, goal) written: tests check the speed bound
        speed = np.full(NUM_JOINTS, self.cfg.speed_deg_s)
        speed[GRIPPER_INDEX] = self.cfg.gripper_speed_pct_s
        self._speed = speed

    @property
    def finished(self) -> bool:
        return self.phase in ("done", "failed")

    def step(self, now_s: float, follower_pose_units: np.ndarray | None) -> str:
        if self.finished:
            return self.phase
        if self.started_s is None:
            self.started_s = now_s
        try:
            if now_s - self.started_s > self.cfg.timeout_s:
                raise TimeoutError(f"the leader did not reach the follower's pose within {self.cfg.timeout_s:.1f} s")
            if follower_pose_units is None or not np.all(np.isfinite(follower_pose_units)):
                raise ValueError("no valid follower pose to move the leader to")
            target = np.asarray(follower_pose_units, dtype=np.float64)
            if self.phase == "torque_on":
                self.leader.set_torque(True)
                self._cmd = np.asarray(self.leader.read_joints(), dtype=np.float64).copy()
                self._last_s = now_s
                self.phase = "moving"
                return self.phase
            dt = max(0.0, now_s - (self._last_s if self._last_s is not None else now_s))
            self._last_s = now_s
            if self.phase in ("moving", "settling"):
                assert self._cmd is not None
                step = self._speed * dt
                self._cmd = self._cmd + np.clip(target - self._cmd, -step, step)
                self.leader.write_goals(self._cmd)
                self.commands.append((now_s, self._cmd.copy()))
                measured = np.asarray(self.leader.read_joints(), dtype=np.float64)
                err = float(np.max(np.abs(measured - target)))
                if np.array_equal(self._cmd, target) or err <= self.cfg.tolerance_deg:
                    if err <= self.cfg.tolerance_deg:
                        if self._settled_since is None:
                            self._settled_since = now_s
                            self.phase = "settling"
                        elif now_s - self._settled_since >= self.cfg.settle_s:
                            self.max_error = err
                            self.phase = "releasing"
                    else:
                        self._settled_since = None
                        self.phase = "moving"
                return self.phase
            if self.phase == "releasing":
                self.leader.set_torque(False)
                self.phase = "done"
                log.info(
                    "take-over done: leader released at the follower's pose (max error %.2f)", self.max_error or 0.0
                )
                return self.phase
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.phase = "failed"
            log.error("take-over failed: %s", self.error)
            try:
                self.leader.set_torque(False)
            except Exception as exc2:
                self.error += f"; releasing the leader failed too: {exc2}"
        return self.phase


class LeaderActuator:
    """The leader as the take-over drives it: its own ``set_torque``, ``write_goals`` (LeRobot
    units, clamped by the driver to the calibrated range) and ``read_joints`` (our Feetech leader
    has all three; a leader behind a sim mapping hands them to the leader it wraps)."""

    def __init__(self, leader: TakeoverLeader):
        self.leader = leader

    def read_joints(self) -> np.ndarray:
        return self.leader.read_joints()

    def set_torque(self, enabled: bool) -> None:
        self.leader.set_torque(enabled)

    def write_goals(self, goals_units: np.ndarray) -> None:
        self.leader.write_goals(goals_units)


class TakeoverSet:
    """Several leaders brought over at once, each to its own follower (a bimanual rig's two pairs:
    one task, so teleop resumes only when both are over). Its phase is the least advanced of its
    parts' ("failed" once one fails: the others are stopped and their leaders let go, so no leader
    is left stiff while the operator is told the take-over failed)."""

    def __init__(self, parts: Mapping[str, Takeover]):
        if not parts:
            raise ValueError("a take-over of no leader")
        self.parts = dict(parts)
        self._after: str | None = None  # what went wrong once every leader was over (teleop refused)

    @property
    def finished(self) -> bool:
        return all(t.finished for t in self.parts.values())

    @property
    def phase(self) -> str:
        phases = [t.phase for t in self.parts.values()]
        if "failed" in phases:
            return "failed"
        return min(phases, key=PHASES.index)

    @property
    def error(self) -> str | None:
        errors = [f"{name}: {t.error}" for name, t in self.parts.items() if t.error]
        if self._after:
            errors.append(self._after)
        return "; ".join(errors) or None

    @error.setter
    def error(self, why: str | None) -> None:
        self._after = why

    @property
    def max_error(self) -> float | None:
        done = [t.max_error for t in self.parts.values() if t.max_error is not None]
        return max(done) if done else None

    def step(self, now_s: float, follower_poses_units: Mapping[str, np.ndarray | None]) -> str:
        for name, t in self.parts.items():
            t.step(now_s, follower_poses_units.get(name))
        failed = [name for name, t in self.parts.items() if t.phase == "failed"]
        if failed:
            for t in self.parts.values():
                if not t.finished:
                    t.phase = "failed"
                    t.error = f"stopped: the {', '.join(failed)} take-over failed"
                    try:
                        t.leader.set_torque(False)
                    except Exception as exc:
                        t.error += f"; releasing this leader failed: {exc}"
        return self.phase

    def release(self) -> None:
        """Ended mid-way (``policy stop``): every leader's torque off, for the hand."""
        for name, t in self.parts.items():
            if not t.finished:
                try:
                    t.leader.set_torque(False)
                except Exception as exc:
                    log.error("take-over of %s: releasing its leader failed: %s", name, exc)
