"""A recorded episode's actions as a target source: the loop plays them at the episode's rate.

``ReplaySource`` is handed plain arrays (the data layer reads the dataset); it meets the
``TargetSource`` seam and is assigned to an arm like any other source, so the same safety layer
shapes every command. Its clock does not start until safety has aligned the arm to the first
action at the safe speed (the service forces that alignment when it assigns the source): frames
are not skipped while the arm travels to the start pose.

Each call also notes the cycle (the target given, the measured pose, whether safety shaped the
previous command) in arrays sized up front, so the loop thread never allocates; the tracking
report is computed from them after the replay, off the loop (``daemon.control.tracking_report``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from calibration.conventions import NUM_JOINTS
from daemon.control.safety import ControllerState, SafetyParams

Phase = Literal["aligning", "playing", "done", "stopped"]
_SHAPED_EPS = 1e-6  # a command this close to the target was not shaped (float round-off)
_SPARE_CYCLES = 2000  # log room beyond the episode's own length (late cycles, the alignment's end)
# The log's ceiling, whatever the episode's length and speed: an hour at 100 Hz, about 50 MB. Past
# it cycles are counted as dropped: a request must not make the daemon allocate without bound.
MAX_LOG_CYCLES = 360_000
MIN_SPEED = 0.01  # slower than this a replay is a still arm, not a replay


class ArmView(Protocol):
    """What the source reads of the arm it drives (``daemon.control.driven_arm.DrivenArm``)."""

    @property
    def state(self) -> ControllerState: ...

    @property
    def params(self) -> SafetyParams | None: ...


@dataclass(frozen=True)
class ReplayLog:
    """The played cycles (copies), for the report: one row per cycle that followed a frame."""

    t_s: np.ndarray  # (k,) seconds since the first played frame
    frame: np.ndarray  # (k,) the episode frame commanded
    target: np.ndarray  # (k, 6) the episode's action given that cycle
    measured: np.ndarray  # (k, 6) the pose measured that cycle (before its command)
    command: np.ndarray  # (k, 6) the command safety wrote that cycle (NaN: not known yet)
    shaped_step: np.ndarray  # (k,) bool: safety's step limit changed that cycle's command
    shaped_limit: np.ndarray  # (k,) bool: the joint limits clamped that cycle's target
    dropped_cycles: int  # cycles not logged (the log was full)


class ReplaySource:
    """Plays ``actions_units`` (n, 6) at ``fps * speed`` frames per second once aligned."""

    def __init__(self, actions_units: np.ndarray, fps: float, speed: float, arm: ArmView, period_s: float) -> None:
        actions = np.asarray(actions_units, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[1] != NUM_JOINTS or len(actions) == 0:
            raise ValueError(f"actions must be (frames, {NUM_JOINTS}), got {actions.shape}")
        if not np.all(np.isfinite(actions)):
            raise ValueError("actions hold NaN or infinite values")
        if not (math.isfinite(fps) and fps > 0 and MIN_SPEED <= speed <= 1):
            raise ValueError(f"fps must be > 0 and speed in [{MIN_SPEED}, 1], got fps {fps} speed {speed}")
        self.actions = actions
        self.frames_per_s = float(fps) * float(speed)
        self.arm = arm
        self.phase: Phase = "aligning"
        self.why = ""  # why it stopped ("" while playing or when done)
        self.frame = 0  # the frame commanded last
        self._calls = 0
        self._tracking_seen = False  # the arm aligning to (or following) us, seen once
        self._start_s: float | None = None
        self._given: np.ndarray | None = None  # the target of the previous call, for the shaped check
        cap = min(math.ceil(len(actions) / self.frames_per_s / period_s) + _SPARE_CYCLES, MAX_LOG_CYCLES)
        self._t = np.zeros(cap)
        self._frame = np.zeros(cap, dtype=np.int64)
        self._target = np.zeros((cap, NUM_JOINTS))
        self._measured = np.zeros((cap, NUM_JOINTS))
        self._command = np.full((cap, NUM_JOINTS), np.nan)
        self._step = np.zeros(cap, dtype=bool)
        self._limit = np.zeros(cap, dtype=bool)
        self._n = 0
        self._dropped = 0

    @property
    def frames(self) -> int:
        return len(self.actions)

    def stop(self, why: str) -> None:
        """Stop now (any thread): the next cycle gets no target, so the arm holds."""
        if self.phase in ("aligning", "playing"):
            self.why = why
            self.phase = "stopped"

    def last_target(self) -> np.ndarray | None:
        """What the recorder's teleop.action shows while nothing is played: the frame last given."""
        return self._given

    def target(self, now_monotonic_s: float, state_units: np.ndarray) -> np.ndarray | None:
        if self.phase in ("done", "stopped"):
            return None
        self._calls += 1
        st = self.arm.state
        if self._start_s is None:
            # The first call's state is from before this source was assigned; from the second on it
            # is the outcome of aligning to our first action (the service forced a re-alignment).
            if self._calls >= 2 and st.mode in ("aligning", "teleop"):
                self._tracking_seen = True
            elif self._tracking_seen:
                # a hold, a fault or torque off while aligning ends the replay as it does while playing
                # (else it would wait, holding the follower, and any later teleop.start would play it)
                self.stop(f"the arm left tracking while aligning: {st.mode} ({st.reason})")
                return None
            if self._calls < 2 or not (st.aligned and st.mode == "teleop"):
                self._given = self.actions[0]
                return self._given
            self._start_s = now_monotonic_s
            self.phase = "playing"
        elif st.mode != "teleop":
            self.stop(f"the arm left tracking: {st.mode} ({st.reason})")
            return None
        else:
            self._note_shaped(st)
        t = now_monotonic_s - self._start_s
        i = int(t * self.frames_per_s)
        last = len(self.actions) - 1
        if i > last:
            if self.frame == last:
                self.phase = "done"
                return None
            # a late cycle (a loaded machine) passed the end: frames it passed are skipped, but the
            # last one is played, so the arm holds where the episode ends
            i = last
        self.frame = i
        target = self.actions[i]
        k = self._n
        if k < len(self._t):
            self._t[k] = t
            self._frame[k] = i
            self._target[k] = target
            self._measured[k] = state_units
            self._n = k + 1
        else:
            self._dropped += 1
        self._given = target
        return target

    def _note_shaped(self, st: ControllerState) -> None:
        """Did safety change the previous cycle's target? Step limit or joint limits, told apart."""
        k = self._n - 1
        given, cmd, params = self._given, st.command, self.arm.params
        if k < 0 or given is None or cmd is None:
            return
        self._command[k] = cmd
        if params is not None and bool(np.any((given < params.lower) | (given > params.upper))):
            self._limit[k] = True
            inside = np.clip(given, params.lower, params.upper)
        else:
            inside = given
        self._step[k] = bool(np.any(np.abs(cmd - inside) > _SHAPED_EPS))

    def log(self) -> ReplayLog:
        """The cycles played so far (copies; call once the replay ended)."""
        n = self._n
        return ReplayLog(
            self._t[:n].copy(),
            self._frame[:n].copy(),
            self._target[:n].copy(),
            self._measured[:n].copy(),
            self._command[:n].copy(),
            self._step[:n].copy(),
            self._limit[:n].copy(),
            self._dropped,
        )
