"""The safety layer as a pure function: alignment, step limit, limits, stale target, faults, NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.config.settings import SafetyConfig
from daemon.control.safety import ControllerState, CycleInputs, SafetyParams, update

PERIOD_S = 0.01
LOWER = np.array([-110.0, -100.0, -95.0, -95.0, -160.0, 0.0])
UPPER = np.array([110.0, 100.0, 90.0, 95.0, 160.0, 100.0])


def params(**kw) -> SafetyParams:
    return SafetyParams.from_config(SafetyConfig(**kw), LOWER, UPPER, PERIOD_S)


def inputs(measured, target, intent="teleop", age=0.0, **kw) -> CycleInputs:
    return CycleInputs(
        intent=intent,
        torque_wanted=kw.pop("torque_wanted", True),
        follower_ok=kw.pop("follower_ok", True),
        measured=None if measured is None else np.asarray(measured, float),
        target=None if target is None else np.asarray(target, float),
        target_age_s=age,
        **kw,
    )


def run_cycles(state, p, measured, target, n, **kw):
    cmds = []
    for _ in range(n):
        out = update(state, inputs(measured, target, **kw), p)
        state = out.state
        cmds.append(out.command)
    return state, cmds


def test_alignment_starts_at_measured_pose_and_moves_at_bounded_speed():
    p = params(align_speed_deg_s=30.0, align_gripper_speed_pct_s=50.0)
    measured = np.zeros(6)
    target = np.array([60.0, -30.0, 10.0, 0.0, 0.0, 80.0])
    s = ControllerState()
    out = update(s, inputs(measured, target), p)
    assert out.torque is True  # torque asked once, after connect
    assert out.state.mode == "aligning"
    # first command: one bounded step from the measured pose, not the target
    np.testing.assert_allclose(out.command, [0.3, -0.3, 0.3, 0, 0, 0.5])
    state, cmds = run_cycles(out.state, p, measured, target, 400)
    prev = out.command
    for c in cmds:
        # alignment steps are bounded by speed x period; the hand-over to 1:1 tracking by the
        # alignment tolerance (never a jump)
        assert np.all(np.abs(c - prev) <= np.maximum(p.align_step, p.align_tolerance) + 1e-9)
        prev = c
    assert state.mode == "teleop"
    # 60 degrees at 30 deg/s: about 2 s = 200 cycles of alignment before tracking
    first_teleop = next(i for i, c in enumerate(cmds) if np.allclose(c, target))
    assert 190 <= first_teleop <= 200


def test_leader_jump_larger_than_step_limit_is_spread_over_cycles():
    p = params(max_step_deg=5.0, max_step_gripper_pct=10.0)
    target = np.zeros(6)
    state, _ = run_cycles(ControllerState(), p, np.zeros(6), target, 3)
    assert state.mode == "teleop"
    jump = np.array([23.0, 0, 0, 0, 0, 35.0])
    state, cmds = run_cycles(state, p, np.zeros(6), jump, 6)
    assert cmds[0][0] == pytest.approx(5.0) and cmds[0][5] == pytest.approx(10.0)
    assert [round(c[0], 6) for c in cmds] == [5.0, 10.0, 15.0, 20.0, 23.0, 23.0]
    assert state.mode == "teleop"


def test_targets_clamped_to_follower_limits():
    p = params(max_step_deg=90.0, max_step_gripper_pct=100.0)
    state, _ = run_cycles(ControllerState(), p, np.zeros(6), np.zeros(6), 2)
    out = update(state, inputs(np.zeros(6), [500.0, -500.0, 0, 0, 0, 150.0]), p)
    assert np.all(out.command <= UPPER) and np.all(out.command >= LOWER)
    assert out.limited


def test_stale_leader_holds_measured_pose_then_realigns():
    p = params()
    state, _ = run_cycles(ControllerState(), p, np.zeros(6), np.zeros(6), 3)
    assert state.mode == "teleop"
    sagging = np.array([1.0, 2.0, 3.0, 0, 0, 10.0])
    out = update(state, inputs(sagging, np.zeros(6), age=0.5), p)
    assert out.state.mode == "hold" and "stale" in out.state.reason
    np.testing.assert_allclose(out.command, sagging)
    # the held pose is captured once: further sag does not move the goal
    out2 = update(out.state, inputs(sagging + 5, np.zeros(6), age=0.6), p)
    np.testing.assert_allclose(out2.command, sagging)
    # leader back, far away: alignment from the measured pose, bounded
    far = np.array([40.0, 0, 0, 0, 0, 10.0])
    out3 = update(out2.state, inputs(sagging + 5, far, age=0.0), p)
    assert out3.state.mode == "aligning"
    assert np.all(np.abs(out3.command - (sagging + 5)) <= p.align_step + 1e-9)


def test_missing_target_holds():
    p = params()
    out = update(ControllerState(), inputs(np.zeros(6), None, age=math.inf), p)
    assert out.state.mode == "hold"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_target_never_reaches_the_bus(bad):
    p = params()
    state, _ = run_cycles(ControllerState(), p, np.zeros(6), np.zeros(6), 3)
    tgt = np.zeros(6)
    tgt[2] = bad
    out = update(state, inputs(np.zeros(6), tgt), p)
    assert out.state.mode == "hold"
    assert out.command is not None and np.all(np.isfinite(out.command))


def test_non_finite_measurement_means_no_command():
    p = params()
    m = np.zeros(6)
    m[0] = math.nan
    out = update(ControllerState(), inputs(m, np.zeros(6)), p)
    assert out.command is None and out.state.mode == "disconnected"


def test_fault_hold_latches_until_cleared():
    p = params(on_fault="hold")
    state, _ = run_cycles(ControllerState(), p, np.zeros(6), np.zeros(6), 3)
    out = update(state, inputs(np.ones(6), np.zeros(6), fault_now="gripper: overload"), p)
    assert out.state.mode == "fault" and out.state.fault
    np.testing.assert_allclose(out.command, np.ones(6))
    # fault bits gone but no operator action: still latched
    out = update(out.state, inputs(np.ones(6), np.zeros(6)), p)
    assert out.state.mode == "fault"
    # operator clears: alignment from the measured pose
    out = update(out.state, inputs(np.ones(6), np.zeros(6), clear_fault=True), p)
    assert out.state.mode in ("aligning", "teleop") and not out.state.fault


def test_fault_clear_refused_while_fault_present():
    p = params()
    out = update(ControllerState(), inputs(np.zeros(6), np.zeros(6), fault_now="overheat"), p)
    out = update(out.state, inputs(np.zeros(6), np.zeros(6), fault_now="overheat", clear_fault=True), p)
    assert out.state.mode == "fault"


def test_fault_torque_off_reaction():
    p = params(on_fault="torque_off")
    state, _ = run_cycles(ControllerState(), p, np.zeros(6), np.zeros(6), 3)
    out = update(state, inputs(np.zeros(6), np.zeros(6), fault_now="elbow_flex: overload"), p)
    assert out.torque is False and out.command is None and out.state.mode == "fault"
    out = update(out.state, inputs(np.zeros(6), np.zeros(6), fault_now="elbow_flex: overload"), p)
    assert out.torque is None  # asked once


def test_torque_off_is_idle_and_writes_nothing():
    p = params()
    out = update(ControllerState(), inputs(np.zeros(6), np.zeros(6), torque_wanted=False), p)
    assert out.state.mode == "idle" and out.command is None and out.torque is False


def test_hold_intent_and_back_to_teleop_realigns():
    p = params()
    state, _ = run_cycles(ControllerState(), p, np.zeros(6), np.zeros(6), 3)
    out = update(state, inputs(np.zeros(6), np.zeros(6), intent="hold"), p)
    assert out.state.mode == "hold"
    out = update(out.state, inputs(np.zeros(6), np.full(6, 30.0), intent="teleop"), p)
    assert out.state.mode == "aligning"


def test_disconnected_follower_commands_nothing_and_restarts_alignment():
    p = params()
    state, _ = run_cycles(ControllerState(), p, np.zeros(6), np.zeros(6), 3)
    out = update(state, inputs(None, np.zeros(6), follower_ok=False), p)
    assert out.command is None and out.state.mode == "disconnected"
    out = update(out.state, inputs(np.zeros(6), np.full(6, 20.0)), p)
    assert out.state.mode == "aligning" and out.torque is True


@settings(max_examples=200, deadline=None)
@given(
    measured=st.lists(st.floats(-200, 200), min_size=6, max_size=6),
    targets=st.lists(
        st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(math.nan), st.just(math.inf)), min_size=6, max_size=6),
        min_size=1,
        max_size=20,
    ),
)
def test_every_command_is_finite_in_limits_and_step_bounded(measured, targets):
    p = params()
    state = ControllerState()
    prev = None
    for t in targets:
        out = update(state, inputs(measured, t), p)
        if out.command is not None:
            c = out.command
            assert np.all(np.isfinite(c)) and np.all(c >= LOWER) and np.all(c <= UPPER)
            if prev is not None and out.state.mode in ("aligning", "teleop") and state.mode in ("aligning", "teleop"):
                assert np.all(np.abs(c - prev) <= np.maximum(p.max_step, p.align_step) + 1e-9)
            prev = c
        state = out.state


def test_alignment_speed_is_per_second_and_a_late_cycle_catches_up_at_most_two_periods():
    p = params(align_speed_deg_s=30.0)
    target = np.full(6, 50.0)
    half = update(ControllerState(), inputs(np.zeros(6), target, dt_s=0.005), p)
    np.testing.assert_allclose(half.command[0], 0.15)  # 30 deg/s x 5 ms
    late = update(ControllerState(), inputs(np.zeros(6), target, dt_s=0.5), p)
    np.testing.assert_allclose(late.command[0], 0.6)  # capped at two periods' worth
    assert np.all(late.command <= p.max_align_step + 1e-12)


def test_a_follower_moved_under_us_realigns_from_where_it_now_is():
    """A simulator's scene reset puts the arm at its rest pose mid-teleop: the next command starts
    one align step from that measured pose, not from the last command (a jump to the leader)."""
    p = params(align_speed_deg_s=30.0, align_gripper_speed_pct_s=50.0)
    target = np.array([40.0, -30.0, 30.0, 10.0, 0.0, 60.0])
    state, _ = run_cycles(ControllerState(), p, target, target, 5)
    assert state.mode == "teleop"
    rest = np.zeros(6)
    out = update(state, inputs(rest, target, realign=True), p)
    assert out.state.mode == "aligning"
    np.testing.assert_allclose(out.command, rest + np.sign(target - rest) * p.align_step)
    # without the flag the same cycle keeps tracking the target: that is the jump the flag prevents
    assert update(state, inputs(rest, target), p).state.mode == "teleop"
