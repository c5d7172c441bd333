"""Property tests of the unit conventions (calibration/conventions.py).

The reference for "LeRobot units" is LeRobot 0.6.1 itself: we build its FeetechMotorsBus (no
port is opened) with the same calibration and compare its _normalize / _unnormalize with ours.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibration.calibration_file import ArmCalibration, MotorCalibration
from calibration.conventions import (
    GRIPPER_INDEX,
    JOINT_IDS,
    JOINT_NAMES,
    LEISAAC_USD_LIMITS_DEG,
    MAX_TICK,
    NUM_JOINTS,
    leader_ticks_to_follower_ticks,
    normalized_to_sim_rad,
    sim_rad_to_normalized,
    sim_rad_to_units,
    sim_unit_limits,
    ticks_to_units,
    unit_limits,
    units_to_sim_rad,
    units_to_ticks,
)

# Per-test settings (not a global profile: other test modules keep their own).
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
AGAINST_LEROBOT = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BODY = [i for i in range(NUM_JOINTS) if i != GRIPPER_INDEX]


# ---------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------
@st.composite
def motor_ranges(draw: st.DrawFn, min_span: int = 20) -> tuple[int, int]:
    lo = draw(st.integers(0, MAX_TICK - min_span))
    hi = draw(st.integers(lo + min_span, MAX_TICK))
    return lo, hi


@st.composite
def calibrations(
    draw: st.DrawFn, gripper_drive_mode: int | None = None, body_drive_modes: bool = False
) -> ArmCalibration:
    motors = {}
    for name in JOINT_NAMES:
        lo, hi = draw(motor_ranges())
        if name == "gripper":
            drive = draw(st.sampled_from([0, 1])) if gripper_drive_mode is None else gripper_drive_mode
        else:
            drive = draw(st.sampled_from([0, 1])) if body_drive_modes else 0
        offset = draw(st.integers(-2047, 2047))
        motors[name] = MotorCalibration(JOINT_IDS[name], drive, offset, lo, hi)
    return ArmCalibration(motors)


def ticks_in(cal: ArmCalibration) -> st.SearchStrategy[np.ndarray]:
    return st.tuples(*[st.integers(cal[n].range_min, cal[n].range_max) for n in JOINT_NAMES]).map(
        lambda t: np.array(t, dtype=np.int64)
    )


def lerobot_bus(cal: ArmCalibration, body_mode: str = "degrees"):
    """LeRobot's own bus object with our calibration; the port is never opened."""
    from lerobot.motors import Motor, MotorNormMode
    from lerobot.motors import MotorCalibration as LRCal
    from lerobot.motors.feetech import FeetechMotorsBus

    body = MotorNormMode.DEGREES if body_mode == "degrees" else MotorNormMode.RANGE_M100_100
    motors = {
        name: Motor(JOINT_IDS[name], "sts3215", MotorNormMode.RANGE_0_100 if name == "gripper" else body)
        for name in JOINT_NAMES
    }
    lr_cal = {name: LRCal(**vars(cal[name])) for name in JOINT_NAMES}
    return FeetechMotorsBus(port="/dev/null-so101d-test", motors=motors, calibration=lr_cal)


# ---------------------------------------------------------------------------------------------
# ticks <-> units
# ---------------------------------------------------------------------------------------------
@PROPERTY
@given(st.data(), st.sampled_from(["degrees", "range_m100_100"]))
def test_ticks_units_ticks_is_identity_inside_the_range(data: st.DataObject, body_mode: str) -> None:
    cal = data.draw(calibrations(body_drive_modes=True))
    ticks = data.draw(ticks_in(cal))
    back = units_to_ticks(ticks_to_units(ticks, cal, body_mode), cal, body_mode)
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, ticks)


@PROPERTY
@given(st.data())
def test_degrees_round_trip_outside_the_range_too(data: st.DataObject) -> None:
    # Degrees are not clamped (LeRobot 0.6.1): a joint read beyond its calibrated range keeps its angle.
    cal = data.draw(calibrations())
    ticks = np.array(data.draw(st.lists(st.integers(0, MAX_TICK), min_size=6, max_size=6)), dtype=np.int64)
    units = ticks_to_units(ticks, cal)
    back = units_to_ticks(units, cal)
    np.testing.assert_array_equal(back[BODY], ticks[BODY])
    # The gripper (0..100) is clamped to its range like LeRobot.
    g = GRIPPER_INDEX
    assert 0.0 <= units[g] <= 100.0
    assert back[g] == np.clip(ticks[g], cal["gripper"].range_min, cal["gripper"].range_max)


