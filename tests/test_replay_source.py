"""The replay source against the real safety layer, cycle by cycle (no arm, no loop thread).

A tiny bench: each cycle the source gives its target, ``safety.update`` shapes it, and the arm
is where the last command put it. The episode's clock waits for the alignment; a jump is spread by
the step limit and counted; a target past a joint limit is counted apart; a hold stops the replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from calibration.conventions import FEATURE_NAMES
from daemon.config.settings import SafetyConfig
from daemon.control.replay_source import ReplaySource
from daemon.control.safety import ControllerState, CycleInputs, SafetyParams, update
from daemon.control.tracking_report import tracking_report

PERIOD_S = 0.01
LOWER = np.array([-110.0, -100.0, -100.0, -95.0, -160.0, 0.0])
UPPER = -LOWER
UPPER[5] = 100.0


@dataclass
class Arm:
    """The arm the source reads (state, params), moved by safety's command each cycle."""

    params: SafetyParams
    pose: np.ndarray
    state: ControllerState = field(default_factory=lambda: ControllerState(mode="teleop", torque_on=True))
    intent: str = "teleop"
    commands: list[np.ndarray] = field(default_factory=list)

    def cycle(self, src: ReplaySource, now_s: float, realign: bool = False) -> None:
        target = src.target(now_s, self.pose.copy())
        inp = CycleInputs(
            intent=self.intent,
            torque_wanted=True,
            follower_ok=True,
            measured=self.pose.copy(),
            target=target,
            target_age_s=0.0 if target is not None else float("inf"),
            target_name="replay",
            realign=realign,
        )
        out = update(self.state, inp, self.params)
        self.state = out.state
        if out.command is not None:
            self.commands.append(out.command)
            self.pose = out.command.copy()


def _bench(start: np.ndarray) -> Arm:
    p = SafetyParams.from_config(SafetyConfig(align_speed_deg_s=100.0, max_step_deg=10.0), LOWER, UPPER, PERIOD_S)
    return Arm(p, start.astype(np.float64))


def _run(arm: Arm, src: ReplaySource, cycles: int) -> None:
    for k in range(cycles):
        arm.cycle(src, k * PERIOD_S, realign=k == 0)
        if src.phase in ("done", "stopped"):
            return


def test_the_clock_waits_for_the_alignment_and_no_frame_is_skipped():
    actions = np.tile(np.array([30.0, 0, 0, 0, 0, 50]), (20, 1))
    actions[:, 1] = np.arange(20) * 0.5  # a slow move on shoulder_lift
    arm = _bench(np.array([0.0, 0, 0, 0, 0, 50]))  # 30 deg from the first action on shoulder_pan
    src = ReplaySource(actions, fps=50.0, speed=1.0, arm=arm, period_s=PERIOD_S)
    _run(arm, src, 2000)
    assert src.phase == "done"
    log = src.log()
    assert log.frame[0] == 0 and set(range(20)) <= set(log.frame.tolist())
    # alignment: 1 deg per cycle (100 deg/s x 10 ms) until within the 2 deg tolerance of the first
    # action, 28 cycles, before frame 0 played
    aligning = [c for c in arm.commands if abs(c[0] - 30.0) > 1e-9]
    assert len(aligning) == 28, len(aligning)
    assert log.t_s[0] == 0.0 and len(log.t_s) >= 20
    # frame 0 played with the arm already at the first action (within the alignment tolerance),
    # not from where it stood
    assert np.abs(log.measured[0] - actions[0]).max() <= 2.0 + 1e-9, log.measured[0]
    assert max(np.abs(np.diff(np.array(aligning)[:, 0]))) <= 1.0 + 1e-9  # 100 deg/s x 10 ms


