"""The STS3215 model: registers, motion limits, protections, presets and motion sources.

Driven by a fake clock, so every number here is deterministic (no bus, no sleeping).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibration.conventions import JOINT_NAMES, ticks_to_units
from drivers.emulator import EmulatedArm, MotionError, StillMotion, load_trajectory, reference_calibration
from drivers.emulator.motion import DEMO_KEYFRAMES, DemoMotion, motion_from_spec
from drivers.sts3215_table import ERR_OVERHEAT, ERR_OVERLOAD, ERR_VOLTAGE, encode_sign_magnitude


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def _arm(role: str = "follower", **kw) -> tuple[EmulatedArm, FakeClock]:
    clock = FakeClock()
    return EmulatedArm(role, clock=clock, **kw), clock  # type: ignore[arg-type]


def _pos(servo) -> int:
    servo.update()
    return servo.present_ticks()


def _unlock_torque_on(servo, goal: int) -> None:
    servo.write(55, bytes([0]))
    servo.write(40, bytes([1]))
    servo.write(42, goal.to_bytes(2, "little"))


def test_speed_is_limited_to_about_3000_ticks_per_second() -> None:
    arm, clock = _arm()
    s = arm.servo("shoulder_pan")
    start = _pos(s)
    _unlock_torque_on(s, start + 1000)
    clock.advance(0.25)
    moved = _pos(s) - start
    assert 500 < moved <= 0.25 * 3000 + 1
    assert s.read(66, 1) == b"\x01"  # Moving
    vel = int.from_bytes(s.read(58, 2), "little")
    assert 2500 <= vel <= 3000
    clock.advance(0.5)
    assert _pos(s) == start + 1000
    assert s.read(66, 1) == b"\x00"


def test_acceleration_register_ramps_the_speed() -> None:
    arm, clock = _arm()
    s = arm.servo("shoulder_pan")
    start = _pos(s)
    s.write(41, bytes([10]))  # 10 x 100 ticks/s^2
    _unlock_torque_on(s, start + 1000)
    clock.advance(0.1)
    # 0.5 * 1000 * 0.1^2 = 5 ticks (plus integration rounding)
    assert 3 <= _pos(s) - start <= 7


def test_dead_band_and_goal_clamp() -> None:
    arm, clock = _arm()
    s = arm.servo("elbow_flex")
    start = _pos(s)
    _unlock_torque_on(s, start + 1)
    clock.advance(0.5)
    assert _pos(s) == start  # within the dead band: the horn does not move
    s.write(42, (4000).to_bytes(2, "little"))  # beyond Max_Position_Limit
    assert s.goal_ticks() == reference_calibration("follower")["elbow_flex"].range_max
    s.write(42, encode_sign_magnitude(-5, 15).to_bytes(2, "little"))
    assert s.goal_ticks() == reference_calibration("follower")["elbow_flex"].range_min


def test_homing_offset_changes_the_reading_not_the_joint() -> None:
    arm, _clock = _arm()
    s = arm.servo("wrist_flex")
    before_units = arm.pose_units()
    present = _pos(s)
    off = s.homing_offset
    s.write(55, bytes([0]))
    s.write(31, encode_sign_magnitude(off - 100, 11).to_bytes(2, "little"))
    assert _pos(s) == (present + 100) % 4096
    np.testing.assert_allclose(arm.pose_units(), before_units)
    # Present = actual - offset, wrapped to 0..4095
    s.write(31, encode_sign_magnitude(0, 11).to_bytes(2, "little"))
    assert _pos(s) == (present + off) % 4096


def test_phase_bit_4_unwraps_feedback_like_lr_3373() -> None:
    arm, _ = _arm("follower", preset="factory")
    roll = arm.servo("wrist_roll")
    assert roll.reg("Phase") & 0x10
    arm.set_pose_units([0.0, -95.0, 92.0, 55.0, -20.0, 2.0])  # raw encoder just below 0
    raw = int.from_bytes(roll.read(56, 2), "little")
    assert raw & 0x8000  # negative reading, sign-magnitude bit 15: what LeRobot guards against
    roll.write(55, bytes([0]))
    roll.write(18, bytes([roll.reg("Phase") & ~0x10]))
    assert 0 <= int.from_bytes(roll.read(56, 2), "little") <= 4095


def test_eeprom_lock_ignores_writes_until_unlocked() -> None:
    arm, _ = _arm()
    s = arm.servo(1)
    assert s.reg("Lock") == 1
    s.write(9, (100).to_bytes(2, "little"))
    assert s.reg("Min_Position_Limit") == reference_calibration("follower")["shoulder_pan"].range_min
    s.write(55, bytes([0]))
    s.write(9, (100).to_bytes(2, "little"))
    assert s.reg("Min_Position_Limit") == 100


def test_obstacle_stalls_loads_then_overload_cuts_torque() -> None:
    arm, clock = _arm()
    g = arm.servo("gripper")
    start = _pos(g)
    arm.block_joint("gripper", start + 200)  # an object in the gripper
    _unlock_torque_on(g, start + 800)
    clock.advance(0.3)
    assert _pos(g) == start + 200
    load = int.from_bytes(g.read(60, 2), "little")
    assert load & 0x3FF >= 250  # at least 25 %, above LeRobot's gripper Overload_Torque
    assert g.torque_enabled and not g.error_bits() & ERR_OVERLOAD
    clock.advance(2.0)  # Protection_Time 200 x 10 ms
    g.update()
    assert not g.torque_enabled
    assert g.error_bits() & ERR_OVERLOAD
    assert g.read(65, 1)[0] & ERR_OVERLOAD  # Status register
    g.write(40, bytes([0]))  # a Torque_Enable write clears the latch
    assert not g.error_bits() & ERR_OVERLOAD
    # Free motion never trips the protection.
    arm.block_joint("gripper", None)
    g.write(40, bytes([1]))
    clock.advance(3.0)
    g.update()
    assert g.torque_enabled and _pos(g) == start + 800


def test_temperature_rises_under_load_and_voltage_limits_raise_bits() -> None:
    arm, clock = _arm()
    s = arm.servo("shoulder_lift")
    s.write(55, bytes([0]))
    s.write(35, bytes([255]))  # long protection time: let it cook
    s.write(36, bytes([100]))  # and a threshold it never exceeds
    start = _pos(s)
    arm.block_joint("shoulder_lift", start + 50)
    _unlock_torque_on(s, start + 1000)
    t0 = s.temperature_c
    clock.advance(60.0)
    s.update()
    assert s.temperature_c > t0 + 10
    arm.set_temperature("shoulder_lift", 75.0)
    assert s.error_bits() & ERR_OVERHEAT
    arm.set_supply_voltage(3.5)
    assert all(x.error_bits() & ERR_VOLTAGE for x in arm.servos)
    arm.set_supply_voltage(7.4)
    assert not arm.servo(1).error_bits() & ERR_VOLTAGE


def test_velocity_mode_turns_continuously() -> None:
    arm, clock = _arm()
    s = arm.servo("wrist_roll")
    s.write(55, bytes([0]))
    s.write(33, bytes([1]))
    s.write(46, (500).to_bytes(2, "little"))
    s.write(40, bytes([1]))
    p0 = s.phys
    clock.advance(1.0)
    s.update()
    assert 480 <= s.phys - p0 <= 500


def test_set_middle_with_torque_enable_128() -> None:
    arm, _ = _arm()
    s = arm.servo("wrist_flex")
    s.write(40, bytes([128]))
    assert _pos(s) == 2048


def test_leader_follows_its_motion_source_with_torque_off() -> None:
    arm, clock = _arm("leader")
    p0 = arm.pose_units()
    np.testing.assert_allclose(p0, DEMO_KEYFRAMES[0][1], atol=0.1)
    clock.advance(2.5)
    np.testing.assert_allclose(arm.pose_units(), DEMO_KEYFRAMES[1][1], atol=0.1)
    vel = int.from_bytes(arm.servo(1).read(58, 2), "little")
    assert vel == 0 or vel & 0x7FFF < 50  # at a keyframe the eased motion is (nearly) at rest
    arm.set_joint_ticks("gripper", 2500)  # the operator squeezes the trigger
    assert arm.present_ticks()[5] == 2500
    clock.advance(1.0)
    assert arm.present_ticks()[5] == 2500  # hand motion sticks (motion source frozen)


def test_demo_motion_stays_inside_both_calibrated_ranges_and_loops() -> None:
    demo = DemoMotion()
    assert 10.0 <= demo.duration_s <= 20.0
    for role in ("leader", "follower"):
        cal = reference_calibration(role)  # type: ignore[arg-type]
        arm = EmulatedArm(role, motion=StillMotion(DEMO_KEYFRAMES[0][1]))  # type: ignore[arg-type]
        for t in np.linspace(0, demo.duration_s, 161):
            arm.set_pose_units(demo.pose_at(float(t)))
            ticks = arm.present_ticks()
            for i, n in enumerate(JOINT_NAMES):
                assert cal[n].range_min <= ticks[i] <= cal[n].range_max, (role, n, t)
    np.testing.assert_allclose(demo.pose_at(0.0), demo.pose_at(demo.duration_s))
    # Smooth: no jump bigger than a few degrees in 10 ms.
    poses = np.array([demo.pose_at(t) for t in np.arange(0, 32, 0.01)])
    assert np.abs(np.diff(poses, axis=0)).max() < 2.0
    grip = poses[:, 5]
    assert grip.min() < 10 and grip.max() > 60  # closes and opens


def test_trajectory_files_csv_and_json(tmp_path: Path) -> None:
    csv_path = tmp_path / "traj.csv"
    csv_path.write_text(
        "t_s,shoulder_pan.pos,shoulder_lift.pos,elbow_flex.pos,wrist_flex.pos,wrist_roll.pos,gripper.pos\n"
        "0,0,-90,90,50,0,10\n1,10,-80,80,40,0,90\n"
    )
    m = load_trajectory(csv_path)
    np.testing.assert_allclose(m.pose_at(0.5), [5, -85, 85, 45, 0, 50])
    json_path = tmp_path / "traj.json"
    json_path.write_text(json.dumps({"t_s": [0, 2], "positions": [[0, 0, 0, 0, 0, 0], [20, 20, 20, 20, 20, 20]]}))
    np.testing.assert_allclose(motion_from_spec(str(json_path)).pose_at(1.0), [10] * 6)
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"t_s": 0, **{n: 1.0 for n in JOINT_NAMES}}]))
    np.testing.assert_allclose(load_trajectory(rows).pose_at(5.0), [1.0] * 6)


@pytest.mark.parametrize(
    "content, message",
    [
        ("t_s,shoulder_pan\n0,1\n", "missing column for joint 'shoulder_lift'"),
        ("a,b\n", "no samples"),
        ("x," + ",".join(JOINT_NAMES) + "\n0,1,2,3,4,5,6\n", "no time column"),
        ("t_s," + ",".join(JOINT_NAMES) + "\n1,0,0,0,0,0,0\n0,0,0,0,0,0,0\n", "strictly increasing"),
        ("t_s," + ",".join(JOINT_NAMES) + "\n0,0,0,0,0,0,nan\n", "non-finite"),
        ("t_s," + ",".join(JOINT_NAMES) + "\n0,0,0,0,0,0,abc\n", "sample 0"),
    ],
)
def test_bad_trajectory_files_are_refused_clearly(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(MotionError, match=message):
        load_trajectory(p)


def test_missing_and_corrupt_trajectory_files(tmp_path: Path) -> None:
    with pytest.raises(MotionError, match="cannot read"):
        load_trajectory(tmp_path / "nope.csv")
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(MotionError, match="corrupt JSON"):
        load_trajectory(p)


def test_factory_preset_reads_raw_positions_and_reference_is_the_same_arm() -> None:
    pose = [10.0, -30.0, 40.0, 20.0, 0.0, 50.0]
    cal, fac = (
        EmulatedArm("follower", initial_pose_units=pose),
        EmulatedArm("follower", "factory", initial_pose_units=pose),
    )
    assert fac.eeprom_calibration().motors["shoulder_pan"].homing_offset == 0
    assert fac.servo(1).reg("Return_Delay_Time") == 250
    np.testing.assert_allclose(cal.pose_units(), fac.pose_units())
    ref = reference_calibration("follower")
    # Raw factory reading minus the reference offset is the calibrated reading.
    raw = fac.servo("elbow_flex").present_ticks()
    assert (raw - ref["elbow_flex"].homing_offset) % 4096 == cal.servo("elbow_flex").present_ticks()
    np.testing.assert_allclose(ticks_to_units(cal.present_ticks(), ref), pose, atol=0.1)


def test_leader_released_after_being_driven_stays_where_the_motors_left_it() -> None:
    # A take-over drives the leader away from its motion source's pose, then releases it: the
    # hand holds it there (the source is paused), it does not snap back to the script.
    arm, clock = _arm("leader", motion=DemoMotion())
    s = arm.servo("shoulder_pan")
    other = arm.servo("elbow_flex")  # never torqued: it follows the demo until the release
    start = _pos(s)
    _unlock_torque_on(s, start + 300)
    clock.advance(1.0)
    assert _pos(s) == start + 300
    moving_before = _pos(other)
    clock.advance(0.5)
    assert _pos(other) != moving_before  # the demo still drives the free joints
    s.write(40, bytes([0]))
    assert arm.motion_paused
    held_other = _pos(other)
    clock.advance(3.0)
    assert _pos(s) == start + 300
    assert _pos(other) == held_other
    arm.set_motion(DemoMotion())  # an explicit new source drives the arm again
    assert not arm.motion_paused
    clock.advance(2.0)
    assert _pos(other) != held_other


def test_a_reversed_gripper_closes_toward_high_ticks() -> None:
    normal = EmulatedArm("follower", initial_pose_units=[0, 0, 0, 0, 0, 0.0])
    rev = EmulatedArm("follower", initial_pose_units=[0, 0, 0, 0, 0, 0.0], gripper_reversed=True)
    ref = reference_calibration("follower")
    g = ref["gripper"]
    assert normal.present_ticks()[5] == pytest.approx(g.range_min, abs=1)
    assert rev.present_ticks()[5] == pytest.approx(g.range_max, abs=1)  # closed at the high end
    assert rev.reference_calibration()["gripper"].drive_mode == 1
    assert reference_calibration("follower", gripper_reversed=True)["gripper"].drive_mode == 1
    for opening in (0.0, 30.0, 100.0):
        rev.set_pose_units([0, 0, 0, 0, 0, opening])
        assert rev.pose_units()[5] == pytest.approx(opening, abs=0.1)  # LeRobot units unchanged
        # What LeRobot reads through the drive_mode-1 calibration: 100 - fraction of the range.
        assert ticks_to_units(rev.present_ticks(), rev.reference)[5] == pytest.approx(opening, abs=0.1)
    rev.set_pose_units([0, 0, 0, 0, 0, 100.0])
    assert rev.present_ticks()[5] == pytest.approx(g.range_min, abs=1)


def test_overcurrent_protection_trips_on_a_low_protection_current() -> None:
    from drivers.sts3215_table import ERR_OVERCURRENT

    arm, clock = _arm()
    s = arm.servo("elbow_flex")
    s.write(55, bytes([0]))
    s.write(28, (60).to_bytes(2, "little"))  # 390 mA
    s.write(38, bytes([10]))  # 100 ms
    s.write(36, bytes([100]))  # keep the overload protection out of the way
    start = _pos(s)
    arm.block_joint("elbow_flex", start - 20)
    _unlock_torque_on(s, start - 600)
    clock.advance(0.05)
    s.update()
    assert s.torque_enabled and s.current_ma() > 390
    assert int.from_bytes(s.read(69, 2), "little") * 6.5 > 390  # Present_Current reports it
    clock.advance(0.2)
    s.update()
    assert not s.torque_enabled and s.error_bits() & ERR_OVERCURRENT