@PROPERTY
@given(st.data(), st.sampled_from(["degrees", "range_m100_100"]))
def test_units_ticks_units_within_half_a_tick(data: st.DataObject, body_mode: str) -> None:
    cal = data.draw(calibrations(body_drive_modes=True))
    lo_u, hi_u = unit_limits(cal, body_mode)
    units = np.array([data.draw(st.floats(float(lo_u[i]), float(hi_u[i]))) for i in range(NUM_JOINTS)])
    back = ticks_to_units(units_to_ticks(units, cal, body_mode), cal, body_mode)
    for i, name in enumerate(JOINT_NAMES):
        span = cal[name].range_max - cal[name].range_min
        if i == GRIPPER_INDEX:
            half_tick_units = 0.5 * 100.0 / span
        elif body_mode == "degrees":
            half_tick_units = 0.5 * 360.0 / MAX_TICK
        else:
            half_tick_units = 0.5 * 200.0 / span
        assert abs(back[i] - units[i]) <= half_tick_units + 1e-9, (name, units[i], back[i])


@PROPERTY
@given(st.data(), st.sampled_from(["degrees", "range_m100_100"]))
def test_ticks_to_units_is_monotonic_with_the_drive_mode_deciding_the_direction(
    data: st.DataObject, body_mode: str
) -> None:
    cal = data.draw(calibrations(body_drive_modes=True))
    a = data.draw(ticks_in(cal))
    b = data.draw(ticks_in(cal))
    ua, ub = ticks_to_units(a, cal, body_mode), ticks_to_units(b, cal, body_mode)
    for i, name in enumerate(JOINT_NAMES):
        # LeRobot ignores drive_mode in DEGREES mode; it flips RANGE_M100_100 and RANGE_0_100.
        flips = cal[name].drive_mode == 1 and (i == GRIPPER_INDEX or body_mode == "range_m100_100")
        sign = -1 if flips else 1
        if a[i] < b[i]:
            assert sign * ua[i] < sign * ub[i]
        elif a[i] == b[i]:
            assert ua[i] == ub[i]


@PROPERTY
@given(st.data(), st.sampled_from(["degrees", "range_m100_100"]))
def test_units_to_ticks_is_monotonic(data: st.DataObject, body_mode: str) -> None:
    cal = data.draw(calibrations(body_drive_modes=True))
    x = np.array(data.draw(st.lists(st.floats(-400, 400), min_size=6, max_size=6)))
    y = np.array(data.draw(st.lists(st.floats(-400, 400), min_size=6, max_size=6)))
    tx, ty = units_to_ticks(x, cal, body_mode), units_to_ticks(y, cal, body_mode)
    for i, name in enumerate(JOINT_NAMES):
        flips = cal[name].drive_mode == 1 and (i == GRIPPER_INDEX or body_mode == "range_m100_100")
        if x[i] <= y[i]:
            assert (tx[i] >= ty[i]) if flips else (tx[i] <= ty[i])


@PROPERTY
@given(st.data(), st.sampled_from([math.nan, math.inf, -math.inf]), st.integers(0, NUM_JOINTS - 1))
def test_units_to_ticks_refuses_non_finite_values(data: st.DataObject, bad: float, index: int) -> None:
    cal = data.draw(calibrations())
    units = np.zeros(NUM_JOINTS)
    units[index] = bad
    for mode in ("degrees", "range_m100_100"):
        with pytest.raises(ValueError, match="non-finite"):
            units_to_ticks(units, cal, mode)


def test_units_to_ticks_refuses_a_wrong_shape() -> None:
    cal = ArmCalibration({n: MotorCalibration(JOINT_IDS[n], 0, 0, 1000, 3000) for n in JOINT_NAMES})
    with pytest.raises(ValueError, match="6 joint values"):
        units_to_ticks(np.zeros(5), cal)


@PROPERTY
@given(st.data())
def test_gripper_zero_is_closed_whatever_the_drive_mode(data: st.DataObject) -> None:
    # drive_mode 0: closed = range_min; drive_mode 1 (gripper mounted reversed): closed = range_max.
    drive = data.draw(st.sampled_from([0, 1]))
    cal = data.draw(calibrations(gripper_drive_mode=drive))
    g = cal["gripper"]
    closed_end, open_end = (g.range_max, g.range_min) if drive else (g.range_min, g.range_max)
    units = np.zeros(NUM_JOINTS)
    units[GRIPPER_INDEX] = 0.0
    assert units_to_ticks(units, cal)[GRIPPER_INDEX] == closed_end
    units[GRIPPER_INDEX] = 100.0
    assert units_to_ticks(units, cal)[GRIPPER_INDEX] == open_end
    ticks = np.full(NUM_JOINTS, 2047)
    ticks[GRIPPER_INDEX] = closed_end
    assert ticks_to_units(ticks, cal)[GRIPPER_INDEX] == pytest.approx(0.0)


