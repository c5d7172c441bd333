"""FeetechLeader / FeetechFollower against the STS3215 bus emulator."""

from __future__ import annotations

import time

import numpy as np
import pytest
from support import connect_lerobot, poll_until

from calibration.calibration_file import ArmCalibration
from calibration.conventions import JOINT_NAMES, ticks_to_units, unit_limits
from drivers.arm_interface import ArmHealth, BusTimeoutError, FollowerArm, HandshakeError, LeaderArm, PortGoneError
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.feetech_arm import FeetechFollower, FeetechLeader, FollowerBusConfig, LeaderBusConfig

TICK_DEG = 360.0 / 4095


def serve(tmp_path, role="follower", preset="calibrated", **arm_kw):
    arm = EmulatedArm(role, preset=preset, **arm_kw)
    return BusEmulator(tmp_path / role, arm, wire_time=False).start()


@pytest.fixture
def follower_emu(tmp_path):
    emu = serve(tmp_path)
    yield emu
    emu.stop()


@pytest.fixture
def follower(follower_emu):
    f = FeetechFollower(str(follower_emu.link_path), reference_calibration("follower"), FollowerBusConfig())
    f.connect()
    yield f
    f.close()


def test_protocols_are_implemented(follower):
    assert isinstance(follower, FollowerArm)
    assert follower.kind == "feetech"
    assert isinstance(FeetechLeader("/dev/null", None), LeaderArm)


def test_handshake_ok_on_a_calibrated_arm(follower, follower_emu):
    assert follower.firmware == (3, 10)
    assert follower.calibration_mismatches == []
    # an arm LeRobot already configured needs no EEPROM write, so torque is not touched
    assert follower.torque_enabled is False


def test_handshake_names_the_missing_servo_and_port(follower_emu):
    follower_emu.arm.set_online("elbow_flex", False)
    f = FeetechFollower(str(follower_emu.link_path), reference_calibration("follower"), FollowerBusConfig())
    with pytest.raises(HandshakeError) as ei:
        f.connect()
    msg = str(ei.value)
    assert "'elbow_flex' (id 3)" in msg
    assert str(follower_emu.link_path) in msg
    assert "shoulder_pan" not in msg.split("ids answering")[0]
    assert not f.bus.is_open  # a failed connect leaves nothing open


def test_handshake_wrong_model(follower_emu):
    follower_emu.arm.servo("wrist_flex").set_register("Model_Number", 1284)
    f = FeetechFollower(str(follower_emu.link_path), reference_calibration("follower"))
    with pytest.raises(HandshakeError) as ei:
        f.connect()
    assert "'wrist_flex' (id 4) reports model 1284" in str(ei.value)
    assert "777" in str(ei.value)


def test_handshake_mixed_firmware(follower_emu):
    follower_emu.arm.servo("gripper").set_register("Firmware_Minor_Version", 9)
    f = FeetechFollower(str(follower_emu.link_path), reference_calibration("follower"))
    with pytest.raises(HandshakeError, match=r"'gripper' \(id 6\) 3.9"):
        f.connect()
    f2 = FeetechFollower(
        str(follower_emu.link_path), reference_calibration("follower"), FollowerBusConfig(expected_firmware=(3, 9))
    )
    follower_emu.arm.servo("gripper").set_register("Firmware_Minor_Version", 10)
    with pytest.raises(HandshakeError, match="expected 3.9"):
        f2.connect()


def test_connect_on_a_missing_port_is_port_gone(tmp_path):
    with pytest.raises(PortGoneError):
        FeetechFollower(str(tmp_path / "ttyNONE"), reference_calibration("follower")).connect()


def test_configure_a_factory_follower_like_lerobot(tmp_path):
    emu = serve(tmp_path, preset="factory")
    try:
        f = FeetechFollower(str(emu.link_path), None)
        f.connect()
        for name in JOINT_NAMES:
            s = emu.arm.servo(name)
            assert s.reg("Return_Delay_Time") == 0
            assert s.reg("Maximum_Acceleration") == 254
            assert s.reg("Acceleration") == 254
            assert s.reg("Operating_Mode") == 0
            assert (s.reg("P_Coefficient"), s.reg("I_Coefficient"), s.reg("D_Coefficient")) == (16, 0, 32)
            assert s.reg("Phase") & 0x10 == 0
            assert not s.torque_enabled and s.reg("Lock") == 0
        g = emu.arm.servo("gripper")
        assert (g.reg("Max_Torque_Limit"), g.reg("Protection_Current"), g.reg("Overload_Torque")) == (500, 250, 25)
        assert emu.arm.servo("elbow_flex").reg("Max_Torque_Limit") != 500  # body joints keep theirs
        f.close()
    finally:
        emu.stop()


