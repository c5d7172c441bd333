"""The emulator's realism options (issue 19), each exercised by the Feetech SDK or LeRobot's own
FeetechMotorsBus *and* by our driver: the defaults stay LeRobot-compatible, and LeRobot, which
works on real arms, keeps working under every option.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterator

import numpy as np
import pytest
import scservo_sdk as scs
from lerobot.motors import Motor, MotorCalibration, MotorNormMode
from lerobot.motors.feetech import FeetechMotorsBus
from support import connect_lerobot, poll_until, sdk_port_on_emulated_follower
from test_emulator_sdk import ok

from calibration.conventions import JOINT_NAMES
from drivers.emulator import BusEmulator, EmulatedArm, reference_calibration
from drivers.emulator.process import EmulatorControlError, EmulatorProcess
from drivers.emulator.realism import USB_CH343, USB_FTDI, realism_from_spec
from drivers.feetech_arm import FeetechFollower, FollowerBusConfig
from drivers.feetech_bus import FeetechBus
from drivers.sts3215_table import ERR_OVERLOAD

HEALTH = (40, 31)


def _motors() -> dict[str, Motor]:
    return {
        n: Motor(i + 1, "sts3215", MotorNormMode.RANGE_0_100 if n == "gripper" else MotorNormMode.DEGREES)
        for i, n in enumerate(JOINT_NAMES)
    }


def _lerobot_calibration() -> dict[str, MotorCalibration]:
    cal = reference_calibration("follower")
    return {n: MotorCalibration(**vars(cal[n])) for n in JOINT_NAMES}


@pytest.fixture(scope="module")
def real_bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    """`so101d emulate --realism real` (strict servos, CH343 USB, collisions) in its own process."""
    d = tmp_path_factory.mktemp("real")
    with EmulatorProcess(d, leader=False, extra_args=["--realism", "real"]) as ep:
        yield ep


def test_realism_is_reported_and_settable_over_the_control_socket(real_bench: EmulatorProcess) -> None:
    r = real_bench.control({"cmd": "realism"})["realism"]["follower"]
    assert r["servo"]["lock_applies_unsaved"] and r["servo"]["return_delay_min"] == 50
    assert r["bus"]["usb"]["name"] == "ch343" and r["bus"]["ping_collisions"]
    with pytest.raises(EmulatorControlError, match="unknown realism preset 'bogus'"):
        real_bench.control({"cmd": "realism", "preset": "bogus"})
    with pytest.raises(EmulatorControlError, match="unknown USB profile"):
        real_bench.control({"cmd": "realism", "usb": "pl2303"})
    assert real_bench.control({"cmd": "realism"})["realism"]["follower"] == r  # a refused request changed nothing


def test_lerobot_bus_connects_configures_and_drives_strict_servos_over_ch343(real_bench: EmulatorProcess) -> None:
    assert real_bench.follower_path is not None
    lr = connect_lerobot(
        lambda: FeetechMotorsBus(str(real_bench.follower_path), _motors(), calibration=_lerobot_calibration())
    )
    try:
        real_bench.control({"cmd": "set_register", "joint": "elbow_flex", "name": "Maximum_Acceleration", "value": 0})
        with lr.torque_disabled():
            lr.configure_motors()  # writes Return_Delay_Time 0, Maximum_Acceleration 254 ... and never checks
        # what real servos (and now the emulator) kept: the clamp and the read-only register
        assert lr.read("Return_Delay_Time", "elbow_flex", num_retry=2) == 50
        assert lr.read("Maximum_Acceleration", "elbow_flex", num_retry=2) == 0
        present = lr.sync_read("Present_Position", num_retry=3)
        lr.enable_torque(num_retry=2)
        goal = dict(present)
        goal["elbow_flex"] = present["elbow_flex"] - 10.0  # toward mid-range, inside the limits
        lr.sync_write("Goal_Position", goal)
        assert poll_until(
            lambda: abs(lr.sync_read("Present_Position", num_retry=3)["elbow_flex"] - goal["elbow_flex"]) < 1.0, 5.0
        )
        # Lock = 1 (LeRobot's enable_torque sets it): an EEPROM write applies but is not saved
        lr.write("P_Coefficient", "elbow_flex", 20, num_retry=2)
        assert lr.read("P_Coefficient", "elbow_flex", num_retry=2) == 20
        lr.disable_torque(num_retry=2)
    finally:
        lr.port_handler.closePort()
    real_bench.control({"cmd": "power_cycle"})  # the operator unplugs the arm's power
    lr = connect_lerobot(
        lambda: FeetechMotorsBus(str(real_bench.follower_path), _motors(), calibration=_lerobot_calibration())
    )
    try:
        assert lr.read("P_Coefficient", "elbow_flex", num_retry=2) == 16  # the saved value came back
        assert lr.read("Torque_Enable", "elbow_flex", num_retry=2) == 0
        assert real_bench.control({"cmd": "snapshot"})["servos"]["elbow_flex"]["power_cycles"] == 1
    finally:
        lr.port_handler.closePort()


def test_our_driver_connects_on_the_same_real_bench_and_reports_what_was_refused(real_bench: EmulatorProcess) -> None:
    assert real_bench.follower_path is not None
    f = FeetechFollower(str(real_bench.follower_path), reference_calibration("follower"), FollowerBusConfig())
    f.connect()
    try:
        assert any("Return_Delay_Time=50" in w for w in f.configure_warnings)
        h = f.read_health()
        assert set(h.servos) == set(JOINT_NAMES)
    finally:
        f.close()


def test_lerobot_bus_reads_true_values_through_every_noise_shape_and_the_ftdi_timer(
    real_bench: EmulatorProcess,
) -> None:
    """LeRobot's own retries against each corruption mode and the FTDI latency: slower, never wrong."""
    assert real_bench.follower_path is not None
    lr = connect_lerobot(
        lambda: FeetechMotorsBus(str(real_bench.follower_path), _motors(), calibration=_lerobot_calibration())
    )
    try:
        snap = real_bench.control({"cmd": "snapshot"})["servos"]
        truth = {n: snap[n]["present_ticks"] for n in JOINT_NAMES}
        for mode in ("any", "len", "drop", "insert"):
            real_bench.control({"cmd": "corrupt", "rate": 0.02, "mode": mode})
            for _ in range(25):
                assert lr.sync_read("Present_Position", normalize=False, num_retry=5) == truth, mode
        real_bench.control({"cmd": "clear_faults"})
        stats = real_bench.control({"cmd": "stats"})["stats"]
        assert stats["corrupted_replies"] > 0
        real_bench.control({"cmd": "realism", "usb": "ftdi"})
        t0 = time.perf_counter()
        assert lr.sync_read("Present_Position", normalize=False, num_retry=3) == truth
        assert time.perf_counter() - t0 >= 0.001  # through the FTDI model, not at once
    finally:
        real_bench.control({"cmd": "clear_faults"})
        real_bench.control({"cmd": "realism", "usb": "ch343"})
        lr.port_handler.closePort()