# ---------------------------------------------------------------------------------------------
# equality with LeRobot 0.6.1's own normalisation
# ---------------------------------------------------------------------------------------------
@AGAINST_LEROBOT
@given(st.data(), st.sampled_from(["degrees", "range_m100_100"]))
def test_ticks_to_units_equals_lerobots_normalize(data: st.DataObject, body_mode: str) -> None:
    cal = data.draw(calibrations(body_drive_modes=True))
    ticks = np.array(data.draw(st.lists(st.integers(0, MAX_TICK), min_size=6, max_size=6)), dtype=np.int64)
    bus = lerobot_bus(cal, body_mode)
    theirs = bus._normalize({JOINT_IDS[n]: int(ticks[i]) for i, n in enumerate(JOINT_NAMES)})
    ours = ticks_to_units(ticks, cal, body_mode)
    for i, name in enumerate(JOINT_NAMES):
        assert ours[i] == pytest.approx(theirs[JOINT_IDS[name]], abs=1e-9), name


@AGAINST_LEROBOT
@given(st.data(), st.sampled_from(["degrees", "range_m100_100"]))
def test_units_to_ticks_within_one_tick_of_lerobots_unnormalize(data: st.DataObject, body_mode: str) -> None:
    cal = data.draw(calibrations(body_drive_modes=True))
    lo_u, hi_u = unit_limits(cal, body_mode)
    # Degrees stay inside the range so that LeRobot's int() truncation never meets a negative value.
    units = np.array([data.draw(st.floats(float(lo_u[i]), float(hi_u[i]))) for i in range(NUM_JOINTS)])
    bus = lerobot_bus(cal, body_mode)
    theirs = bus._unnormalize({JOINT_IDS[n]: float(units[i]) for i, n in enumerate(JOINT_NAMES)})
    ours = units_to_ticks(units, cal, body_mode)
    for i, name in enumerate(JOINT_NAMES):
        # LeRobot truncates, we round to nearest: ours is theirs or theirs + 1.
        assert 0 <= ours[i] - theirs[JOINT_IDS[name]] <= 1, (name, units[i], ours[i], theirs[JOINT_IDS[name]])


# ---------------------------------------------------------------------------------------------
# leader -> follower
# ---------------------------------------------------------------------------------------------
@PROPERTY
@given(st.data())
def test_leader_to_follower_honours_both_calibrations(data: st.DataObject) -> None:
    leader = data.draw(calibrations())
    follower = data.draw(calibrations())
    lt = data.draw(ticks_in(leader))
    ft = leader_ticks_to_follower_ticks(lt, leader, follower)
    # Stays inside the follower's calibrated range.
    for i, n in enumerate(JOINT_NAMES):
        assert follower[n].range_min <= ft[i] <= follower[n].range_max
    # Same physical pose in LeRobot units (within a follower tick), wherever the follower can reach it.
    lu, fu = ticks_to_units(lt, leader), ticks_to_units(ft, follower)
    f_lo, f_hi = unit_limits(follower)
    for i, n in enumerate(JOINT_NAMES):
        tick_units = 100.0 / (follower[n].range_max - follower[n].range_min) if i == GRIPPER_INDEX else 360.0 / MAX_TICK
        if f_lo[i] <= lu[i] <= f_hi[i]:
            assert abs(fu[i] - lu[i]) <= 0.5 * tick_units + 1e-9, n
        else:  # out of the follower's reach: held at the nearer limit
            assert fu[i] == pytest.approx(f_lo[i] if lu[i] < f_lo[i] else f_hi[i], abs=0.5 * tick_units + 1e-9)


@PROPERTY
@given(st.data())
def test_leader_to_follower_differs_in_ticks_when_the_calibrations_differ(data: st.DataObject) -> None:
    # Two arms with different mid-points: the same physical angle needs different ticks.
    shift = data.draw(st.integers(50, 400))
    base = {n: MotorCalibration(JOINT_IDS[n], 0, 0, 1000, 3000) for n in JOINT_NAMES}
    leader = ArmCalibration(base)
    follower = ArmCalibration(
        {n: MotorCalibration(JOINT_IDS[n], 0, 0, 1000 + shift, 3000 + shift) for n in JOINT_NAMES}
    )
    lt = np.array(data.draw(st.lists(st.integers(1200, 2800), min_size=6, max_size=6)), dtype=np.int64)
    ft = leader_ticks_to_follower_ticks(lt, leader, follower)
    np.testing.assert_array_equal(ft, lt + shift)