def test_configure_is_configurable(tmp_path):
    emu = serve(tmp_path, preset="factory")
    try:
        cfg = FollowerBusConfig(gripper_max_torque_limit=300, p_coefficient=20)
        f = FeetechFollower(str(emu.link_path), None, cfg)
        f.connect()
        assert emu.arm.servo("gripper").reg("Max_Torque_Limit") == 300
        assert emu.arm.servo("shoulder_pan").reg("P_Coefficient") == 20
        f.close()
    finally:
        emu.stop()


def test_configure_keeps_a_holding_follower_holding(follower, follower_emu):
    follower.set_torque(True)
    follower.bus.close()
    f2 = FeetechFollower(str(follower_emu.link_path), reference_calibration("follower"))
    f2.connect()  # nothing to change in EEPROM: torque stays on
    assert f2.torque_enabled is True
    assert all(s.torque_enabled for s in follower_emu.arm.servos)
    f2.close()


def test_leader_is_configured_with_torque_off(tmp_path):
    emu = serve(tmp_path, role="leader")
    try:
        for s in emu.arm.servos:
            s.set_register("Torque_Enable", 1)
            s.set_register("Lock", 1)
        leader = FeetechLeader(str(emu.link_path), reference_calibration("leader"), LeaderBusConfig())
        leader.connect()
        assert not any(s.torque_enabled for s in emu.arm.servos)
        assert all(s.reg("Lock") == 0 for s in emu.arm.servos)
        # the leader follows its motion source: consecutive reads move and match the arm's pose
        a = leader.read_joints()
        np.testing.assert_allclose(a, emu.arm.pose_units(), atol=2 * TICK_DEG + 2.0)
        leader.close()
    finally:
        emu.stop()


def test_read_joints_matches_the_emulated_pose(follower, follower_emu):
    pose = np.array([12.5, -33.0, 41.0, -7.5, 90.0, 35.0])
    follower_emu.arm.set_pose_units(pose)
    ticks = follower.read_joints_ticks()
    assert ticks.dtype == np.int64
    assert ticks.tolist() == follower_emu.arm.present_ticks().tolist()
    units = follower.read_joints()
    tol = np.full(6, TICK_DEG)
    tol[5] = 100.0 / (3481 - 2003)  # gripper: one tick of its range in 0..100
    assert np.all(np.abs(units - pose) <= tol), (units, pose)
    np.testing.assert_allclose(units, ticks_to_units(ticks, reference_calibration("follower")))


def test_write_goals_moves_the_follower(follower, follower_emu):
    follower_emu.arm.set_pose_units([0.0, 0.0, 0.0, 0.0, 0.0, 50.0])
    follower.set_torque(True)
    target = np.array([20.0, -15.0, 10.0, 25.0, -30.0, 70.0])
    follower.write_goals(target)
    assert poll_until(lambda: np.all(np.abs(follower.read_joints() - target) < 1.0)), follower.read_joints()
    np.testing.assert_allclose(follower_emu.arm.pose_units(), target, atol=1.0)


def test_set_torque_on_holds_the_present_pose(follower, follower_emu):
    follower_emu.arm.set_pose_units([5.0, 5.0, 5.0, 5.0, 5.0, 20.0])
    for s in follower_emu.arm.servos:  # a stale goal far away, as left by an earlier session
        s.set_register("Goal_Position", 2047)
    present = follower.read_joints_ticks()
    follower.set_torque(True)
    assert follower_emu.arm.goal_ticks().tolist() == present.tolist()
    assert all(s.torque_enabled and s.reg("Lock") == 1 for s in follower_emu.arm.servos)
    time.sleep(0.1)
    assert np.abs(follower.read_joints_ticks() - present).max() <= 1
    follower.set_torque(False)
    assert not any(s.torque_enabled for s in follower_emu.arm.servos)
    assert all(s.reg("Lock") == 0 for s in follower_emu.arm.servos)


