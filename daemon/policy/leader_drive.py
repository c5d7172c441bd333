"""The leader's motors driven for someone other than the operator's hand: a client's goals (the
LeRobot plugin's ``send_feedback``, LeRobot's smooth handover) or the policy's take-over, one at
a time (``LeaderClaim``).

``LeaderDrive`` runs on its own thread at ``period_s``: torque on first (the driver sets goals :=
present, so nothing moves), then each tick the written goal moves toward the newest goal it was
given by at most the take-over's speed (45 deg/s, the gripper 60 %/s by default; the driver
clamps every goal to the leader's calibrated range), and holds there. A goal far away is so
reached at that speed whatever the client asked, and a client's burst of goals only moves the
target. Torque goes off again (the leader limp, the operator's hand takes it) at ``stop``, when
``keep`` names a reason to let go (the client's process gone, an arm that follows the leader),
or at any error; it never raises on its thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from calibration.conventions import GRIPPER_INDEX, NUM_JOINTS

log = logging.getLogger("so101d.policy.leader_drive")

_STARTED_WITHIN_S = 3.0  # torque on and the first reading, or the drive is refused
_MAX_DT_PERIODS = 2.0  # a late tick moves at most two periods' worth


@runtime_checkable
class DrivableLeader(Protocol):
    """A leader whose motors can be driven (our Feetech leader; a simulated one cannot)."""

    def set_torque(self, enabled: bool) -> None: ...

    def write_goals(self, goals: np.ndarray) -> None: ...

    def read_joints(self) -> np.ndarray: ...

    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]: ...


class LeaderClaim:
    """Who drives the leader's motors now: one at a time (the policy's take-over, a client)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: str | None = None

    def take(self, who: str) -> str | None:
        """Claim the leader for ``who``; None when it is theirs now, else who holds it."""
        with self._lock:
            if self._holder is not None and self._holder != who:
                return self._holder
            self._holder = who
            return None

    def give(self, who: str) -> None:
        with self._lock:
            if self._holder == who:
                self._holder = None

    @property
    def holder(self) -> str | None:
        return self._holder


@dataclass(frozen=True)
class LeaderDriveConfig:
    speed_deg_s: float = 45.0  # the take-over's (daemon/policy/takeover.py TakeoverConfig)
    gripper_speed_pct_s: float = 60.0
    period_s: float = 0.02

    def __post_init__(self) -> None:
        for name in ("speed_deg_s", "gripper_speed_pct_s", "period_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"leader drive {name} must be > 0, got {v!r}")


PHASES = ("starting", "holding", "moving", "released", "failed")


class LeaderDrive:
    def __init__(
        self,
        leader: DrivableLeader,
        keep: Callable[[], str],
        config: LeaderDriveConfig | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``keep()``: "" while the drive may go on, else why the leader is let go."""
        self.leader = leader
        self.keep = keep
        self.cfg = cfg = config or LeaderDriveConfig()
        self._monotonic = monotonic
        speed = np.full(NUM_JOINTS, cfg.speed_deg_s)
        speed[GRIPPER_INDEX] = cfg.gripper_speed_pct_s
        self._speed = speed
        lower, upper = leader.joint_limits()
        self.lower, self.upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
        self.phase = "starting"
        self.why: str | None = None  # why it ended (released, or the failure)
        self.command: np.ndarray | None = None  # the goal written last
        self._goal: np.ndarray | None = None  # the newest goal given (reference swap)
        self.commands: deque[tuple[float, np.ndarray]] = deque(maxlen=2000)  # (time, goal written): tests
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="so101d-leader-drive", daemon=True)

    @property
    def finished(self) -> bool:
        return self.phase in ("released", "failed")

    def start(self) -> None:
        """Torque on; returns once the leader holds where it is (RuntimeError if it did not)."""
        self._thread.start()
        if not self._started.wait(_STARTED_WITHIN_S) or self.finished:
            self.stop("did not start")
            self._thread.join(_STARTED_WITHIN_S)
            raise RuntimeError(f"the leader's torque did not come on: {self.why or 'no answer'}")

    def goal(self, units: np.ndarray) -> np.ndarray:
        """Drive toward ``units`` (six values, LeRobot units; NaN: that joint keeps its goal);
        returns the goal as it will be reached (within the leader's calibrated range)."""
        given = np.asarray(units, dtype=np.float64)
        if given.shape != (NUM_JOINTS,) or np.isinf(given).any():
            raise ValueError(f"a leader goal is {NUM_JOINTS} finite joint values, got {given!r}")
        base = self._goal if self._goal is not None else self.command
        assert base is not None  # start() returned: the first reading is the command
        goal = np.clip(np.where(np.isnan(given), base, given), self.lower, self.upper)
        self._goal = goal
        return goal

    def stop(self, why: str = "released") -> None:
        if self.why is None:
            self.why = why
        self._stop.set()

    def join(self, timeout_s: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self.leader.set_torque(True)
            cmd = np.asarray(self.leader.read_joints(), dtype=np.float64).copy()
            self.command = cmd
            self.phase = "holding"
            self._started.set()
            last = self._monotonic()
            period = self.cfg.period_s
            while not self._stop.wait(period):
                why = self.keep()
                if why:
                    self.stop(why)
                    break
                now = self._monotonic()
                dt = min(max(0.0, now - last), _MAX_DT_PERIODS * period)
                last = now
                goal = self._goal
                if goal is None or np.array_equal(goal, cmd):
                    self.phase = "holding"
                    continue
                step = self._speed * dt
                cmd = cmd + np.clip(goal - cmd, -step, step)
                self.leader.write_goals(cmd)
                self.command = cmd
                self.commands.append((now, cmd))
                self.phase = "moving"
        except Exception as exc:
            self.why = f"{type(exc).__name__}: {exc}"
            self.phase = "failed"
            log.error("leader drive failed: %s", self.why)
        finally:
            try:
                self.leader.set_torque(False)
            except Exception as exc:
                self.why = f"{self.why or 'released'}; the leader's torque off failed too: {exc}"
                self.phase = "failed"
                log.error("leader drive: torque off failed: %s", exc)
            if self.phase != "failed":
                self.phase = "released"
            self._started.set()