def test_leader_to_follower_maps_a_reversed_follower_gripper() -> None:
    leader = ArmCalibration({n: MotorCalibration(JOINT_IDS[n], 0, 0, 1000, 3000) for n in JOINT_NAMES})
    motors = dict(leader.motors)
    motors["gripper"] = MotorCalibration(6, 1, 0, 2000, 3400)  # closes towards high ticks
    follower = ArmCalibration(motors)
    closed_leader = np.array([2000, 2000, 2000, 2000, 2000, 1000])
    open_leader = np.array([2000, 2000, 2000, 2000, 2000, 3000])
    assert leader_ticks_to_follower_ticks(closed_leader, leader, follower)[GRIPPER_INDEX] == 3400
    assert leader_ticks_to_follower_ticks(open_leader, leader, follower)[GRIPPER_INDEX] == 2000


# ---------------------------------------------------------------------------------------------
# simulation radians (LeIsaac)
# ---------------------------------------------------------------------------------------------
@PROPERTY
@given(st.lists(st.floats(-400, 400), min_size=6, max_size=6))
def test_sim_radians_round_trip(values: list[float]) -> None:
    units = np.array(values)
    np.testing.assert_allclose(sim_rad_to_units(units_to_sim_rad(units)), units, atol=1e-9)
    np.testing.assert_allclose(sim_rad_to_normalized(normalized_to_sim_rad(units)), units, atol=1e-9)


def _table_spanning_calibration() -> ArmCalibration:
    """A calibration whose range is LeIsaac's limit table (rounded to whole ticks), centred at 2047."""
    motors = {}
    for name in JOINT_NAMES:
        lo_deg, hi_deg = LEISAAC_USD_LIMITS_DEG[name]
        half_span = round((hi_deg - lo_deg) / 2 * MAX_TICK / 360.0)
        motors[name] = MotorCalibration(JOINT_IDS[name], 0, 0, 2047 - half_span, 2047 + half_span)
    return ArmCalibration(motors)


@PROPERTY
@given(st.data())
def test_normalized_to_sim_rad_agrees_with_units_to_sim_rad_through_a_table_spanning_calibration(
    data: st.DataObject,
) -> None:
    cal = _table_spanning_calibration()
    ticks = data.draw(ticks_in(cal))
    via_normalized = normalized_to_sim_rad(ticks_to_units(ticks, cal, "range_m100_100"))
    via_degrees = units_to_sim_rad(ticks_to_units(ticks, cal, "degrees"))
    # The only difference is the table's span rounded to whole ticks: < 1 tick at the ends.
    np.testing.assert_allclose(via_degrees, via_normalized, atol=math.radians(360.0 / MAX_TICK))


def test_the_table_ends_map_to_the_sim_limits() -> None:
    lo, hi = sim_unit_limits()
    lo_rad, hi_rad = units_to_sim_rad(lo), units_to_sim_rad(hi)
    for i, name in enumerate(JOINT_NAMES):
        assert math.degrees(lo_rad[i]) == pytest.approx(LEISAAC_USD_LIMITS_DEG[name][0])
        assert math.degrees(hi_rad[i]) == pytest.approx(LEISAAC_USD_LIMITS_DEG[name][1])
    # Normalised ends too (LeIsaac's own map).
    n_lo = np.array([-100.0] * 5 + [0.0])
    n_hi = np.array([100.0] * 5 + [100.0])
    np.testing.assert_allclose(
        np.degrees(normalized_to_sim_rad(n_lo)), [LEISAAC_USD_LIMITS_DEG[n][0] for n in JOINT_NAMES]
    )
    np.testing.assert_allclose(
        np.degrees(normalized_to_sim_rad(n_hi)), [LEISAAC_USD_LIMITS_DEG[n][1] for n in JOINT_NAMES]
    )


@PROPERTY
@given(st.floats(-180, 180))
def test_gripper_closed_is_the_sims_lower_gripper_limit(body_value: float) -> None:
    units = np.full(NUM_JOINTS, body_value)
    units[GRIPPER_INDEX] = 0.0
    rad = units_to_sim_rad(units)
    assert math.degrees(rad[GRIPPER_INDEX]) == pytest.approx(LEISAAC_USD_LIMITS_DEG["gripper"][0])
    units[GRIPPER_INDEX] = 100.0
    assert math.degrees(units_to_sim_rad(units)[GRIPPER_INDEX]) == pytest.approx(LEISAAC_USD_LIMITS_DEG["gripper"][1])


@PROPERTY
@given(st.lists(st.floats(-300, 300), min_size=6, max_size=6))
def test_body_degrees_stay_degrees_in_the_sim(values: list[float]) -> None:
    # 1 LeRobot degree is 1 sim degree: the arm moves as much in sim as the leader does in reality.
    a = np.array(values)
    b = a + 1.0
    d = np.degrees(units_to_sim_rad(b) - units_to_sim_rad(a))
    np.testing.assert_allclose(d[BODY], 1.0, atol=1e-9)