def test_goals_are_clamped_to_the_calibrated_range(follower, follower_emu):
    cal = reference_calibration("follower")
    lo, hi = follower.joint_limits()
    np.testing.assert_allclose((lo, hi), unit_limits(cal))
    # a sync write has no reply: wait until the emulator has applied it
    follower.write_goals(hi + 50.0)
    want_hi = [cal[n].range_max for n in JOINT_NAMES]
    assert poll_until(lambda: follower_emu.arm.goal_ticks().tolist() == want_hi), follower_emu.arm.goal_ticks()
    assert follower.last_goal_ticks.tolist() == want_hi
    follower.write_goals(lo - 50.0)
    want_lo = [cal[n].range_min for n in JOINT_NAMES]
    assert poll_until(lambda: follower_emu.arm.goal_ticks().tolist() == want_lo), follower_emu.arm.goal_ticks()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_goals_never_reach_the_bus(follower, follower_emu, bad):
    before_goals = follower_emu.arm.goal_ticks().tolist()
    before_req = follower_emu.stats.requests
    goals = np.zeros(6)
    goals[2] = bad
    with pytest.raises(ValueError, match="elbow_flex"):
        follower.write_goals(goals)
    with pytest.raises(ValueError):
        follower.write_goals(np.zeros(5))
    with pytest.raises(ValueError):
        follower.write_goals_ticks(np.array([2048.0, 2048, np.nan, 2048, 2048, 2048]))
    assert follower_emu.stats.requests == before_req
    assert follower_emu.arm.goal_ticks().tolist() == before_goals


def test_read_health(follower, follower_emu):
    arm = follower_emu.arm
    arm.set_temperature("gripper", 55.0)
    arm.set_error_bits("elbow_flex", 0x20)
    h = follower.read_health()
    assert isinstance(h, ArmHealth)
    assert set(h.servos) == set(JOINT_NAMES) and h.missing == ()
    assert h.servos["gripper"].temperature_c == pytest.approx(55.0, abs=1.0)
    assert h.servos["shoulder_pan"].voltage_v == pytest.approx(7.4, abs=0.3)
    assert h.faults == {"elbow_flex": 0x20}
    assert not h.servos["wrist_roll"].torque_enabled
    arm.set_online("wrist_roll", False)
    h2 = follower.read_health()
    assert h2.missing == ("wrist_roll",)
    assert "wrist_roll" not in h2.servos and len(h2.servos) == 5


def test_write_calibration_like_lerobot(tmp_path):
    emu = serve(tmp_path, preset="factory")
    try:
        cal = reference_calibration("follower")
        f = FeetechFollower(str(emu.link_path), cal)
        f.connect()
        assert f.calibration_mismatches  # factory EEPROM differs from the file: reported, not overwritten
        # the same wording as `so101d calibrate --verify` (drivers.calibration_io, one implementation)
        off = cal["elbow_flex"].homing_offset
        assert (
            f"motor 'elbow_flex' (id 3): Homing_Offset is 0 on the servo, {off} in the file" in f.calibration_mismatches
        )
        assert len(f.calibration_mismatches) == 6 * 3 - 2  # all differ but wrist_roll's range (0..4095 both)
        assert emu.arm.eeprom_calibration().to_json_dict() != cal.to_json_dict()
        for s in emu.arm.servos:  # a locked servo ignores EEPROM writes: write_calibration must unlock
            s.set_register("Lock", 1)
        f.write_calibration(cal)
        assert emu.arm.eeprom_calibration().to_json_dict() == cal.to_json_dict()
        assert f.calibration_mismatches == []
        pose = np.array([0.0, 10.0, -10.0, 20.0, 0.0, 60.0])
        emu.arm.set_pose_units(pose)
        np.testing.assert_allclose(f.read_joints(), pose, atol=0.1 + 100 / (3481 - 2003))
        f.reset_calibration()
        held = emu.arm.eeprom_calibration()
        assert all((held[n].homing_offset, held[n].range_min, held[n].range_max) == (0, 0, 4095) for n in JOINT_NAMES)
        f.close()
    finally:
        emu.stop()


def test_no_calibration_loaded(tmp_path):
    emu = serve(tmp_path)
    try:
        f = FeetechFollower(str(emu.link_path), None)
        f.connect()
        assert f.read_joints_ticks().shape == (6,)
        with pytest.raises(Exception, match="no calibration"):
            f.read_joints()
        f.close()
    finally:
        emu.stop()


def test_dropped_replies_counted_then_bus_timeout(follower, follower_emu):
    follower_emu.drop_replies(2)
    follower.read_joints()
    assert follower.counters.retries == 1 and follower.counters.failures == 0
    follower_emu.drop_replies(6 * 3)
    with pytest.raises(BusTimeoutError):
        follower.read_joints()
    assert follower.counters.failures == 1
    assert follower.counters.retries == 3


def test_unplug_then_reconnect(follower, follower_emu):
    follower.read_joints()
    follower_emu.unplug()
    with pytest.raises(PortGoneError):
        follower.read_joints()
    with pytest.raises(PortGoneError):
        follower.reconnect(timeout_s=0.2)  # still unplugged: bounded, then the error
    follower_emu.replug()
    follower.reconnect(timeout_s=5.0)
    assert follower.counters.reconnects == 1
    follower_emu.arm.set_pose_units([1.0, 2.0, 3.0, 4.0, 5.0, 60.0])
    np.testing.assert_allclose(follower.read_joints(), [1.0, 2.0, 3.0, 4.0, 5.0, 60.0], atol=0.2)