# --- in-process options ------------------------------------------------------------------------
@pytest.fixture
def strict_rig(tmp_path) -> Iterator[tuple[EmulatedArm, BusEmulator, scs.PortHandler, scs.PacketHandler]]:
    with sdk_port_on_emulated_follower(tmp_path, realism=realism_from_spec("strict").servo) as rig:
        yield rig


def test_sdk_sees_the_overload_latch_survive_torque_writes_until_power_cycle(strict_rig) -> None:
    arm, _bus, port, ph = strict_rig
    g = arm.servo("gripper")
    g.set_register("Protection_Time", 5)
    ok(port, ph.write1ByteTxRx, port, 6, 40, 1)
    arm.block_joint("gripper", g.present_ticks() + 5)
    ok(port, ph.write2ByteTxRx, port, 6, 42, g.present_ticks() + 600)
    assert poll_until(lambda: ok(port, ph.ping, port, 6)[2] & ERR_OVERLOAD, 3.0)
    arm.block_joint("gripper", None)
    for _ in range(2):
        comm, err = ok(port, ph.write1ByteTxRx, port, 6, 40, 1)
        assert comm == scs.COMM_SUCCESS and err & ERR_OVERLOAD
        assert ok(port, ph.read1ByteTxRx, port, 6, 40)[0] == 0  # torque stays off
    arm.power_cycle()
    comm, err = ok(port, ph.write1ByteTxRx, port, 6, 40, 1)
    assert comm == scs.COMM_SUCCESS and err == 0
    assert ok(port, ph.read1ByteTxRx, port, 6, 40)[0] == 1


def test_lerobot_default_emulator_still_clears_the_latch_on_a_torque_write(tmp_path) -> None:
    """Default stays as it was (LeRobot-compatible): only the realism option makes it strict."""
    arm = EmulatedArm("follower")
    g = arm.servo("gripper")
    g.latched_errors = ERR_OVERLOAD
    g.write(40, b"\x01")
    assert g.latched_errors == 0 and g.torque_enabled


def _timed_reads(fd: int, n_bytes: int, timeout_s: float = 1.0) -> list[tuple[float, int]]:
    got: list[tuple[float, int]] = []
    total = 0
    end = time.monotonic() + timeout_s
    while total < n_bytes and time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            data = os.read(fd, 4096)
            got.append((time.perf_counter(), len(data)))
            total += len(data)
    return got