def test_a_jump_is_spread_by_the_step_limit_and_counted_and_a_joint_limit_apart():
    actions = np.tile(np.array([0.0, 0, 0, 0, 0, 50]), (40, 1))
    actions[10:, 2] = 40.0  # 40 deg in one frame
    actions[25:, 3] = 120.0  # past wrist_flex's limit (95)
    arm = _bench(actions[0])
    src = ReplaySource(actions, fps=100.0, speed=1.0, arm=arm, period_s=PERIOD_S)
    _run(arm, src, 500)
    rep = tracking_report(src.log(), list(FEATURE_NAMES), len(actions), "done", PERIOD_S)
    assert rep.step_limited_cycles >= 3 and 10 in rep.shaped_frames, rep
    assert rep.joint_limited_cycles >= 10 and 25 in rep.shaped_frames, rep
    assert max(rep.max_command_step[:5]) <= 10.0 + 1e-9, rep.max_command_step
    assert max(c[3] for c in arm.commands) <= 95.0


def test_a_hold_stops_the_replay_and_it_gives_no_target_after():
    actions = np.tile(np.array([0.0, 0, 0, 0, 0, 50]), (100, 1))
    arm = _bench(actions[0])
    src = ReplaySource(actions, fps=100.0, speed=0.5, arm=arm, period_s=PERIOD_S)
    _run(arm, src, 20)
    assert src.phase == "playing"
    arm.intent = "hold"
    arm.cycle(src, 0.2)
    arm.cycle(src, 0.21)
    assert src.phase == "stopped" and src.why.startswith("the arm left tracking: hold"), src.why
    assert src.target(0.22, arm.pose) is None


def test_a_hold_while_aligning_stops_the_replay_before_it_plays():
    """The operator holds while the arm is still on its way to the first action: the replay ends
    there (it does not wait, keeping the follower, for a later teleop.start to play it)."""
    actions = np.tile(np.array([60.0, 0, 0, 0, 0, 50]), (100, 1))
    arm = _bench(np.array([0.0, 0, 0, 0, 0, 50]))  # 60 deg away: 60 cycles of alignment
    arm.intent = "hold"  # the replay is assigned before its teleop intent reaches the loop
    src = ReplaySource(actions, fps=100.0, speed=1.0, arm=arm, period_s=PERIOD_S)
    for k in range(3):
        arm.cycle(src, k * PERIOD_S)
    assert src.phase == "aligning", "a hold from before the replay took the arm does not end it"
    arm.intent = "teleop"
    for k in range(3, 13):
        arm.cycle(src, k * PERIOD_S, realign=k == 3)
    assert src.phase == "aligning" and arm.state.mode == "aligning", (src.phase, arm.state)
    arm.intent = "hold"
    arm.cycle(src, 0.13)
    arm.cycle(src, 0.14)
    assert src.phase == "stopped" and src.why.startswith("the arm left tracking while aligning: hold"), src.why
    assert src.target(0.15, arm.pose) is None and src.frame == 0


def test_a_late_cycle_at_the_end_still_plays_the_last_frame_so_the_arm_holds_where_the_episode_ends():
    """A loaded machine: the loop's cycle comes a second late near the end of the episode. Frames
    it passed are skipped, as in any real-time playback, but the last one is played before the
    replay is done: the arm holds at the episode's last action, and the report says all frames."""
    actions = np.tile(np.array([0.0, 0, 0, 0, 0, 50]), (50, 1))
    actions[:, 0] = np.arange(50) * 0.2  # shoulder_pan moving to 9.8 deg
    arm = _bench(actions[0])
    src = ReplaySource(actions, fps=100.0, speed=1.0, arm=arm, period_s=PERIOD_S)
    _run(arm, src, 40)
    assert src.phase == "playing" and 30 <= src.frame < 45, (src.phase, src.frame)
    arm.cycle(src, 1.5)  # a second late: past the end
    arm.cycle(src, 1.51)
    assert src.phase == "done", src.phase
    log = src.log()
    assert log.frame[-1] == 49 and np.array_equal(log.target[-1], actions[-1]), log.frame[-3:]
    assert np.allclose(arm.pose, actions[-1]), arm.pose
    rep = tracking_report(log, list(FEATURE_NAMES), len(actions), "done", PERIOD_S)
    assert rep.frames_played == rep.frames == 50, rep