def test_reconnect_while_unplugged_in_the_background(follower, follower_emu):
    import threading

    follower_emu.unplug()
    timer = threading.Timer(0.3, follower_emu.replug)
    timer.start()
    try:
        follower.reconnect(timeout_s=5.0)
    finally:
        timer.join()
    assert follower.read_joints_ticks().tolist() == follower_emu.arm.present_ticks().tolist()


def test_leader_can_be_driven_for_a_take_over(tmp_path):
    emu = serve(tmp_path, role="leader")
    try:
        leader = FeetechLeader(str(emu.link_path), reference_calibration("leader"))
        leader.connect()
        emu.arm.set_pose_units([0.0, 0.0, 0.0, 0.0, 0.0, 30.0])
        leader.set_torque(True)
        target = np.array([10.0, -10.0, 5.0, 0.0, 20.0, 50.0])
        leader.write_goals(target)
        assert poll_until(lambda: np.all(np.abs(leader.read_joints() - target) < 1.0)), leader.read_joints()
        leader.close()  # a leader is never left holding
        assert not any(s.torque_enabled for s in emu.arm.servos)
    finally:
        emu.stop()


def test_lerobot_reads_the_calibration_we_wrote(tmp_path):
    """Interop: after our write_calibration, LeRobot 0.6.1's FeetechMotorsBus finds the arm
    calibrated (no input() prompt on its connect) and normalises to the same units.

    The emulator runs in its own process (``so101d emulate``): LeRobot's SDK allows 50 ms per
    status packet, which an in-process emulator sharing our GIL misses under load."""
    from lerobot.motors import Motor, MotorCalibration, MotorNormMode
    from lerobot.motors.feetech import FeetechMotorsBus

    from drivers.emulator.process import EmulatorProcess

    with EmulatorProcess(tmp_path / "bench", leader=False, preset="factory") as proc:
        cal = reference_calibration("follower")
        ours = FeetechFollower(str(proc.follower_path), cal)
        ours.connect()
        ours.write_calibration(cal)
        proc.control({"cmd": "set_pose", "arm": "follower", "pose_units": [15.0, -25.0, 35.0, -45.0, 55.0, 65.0]})
        units = ours.read_joints()
        ours.close()
        motors = {
            n: Motor(cal[n].id, "sts3215", MotorNormMode.RANGE_0_100 if n == "gripper" else MotorNormMode.DEGREES)
            for n in JOINT_NAMES
        }
        lr_cal = {
            n: MotorCalibration(cal[n].id, cal[n].drive_mode, cal[n].homing_offset, cal[n].range_min, cal[n].range_max)
            for n in JOINT_NAMES
        }
        lr = connect_lerobot(lambda: FeetechMotorsBus(str(proc.follower_path), motors, calibration=lr_cal))
        try:
            assert lr.is_calibrated
            got = lr.sync_read("Present_Position", num_retry=2)
            np.testing.assert_allclose([got[n] for n in JOINT_NAMES], units, atol=1e-6)
        finally:
            lr.disconnect(disable_torque=False)


def test_against_the_emulator_process(tmp_path):
    """The same driver against `so101d emulate` in its own process, unplug/replug over its socket."""
    from drivers.emulator.process import EmulatorProcess

    with EmulatorProcess(tmp_path / "bench", leader=True, follower=True) as proc:
        cal = {
            role: ArmCalibration.from_json_dict(
                proc.control({"cmd": "reference_calibration", "arm": role})["calibration"]
            )
            for role in ("leader", "follower")
        }
        leader = FeetechLeader(str(proc.leader_path), cal["leader"])
        follower = FeetechFollower(str(proc.follower_path), cal["follower"])
        leader.connect()
        follower.connect()
        follower.set_torque(True)
        pose = leader.read_joints()
        lo, hi = follower.joint_limits()
        follower.write_goals(np.clip(pose, lo, hi))
        proc.control({"cmd": "unplug", "arm": "follower"})
        with pytest.raises(PortGoneError):
            follower.read_joints()
        assert leader.read_joints().shape == (6,)  # the other arm's bus is unaffected
        proc.control({"cmd": "replug", "arm": "follower"})
        follower.reconnect(timeout_s=10.0)
        assert follower.counters.reconnects == 1
        assert follower.read_joints().shape == (6,)
        follower.close()
        leader.close()
