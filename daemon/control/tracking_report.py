"""How well the arm followed a replayed episode: the tracking report, computed from the replay's
log after it ended (pure numpy, off the loop thread).

- error: per joint, |commanded - measured| over the played cycles (p50, p99, max). The measured
  pose of a cycle is read before that cycle's command, so the error includes the arm's lag;
  ``lag_ms`` says how much of it is lag: the delay (whole cycles) that best lines the measured
  trajectory up with the commanded one.
- shaped cycles: the cycles in which safety changed the command, by the step limit or by the
  joint limits, with the first frames where that happened.
- max command step: per joint, the largest change between two consecutive commands sent (what
  the step limit bounds).
- sim gap: for an episode recorded in simulation, per joint, |recorded sim state - measured real
  state| at the same frame: the sim-to-real gap of that trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from daemon.control.replay_source import ReplayLog

_MAX_LAG_S = 1.0  # the lag search's window
_FIRST_FRAMES = 20  # shaped frames named in the report


@dataclass(frozen=True)
class JointError:
    joint: str
    p50: float
    p99: float
    max: float


@dataclass(frozen=True)
class TrackingReport:
    outcome: str  # "done" or "stopped: why"
    frames: int  # the episode's frames
    frames_played: int  # the last frame commanded + 1
    cycles: int  # cycles that followed a frame
    error: list[JointError] = field(default_factory=list)  # commanded vs measured (deg; gripper %)
    lag_ms: float | None = None
    shaped_cycles: int = 0
    step_limited_cycles: int = 0
    joint_limited_cycles: int = 0
    shaped_frames: list[int] = field(default_factory=list)  # the first frames safety shaped
    sim_gap: list[JointError] = field(default_factory=list)  # recorded sim state vs measured real state
    max_command_step: list[float] = field(default_factory=list)  # per joint, between two commands sent
    dropped_cycles: int = 0

    def p99_worst(self) -> float | None:
        return max((e.p99 for e in self.error), default=None)

    def summary(self) -> str:
        """One line for a tag note or a log line."""
        worst = self.p99_worst()
        text = (
            f"replay {self.outcome}: {self.frames_played}/{self.frames} frames, "
            f"tracking p99 {'-' if worst is None else f'{worst:.2f}'}, lag "
            f"{'-' if self.lag_ms is None else f'{self.lag_ms:.0f} ms'}, shaped {self.shaped_cycles} cycles "
            f"(step {self.step_limited_cycles}, joint limits {self.joint_limited_cycles})"
        )
        if self.sim_gap:
            text += ", sim gap p99 " + ",".join(f"{e.p99:.1f}" for e in self.sim_gap)
        return text


def _errors(names: list[str], err: np.ndarray) -> list[JointError]:
    if len(err) == 0:
        return []
    p50, p99, mx = np.percentile(err, 50, axis=0), np.percentile(err, 99, axis=0), err.max(axis=0)
    return [
        JointError(n, round(float(a), 3), round(float(b), 3), round(float(c), 3))
        for n, a, b, c in zip(names, p50, p99, mx)
    ]


def _lag_cycles(target: np.ndarray, measured: np.ndarray, max_shift: int) -> int:
    """The delay d (cycles) minimising mean |target[k] - measured[k + d]|."""
    best, best_d = np.inf, 0
    for d in range(0, min(max_shift, len(target) - 1) + 1):
        e = float(np.mean(np.abs(target[: len(target) - d] - measured[d:])))
        if e < best:
            best, best_d = e, d
    return best_d


def tracking_report(
    log: ReplayLog,
    joint_names: list[str],
    frames: int,
    outcome: str,
    period_s: float,
    sim_state: np.ndarray | None = None,
) -> TrackingReport:
    """The report of one replay (``sim_state``: the episode's recorded state, for a sim episode)."""
    n = len(log.t_s)
    if n == 0:
        return TrackingReport(outcome, frames, 0, 0, dropped_cycles=log.dropped_cycles)
    err = np.abs(log.target - log.measured)
    lag = None
    if n > 2:
        lag = round(_lag_cycles(log.target, log.measured, int(_MAX_LAG_S / period_s)) * period_s * 1000.0, 1)
    shaped = log.shaped_step | log.shaped_limit
    shaped_frames = sorted({int(f) for f in log.frame[shaped]})[:_FIRST_FRAMES]
    gap: list[JointError] = []
    if sim_state is not None and len(sim_state):
        idx = np.clip(log.frame, 0, len(sim_state) - 1)
        diff = np.abs(np.asarray(sim_state, np.float64)[idx] - log.measured)
        # a frame whose recorded state is NaN (a sim that lost the object, a padded import) has no
        # gap to tell: left out, not allowed to turn every figure into NaN
        gap = _errors(joint_names, diff[np.all(np.isfinite(diff), axis=1)])
    sent = log.command[np.all(np.isfinite(log.command), axis=1)]
    max_step = np.abs(np.diff(sent, axis=0)).max(axis=0) if len(sent) > 1 else np.zeros(0)
    return TrackingReport(
        outcome=outcome,
        frames=frames,
        frames_played=int(log.frame.max()) + 1,
        cycles=n,
        error=_errors(joint_names, err),
        lag_ms=lag,
        shaped_cycles=int(shaped.sum()),
        step_limited_cycles=int(log.shaped_step.sum()),
        joint_limited_cycles=int(log.shaped_limit.sum()),
        shaped_frames=shaped_frames,
        sim_gap=gap,
        max_command_step=[round(float(v), 3) for v in max_step],
        dropped_cycles=log.dropped_cycles,
    )