@pytest.mark.parametrize("profile", [USB_CH343, USB_FTDI])
def test_usb_profiles_split_a_long_reply_into_transfers_and_add_their_latency(tmp_path, profile) -> None:
    arm = EmulatedArm("follower")
    bus = BusEmulator(tmp_path / "f", arm, realism=realism_from_spec(profile.name).bus).start()
    try:
        with FeetechBus(str(tmp_path / "f")) as b:
            b.sync_read("Present_Position", list(range(1, 7)))  # warm up (and start the FTDI timer)
            before = bus.stats.usb_transfers
            pkt = __import__("drivers.protocol", fromlist=["sync_read"]).sync_read(
                HEALTH[0], HEALTH[1], list(range(1, 7))
            )
            t0 = time.perf_counter()
            os.write(b._fd, pkt)
            reads = _timed_reads(b._fd, 6 * (6 + HEALTH[1]))
        assert sum(n for _, n in reads) == 6 * 37
        transfers = bus.stats.usb_transfers - before
        assert transfers >= 4  # 222 bytes do not fit one 62/64-byte USB packet
        assert max(n for _, n in reads) <= 4 * profile.chunk_bytes
        first_s = reads[0][0] - t0
        assert first_s >= 0.0009, f"first bytes after {first_s * 1e3:.2f} ms: no USB frame latency"
    finally:
        bus.stop()


def test_our_driver_reads_every_register_block_through_each_usb_profile(tmp_path) -> None:
    for name in ("ch343", "ftdi", "ftdi-1ms"):
        arm = EmulatedArm("follower")
        bus = BusEmulator(tmp_path / name, arm, realism=realism_from_spec(name).bus).start()
        try:
            f = FeetechFollower(str(tmp_path / name), reference_calibration("follower"), FollowerBusConfig())
            f.connect()
            try:
                for _ in range(10):
                    np.testing.assert_array_equal(f.read_joints_ticks(), arm.present_ticks())
                    assert set(f.read_health().servos) == set(JOINT_NAMES)
                assert f.counters.failures == 0, name
            finally:
                f.close()
        finally:
            bus.stop()


def test_a_silent_servo_silences_the_later_ones_but_health_names_only_the_silent_one(tmp_path) -> None:
    arm = EmulatedArm("follower")
    bus = BusEmulator(tmp_path / "f", arm, wire_time=False, realism=realism_from_spec("collisions").bus).start()
    try:
        f = FeetechFollower(str(tmp_path / "f"), reference_calibration("follower"), FollowerBusConfig(retries=0))
        f.connect()
        try:
            arm.set_online("elbow_flex", False)
            with pytest.raises(Exception) as ei:
                f.read_joints_ticks()
            assert getattr(ei.value, "missing_ids", None) == (3, 4, 5, 6)  # what the chain looks like
            assert bus.stats.chained_silences >= 3
            h = f.read_health()
            assert h.missing == ("elbow_flex",)
            assert set(h.servos) == set(JOINT_NAMES) - {"elbow_flex"}
        finally:
            arm.set_online("elbow_flex", True)
            f.close()
    finally:
        bus.stop()


def test_presets_compose_and_bad_options_are_refused() -> None:
    from drivers.emulator.realism import servo_realism_from_json

    r = realism_from_spec("strict, ftdi ,collisions")
    assert r.servo.lock_applies_unsaved and r.bus.usb is USB_FTDI and r.bus.ping_collisions
    assert realism_from_spec("strict,lerobot") == realism_from_spec("")  # lerobot resets to the default
    with pytest.raises(ValueError, match="unknown servo realism option"):
        servo_realism_from_json({"lock_aplies_unsaved": True})


def test_power_cycle_reloads_saved_eeprom_and_resets_sram() -> None:
    arm = EmulatedArm("follower", realism=realism_from_spec("strict").servo)
    g = arm.servo("gripper")
    g.write(41, b"\x10")  # Acceleration (SRAM)
    g.write(48, (300).to_bytes(2, "little"))  # Torque_Limit (SRAM)
    g.write(21, b"\x05")  # P_Coefficient with Lock = 1: applied, not saved
    assert g.reg("P_Coefficient") == 5
    g.write(55, b"\x00")  # unlock
    g.write(16, (400).to_bytes(2, "little"))  # Max_Torque_Limit, saved
    g.write(40, b"\x01")
    arm.power_cycle()
    assert g.reg("P_Coefficient") == 16 and g.reg("Max_Torque_Limit") == 400
    assert g.reg("Torque_Limit") == 400  # seeded from Max_Torque_Limit at power-on
    assert g.reg("Acceleration") == 0 and g.reg("Lock") == 1 and g.reg("Torque_Enable") == 0
    assert g.goal_ticks() == g.present_ticks()
